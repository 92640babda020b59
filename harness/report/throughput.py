"""Throughput figures: against M and against microbatch size B, and data-parallel scaling."""

from __future__ import annotations

from pathlib import Path
from statistics import fmean

import matplotlib.pyplot as plt

from harness.measure.intervals import interval
from harness.report.figures import Figure, log2_x, save, say
from harness.report.modelled import sync_against_model, throughput_against_model
from harness.report.noise import bars_note
from harness.report.runs import COMPARABLE, Run, dim, label, mode, ok, run_ids, series, varying


def trend(ax, runs: list[Run], x: str, y, label: str, style: str = "-", spread=None, **kw) -> None:
    """Every run as a point (with `spread(r)` as its error bar), the line through the mean at
    each x (repeats of a point stay visible) and, where an x has repeats, a bootstrap interval of
    their mean as a band."""
    xs = sorted({dim(r, x) for r in runs})
    at = {v: [y(r) for r in runs if dim(r, x) == v] for v in xs}
    line = ax.plot(xs, [fmean(at[v]) for v in xs], style, lw=1.2, label=label, **kw)
    color = line[0].get_color()
    if any(len(vs) > 1 for vs in at.values()):
        band = [interval(at[v], fmean) for v in xs]
        ax.fill_between(xs, [b[0] for b in band], [b[1] for b in band], color=color, alpha=0.15, lw=0)
    for r in runs:
        err = spread(r) if spread else None
        ax.errorbar(dim(r, x), y(r), yerr=err, fmt="o", ms=4, color=color, capsize=2 if err else 0)


def samples_s(r: Run) -> float:
    return r.metrics.throughput_samples_s


def samples_spread(r: Run) -> list[list[float]] | None:
    """Throughput's error bar: its interval over the run's steps (records before intervals:
    from the interquartile range of its step times)."""
    m = r.metrics
    y = samples_s(r)
    if m.intervals is not None and (ci := m.intervals.throughput_samples_s):
        return [[max(0.0, y - ci[0])], [max(0.0, ci[1] - y)]]
    if not m.step_time_iqr_s:
        return None
    q1, q3 = m.step_time_iqr_s
    samples = y * m.step_time_s
    return [[max(0.0, y - samples / q3)], [max(0.0, samples / q1 - y)]]


def _model_samples_s(r: Run) -> float:
    """The throughput the cost model predicts for the run (modeled op costs and comm.*)."""
    c = r.cfg
    return c.microbatches * c.microbatch_size * c.dp / r.metrics.model_step_s


def _only_varying(runs: list[Run], x: str) -> list[Run]:
    """The runs that form lines against x: groups equal in everything but x (dims that vary
    in the sweep) with at least two values of x. Other runs belong to other figures."""
    others = [d for d in varying(runs) if d != x]
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(repr(dim(r, d)) for d in others), []).append(r)
    return [r for g in groups.values() if len({dim(r, x) for r in g}) > 1 for r in g]


def _against(ax, runs: list[Run], x: str, name: str) -> list[Run]:
    """Throughput against dimension x, one line per combination of what else varies; the
    runs drawn ([] and the panel says why when no two runs differ in x alone)."""
    runs = _only_varying(runs, x)
    if not runs:
        say(ax, f"no runs that differ in {name} alone")
        return []
    for lbl, mine in series(runs, x).items():
        trend(ax, mine, x, samples_s, lbl, spread=samples_spread)
    # what every line of the panel shares (the legend names only what sets lines apart)
    ax.set_title(label(runs[0], [d for d in COMPARABLE if d != x and len({repr(dim(r, d)) for r in runs}) == 1]),
                 fontsize=7)
    log2_x(ax, sorted({dim(r, x) for r in runs}))
    ax.set(xlabel=name, ylabel="throughput (samples/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    return runs


def throughput(runs: list[Run], out: Path) -> Figure:
    runs = ok(runs)
    fig_ = Figure("Throughput against M and microbatch size",
                  "Samples per second (M x B x dp / median step time) against the microbatch count M (left) and the "
                  "microbatch size B (right); one line per combination of the other swept dimensions, through the "
                  "mean of repeated points (band: a percentile bootstrap of that mean, nominally 95%, less at 2-3 "
                  f"repeats; bars: each run's interval over its steps, {bars_note(runs)}). "
                  "More microbatches shrink the bubble; larger ones use each op better.", runs)
    if not runs:
        fig_.missing.append("no run finished ok")
        return fig_
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    drawn = [_against(left, runs, "M", "microbatches M"), _against(right, runs, "B", "microbatch size B")]
    fig_.missing += [f"no runs that differ in {x} alone" for x, d in zip(("microbatches M", "microbatch size B"), drawn)
                     if not d]
    shown = {id(r) for d in drawn for r in d}
    if rest := [r for r in runs if id(r) not in shown]:
        fig_.missing.append(f"runs {run_ids(rest)}: no other run differs from them in M or B alone")
    fig_.runs = [r for r in runs if id(r) in shown]
    if not fig_.runs:
        plt.close(fig)
        return fig_
    fig_.path = save(fig, out / "throughput.png", fig_.title, fig_.runs)
    return fig_


def dp_scaling(runs: list[Run], out: Path) -> Figure:
    """Throughput, bubble and gradient sync against dp, one line per plan that differs only in
    dp (and the microbatch size a fixed global batch implies): ideal scaling is throughput x dp
    at an unchanged bubble."""
    runs = ok(runs)
    fig_ = Figure("Data-parallel scaling",
                  "Throughput (left; dotted: the cost model's prediction for each point, what ideal scaling means "
                  "for this study: at a fixed global batch each replica's microbatches shrink, and so does their "
                  "work, but not the fixed part of each op), measured bubble (middle) and the gradient sync (right: "
                  "measured dp_sync_s solid, ring all-reduce model dashed) against the data-parallel replicas dp, "
                  "at fixed pipeline depth and microbatch count. Beside each sync point: measured / model; where the "
                  "model falls outside the measured 95% interval, a line under this caption says by how much (the "
                  "ring model prices latency and bandwidth only: README, Pipeline x data parallelism).", runs)
    if not any(dim(r, "dp") > 1 for r in runs):
        fig_.missing.append(f"no runs with dp > 1 (all {len(runs)} ok runs have dp=1): nothing to scale")
        fig_.runs = []
        return fig_
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        c = r.cfg
        groups.setdefault((c.schedule.name, c.pp, c.microbatches, mode(r), dim(r, "model"), c.tp, dim(r, "partition"),
                           c.global_batch), []).append(r)
    scaling = {k: g for k, g in groups.items() if len({dim(r, "dp") for r in g}) > 1}
    if skipped := [r for k, g in groups.items() if k not in scaling for r in g]:
        fig_.missing.append(f"runs {run_ids(skipped)}: no other run differs from them in dp alone")
    runs = fig_.runs = [r for g in scaling.values() for r in g]
    if not runs:
        return fig_
    fig, (left, right, sync) = plt.subplots(1, 3, figsize=(15, 4.2))
    for (sched, pp, m, compute, model, tp, *_), mine in scaling.items():
        gb = mine[0].cfg.global_batch
        full = (f"{sched} pp={pp} M={m} {model}{f' tp={tp}' if tp > 1 else ''} {compute}"
                + (f", global batch {gb}" if gb else ""))
        lbl = full if len(scaling) > 1 else "measured"  # one line: its setting goes into the caption
        if len(scaling) == 1:
            fig_.caption += f" Every line: {full}."
        trend(left, mine, "dp", samples_s, lbl, spread=samples_spread)
        if modeled := [r for r in mine if r.metrics.model_step_s]:
            dps = sorted({dim(r, "dp") for r in modeled})
            left.plot(dps, [fmean(_model_samples_s(r) for r in modeled if dim(r, "dp") == d) for d in dps], ":",
                      color=left.lines[-1].get_color(), lw=1)
        trend(right, mine, "dp", lambda r: r.metrics.bubble.measured, lbl)
        if synced := [r for r in mine if r.metrics.dp_sync_s is not None]:
            trend(sync, synced, "dp", lambda r: r.metrics.dp_sync_s * 1e3, lbl)
            trend(sync, synced, "dp", lambda r: r.metrics.dp_sync_theory_s * 1e3, f"{lbl} (model)" if len(scaling) > 1
                  else "ring all-reduce model", "--", color=sync.lines[-1].get_color())
            fig_.notes += sync_against_model(sync, synced, full)
        fig_.notes += [n for d in sorted({dim(r, "dp") for r in modeled}) if (n := throughput_against_model(
            [r for r in modeled if dim(r, "dp") == d], _model_samples_s, f"{full}, dp={d}: throughput"))]
    for ax, ylabel in ((left, "throughput (samples/s)"), (right, "bubble, measured"), (sync, "gradient sync (ms)")):
        ax.set(xlabel="data-parallel replicas dp", ylabel=ylabel)
        log2_x(ax, [dim(r, "dp") for r in runs])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # the sync panel is empty when no run synced
            ax.legend(fontsize=6)
    fig_.path = save(fig, out / "dp_scaling.png", fig_.title, runs)
    fig_.notes = [f"Modelled against measured: {n}" for n in fig_.notes]
    return fig_
