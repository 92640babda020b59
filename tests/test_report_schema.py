"""The report reads typed records only, and only what the record's schema has: every field a
figure or table reads of a run's config (`run.cfg`, a Config), its metrics, env or plan is a
field of harness/config.py's or harness/records/result.py's dataclasses, and every config key
it reads is one the loader type-checks first (harness/report/load.py REPORTED). Checked on the
source (the attribute chains in harness/report/*.py), so a figure that reads a field the schema
renamed fails here, not on some sweep's records. The rendering itself: tests/test_report.py."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from harness.config import Config, schema_keys
from harness.records.result import Env, Metrics, PlanRecord, Result, upgrade
from harness.report.load import REPORTED

REPORT = Path(__file__).resolve().parents[1] / "harness" / "report"
ROOTS: dict[str, type] = {"cfg": Config, "metrics": Metrics, "env": Env, "plan": PlanRecord, "result": Result}


def _chain(node: ast.expr) -> tuple[ast.expr, list[str]]:
    """`a.b.c` as (a, ["b", "c"])."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    return node, names


def _typed_path(expr: ast.expr, aliases: dict[str, tuple[type, list[str]]]) -> tuple[type, list[str]] | None:
    """(root class, the fields read below it) for an attribute chain through a record's typed
    parts (`r.cfg.schedule.name`, `m.bubble.measured` where `m = r.metrics`); None otherwise."""
    base, names = _chain(expr)
    if isinstance(base, ast.Name) and base.id in aliases:
        root, path = aliases[base.id]
        return root, path + names
    for i, name in enumerate(names):
        if name in ROOTS:
            return ROOTS[name], names[i + 1:]
    return None


def _aliases(fn: ast.AST) -> dict[str, tuple[type, list[str]]]:
    """Names a function binds to a typed part (`c = r.cfg`, `plan, c = ..., e.run.cfg`) or
    declares one (`c: Config`)."""
    out: dict[str, tuple[type, list[str]]] = {}
    args = fn.args.args if isinstance(fn, (ast.FunctionDef, ast.Lambda)) else []
    for a in args:
        if isinstance(a.annotation, ast.Name) and a.annotation.id == "Config":
            out[a.arg] = (Config, [])
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                pairs = (zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple)
                         and isinstance(node.value, ast.Tuple) else [(target, node.value)])
                for t, v in pairs:
                    if isinstance(t, ast.Name) and (typed := _typed_path(v, out)) is not None:
                        out[t.id] = typed
    return out


def _check(root: type, path: list[str], keys: dict[str, object]) -> str | None:
    """Why `path` read below `root` is not in the schema, or None. Stops at the first name
    below a field that is no dataclass (a str's method, a list's)."""
    if root is Config:
        key = ""
        for name in path:
            key = f"{key}.{name}" if key else name
            if key not in keys:
                return f"config key {key}"
            hint = keys[key]
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            if not dataclasses.is_dataclass(inner[0] if len(inner) == 1 else hint):
                return None
        return None
    cls: object = root
    for name in path:
        if not dataclasses.is_dataclass(cls):
            return None
        if name not in {f.name for f in dataclasses.fields(cls)}:
            return None if hasattr(cls, name) else f"{cls.__name__}.{name}"  # a method or property
        hint = typing.get_type_hints(cls)[name]
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        cls = inner[0] if len(inner) == 1 else hint
    return None


def _reads() -> list[tuple[str, int, type, list[str]]]:
    """(file, line, root, path) of every typed read in harness/report/."""
    out = []
    for f in sorted(REPORT.glob("*.py")):
        tree = ast.parse(f.read_text())
        scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda))]
        dims = [n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "DIMS"]
        for scope in scopes:
            aliases = _aliases(scope)
            if isinstance(scope, ast.Lambda) and any(scope in list(ast.walk(d)) for d in dims):
                aliases |= {a.arg: (Config, []) for a in scope.args.args}  # DIMS: config -> a dimension
            for node in ast.walk(scope):
                if isinstance(node, ast.Attribute) and (typed := _typed_path(node, aliases)) is not None and typed[1]:
                    out.append((f.name, node.lineno, *typed))
    return out


@pytest.fixture(scope="module")
def reads() -> list[tuple[str, int, type, list[str]]]:
    return _reads()


def test_every_field_the_report_reads_is_in_the_schema(reads):
    keys = schema_keys()
    wrong = [f"{f}:{line}: {why}" for f, line, root, path in reads if (why := _check(root, path, keys))]
    assert not wrong, "the report reads what the record's schema lacks: " + "; ".join(wrong)
    # the check sees the figures' reads (an alias-blind check would pass on nothing)
    seen = {(root, ".".join(path)) for _, _, root, path in reads}
    assert {(Config, "pp"), (Config, "schedule.name"), (Metrics, "bubble.measured"),
            (Metrics, "memory.peak_activation_bytes_per_rank")} <= seen


def test_every_config_key_the_report_reads_is_type_checked_on_loading(reads):
    keys = schema_keys()
    read = set()
    for _, _, root, path in reads:
        if root is Config:
            key = ""
            for name in path:  # the deepest key the chain names (c.schedule.name: schedule.name)
                if (key + "." + name if key else name) not in keys:
                    break
                key = key + "." + name if key else name
            read.add(key)
    groups = {k.split(".")[0] for k in REPORTED if "." in k}
    unchecked = sorted(k for k in read if k not in REPORTED and k not in groups)
    assert not unchecked, f"config keys the report reads that load.REPORTED does not type-check: {unchecked}"
    assert set(REPORTED) <= set(keys), sorted(set(REPORTED) - set(keys))


def test_no_dict_lookups_into_a_record_in_the_report():
    for f in sorted(REPORT.glob("*.py")):
        text = f.read_text()
        for needle in ('["config"]', '["metrics"]', '["_dir"]', "r.get(\"env\")", '== "sim"'):
            assert needle not in text, f"{f.name}: {needle}"


@pytest.mark.parametrize("config,plan,want", [
    ({"executor": "sim", "compute": "emulated"}, None, "simulated"),
    ({"executor": "native", "compute": "emulated"}, {"simulated": False}, "emulated"),
    ({"executor": "pytorch", "compute": "real"}, None, "measured"),
    ({"executor": "native", "compute": "auto"}, None, None),  # never planned: not known
])
def test_records_without_measurement_get_it_from_their_config(config, plan, want):
    """Older records say what made their times once read (Result.measurement)."""
    data = {"status": "failed", "error": None, "config": config, "plan": plan, "schema_version": 5}
    assert upgrade(data)["measurement"] == want
    assert upgrade({**data, "measurement": "emulated"})["measurement"] == "emulated"  # as recorded
