"""Schedule gallery: per schedule in a sweep, the simulator's Gantt on the run's modeled
costs beside the Gantt the real run measured."""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import OmegaConf

from harness.config import Config
from harness.plan import make_plan
from harness.record import plot_gantt
from harness.simulate.engine import simulate


def config_of(run: dict) -> Config:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), run["config"]))


def gallery(runs: list[dict], sweep: Path, out: Path) -> list[tuple[str, str | None, str | None]]:
    """[(schedule label, simulated png, measured png)], relative to `out`: for each schedule,
    its run with the most microbatches up to 16 (the most readable chart)."""
    out.mkdir(parents=True, exist_ok=True)
    best: dict[str, dict] = {}
    for r in runs:
        if r["status"] != "ok":
            continue
        c = r["config"]
        label = c["schedule"]["name"] + (f" v={c['virtual_stages']}" if c["virtual_stages"] > 1 else "")
        m = c["microbatches"]
        old = best.get(label)
        if old is None or (m <= 16 and (old["config"]["microbatches"] > 16 or m > old["config"]["microbatches"])):
            best[label] = r
    rows = []
    for label, r in sorted(best.items()):
        stem = label.replace(" ", "_").replace("=", "")
        sim_png = None
        try:
            plan = make_plan(config_of(r))
            trace = simulate(plan.schedule, plan.sim_cost())
            labels = {k: ", ".join(f"layers {a}-{b - 1}" for s, (a, b) in enumerate(plan.stage_layers)
                                   if plan.stage_rank[s] == k) for k in range(plan.world)}
            c = plan.config
            plot_gantt(out / f"{stem}_sim.png", trace, 0, labels,
                       f"{label}  pp={c.pp}  M={c.microbatches}  simulated on modeled costs (cost.*, comm.*)")
            sim_png = f"{out.name}/{stem}_sim.png"
        except Exception:  # noqa: BLE001 - a record from another version must not stop the report
            sim_png = None
        measured = sweep / r["_dir"] / "gantt.png"
        real_png = None
        if measured.exists():
            shutil.copyfile(measured, out / f"{stem}_measured.png")
            real_png = f"{out.name}/{stem}_measured.png"
        rows.append((label, sim_png, real_png))
    return rows
