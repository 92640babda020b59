"""What the harness assumes of Hydra (harness/frontend/hydra_compat.py), checked against the
Hydra installed: a release that changes any of it fails here, by name, before a sweep
misbehaves. And no module of the harness imports Hydra's private modules."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import hydra
import pytest

from harness.frontend import hydra_compat

ROOT = Path(__file__).resolve().parents[1]


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_this_hydra_is_one_the_assumptions_were_checked_on():
    assert ".".join(hydra.__version__.split(".")[:2]) in hydra_compat.TESTED_HYDRA, (
        f"hydra-core {hydra.__version__}: re-check harness/frontend/hydra_compat.py and this file, then add it to "
        "TESTED_HYDRA")


def test_an_untested_hydra_is_refused_unless_allowed(monkeypatch):
    monkeypatch.setattr(hydra, "__version__", "9.9.0")
    monkeypatch.delenv(hydra_compat.ALLOW_ENV, raising=False)
    assert "hydra-core 9.9.0: untested with the harness sweeper" in hydra_compat.untested_hydra()
    monkeypatch.setenv(hydra_compat.ALLOW_ENV, "1")
    assert hydra_compat.untested_hydra() is None


def test_the_basic_launcher_is_where_and_what_the_harness_names():
    """hydra/launcher=basic instantiates the class named BASIC_LAUNCHER, a Launcher whose module's
    logger says "Launching ..." (the sweeper says it once for its one-job batches)."""
    from hydra.core.config_store import ConfigStore
    from hydra.plugins.launcher import Launcher

    module, _, name = hydra_compat.BASIC_LAUNCHER.rpartition(".")
    mod = importlib.import_module(module)
    cls = getattr(mod, name)
    assert issubclass(cls, Launcher)
    assert ConfigStore.instance().load("hydra/launcher/basic.yaml").node._target_ == hydra_compat.BASIC_LAUNCHER
    assert hydra_compat.BASIC_LAUNCHER_LOGGER == module and mod.log.name == module
    assert "Launching " in inspect.getsource(cls.launch)
    assert hydra_compat.runs_jobs_here(cls.__new__(cls)) and not hydra_compat.runs_jobs_here(object())


def test_the_public_api_the_sweeper_uses_has_the_signatures_it_calls():
    from hydra.core.config_loader import ConfigLoader
    from hydra.core.override_parser.types import Override, OverrideType, ValueType
    from hydra.core.plugins import Plugins
    from hydra.errors import MissingConfigException, OverrideParseException
    from hydra.plugins.sweeper import Sweeper
    from hydra.types import HydraContext

    assert _params(Sweeper.setup) == ["hydra_context", "task_function", "config"]
    assert _params(Sweeper.sweep) == ["arguments"]
    assert _params(Plugins.instantiate_launcher) == ["hydra_context", "task_function", "config"]
    assert _params(ConfigLoader.load_sweep_config) == ["master_config", "sweep_overrides"]
    assert _params(ConfigLoader.list_groups) == ["parent_name"]
    assert {f for f in HydraContext.__dataclass_fields__} == {"config_loader", "callbacks"}
    for member in ("is_sweep_override", "is_discrete_sweep", "sweep_string_iterator", "get_key_element",
                   "get_value_element_as_str", "is_hydra_override", "is_add", "is_delete", "value"):
        assert callable(getattr(Override, member)), member
    assert {"key_or_group", "type", "package", "input_line", "value_type"} <= set(Override.__dataclass_fields__)
    assert OverrideType.CHANGE and ValueType.SIMPLE_CHOICE_SWEEP
    assert {"override", "message"} <= set(_params(OverrideParseException.__init__))
    assert {"missing_cfg_file", "options"} <= set(_params(MissingConfigException.__init__))
    # the line harness.frontend.cli keeps off stderr (the error is said once, in one line)
    import hydra.core.utils

    assert "Error executing job with overrides:" in inspect.getsource(hydra.core.utils)


def test_no_module_of_the_harness_imports_hydras_private_api():
    found = []
    for path in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.startswith("hydra._internal")]
    assert found == []


def test_expand_makes_the_basic_sweepers_points():
    """The sweeper's points are Hydra's basic sweeper's: the product, keys in first-seen order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from harness.config import ConfigError
    from harness.frontend.sweeper import expand

    parse = OverridesParser.create().parse_overrides
    assert expand(parse(["pp=2,4", "schedule=gpipe", "microbatches=range(1,3)"])) == [
        ["pp=2", "schedule=gpipe", "microbatches=1"], ["pp=2", "schedule=gpipe", "microbatches=2"],
        ["pp=4", "schedule=gpipe", "microbatches=1"], ["pp=4", "schedule=gpipe", "microbatches=2"]]
    assert expand(parse(["pp=2,4", "seed=1", "pp=8"])) == [["pp=8", "seed=1"]]
    with pytest.raises(ConfigError, match=r"^lr=interval\(0,1\): not a list of values"):
        expand(parse(["lr=interval(0,1)"]))
