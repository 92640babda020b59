"""Memory figures: peak activation memory per rank, and the checkpointing trade-off."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from harness.report.figures import Figure, save, schedule_order
from harness.report.runs import ok, run_ids, setting


def _peaks(r: dict) -> list[int] | None:
    return r["metrics"]["memory"]["peak_activation_bytes_per_rank"]


def memory_per_rank(runs: list[dict], out: Path) -> Figure:
    """Measured peak per rank, one bar per M, theory (the schedule's in-flight microbatches x
    measured bytes per microbatch) as black ticks; one panel per schedule at the deepest
    pipeline of the sweep, checkpointing off."""
    runs = ok(runs)
    fig_ = Figure("Activation memory per rank",
                  "Measured peak bytes held for backward (saved tensors + kept inputs) per rank, one bar per M; "
                  "black ticks: the schedule's in-flight microbatches x measured bytes per microbatch.", [])
    measured = [r for r in runs if _peaks(r)]
    if unmeasured := [r for r in runs if not _peaks(r)]:
        fig_.missing.append(f"runs {run_ids(unmeasured)}: no memory measured (executor=sim)")
    if ckpt := [r for r in measured if r["config"].get("checkpointing")]:
        fig_.missing.append(f"runs {run_ids(ckpt)}: checkpointing on, see the checkpointing trade-off")
    measured = [r for r in measured if not r["config"].get("checkpointing")]
    if not measured:
        fig_.missing.append("no run with measured memory and checkpointing off")
        return fig_
    n = max(r["config"]["pp"] for r in measured)
    if shallow := [r for r in measured if r["config"]["pp"] != n]:
        fig_.missing.append(f"runs {run_ids(shallow)}: pp < {n}, only the deepest pipeline is drawn")
    deepest = [r for r in measured if r["config"]["pp"] == n]
    common = max({setting(r) for r in deepest}, key=lambda k: sum(setting(r) == k for r in deepest))
    if other := [r for r in deepest if setting(r) != common]:  # bars of one model and batch shape only
        fig_.missing.append(f"runs {run_ids(other)}: another model, microbatch size, dp or compute mode")
    fig_.runs = [r for r in deepest if setting(r) == common]
    schedules = schedule_order({r["config"]["schedule"]["name"] for r in fig_.runs})
    fig, axes = plt.subplots(1, len(schedules), figsize=(5 * len(schedules), 3.8), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], schedules):
        mine = sorted((r for r in fig_.runs if r["config"]["schedule"]["name"] == s),
                      key=lambda r: r["config"]["microbatches"])
        width = 0.8 / len(mine)
        for i, r in enumerate(mine):
            mem = r["metrics"]["memory"]
            xs = [rank - 0.4 + width * (i + 0.5) for rank in range(n)]
            ax.bar(xs, [b / 2**20 for b in mem["peak_activation_bytes_per_rank"][:n]], width,
                   label=f"M={r['config']['microbatches']}", color=plt.cm.viridis(i / max(1, len(mine) - 1) * 0.85))
            if None not in mem["theory_peak_microbatches_per_rank"]:
                ax.plot(xs, [k * b / 2**20 for k, b in zip(mem["theory_peak_microbatches_per_rank"],
                                                           mem["activation_bytes_per_microbatch_per_rank"])],
                        "_", color="black", ms=width * 40, mew=2)
        ax.plot([], [], "_", color="black", mew=2, label="theory")
        ax.set_title(f"{s}, N={n}", fontsize=9)
        ax.set_xticks(range(n), [f"rank {r}" for r in range(n)])
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("peak activation memory (MiB)")
    fig_.path = save(fig, out / "memory_per_rank.png", "Activations held for backward, per rank", fig_.runs)
    return fig_


def checkpointing_tradeoff(runs: list[dict], out: Path) -> Figure:
    """Each configuration run with and without checkpointing: peak activation memory (largest
    rank) and step time side by side."""
    runs = [r for r in ok(runs) if _peaks(r)]
    fig_ = Figure("Checkpointing trade-off",
                  "Each configuration with checkpointing off and on: peak activation memory of its fullest rank "
                  "(left) against step time (right). What checkpointing saves in memory it pays in recompute.", [])

    def key(r: dict) -> tuple:
        c = r["config"]
        return (c["schedule"]["name"], c["pp"], c["microbatches"], c["microbatch_size"], c["compute"],
                c.get("dp", 1), repr(c.get("model")), (c.get("partition") or {}).get("name"))

    on = {key(r): r for r in runs if r["config"].get("checkpointing")}
    off = {key(r): r for r in runs if not r["config"].get("checkpointing")}
    pairs = sorted(k for k in on if k in off)
    if not pairs:
        fig_.missing.append("no pair of runs that differ only in checkpointing")
        return fig_
    fig_.runs = [by[k] for k in pairs for by in (off, on)]
    labels = [f"{s} N={n} M={m}" for s, n, m, *_ in pairs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 0.45 * len(pairs) + 2.2))
    y = range(len(pairs))
    for ax, unit, value in ((a1, "peak activation MiB (largest rank)", lambda r: max(_peaks(r)) / 2**20),
                            (a2, "step time (ms)", lambda r: r["metrics"]["step_time_s"] * 1e3)):
        for dy, by, name, color in ((-0.2, off, "off", "#4c72b0"), (0.2, on, "on", "#dd8452")):
            ax.barh([i + dy for i in y], [value(by[k]) for k in pairs], 0.4, label=f"checkpointing {name}", color=color)
        ax.set_xlabel(unit)
        ax.set_yticks(list(y), labels if ax is a1 else [""] * len(pairs))
        ax.invert_yaxis()
    a1.legend(fontsize=7)
    fig_.path = save(fig, out / "checkpointing.png", "Checkpointing: memory saved against step time lost", fig_.runs)
    return fig_
