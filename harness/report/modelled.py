"""Modelled against measured: where a figure draws a model beside the measurement of the same
quantity, whether the model falls outside the measurement's interval, and by how much. The
interval is the measurement's own, named with its method, coverage and n: over repeats where
there are several (a bootstrap of their mean), else over the run's measured steps (the order
statistics of their median, as the record's own intervals; for the gradient sync read back from
its trace.json: the record keeps only the median)."""

from __future__ import annotations

from collections.abc import Callable
from statistics import fmean

from harness.measure.intervals import LEVEL, ORDER_STATISTICS, describe, interval, median_interval
from harness.records.record import TRACE
from harness.records.safe_io import FileRefused
from harness.report.gallery import read_trace_capped
from harness.report.runs import Run, dim


def sync_per_step(r: Run) -> list[float] | None:
    """The run's gradient sync in each measured step, as metrics.dp_sync_s takes its median of them
    (harness/measure/metrics.py: the longest per-rank total of dp_sync events), from its trace.json;
    None where there is no trace to read (a made-up run, a trace cut or removed)."""
    if r.sweep is None:
        return None
    try:
        trace = read_trace_capped(r.sweep / r.dir / TRACE)
    except (OSError, ValueError, KeyError, TypeError, FileRefused):
        return None
    totals: dict[int, dict[int, float]] = {}
    for e in trace:
        if e.kind == "dp_sync" and e.step >= r.cfg.warmup_steps:
            per_rank = totals.setdefault(e.step, {})
            per_rank[e.rank] = per_rank.get(e.rank, 0.0) + e.dur
    return [max(v.values()) for _, v in sorted(totals.items())] or None


def sync_interval(runs: list[Run]) -> tuple[float, float, float, str] | None:
    """(value, lo, hi, what the interval is) of the measured gradient sync at one point: over the
    repeats' values where there are several runs, else over the run's measured steps (the order
    statistics of their median, as the record's other intervals); None: no interval to be had."""
    values = [r.metrics.dp_sync_s for r in runs]
    if len(values) > 1:
        lo, hi = interval(values, fmean)
        return fmean(values), lo, hi, describe("percentile bootstrap of the mean (nominal: few repeats cover less)", LEVEL, len(values), "repeats")
    if (steps := sync_per_step(runs[0])) is None:
        return None
    lo, hi, cover = median_interval(steps)
    return values[0], lo, hi, describe(ORDER_STATISTICS, cover, len(steps))


def disagreement(what: str, measured: float, lo: float, hi: float, over: str, model: float, unit: str,
                 scale: float = 1.0) -> str | None:
    """One line where the model falls outside the measurement's interval (`over` says which: its
    coverage, method and n): by how much, and on which side; None where it falls inside (model and
    measurement agree as far as they can tell)."""
    if lo <= model <= hi:
        return None
    ratio = measured / model if model else float("inf")
    side = f"{ratio:.3g}x the model's" if ratio >= 1 else f"{1 / ratio:.3g}x below the model's"
    return (f"{what}: measured {measured * scale:.4g} {unit} (interval {lo * scale:.4g}-{hi * scale:.4g}: "
            f"{over}) is {side} {model * scale:.4g} {unit}: outside the interval")


def sync_against_model(ax, synced: list[Run], lbl: str) -> list[str]:
    """At each dp, the measured sync against the ring model: measured / model written beside every
    point (red, with `outside` where the model falls outside the measured interval); the lines that
    say where it does."""
    notes = []
    for d in sorted({dim(r, "dp") for r in synced}):
        mine = [r for r in synced if dim(r, "dp") == d]
        model = fmean(r.metrics.dp_sync_theory_s for r in mine)
        if (measured := sync_interval(mine)) is None:
            mean, note, verdict = fmean(r.metrics.dp_sync_s for r in mine), None, ", no interval"
        else:
            mean, lo, hi, over = measured
            note = disagreement(f"{lbl}, dp={d}: gradient sync", mean, lo, hi, over, model, "ms", 1e3)
            verdict = ", outside its interval" if note else ", within its interval"
        notes += [note] if note else []
        ratio = f"{mean / model:.3g}x model" if model else "model 0"
        ax.annotate(ratio + verdict, (d, mean * 1e3), fontsize=7, xytext=(-4, 6), textcoords="offset points",
                    ha="right", color="#c44e52" if note else "0.35")
    return notes


def throughput_against_model(runs: list[Run], model_samples_s: Callable[[Run], float], what: str) -> str | None:
    """The cost model's throughput against the measured one at one point (repeats: the interval
    of their mean; one run: its own interval over its steps)."""
    values = [r.metrics.throughput_samples_s for r in runs]
    model = fmean(model_samples_s(r) for r in runs)
    if len(values) > 1:
        (lo, hi), over = interval(values, fmean), describe("percentile bootstrap of the mean (nominal: few repeats cover less)", LEVEL, len(values), "repeats")
    elif (ci := runs[0].metrics.intervals) is not None and ci.throughput_samples_s:
        (lo, hi), over = ci.throughput_samples_s, describe(ci.method, ci.level, ci.steps)
    else:
        return None
    return disagreement(what, fmean(values), lo, hi, over, model, "samples/s")
