"""Bubble figures: against M with each schedule's theory, and measured against theory."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from harness.planning import theory
from harness.report.figures import Figure, log2_x, save, schedule_colors
from harness.config import Config
from harness.report.noise import bars_note
from harness.report.runs import Run, ok, run_ids, schedule_label, setting


def _theory(r: Run) -> float | None:
    return r.metrics.bubble.theory


def _curve(c: Config, costs: dict | None, n: int, m: int) -> float | None:
    """The schedule's theory at (n, m) in the costs a run recorded (B/F, W/B)."""
    try:
        return theory.bubble(c.schedule.name, n, m, c.virtual_stages, **(costs or {})).value
    except (KeyError, ValueError, TypeError):
        return None


def _simulated_runs(runs: list[Run]) -> bool:
    """Runs the simulator timed (as their records say): their 'measured' bubble is the simulator's."""
    return all(r.measurement == "simulated" for r in runs)


def _spread(r: Run) -> list[list[float]]:
    """Error bar of a run's bubble: its interval over the measured steps (records before
    intervals: the interquartile range)."""
    b, ci = r.metrics.bubble, r.metrics.intervals
    lo, hi = (ci.bubble if ci is not None else None) or b.measured_step_iqr or [min(b.measured_per_step),
                                                                                 max(b.measured_per_step)]
    return [[max(0.0, b.measured - lo)], [max(0.0, hi - b.measured)]]


def bubble_vs_microbatches(runs: list[Run], out: Path) -> Figure:
    """One panel per pipeline depth N, one colour per schedule: its closed form as a line,
    measured as filled points (bars: spread over measured steps), simulated as hollow ones.
    Drawn for the sweep's most common setting (compute, partition, dp, ...); runs in other
    settings are listed as not drawn, each has its own figure below."""
    runs = ok(runs)
    common = max(({setting(r) for r in runs}), key=lambda k: sum(setting(r) == k for r in runs), default=None)
    others = [r for r in runs if setting(r) != common]
    runs = [r for r in runs if setting(r) == common]
    fig_ = Figure("Bubble against microbatches",
                  "Lines: each schedule's theory in the runs' costs ((N-1)/(M+N-1) for GPipe and 1F1B, its own for "
                  "the others). Filled markers: measured (mean idle fraction of the step window over ranks; bars: "
                  f"its interval over the measured steps: {bars_note(runs)}; x: oversubscribed, CPU "
                  "contention). Hollow: the simulator fed with each run's own measured op costs and hop latency.", runs)
    if not runs:
        fig_.missing.append("no run finished ok")
        return fig_
    if others:
        fig_.missing.append(f"runs {run_ids(others)}: another compute mode, partition, dp, checkpointing, model or "
                            "microbatch size than the rest (their own sections show them)")
    depths = sorted({r.cfg.pp for r in runs})
    colors = schedule_colors(runs)
    sim = _simulated_runs(runs)
    fig, axes = plt.subplots(1, len(depths), figsize=(5.2 * len(depths), 4.2), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], depths):
        mine = [r for r in runs if r.cfg.pp == n]
        ms = sorted({r.cfg.microbatches for r in mine})
        for s in sorted({schedule_label(r.cfg) for r in mine}, key=list(colors).index):
            first = next(r for r in mine if schedule_label(r.cfg) == s)
            costs = first.metrics.bubble.theory_costs
            line_ms = range(ms[0], ms[-1] + 1) if ms[-1] - ms[0] <= 64 else sorted(
                {round(ms[0] * (ms[-1] / ms[0]) ** (i / 64)) for i in range(65)})  # a theory may simulate
            pts = [(m, _curve(first.cfg, costs, n, m)) for m in line_ms]
            if pts := [(m, t) for m, t in pts if t is not None]:  # a single M: a tick, since a line needs two
                ax.plot(*zip(*pts), color=colors[s], lw=1.2, alpha=0.8, marker="_" if len(pts) == 1 else "", ms=24)
            ax.plot([], [], "o", color=colors[s], label=s)
        for r in mine:
            b, m, color = r.metrics.bubble, r.cfg.microbatches, colors[schedule_label(r.cfg)]
            ax.errorbar(m, b.measured, yerr=_spread(r), fmt="o", color=color, ms=5, capsize=2)
            if r.oversubscribed:
                ax.plot(m, b.measured, "x", color="black", ms=9, mew=1.5)
            if b.simulated is not None and not sim:
                ax.plot(m, b.simulated, "o", mfc="none", color=color, ms=10, mew=1)
        ax.plot([], [], "-", color="gray", label="theory")
        ax.plot([], [], "o", color="gray", label="simulated (executor=sim)" if sim else "measured")
        if not sim:
            ax.plot([], [], "o", mfc="none", color="gray", ms=10, label="simulated (measured op costs)")
        if any(r.oversubscribed for r in mine):
            ax.plot([], [], "x", color="black", label="oversubscribed (contention)")
        log2_x(ax, ms)
        ax.set_xlabel("microbatches M")
        ax.set_title(f"N = {n}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylim(bottom=0)  # once every panel is drawn: the axes share y, and this fixes the top
    axes[0][0].set_ylabel("bubble fraction (idle / step window)")
    fig_.path = save(fig, out / "bubble_vs_microbatches.png", fig_.title, runs)
    return fig_


def measured_vs_theory(runs: list[Run], out: Path) -> Figure:
    """One point per run: closed form on x, measured on y, the identity line; colour by
    schedule, marker by compute mode."""
    runs = ok(runs)
    drawn = [r for r in runs if _theory(r) is not None]
    fig_ = Figure("Bubble: measured against theory",
                  "One filled point per run at (theory, measured); hollow: (theory, simulated). On the dashed "
                  "identity line a run idles exactly as theory says. Above it: imbalance and communication (theory "
                  "-> simulated) and overhead (simulated -> measured); the attribution figure splits them.", drawn)
    if no_theory := [r for r in runs if _theory(r) is None]:
        fig_.missing.append(f"no theory for runs {run_ids(no_theory)}: not drawn")
    if not drawn:
        fig_.missing.append("no run finished ok with a theory")
        return fig_
    colors = schedule_colors(drawn)
    markers = dict(zip(sorted({r.cfg.compute for r in drawn}), "os^Dv"))
    fig, ax = plt.subplots(figsize=(5.6, 5.0))
    for r in drawn:
        b, t, color = r.metrics.bubble, _theory(r), colors[schedule_label(r.cfg)]
        ax.plot(t, b.measured, markers[r.cfg.compute], color=color, ms=6)
        if b.simulated is not None:
            ax.plot(t, b.simulated, markers[r.cfg.compute], mfc="none", color=color, ms=9, mew=1)
    top = max(max(_theory(r), r.metrics.bubble.measured) for r in drawn) * 1.08
    ax.plot([0, top], [0, top], "--", color="gray", lw=1, label="identity")
    for s, color in colors.items():
        ax.plot([], [], "o", color=color, label=s)
    if len(markers) > 1:
        for mode, mk in markers.items():
            ax.plot([], [], mk, color="gray", label=f"compute={mode}")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="bubble, theory", ylabel="bubble, measured (hollow: simulated)")
    ax.set_aspect("equal")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig_.path = save(fig, out / "bubble_measured_vs_theory.png", fig_.title, drawn)
    return fig_
