"""The shape of the code: no import cycle among harness modules (lazy imports counted), config
at the bottom, the model built once per job in the main process, no function over 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.config import Config, set_keys
from harness.job import run_job
from harness.model import MODELS

PACKAGE = Path(__file__).resolve().parents[1] / "harness"


def imports() -> dict[str, set[str]]:
    """Module -> the harness modules it imports, every import statement anywhere in the file
    (top level, in functions, under TYPE_CHECKING); a package importing its own submodules
    is not counted (that is how a package registers its parts)."""
    files = {".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): f
             for f in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != name and not (f.name == "__init__.py" and t.startswith(name + ".")):
                    deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_counting_lazy_imports():
    graph = imports()
    assert len(graph) > 80 and "harness.planning.plan" in graph["harness.measure.metrics"]  # the graph is read
    assert cycles(graph) == []
    assert cycles({**graph, "harness.config": graph["harness.config"] | {"harness.planning.plan"}})  # and would be seen


def test_config_is_at_the_bottom():
    assert imports()["harness.config"] == set()


@pytest.mark.parametrize("executor", ["sim", pytest.param("native", marks=pytest.mark.dist)])
def test_the_model_is_built_once_per_job_in_the_main_process(tmp_path, monkeypatch, executor):
    """The user's factory (here, mlp's, counted) runs once in the process that plans, measures
    and records a job; each rank builds its own once, in its own process."""
    built = []
    factory = MODELS["mlp"]
    monkeypatch.setitem(MODELS, "mlp", lambda cfg: built.append(cfg) or factory(cfg))
    c = set_keys(Config(), **{"pp": 2, "microbatches": 4, "executor": executor, "wandb.mode": "disabled",
                              "steps": 2, "model.hidden": 41 + len(executor),  # a model no earlier test built
                              "checkpointing": True, "verify_grads": executor == "native",
                              "memory_budget_gib": 1.0, "run.timeout_s": 120.0})
    r = run_job(c, tmp_path, "test", "once")
    assert r.status == "ok", r.error
    assert len(built) == 1


def test_a_simulated_job_simulates_each_distinct_cost_model_once(tmp_path, monkeypatch):
    """executor=sim's step, its timeout, its bubble, model_step_s and the planning are one
    simulation of the plan's priced costs; the attribution's free-communication one is the
    only other (theory is a closed form here)."""
    from harness.simulate import engine

    costs = []
    timing = engine.timing
    monkeypatch.setattr(engine, "timing", lambda c, cost: costs.append(cost) or timing(c, cost))
    c = set_keys(Config(), **{"pp": 4, "dp": 2, "microbatches": 8, "executor": "sim", "wandb.mode": "disabled"})
    r = run_job(c, tmp_path, "test", "sim")
    assert r.status == "ok", r.error
    assert len(costs) == len(set(costs)) == 2


def test_the_top_of_the_package_shows_the_layers():
    """`ls harness/` reads as the architecture: packages by what they are (frontend, planning,
    records, measure, runtime, ...), and only the entry points and the schema at the top."""
    top = sorted(f.stem for f in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "config", "job", "profile"]
    packages = {d.name for d in PACKAGE.iterdir() if (d / "__init__.py").is_file()}
    assert {"frontend", "planning", "records", "measure", "runtime", "schedules", "simulate"} <= packages


def test_no_function_runs_over_80_lines():
    """A function a reader cannot hold at once is split where a name explains a part (the
    longest today: about 70 lines)."""
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
            for path in PACKAGE.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80]
    assert not long, long
