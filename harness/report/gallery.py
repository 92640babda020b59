"""Schedule gallery: per schedule in a sweep, the simulator's Gantt on the run's modeled
costs beside the Gantt the real run measured (redrawn from its trace.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.records.gantt import plot_gantt
from harness.records.record import GANTT, TRACE
from harness.report.figures import schedule_order
from harness.report.runs import Run, ok, schedule_label
from harness.records.result import PlanRecord
from harness.records.safe_io import FileRefused, copy, read_bytes
from harness.simulate.engine import simulate
from harness.measure.trace import Event, Trace


@dataclass
class Entry:
    label: str
    run: Run
    simulated: str | None = None  # PNG relative to the report directory (an SVG beside it)
    measured: str | None = None
    missing: list[str] = field(default_factory=list)


def rank_labels(plan: PlanRecord, pp: int, dp: int, ranks: int) -> dict[int, str]:
    return {r: plan.layers_label(r, pp, dp) for r in range(ranks)}


def _plot(path: Path, trace: Trace, step: int, labels: dict[int, str], title: str) -> None:
    for p in (path, path.with_suffix(".svg")):  # plot_gantt writes one file, in its suffix's format
        plot_gantt(p, trace, step, labels, title)


def _pick(runs: list[Run]) -> dict[str, Run]:
    """Per schedule, its run with the most microbatches up to 16 (the most readable chart; then
    the fewest above 16), the deepest pipeline among those, in the schedules' usual order."""
    def rank(r: Run) -> tuple:
        m = r.cfg.microbatches
        return m <= 16, m if m <= 16 else -m, r.cfg.pp

    best: dict[str, Run] = {}
    for r in runs:
        label = schedule_label(r.cfg)
        if label not in best or rank(r) > rank(best[label]):
            best[label] = r
    return {k: best[k] for k in schedule_order(set(best))}


def _simulated(e: Entry, path: Path) -> None:
    """The recorded schedule on the recorded modeled costs: no planning, so the record alone
    draws it (profiles and CSV files may be gone, the code may have moved on)."""
    plan, c = _plan(e.run), e.run.cfg
    trace = simulate(plan.schedule_actions(), plan.cost_model())
    _plot(path, trace, 0, rank_labels(plan, c.pp, 1, c.pp),
          f"{e.label}  pp={c.pp}  M={c.microbatches}  simulated on modeled costs (cost.*, comm.*)")


def _plan(run: Run) -> PlanRecord:
    if run.plan is None:
        raise ValueError("plan: not recorded")
    return run.plan


def read_trace_capped(path: Path) -> Trace:
    """A job's trace.json as trace_json.read_trace reads it, from a regular file within safe_io's
    trace cap only (a record's trace.json may be a FIFO, a link to /dev/zero, a sparse 8 GB
    file: refused by its type or size before a byte is read); ValueError (one line) otherwise."""
    data = json.loads(read_bytes(path, TRACE, "trace"))
    return [Event(e["tid"], e["args"]["step"], e["name"], e["cat"], e["args"]["kind"], e["args"]["stage"],
                  e["args"]["microbatch"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
            for e in data["traceEvents"] if e["ph"] == "X" and e.get("cat") != "step"]


def _measured(e: Entry, job: Path, path: Path) -> None:
    trace, c = read_trace_capped(job / TRACE), e.run.cfg
    ranks = max(ev.rank for ev in trace) + 1
    labels = rank_labels(_plan(e.run), c.pp, c.dp, ranks)
    last = max(ev.step for ev in trace)
    b = e.run.metrics.bubble
    _plot(path, trace, last, labels, f"{e.label}  pp={c.pp}  M={c.microbatches}  compute={c.compute}  "
          f"measured step {last}  (run's bubble, all measured steps: {b.measured:.3f})")


def gallery(runs: list[Run], sweep: Path, out: Path) -> list[Entry]:
    """One entry per schedule; what could not be drawn is said in the entry, never raised: a
    record from another version of the harness must not stop the report."""
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for label, r in _pick(ok(runs)).items():
        e, stem = Entry(label, r), label.replace(" ", "_").replace("=", "")
        try:
            _simulated(e, out / f"{stem}_sim.png")
            e.simulated = f"{out.name}/{stem}_sim.png"
        except Exception as err:  # noqa: BLE001 - see the docstring
            e.missing.append(f"no simulation: {type(err).__name__}: {err}")
        job = sweep / r.dir
        try:
            _measured(e, job, out / f"{stem}_measured.png")
            e.measured = f"{out.name}/{stem}_measured.png"
        except Exception as err:  # noqa: BLE001 - see the docstring; the job's own PNG is the fallback
            try:  # a regular file within the PNG cap only: never a link to /dev/zero copied until the disk fills
                copy(job / GANTT, out / f"{stem}_measured.png", GANTT, "gantt")
                e.measured = f"{out.name}/{stem}_measured.png"
                e.missing.append(f"measured Gantt as the job drew it (PNG only): trace.json unreadable: {err}")
            except (FileRefused, OSError) as png:
                e.missing.append(f"no measured Gantt: {type(err).__name__}: {err}; {png}")
        entries.append(e)
    return entries
