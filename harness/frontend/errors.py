"""Every error composing a config can raise, said in one line from the typed schema
(harness/config.py): `<key>=<value>: <what is allowed>`.

Hydra's and OmegaConf's messages are never parsed. When composition fails, the command line's
overrides are checked against the schema (`check_overrides`: the key, the type of its value,
`+` on a key that always has a value, a key interpolated, Hydra's own keys against hydra.conf),
the one at the key composition stopped at first; what Hydra raised adds only its typed
attributes (the key and dataclass OmegaConf names, a missing config's options, a file).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
import typing
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import (ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException,
                              ValidationError)

from harness.config import BASES, OPTIONS, Config, ConfigError, option_class, schema_keys, unknown_key, what_fits

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"
# a plain ${key} in a value as the user wrote it (a resolver's ${name:...} is not a key)
_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def _first_line(text: object) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~").split("@")[0]


def written(key: str, overrides: list[str]) -> str | None:
    """The override (as the user wrote it) that sets `key`; the last one wins, as in Hydra."""
    found = [o for o in overrides if _key(o) == key]
    return found[-1] if found else None


def _unwrap(hint: Any) -> Any:
    """`X | None` -> X."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(hint) and len(args) == 1 else hint


def _is_dict(hint: Any) -> bool:
    hint = _unwrap(hint)
    return hint is dict or typing.get_origin(hint) is dict or hint is Any


def _hint(key: str, chosen: dict[str, str]) -> tuple[Any, str | None]:
    """(the schema's type hint for `key`, or None if no key of the schema; the option of its
    group that lacks it, if the group's option is known and does not have it). A key below a
    dict (model.kwargs.depth) has the hint Any."""
    group, _, leaf = key.partition(".")
    if group in OPTIONS and leaf and group in chosen:
        hints = typing.get_type_hints(option_class(group, chosen[group]))
        name, _, rest = leaf.partition(".")
        if name not in hints:
            return None, chosen[group]
        return (Any, None) if rest and _is_dict(hints[name]) else (hints[name] if not rest else None, None)
    keys = schema_keys()
    if key in keys:
        return keys[key], None
    parts = key.split(".")
    if any(_is_dict(keys.get(".".join(parts[:i]), None)) for i in range(1, len(parts))):
        return Any, None
    return None, None


def _default(key: str, chosen: dict[str, str]) -> Any:
    """The schema's default for `key` (its group's chosen option's, else the schema's own)."""
    node: Any = Config()
    for i, part in enumerate(key.split(".")):
        if i == 0 and part in chosen and part in OPTIONS:
            node = option_class(part, chosen[part])()
        elif i == 0 and part in OPTIONS:
            node = getattr(node, part)
        elif dataclasses.is_dataclass(node) and hasattr(node, part):
            node = getattr(node, part)
        else:
            return None
    return node


@functools.cache
def _holder(hint: Any) -> Any:
    """A one-value structured config of type `hint`: OmegaConf's own type check of a value."""
    return OmegaConf.structured(dataclasses.make_dataclass("Value", [("value", hint, dataclasses.field(default=MISSING))]))


def fits(hint: Any, value: Any) -> bool:
    """Whether OmegaConf takes `value` for a key of type `hint` (as composition sets it)."""
    if hint is Any:
        return True
    try:
        OmegaConf.merge(_holder(hint), {"value": value})  # OmegaConf.update(..., merge=True), as composition
    except ValidationError:
        return False
    except OmegaConfBaseException:
        return True  # not a question of the value's type: composition says what it is
    return True


def _hydra_key_known(key: str) -> bool:
    """`hydra.<...>` names a field of Hydra's own schema (hydra.conf), down to where it holds
    a dict or a plugin's config (Any)."""
    from hydra.conf import HydraConf

    kind: Any = HydraConf
    for part in key.split(".")[1:]:
        if not dataclasses.is_dataclass(kind):
            return True
        hints = typing.get_type_hints(kind)
        if part not in hints:
            return False
        kind = _unwrap(hints[part])
    return True


def config_groups() -> set[str]:
    """The top-level config groups (model, experiment, a --config-dir's own), from the config
    loader Hydra is running; harness/conf's where none is."""
    from hydra.core.global_hydra import GlobalHydra

    gh = GlobalHydra.instance()
    if gh.is_initialized():
        return set(gh.config_loader().list_groups("")) | {"hydra"}
    from importlib import resources

    return {p.name for p in resources.files("harness.conf").iterdir() if p.is_dir()} | {"hydra"}


def _shown(value: Any) -> str:
    """A default as a command line writes it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def deletion_problem(o: Any, chosen: dict[str, str], groups: set[str], unknown: bool = True) -> str | None:
    """Why `~key` (a parsed override) is refused, or None. The schema gives every key a value
    and every group of BASES an option: deleting one would run its default unasked (OmegaConf
    fills a missing field in), so it is refused; what may go is an optional group's choice
    (~experiment, ~cluster), a key unset by default (~profile), an entry of a dict
    (~model.kwargs.depth) and Hydra's own.
    `unknown`: an unknown key is refused too (else left to Hydra)."""
    key, line = o.key_or_group, str(o.input_line)
    if o.package is not None or "/" in key or key == "hydra" or key.startswith("hydra."):
        return None
    if key in BASES:
        return (f"{line}: {key} always has an option (the schema's default: {key}={getattr(Config(), key).name}): "
                "choose another instead; ~ removes only an optional group's choice (~experiment), a key unset by "
                "default (~profile) or a dict's entry")
    if key in groups:
        return None
    hint, lacking = _hint(key, chosen)
    if hint is None:
        return unknown_key(key, None, lacking, shown=line) if unknown else None
    if hint is Any and "." in key and _is_dict(_hint(key.rpartition(".")[0], chosen)[0]):
        return None  # an entry of a dict: deleting it is what ~ is for
    default = _default(key, chosen)
    if default is None:
        return None  # a key that may be unset (~profile): deleting it leaves it unset, what it says
    only = ("~ removes only an optional group's choice (~experiment), a key unset by default (~profile) or a dict's "
            "entry")
    if dataclasses.is_dataclass(default):
        first = dataclasses.fields(default)[0].name
        return f"{line}: {key} is a section the schema always has: set its keys instead ({key}.{first}=<value>); {only}"
    return (f"{line}: {key} always has a value (the schema's default: {key}={_shown(default)}): set it instead "
            f"({key}=<value>); {only}")


def check_deletions(overrides: list[str]) -> None:
    """ConfigError (one line) for a `~key` the schema refuses (deletion_problem), checked before
    composing: a deleted key composes without error and would run its default. An override
    Hydra cannot parse is left to Hydra's own message."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if not any(o.lstrip().startswith("~") for o in overrides):
        return
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException:
        return
    chosen = {o.key_or_group: o.value() for o in parsed
              if o.key_or_group in OPTIONS and not o.is_sweep_override() and isinstance(o.value(), str)}
    for o in parsed:
        if o.is_delete() and (problem := deletion_problem(o, chosen, config_groups(), unknown=False)):
            raise ConfigError(problem)


def check_overrides(overrides: list[str], sweep: bool = False, chosen: dict[str, str] | None = None,
                    groups: set[str] | None = None) -> None:
    """ConfigError (one line) for the first override the schema refuses. `chosen`: a group's
    option where composition said which it used; the overrides' own choices (model=gpt) are
    added. A group's keys are checked against its option only where the option is known."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise ConfigError(f"{e.override}: not an override Hydra can parse ({_first_line(e.message)}; quote values "
                          f"with spaces or commas: key='a,b'; grammar: {GRAMMAR})") from None
    groups = config_groups() if groups is None else groups
    chosen = {o.key_or_group: o.value() for o in parsed  # the last wins, as in Hydra; composition's word over all
              if o.key_or_group in OPTIONS and not o.is_sweep_override() and isinstance(o.value(), str)} | (chosen or {})
    for o in parsed:
        key, line = o.key_or_group, str(o.input_line)
        value = line.partition("=")[2]
        if o.is_sweep_override() and not sweep:
            if o.value_type == ValueType.SIMPLE_CHOICE_SWEEP:
                raise ConfigError(f"{line}: several values need -m to sweep them (one list: {key}=[{value}]; one "
                                  f"string: {key}='{value}')")
            raise ConfigError(f"{line}: a sweep (allowed with -m only)")
        if o.is_delete() and (problem := deletion_problem(o, chosen, groups)):
            raise ConfigError(problem)
        if o.package is not None or o.is_delete() or "/" in key or key in groups:
            continue  # a group's option: Hydra lists the options it has (hydra_problem)
        if key.startswith("hydra."):
            if not _hydra_key_known(key):
                raise ConfigError(f"{line}: unknown Hydra key (python -m harness --cfg hydra lists them)")
            continue
        hint, lacking = _hint(key, chosen)
        if hint is None:
            raise ConfigError(unknown_key(key, value, lacking))
        if o.is_add() and _default(key, chosen) is not None:
            raise ConfigError(f"{line}: {key} is already set: drop the + to change it")
        if o.is_sweep_override():
            continue  # each point's value is checked when the sweeper composes it
        v = o.value()
        if isinstance(v, str) and "${" in v:
            for ref in _REFERENCE.findall(v):
                if not ref.startswith("hydra.") and _hint(ref, {})[0] is None:
                    raise ConfigError(f"{line}: no key {ref} to interpolate (allowed: any key of the config, e.g. "
                                      "${pp})")
        elif not fits(hint, v):
            raise ConfigError(f"{line}: {what_fits(hint)}")


def _option_of(kind: Any) -> tuple[str, str] | None:
    """(group, option) whose dataclass is `kind`."""
    return next(((g, name) for g, options in OPTIONS.items() for name, cls in options.items() if cls is kind), None)


def omegaconf_problem(e: OmegaConfBaseException, shown: str | None = None) -> str:
    """One line for an error OmegaConf raised about a key, from its typed attributes: `<key>=<value>:
    <what is allowed>`. `shown` is the override as the user wrote it (`pp=abc`), when known."""
    key = str(getattr(e, "full_key", None) or getattr(e, "key", None) or "")
    value = getattr(e, "value", None)
    shown = shown or (f"{key}={value}" if key else None)
    kind = getattr(e, "object_type", None)
    leaf = key.rpartition(".")[2]
    if (isinstance(e, (ConfigAttributeError, ConfigKeyError)) and dataclasses.is_dataclass(kind)
            and leaf not in {f.name for f in dataclasses.fields(kind)}):
        option = _option_of(kind)
        name = option[1] if option else None
        parent = getattr(e, "parent_node", None)  # a group's base dataclass (schedule=1f1b): its node says its name
        if name is None and isinstance(parent, DictConfig) and isinstance(parent.get("name", None), str):
            name = parent.get("name")
        k, _, v = (shown or key).partition("=")
        return unknown_key(k, v, name)
    if isinstance(e, ValidationError) and key in (keys := schema_keys()):
        return f"{shown}: {what_fits(keys[key])}"
    if isinstance(e, MissingMandatoryValue):
        return f"{key}: needs a value ({_first_line(getattr(e, 'msg', '') or e)})"
    what = _first_line(getattr(e, "msg", None) or e)
    return f"{shown}: {what}" if shown else what


def hydra_problem(e: BaseException, overrides: list[str], sweep: bool = False) -> str:
    """One line for anything composing or checking a config raised: the schema's word on the
    overrides (`check_overrides`, the one at the key composition stopped at first), else
    what the error's typed attributes say, else its first line."""
    from hydra.errors import MissingConfigException

    if isinstance(e, ConfigError):
        return str(e)
    cause = e if isinstance(e, OmegaConfBaseException) else e.__cause__
    cause = cause if isinstance(cause, OmegaConfBaseException) else None
    key = str(getattr(cause, "full_key", "") or "")
    at = written(key, overrides)
    chosen = {}
    if (option := _option_of(getattr(cause, "object_type", None))) is not None:
        chosen[option[0]] = option[1]
    try:
        check_overrides(([at] if at else []) + [o for o in overrides if o != at], sweep, chosen)
    except ConfigError as found:
        return str(found)
    unset = [o for o in overrides if _key(o).startswith("cluster.")]
    if unset and not written("cluster", overrides) and isinstance(e, AssertionError):
        # OmegaConf asserts when a key is set inside a group that is null (no cluster chosen)
        return f"{unset[0]}: no cluster to set it on (choose one first: cluster=<preset>, harness/conf/cluster/)"
    if isinstance(e, MissingConfigException):
        missing = str(e.missing_cfg_file or "")
        group, _, choice = missing.rpartition("/")
        shown = written(group, overrides) or (f"{group}={choice}" if group else missing)
        options = list(e.options or [])
        return f"{shown}: unknown (allowed: {', '.join(options)})" if options else f"{shown}: {_first_line(e)}"
    if cause is not None:
        return omegaconf_problem(cause, at)
    if isinstance(e, RuntimeError) and importlib.util.find_spec("hydra_plugins.harness_sweeper") is None:
        return ("hydra/sweeper=harness: harness's sweeper is not installed here (run `make venv`, or pip install -e . "
                f"in the harness checkout; hydra/sweeper=basic runs without it): {_first_line(e)}")
    if isinstance(e, OSError) and e.filename:
        for o in overrides:
            k, _, v = o.partition("=")
            if k in ("hydra.run.dir", "hydra.sweep.dir") and str(e.filename).startswith(v.rstrip("/")):
                return f"{o}: cannot create {e.filename} ({e.strerror}); choose a directory you can write"
        return f"{e.filename}: {e.strerror or _first_line(e)}"
    return f"{type(e).__name__}: {_first_line(e) or 'no message'}"
