"""Hydra and OmegaConf around the schema (harness/config.py): the ConfigStore entries (the
schema and each group option's dataclass), the composed config as a typed Config, and every
error composing or checking raises said in one line, `<key>=<value>: <what is allowed>`.

Only public OmegaConf and Hydra API here; the sweeper's use of Hydra internals is in
harness/frontend/hydra_compat.py.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (ConfigAttributeError, ConfigKeyError, InterpolationResolutionError,
                              MissingMandatoryValue, OmegaConfBaseException, ValidationError)

from harness.config import (BASES, OPTIONS, ClusterConfig, Config, ConfigError, check_cluster, job_dirname,
                            option_class, schema_keys, unknown_key, what_fits)


def register() -> None:
    """The schema (`harness_schema`, the primary config's first default) and each option's
    dataclass (`<group>/schema_<option>`, the first default of its YAML), so Hydra types what it
    composes; the job directory name resolver."""
    cs = ConfigStore.instance()
    # each group typed by its base, so that any option's dataclass (a subclass) merges into it
    cs.store(name="harness_schema", node=Config(**{group: base() for group, base in BASES.items()}))
    for group, options in OPTIONS.items():
        for name, cls in options.items():
            cs.store(group=group, name=f"schema_{name}", node=cls)
    if not OmegaConf.has_resolver("harness.dirname"):
        OmegaConf.register_new_resolver("harness.dirname", job_dirname)


def compose_config(overrides: list[str], cwd: str | Path | None = None) -> Config:
    """The Config `python -m harness <overrides>` runs (no job, no output directory): for
    tools that take harness keys (the planner, the profiler) and tests. ConfigError (one line)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="harness.conf", version_base="1.3"):
            return to_config(compose(config_name="config", overrides=overrides), cwd)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - Hydra's own errors, one line as python -m harness says them
        raise ConfigError(hydra_problem(e, overrides)) from None
    finally:
        GlobalHydra.instance().clear()


def to_config(cfg: DictConfig, cwd: str | Path | None = None) -> Config:
    """The composed config as a typed Config: keys the schema lacks (`+typo=1`) refused with
    a did-you-mean, interpolations resolved, relative paths made absolute against `cwd`
    (default: where the command ran, Hydra's original cwd, also under hydra.job.chdir=true).
    ConfigError (one line) for anything wrong."""
    _refuse_unknown(cfg, Config)
    try:
        if "hydra" in cfg:  # a whole composed config (a sweep's point): its task part
            values = {}
            for f in dataclasses.fields(Config):
                if f.name in cfg:
                    node = cfg[f.name]
                    values[f.name] = OmegaConf.to_object(node) if OmegaConf.is_config(node) else node
            c = Config(**values)
        else:
            c = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_problem(e)) from None
    return absolute_paths(typed_options(c), cwd)


def config_from_dict(d: dict) -> Config:
    """A Config from its dict (a record's `config`, a calibration job's), each group as its
    option's dataclass, typed and checked by OmegaConf; ConfigError (one line)."""
    groups = {g: option_class(g, str((d.get(g) or {}).get("name", base.name))) for g, base in
              ((g, BASES[g]()) for g in BASES)}
    schema = OmegaConf.structured(Config(**{g: cls() for g, cls in groups.items()}))
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema, d))  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_problem(e)) from None


def cluster_from_dict(d: dict) -> ClusterConfig:
    """A ClusterConfig from a dict (what `cluster=<preset>` composes), typed and checked."""
    try:
        c = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ClusterConfig), d))
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_problem(e)) from None
    check_cluster(c)  # type: ignore[arg-type]
    return c  # type: ignore[return-value]


def typed_options(c: Config) -> Config:
    """A group composed from a YAML without its option's schema default (a user's own preset:
    `name: gpt` and its keys) holds the group's base dataclass: made its option's, as if the
    preset had named it."""
    for group, base in BASES.items():
        node = getattr(c, group)
        if type(node) is base and (cls := OPTIONS[group].get(node.name)) is not None:
            setattr(c, group, cls(**dataclasses.asdict(node)))
    return c


def _refuse_unknown(node: DictConfig, cls: type, prefix: str = "") -> None:
    fields = {f.name for f in dataclasses.fields(cls)}
    raw = OmegaConf.to_container(node, resolve=False)
    for key in node.keys():
        key = str(key)
        if key == "hydra" and not prefix:
            continue
        if key not in fields:
            raise ConfigError(unknown_key(prefix + key, raw[key]))  # type: ignore[index]
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue
        sub = node[key]
        if isinstance(sub, DictConfig) and dataclasses.is_dataclass(kind := OmegaConf.get_type(sub)):
            _refuse_unknown(sub, kind, f"{prefix}{key}.")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def omegaconf_problem(e: OmegaConfBaseException, shown: str | None = None) -> str:
    """One line for an error OmegaConf raised about a key: `<key>=<value>: <what is allowed>`.
    `shown` is the override as the user wrote it (`pp=abc`), when known."""
    key = getattr(e, "full_key", None) or getattr(e, "key", None) or ""
    value = getattr(e, "value", None)
    shown = shown or (f"{key}={value}" if key else None)
    if isinstance(e, (ConfigAttributeError, ConfigKeyError)) and "not in" in str(e):
        kind = getattr(e, "object_type", None)  # the option's dataclass the key is not in
        option = next((name for options in OPTIONS.values() for name, cls in options.items() if cls is kind), None)
        return unknown_key(shown.partition("=")[0] if shown else str(key), shown.partition("=")[2] if shown else "",
                           option)
    if isinstance(e, ValidationError) and str(key) in (keys := schema_keys()):
        return f"{shown}: {what_fits(keys[str(key)])}"
    if isinstance(e, MissingMandatoryValue):
        return f"{key}: needs a value ({_first_line(getattr(e, 'msg', '') or str(e))})"
    if isinstance(e, InterpolationResolutionError):
        return f"{shown or key}: {_first_line(getattr(e, 'msg', '') or str(e))}"
    what = _first_line(getattr(e, "msg", None) or str(e))
    return f"{shown}: {what}" if shown else what


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~").split("@")[0]


def written(key: str, overrides: list[str]) -> str | None:
    """The override (as the user wrote it) that sets `key`; the last one wins, as in Hydra."""
    found = [o for o in overrides if _key(o) == key]
    return found[-1] if found else None


def hydra_problem(e: BaseException, overrides: list[str]) -> str:
    """One line for anything composing or checking a config raised: `<key>=<value>: <what is
    allowed>` where the key is known, else the error's first line."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if isinstance(e, ConfigError):
        return str(e)
    unset = [o for o in overrides if _key(o).startswith("cluster.")]
    if unset and not written("cluster", overrides) and isinstance(e, AssertionError):
        # OmegaConf asserts when a key is set inside a group that is null (no cluster chosen)
        return f"{unset[0]}: no cluster to set it on (choose one first: cluster=<preset>, harness/conf/cluster/)"
    if isinstance(e, MissingConfigException):
        missing = str(getattr(e, "missing_cfg_file", "") or "")
        group, _, choice = missing.rpartition("/")
        options = list(getattr(e, "options", None) or [])
        shown = written(group, overrides) or (f"{group}={choice}" if group else missing)
        if options:
            options = [o for o in options if not o.startswith("schema_")]  # the options' typed bases, not options
            return f"{shown}: unknown (allowed: {', '.join(options)})"
        first = lines[0] if lines else "missing config"
        return f"{shown}: {first}" if group else first
    if isinstance(e, OverrideParseException):
        why = lines[0] if lines else "cannot parse"
        return (f"{e.override}: not an override Hydra can parse ({why}; quote values with spaces or "
                "commas: key='a,b'; grammar: https://hydra.cc/docs/advanced/override_grammar/basic/)")
    cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
    if isinstance(e, OmegaConfBaseException):
        cause = e
    if cause is not None:
        key = str(getattr(cause, "full_key", "") or "")
        if m := re.match(r"Interpolation key '(.+?)' not found", str(cause)):
            shown = next((o for o in overrides if "${" + m.group(1) in o), None)
            if shown:
                return f"{shown}: no key {m.group(1)} to interpolate (allowed: any key of the config, e.g. ${{pp}})"
        if key.startswith("hydra.") and "not in" in str(cause):
            return f"{written(key, overrides) or key}: unknown Hydra key (python -m harness --cfg hydra lists them)"
        return omegaconf_problem(cause, written(key, overrides))
    first = lines[0] if lines else type(e).__name__
    if "Unknown plugin class" in first and "harness_sweeper" in first:  # an install from before the sweeper existed
        return (f"{first}: harness's sweeper is not installed here (run `make venv`, or pip install -e . in the "
                "harness checkout; hydra/sweeper=basic runs without it)")
    if isinstance(e, ConfigCompositionException):
        if m := re.match(r"Ambiguous value for argument '(.+)'", first):
            k, _, v = m.group(1).partition("=")
            return (f"{m.group(1)}: several values need -m to sweep them (one list: {k}=[{v}]; one string: "
                    f"{k}='{v}')")
        if m := re.match(r"Could not append to config\. An item is already at '(.+)'", first):
            shown = written(m.group(1), overrides) or m.group(1)
            return f"{shown}: {m.group(1)} is already set: drop the + to change it"
        return "; ".join(lines[:2])
    if isinstance(e, OSError) and e.filename:
        for o in overrides:
            k, _, v = o.partition("=")
            if k in ("hydra.run.dir", "hydra.sweep.dir") and str(e.filename).startswith(v.rstrip("/")):
                return f"{o}: cannot create {e.filename} ({e.strerror}); choose a directory you can write"
        return f"{e.filename}: {e.strerror or first}"
    return f"{type(e).__name__}: {first}"


def original_cwd() -> Path:
    """Where the user ran the command: Hydra's runtime.cwd while a Hydra app runs (the job's
    own cwd may be its output directory under hydra.job.chdir=true), else the current one."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.cwd)
    return Path.cwd()


PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where data/ ships beside harness/ (a source checkout)


def absolute_path(path: str | None, cwd: str | Path | None = None) -> str | None:
    """`path` made absolute against `cwd` (default: original_cwd()); "~" expanded. A relative
    path that does not exist there but does beside the harness package (data/..., what the
    scenario presets name) is taken from there, so presets work from any directory."""
    if not path:
        return path
    p = Path(os.path.expanduser(path))
    if p.is_absolute():
        return str(p)
    here = Path(cwd) if cwd is not None else original_cwd()
    if not (here / p).exists() and (PACKAGE_ROOT / p).exists():
        return str(PACKAGE_ROOT / p)
    return os.path.normpath(here / p)


def absolute_paths(c: Config, cwd: str | Path | None = None) -> Config:
    """profile, schedule.csv_path and a file model.target (path/file.py:fn) as absolute paths:
    the config then means the same in any directory (a job's own under hydra.job.chdir=true,
    a worker's) and the record says which file ran."""
    c.profile = absolute_path(c.profile, cwd)
    if hasattr(c.schedule, "csv_path"):
        c.schedule.csv_path = absolute_path(c.schedule.csv_path, cwd)
    target = getattr(c.model, "target", None)
    if target:
        module, sep, attr = target.rpartition(":")
        if sep and (module.endswith(".py") or "/" in module or os.sep in module):
            c.model.target = f"{absolute_path(module, cwd)}:{attr}"
    return c
