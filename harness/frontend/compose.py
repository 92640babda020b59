"""Hydra and OmegaConf around the schema (harness/config.py): the ConfigStore entries (the
schema and each group option's dataclass) and the composed config as a typed Config; what
composing raises is said in one line by harness/frontend/errors.py. Public Hydra API only.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.config import (BASES, OPTIONS, ClusterConfig, Config, ConfigError, check_cluster, job_dirname,
                            option_class, unknown_key, upgrade_config)
from harness.frontend.errors import check_deletions, hydra_problem, omegaconf_problem
from harness.schedules.registry import SCHEDULES


def option_schema(group: str, option: str) -> str:
    """The ConfigStore name of `group`'s option `option`'s dataclass. At the store's root, not in
    the group: Hydra lists a group's entries as its options (--help, tab completion, a
    `glob(*)` sweep) and lists no root config, so the option's YAML names it absolutely:
    `defaults: [/harness_schema_<group>_<option>@_here_, _self_]`."""
    return f"harness_schema_{group}_{option}"


def register() -> None:
    """The schema (`harness_schema`, the primary config's first default) and each option's
    dataclass (`option_schema`, the first default of its YAML), so Hydra types what it
    composes; the job directory name resolver."""
    cs = ConfigStore.instance()
    # each group typed by its base, so that any option's dataclass (a subclass) merges into it
    cs.store(name="harness_schema", node=Config(**{group: base() for group, base in BASES.items()}))
    for group, options in OPTIONS.items():
        for name, cls in options.items():
            cs.store(name=option_schema(group, name), node=cls)
    if not OmegaConf.has_resolver("harness.dirname"):
        OmegaConf.register_new_resolver("harness.dirname", job_dirname)


def schedule_key(name: str) -> str:
    """How a command line picks schedule `name`: `schedule=<name>`, its Hydra option
    (harness/conf/schedule/<name>.yaml, with its keys), else `schedule.name=<name>` (a schedule
    registered from outside the package, on the group's base keys)."""
    option = Path(__file__).resolve().parents[1] / "conf" / "schedule" / f"{name}.yaml"
    return f"schedule={name}" if option.is_file() else f"schedule.name={name}"


def compose_config(overrides: list[str], cwd: str | Path | None = None) -> Config:
    """The Config `python -m harness <overrides>` runs (no job, no output directory): for
    tools that take harness keys (the planner, the profiler) and tests. ConfigError (one line)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    check_deletions(overrides)  # `~pp` composes, and would run the default
    register()
    GlobalHydra.instance().clear()
    problem = None
    try:
        with initialize_config_module(config_module="harness.conf", version_base="1.3"):
            try:
                return to_config(compose(config_name="config", overrides=overrides), cwd)
            except Exception as e:  # noqa: BLE001 - Hydra's own errors, one line as python -m harness says them
                problem = hydra_problem(e, overrides)  # while Hydra's config groups can be listed
    finally:
        GlobalHydra.instance().clear()
    raise ConfigError(problem)


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
    """A Config from its dict (a record's `config`, a calibration job's; one written before run
    control had its own section read as if it had), each group as its option's dataclass, typed
    and checked by OmegaConf; ConfigError (one line)."""
    d = upgrade_config(d)
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
    for key in node.keys():
        key = str(key)
        if key == "hydra" and not prefix:
            continue
        if key not in fields:
            # the values as written, for the message only: converting every node (Hydra's section
            # included) on each call cost a sweep ~2 ms a point, twice
            raw = OmegaConf.to_container(node, resolve=False)
            option = raw.get("name") if prefix.count(".") == 1 and isinstance(raw, dict) else None  # the group's
            raise ConfigError(unknown_key(prefix + key, raw[key], option))  # type: ignore[index]
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue
        sub = node[key]
        if isinstance(sub, DictConfig) and dataclasses.is_dataclass(kind := OmegaConf.get_type(sub)):
            _refuse_unknown(sub, kind, f"{prefix}{key}.")


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
    entry = SCHEDULES.get(c.schedule.name)
    for key in entry.paths if entry is not None else ():  # the files its entry names (schedule.csv_path)
        if hasattr(c.schedule, key):
            setattr(c.schedule, key, absolute_path(getattr(c.schedule, key), cwd))
    target = getattr(c.model, "target", None)
    if target:
        module, sep, attr = target.rpartition(":")
        if sep and (module.endswith(".py") or "/" in module or os.sep in module):
            c.model.target = f"{absolute_path(module, cwd)}:{attr}"
    return c
