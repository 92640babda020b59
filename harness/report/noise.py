"""Which differences between schedules are within the noise: per setting (everything but the
schedule and the repeat label alike), each schedule's step time and bubble with a 95% interval,
and whether it is told apart from the fastest one. With repeats (`run.repeats=N`, or `repeat=` swept)
the interval is over the repeats' means (harness/measure/intervals.py, a bootstrap of the mean); with
one run per point, over that run's measured steps (metrics.intervals)."""

from __future__ import annotations

import dataclasses
from statistics import fmean

from harness.config import RUN_SECTIONS
from harness.measure.intervals import interval, overlap
from harness.report.doc import Block, Heading, Items, Table, Text
from harness.report.runs import Run, ok, run_ids, schedule_label

IGNORED = ("schedule", "repeat", "seed", *RUN_SECTIONS)


def _setting(r: Run) -> tuple:
    return tuple(sorted((f.name, repr(getattr(r.cfg, f.name))) for f in dataclasses.fields(r.cfg)
                        if f.name not in IGNORED))


def _short(r: Run) -> str:
    c = r.cfg
    return f"pp={c.pp} dp={c.dp} M={c.microbatches} B={c.microbatch_size} {c.compute} {c.executor}"


def _figure(runs: list[Run], key: str) -> tuple[float, list[float], str]:
    """(mean, [lo, hi], how) of `key` over a point's runs."""
    get = {"step": lambda r: r.metrics.step_time_s, "bubble": lambda r: r.metrics.bubble.measured}[key]
    values = [get(r) for r in runs]
    if len(values) > 1:
        return fmean(values), list(interval(values, fmean)), f"{len(values)} repeats"
    ci = runs[0].metrics.intervals
    spread = None if ci is None else ci.step_time_s if key == "step" else ci.bubble
    return values[0], list(spread) if spread else [values[0], values[0]], "its steps"


def noise_section(runs: list[Run]) -> list[Block]:
    blocks: list[Block] = [
        Heading("Within the noise"),
        Text("Per setting (runs alike in everything but the schedule), each schedule's step time and bubble with "
             "a 95% interval: over its repeats' means where the sweep repeated it (`run.repeats=3`), else over its own "
             "measured steps. A schedule whose step-time interval overlaps the fastest one's is not told apart "
             "from it by these runs: repeat the sweep, or run more steps, to separate them.")]
    settings: dict[tuple, dict[str, list[Run]]] = {}
    for r in ok(runs):
        settings.setdefault(_setting(r), {}).setdefault(schedule_label(r.cfg), []).append(r)
    compared = {k: v for k, v in settings.items() if len(v) > 1}
    if not compared:
        return blocks + [Items(["Not drawn: no two schedules ran in the same setting"])]
    rows = []
    for by_schedule in compared.values():
        figures = {s: (_figure(rs, "step"), _figure(rs, "bubble"), rs) for s, rs in by_schedule.items()}
        fastest = min(figures, key=lambda s: figures[s][0][0])
        for s, ((step, step_ci, how), (bub, bub_ci, _), rs) in sorted(figures.items(), key=lambda kv: kv[1][0][0]):
            verdict = ("fastest" if s == fastest else "within the noise of the fastest"
                       if overlap(step_ci, figures[fastest][0][1]) else f"slower than {fastest}")
            rows.append([_short(rs[0]), s, how, f"{step * 1e3:.4g}", f"{step_ci[0] * 1e3:.4g}-{step_ci[1] * 1e3:.4g}",
                         f"{bub:.3f}", f"{bub_ci[0]:.3f}-{bub_ci[1]:.3f}", verdict, run_ids(rs)])
    return blocks + [Table(["setting", "schedule", "interval over", "step ms", "95% interval", "bubble",
                            "95% interval", "verdict", "runs"], rows)]
