"""Which schedules these runs tell apart: per setting (everything but the schedule and the repeat
label alike), each schedule's step time and bubble with an interval that says its method and n,
and each schedule against the fastest by a permutation test of their samples
(harness/measure/intervals.py `compare`): "not distinguishable at n=..." where the samples cannot
tell them apart, never a ranking within the noise. The samples are a schedule's repeats' median
steps where the sweep repeated it (`run.repeats=N`, or `repeat=` swept), else its one run's
measured steps. Each row also says whether the host was busy during its runs (env.host_load)."""

from __future__ import annotations

import dataclasses
from statistics import median

from harness.config import RUN_SECTIONS
from harness.measure.host_load import BUSY_CORES
from harness.measure.intervals import ORDER_STATISTICS, compare, describe, median_interval, steps_note
from harness.records.result import HostLoad
from harness.report.doc import Block, Heading, Items, Table, Text
from harness.report.runs import Run, config_key, ok, run_ids, schedule_label

IGNORED = ("schedule", "repeat", "seed", *RUN_SECTIONS)


def _short(r: Run) -> str:
    c = r.cfg
    tp = f" tp={c.tp}{' sp' if c.sequence_parallel else ''}" if c.tp > 1 else ""
    return f"pp={c.pp}{tp} dp={c.dp} M={c.microbatches} B={c.microbatch_size} {c.compute} {c.executor}"


@dataclasses.dataclass
class Figures:
    """A schedule's samples in one setting and what is shown of them."""
    runs: list[Run]
    unit: str  # steps | repeats
    steps: list[float]  # step-time samples (s)
    step: float  # their median
    step_ci: str  # "lo-hi ms (coverage, method, n)"
    bubble: float
    bubble_ci: str


def _span(lo: float, hi: float, k: float, fmt: str) -> str:
    return f"{lo * k:{fmt}}-{hi * k:{fmt}}"


def figures(runs: list[Run]) -> Figures:
    """Over the repeats (their median steps and bubbles) where there are several runs, else over
    the run's measured steps (its recorded intervals)."""
    if len(runs) > 1:
        steps, bubbles = [r.metrics.step_time_s for r in runs], [r.metrics.bubble.measured for r in runs]
        s_lo, s_hi, cover = median_interval(steps)
        b_lo, b_hi, _ = median_interval(bubbles)
        how = describe(ORDER_STATISTICS, cover, len(runs), "repeats")
        return Figures(runs, "repeats", steps, median(steps), f"{_span(s_lo, s_hi, 1e3, '.4g')} ({how})",
                       median(bubbles), _span(b_lo, b_hi, 1, ".3f"))
    m = runs[0].metrics
    ci = m.intervals
    if ci is None:  # a record from before intervals: its steps' range, nothing claimed of it
        lo, hi = min(m.step_times_s), max(m.step_times_s)
        return Figures(runs, "steps", list(m.step_times_s), m.step_time_s,
                       f"{_span(lo, hi, 1e3, '.4g')} (range, n={len(m.step_times_s)} steps)", m.bubble.measured, "")
    return Figures(runs, "steps", list(m.step_times_s), m.step_time_s,
                   f"{_span(*ci.step_time_s, 1e3, '.4g')} ({describe(ci.method, ci.level, ci.steps)})",
                   m.bubble.measured, _span(*ci.bubble, 1, ".3f"))


def bars_note(runs: list[Run]) -> str:
    """What the runs' error bars over their steps are, in words, for a figure's caption."""
    return steps_note((ci.method, ci.level, ci.steps) if (ci := r.metrics.intervals) is not None else None
                      for r in runs if r.metrics is not None)


def verdict(f: Figures, fastest: Figures, fastest_name: str) -> str:
    """This schedule against the fastest: simulated runs by their values (no noise), else by the
    permutation test of their samples."""
    if f is fastest:
        return "fastest"
    if all(r.simulated for r in (*f.runs, *fastest.runs)):
        return f"slower than {fastest_name} (simulated: exact)" if f.step > fastest.step else f"as fast as {fastest_name}"
    test = compare(f.steps, fastest.steps)
    if test.distinguishable:
        return f"slower than {fastest_name} ({test.phrase(f.unit)})"
    return f"not distinguishable from {fastest_name} ({test.phrase(f.unit)})"


def host(runs: list[Run]) -> str:
    """'busy: 1.8 other cores' where any run's host was busy, 'quiet' where all were sampled quiet."""
    loads: list[HostLoad | None] = [r.env.host_load if r.env is not None else None for r in runs]
    if any(h is not None and h.busy for h in loads):
        return f"busy: {max(h.other_cores for h in loads if h is not None and h.busy):.1f} other cores"
    return "quiet" if all(h is not None for h in loads) else "n/a"


def noise_section(runs: list[Run]) -> list[Block]:
    blocks: list[Block] = [
        Heading("Told apart, or not"),
        Text("Per setting (runs alike in everything but the schedule), each schedule's median step time and bubble "
             "with an interval that says its coverage, method and n: order statistics of the median, exact for any "
             "distribution (3 samples give the range at 75%, 5 at 93.8%, 6 or more at least 95%), over its repeats' "
             "median steps where the sweep repeated it (`run.repeats=N`), else over its own measured steps. Each "
             "schedule is held against the fastest by an exact permutation test of their samples at 5%: "
             "\"not distinguishable at n=...\" where they do not differ, or cannot at so few (3 vs 3 never can; 4 "
             "vs 4 or more can). Steps say whether these runs differ; repeats, whether the configs would on "
             "another run. Host: busy where other processes kept more than "
             f"{BUSY_CORES} core busy on average during a run (env.host_load): its times include contention.")]
    settings: dict[tuple, dict[str, list[Run]]] = {}
    for r in ok(runs):
        settings.setdefault(config_key(r, IGNORED), {}).setdefault(schedule_label(r.cfg), []).append(r)
    compared = {k: v for k, v in settings.items() if len(v) > 1}
    if not compared:
        return blocks + [Items(["Not drawn: no two schedules ran in the same setting"])]
    rows = []
    for by_schedule in compared.values():
        figs = {s: figures(rs) for s, rs in by_schedule.items()}
        fastest = min(figs, key=lambda s: figs[s].step)
        for s, f in sorted(figs.items(), key=lambda kv: kv[1].step):
            rows.append([_short(f.runs[0]), s, f"{f.step * 1e3:.4g}", f.step_ci, f"{f.bubble:.3f}", f.bubble_ci,
                         verdict(f, figs[fastest], fastest), host(f.runs), run_ids(f.runs)])
    return blocks + [Table(["setting", "schedule", "step ms", "interval", "bubble", "interval", "against the fastest",
                            "host", "runs"], rows)]
