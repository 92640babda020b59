"""Why is my bubble bigger than theory? The measured bubble of each run split into its
schedule's own fill and drain, stage imbalance, communication and runtime overhead
(harness.measure.metrics.attribution: each part the step from one model to the next). At
tp > 1 communication holds the TP collectives inside the actions too: the measured compute
leaves them out, the simulation with communication puts them back (metrics.bubbles_less_tp)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from harness.report.figures import Figure, save
from harness.report.runs import COMPARABLE, Run, dim, label, ok, run_id, run_ids, schedule_label

PARTS = (("schedule", "schedule (theory, equal stages)", "#4c72b0"),
         ("imbalance", "stage imbalance", "#dd8452"),
         ("communication", "communication (measured hop; tp > 1: TP collectives)", "#55a868"),
         ("overhead", "runtime overhead, jitter, contention", "#c44e52"))


def _label(r: Run, group: str) -> str:
    """`3: 1f1b N2 M8 [B]`: the run, and the letter of its group of comparable runs (the legend
    says what each letter holds: model, B, compute mode, tp where the drawn runs differ in them)."""
    c = r.cfg
    return f"{run_id(r)}: {schedule_label(c)} N{c.pp} M{c.microbatches}" + (f" [{group}]" if group else "")


def bubble_attribution(runs: list[Run], out: Path) -> Figure:
    runs = ok(runs)
    drawn = [r for r in runs if r.metrics.bubble.attribution is not None]
    fig_ = Figure("Why the bubble is bigger than theory",
                  "Each run's measured bubble (black tick) as the sum of four parts: the schedule's own idle on "
                  "equal stages (theory), what unequal measured stage costs add (the simulator on them, no "
                  "communication), what the measured hop adds (the simulator with it; at tp > 1 also each action's "
                  "measured TP collectives, which its compute leaves out, and the TP gradient sync), and the rest "
                  "(the runtime, jitter; on oversubscribed runs, marked *, CPU contention). Read the largest part to "
                  "know what to "
                  "fix: more microbatches or another schedule, a better partition, fewer or larger messages, "
                  "or fewer ranks per core.", drawn)
    if skipped := [r for r in runs if r not in drawn]:
        fig_.missing.append(f"runs {run_ids(skipped)}: no attribution (executor=sim, or no theory)")
    if not drawn:
        return fig_
    differ = [d for d in COMPARABLE if len({repr(dim(r, d)) for r in drawn}) > 1]
    names = sorted({label(r, differ) for r in drawn})
    letter = {n: chr(ord("A") + i) if len(names) > 1 else "" for i, n in enumerate(names)} if len(names) <= 26 else \
        {n: str(i + 1) for i, n in enumerate(names)}
    # bars of one group side by side, so a reader compares like with like
    drawn.sort(key=lambda r: (label(r, differ), schedule_label(r.cfg), r.cfg.pp, r.cfg.microbatches, run_id(r)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(drawn) + 2), 4.4))
    xs = range(len(drawn))
    bottom = [0.0] * len(drawn)
    for key, part, color in PARTS:
        values = [max(0.0, getattr(r.metrics.bubble.attribution, key)) for r in drawn]
        ax.bar(xs, values, 0.7, bottom=bottom, color=color, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.plot(xs, [r.metrics.bubble.measured for r in drawn], "_", color="black", ms=14, mew=2, label="measured")
    ax.set_xticks(list(xs), [_label(r, letter[label(r, differ)]) + (" *" if r.oversubscribed else "") for r in drawn],
                  rotation=60, ha="right", fontsize=7)
    for n in names if len(names) > 1 else []:  # the groups' key, as legend entries without a mark
        ax.plot([], [], " ", label=f"[{letter[n]}] {n}")
    ax.set_ylabel("bubble fraction")
    ax.set_ylim(0, max(1e-9, max(bottom + [r.metrics.bubble.measured for r in drawn])) * 1.1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    fig_.path = save(fig, out / "bubble_attribution.png", fig_.title, drawn)
    return fig_
