"""Zero-bubble schedules, generated beside handcrafted: per schedule against M, the bubble
with steps overlapped (each rank's measured span against the longest: the zero-bubble paper's
bubble rate), the bubble of a step that starts at a barrier (the harness's runtime), and the
peak activations a rank held, in units of 1F1B's peak (N microbatches on rank 0; the unit of
schedule=zb_auto's memory_limit), measured by the native meter."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from harness.report.figures import Figure, log2_x, save, schedule_colors
from harness.report.runs import Run, dim, ok, run_ids, schedule_label, series
from harness.schedules.registry import SCHEDULES



def _peak_share(r: Run) -> float | None:
    """The fullest rank's measured activations in units of N of its own microbatches (1F1B's
    peak on rank 0, and zb_auto's memory_limit unit on every rank)."""
    m = r.metrics.memory
    peaks, per_mb = m.peak_activation_bytes_per_rank, m.activation_bytes_per_microbatch_per_rank
    if not peaks or not per_mb or not all(per_mb):
        return None
    return max(p / (r.cfg.pp * b) for p, b in zip(peaks, per_mb))


def zero_bubble_study(runs: list[Run], out: Path) -> Figure:
    runs = [r for r in ok(runs) if r.metrics.bubble.steady_measured is not None]
    fig_ = Figure(
        "Zero-bubble schedules: bubble and memory",
        "Per schedule against the microbatch count M: left, the measured bubble with steps overlapped (solid: each "
        "rank's span, first compute start to last compute end, against the longest; the zero-bubble paper's bubble "
        "rate, what a runtime that starts a rank's next step as soon as it ends this one gets) and in a step that "
        "starts at a barrier (dotted: the harness's runtime; the last stage's wait for its first input stays in it "
        "whatever the order); right, the fullest rank's measured activations in units of N of its own microbatches "
        "(1F1B's peak on rank 0), the unit of zb_auto's memory_limit. zb_auto's orders are generated for the run's "
        "own costs and memory (what a deferred W keeps); handcrafted ones are fixed. Lines that coincide (1F1B's "
        "and ZB-H1's peak, both N on rank 0) are drawn over each other.", runs)
    if not any(getattr(SCHEDULES.get(r.cfg.schedule.name), "split_backward", False) for r in runs):
        fig_.missing.append("no run of a zero-bubble schedule (zb_h1, zb_h2, zbv, dualpipev, zb_auto)")
        fig_.runs = []
        return fig_
    shown = runs
    colors = schedule_colors(shown)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for lbl, mine in series(shown, "M", always=("schedule",)).items():
        color = colors[schedule_label(mine[0].cfg)]
        xs = [dim(r, "M") for r in mine]
        left.plot(xs, [100 * r.metrics.bubble.steady_measured for r in mine], "o-", ms=4, lw=1.3, color=color,
                  label=lbl)
        left.plot(xs, [100 * r.metrics.bubble.measured for r in mine], ":", lw=1, color=color)
        held = [(x, s) for x, r in zip(xs, mine) if (s := _peak_share(r)) is not None]
        if held:
            right.plot([x for x, _ in held], [s for _, s in held], "o-", ms=4, lw=1.3, color=color, label=lbl)
    if not any(_peak_share(r) is not None for r in shown):
        fig_.missing.append(f"runs {run_ids(shown)}: no activations measured (executor=sim or pytorch)")
    left.set(xlabel="microbatches M", ylabel="bubble (%)")
    right.set(xlabel="microbatches M", ylabel="peak activations / 1F1B's peak")
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    for ax in (left, right):
        log2_x(ax, [dim(r, "M") for r in shown])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig_.path = save(fig, out / "zero_bubble.png", fig_.title, shown)
    return fig_
