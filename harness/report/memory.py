"""Memory figures: peak activation memory per rank, and the checkpointing trade-off."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from harness.report.figures import Figure, save, schedule_order
from harness.report.runs import COMPARABLE, MODE, Run, by_mode, comparable, dim, label, mode, ok, run_ids, setting


def _peaks(r: Run) -> list[int] | None:
    return r.metrics.memory.peak_activation_bytes_per_rank


def memory_per_rank(runs: list[Run], out: Path) -> Figure:
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
    if ckpt := [r for r in measured if r.cfg.checkpointing]:
        fig_.missing.append(f"runs {run_ids(ckpt)}: checkpointing on, see the checkpointing trade-off")
    measured = [r for r in measured if not r.cfg.checkpointing]
    if not measured:
        fig_.missing.append("no run with measured memory and checkpointing off")
        return fig_
    n = max(r.cfg.pp for r in measured)
    if shallow := [r for r in measured if r.cfg.pp != n]:
        fig_.missing.append(f"runs {run_ids(shallow)}: pp < {n}, only the deepest pipeline is drawn")
    deepest = [r for r in measured if r.cfg.pp == n]
    common = max({setting(r) for r in deepest}, key=lambda k: sum(setting(r) == k for r in deepest))
    if other := [r for r in deepest if setting(r) != common]:  # bars of one model and batch shape only
        fig_.missing.append(f"runs {run_ids(other)}: another model, microbatch size, dp or compute mode")
    fig_.runs = [r for r in deepest if setting(r) == common]
    schedules = schedule_order({r.cfg.schedule.name for r in fig_.runs})
    fig, axes = plt.subplots(1, len(schedules), figsize=(5 * len(schedules), 3.8), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], schedules):
        mine = sorted((r for r in fig_.runs if r.cfg.schedule.name == s), key=lambda r: r.cfg.microbatches)
        width = 0.8 / len(mine)
        for i, r in enumerate(mine):
            mem = r.metrics.memory
            xs = [rank - 0.4 + width * (i + 0.5) for rank in range(n)]
            ax.bar(xs, [b / 2**20 for b in mem.peak_activation_bytes_per_rank[:n]], width,
                   label=f"M={r.cfg.microbatches}", color=plt.cm.viridis(i / max(1, len(mine) - 1) * 0.85))
            if None not in mem.theory_peak_microbatches_per_rank:
                ax.plot(xs, [k * b / 2**20 for k, b in zip(mem.theory_peak_microbatches_per_rank,
                                                           mem.activation_bytes_per_microbatch_per_rank)],
                        "_", color="black", ms=width * 40, mew=2)
        ax.plot([], [], "_", color="black", mew=2, label="theory")
        ax.set_title(f"{s}, N={n}", fontsize=9)
        ax.set_xticks(range(n), [f"rank {r}" for r in range(n)])
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("peak activation memory (MiB)")
    fig_.path = save(fig, out / "memory_per_rank.png", fig_.title, fig_.runs)
    return fig_


def checkpointing_tradeoff(runs: list[Run], out: Path) -> Figure:
    """Each configuration run with and without checkpointing: peak activation memory (largest
    rank) and step time side by side."""
    runs = [r for r in ok(runs) if _peaks(r)]
    fig_ = Figure("Checkpointing trade-off",
                  "Each configuration with checkpointing off and on: peak activation memory of its fullest rank "
                  "(left) against step time (right). What checkpointing saves in memory it pays in recompute.", [])

    def key(r: Run) -> tuple:
        c = r.cfg
        return (c.schedule.name, c.pp, c.microbatches, c.microbatch_size, mode(r), c.dp, c.tp, repr(c.model),
                c.partition.name)

    on = {key(r): r for r in runs if r.cfg.checkpointing}
    off = {key(r): r for r in runs if not r.cfg.checkpointing}
    pairs = sorted(k for k in on if k in off)
    if not pairs:
        fig_.missing.append("no pair of runs that differ only in checkpointing")
        return fig_
    fig_.runs = [by[k] for k in pairs for by in (off, on)]
    # each row names its batch shape, and the model and mode where the pairs differ in them
    differ = [d for d in ("model", *MODE, "dp", "tp", "partition") if len({repr(dim(r, d)) for r in fig_.runs}) > 1]
    labels = [f"{k[0]} N={k[1]} M={k[2]} B={k[3]} {label(off[k], differ)}".strip() for k in pairs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 0.45 * len(pairs) + 2.2))
    y = range(len(pairs))
    for ax, unit, value in ((a1, "peak activation MiB (largest rank)", lambda r: max(_peaks(r)) / 2**20),
                            (a2, "step time (ms)", lambda r: r.metrics.step_time_s * 1e3)):
        for dy, by, name, color in ((-0.2, off, "off", "#4c72b0"), (0.2, on, "on", "#dd8452")):
            ax.barh([i + dy for i in y], [value(by[k]) for k in pairs], 0.4, label=f"checkpointing {name}", color=color)
        ax.set_xlabel(unit)
        ax.set_yticks(list(y), labels if ax is a1 else [""] * len(pairs))
        ax.invert_yaxis()
    a1.legend(fontsize=7)
    fig_.path = save(fig, out / "checkpointing.png", fig_.title, fig_.runs)
    return fig_


PARTS = (("params", "parameters", "#4c72b0"), ("grads", "gradients", "#55a868"),
         ("optimizer", "optimizer state", "#8172b2"), ("activations", "activations", "#dd8452"))


def _breakdown(r: Run) -> tuple[list[dict] | None, list[dict] | None]:
    """Per global rank {params, grads, optimizer, activations, peak} bytes: measured, theory."""
    mem = r.metrics.memory
    return mem.measured_per_rank, mem.theory_per_rank


def memory_breakdown(runs: list[Run], out: Path) -> Figure:
    """Every byte of every rank for the sweep's richest runs: parameters, gradients, optimizer
    state and activations stacked, measured (left bar) beside theory (right bar), the
    accounted peak as a tick, memory_budget_gib as a red line."""
    runs = [r for r in ok(runs) if _breakdown(r)[1]]
    fig_ = Figure("Every byte of every rank",
                  "Per global rank: parameters, gradients, optimizer state and activations held for backward, "
                  "stacked; left bar measured (tensors accounted, each storage once), right bar theory "
                  "(harness/planning/memory_theory.py). Black ticks: the transient peak (measured, theory dashed). Red "
                  "line: memory_budget_gib. Up to six runs, at the sweep's largest M.", [])
    if not runs:
        fig_.missing.append("no run with a memory breakdown (records from before it existed)")
        return fig_
    # the largest M first (where schedules differ most), then each schedule, checkpointing and ZeRO
    picked = sorted(runs, key=lambda r: (-r.cfg.microbatches, -r.cfg.pp * r.cfg.dp, bool(r.cfg.checkpointing),
                                         r.cfg.zero, schedule_order({r.cfg.schedule.name})[0], r.dir))[:6]
    if len(runs) > len(picked):
        fig_.missing.append(f"runs {run_ids([r for r in runs if r not in picked])}: not drawn (six at most)")
    fig_.runs = picked
    cols = min(3, len(picked))  # three across at most: six in a row is unreadable at page width
    rows = -(-len(picked) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(picked):]:
        ax.set_visible(False)
    for ax, r in zip(axes.flat, picked):
        measured, theory = _breakdown(r)
        c = r.cfg
        ranks = range(len(theory))
        for offset, values, hatch in ((-0.2, measured, ""), (0.2, theory, "//")):
            if not values:
                continue
            bottom = [0.0] * len(values)
            for key, label, color in PARTS:
                heights = [(v.get(key) or 0) / 2**20 for v in values]
                ax.bar([g + offset for g in ranks], heights, 0.38, bottom=bottom, color=color, hatch=hatch,
                       edgecolor="white", label=label if offset < 0 or not measured else None)
                bottom = [b + h for b, h in zip(bottom, heights)]
            peaks = [(v.get("peak") or 0) / 2**20 for v in values]
            ax.plot([g + offset for g in ranks], peaks, "_", color="black", ms=16, mew=2,
                    ls="none", label=None)
        if (budget := r.metrics.memory.budget) is not None:
            ax.axhline(budget.bytes / 2**20, color="red", lw=1.2, label="budget")
        ax.set_xticks(list(ranks), [f"r{g}" for g in ranks], fontsize=7)
        ax.set_title(f"{c.schedule.name} pp={c.pp} dp={c.dp}{f' tp={c.tp}' if c.tp > 1 else ''} M={c.microbatches} "
                     f"B={c.microbatch_size} {dim(r, 'model')}\n"
                     f"{c.optimizer.name} {c.dtype} zero={c.zero} ckpt={'on' if c.checkpointing else 'off'}",
                     fontsize=8)
    for row in axes:
        row[0].set_ylabel("MiB (left: measured, right: theory)")
    axes[0][0].legend(fontsize=7)
    fig_.path = save(fig, out / "memory_breakdown.png", fig_.title, picked)
    return fig_


def _pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other beats on both: less memory and more throughput."""
    return [i for i, (m, t) in enumerate(points)
            if not any((m2 <= m and t2 >= t) and (m2 < m or t2 > t) for m2, t2 in points)]


def memory_vs_throughput(runs: list[Run], out: Path) -> Figure:
    """One point per run: its fullest rank's peak bytes against its throughput; a Pareto front
    (no run has both less memory and more throughput) per group of comparable runs (model, B,
    how the times were made, tp: runs.COMPARABLE), each group its own colour and label: a
    front never joins runs of different models or batch shapes, nor a real run's speed and an
    emulated one's."""
    runs = [r for r in ok(runs) if _breakdown(r)[1]]
    fig_ = Figure("Memory against throughput",
                  "Each run at (peak bytes of its fullest rank, samples per second); measured peak where the run "
                  "metered it, else theory (hollow). One colour per group of comparable runs (same model, microbatch "
                  "size B, compute mode, device, executor and tp), named in the legend; its line joins the group's "
                  "Pareto front: the runs no other of the group beats on both memory and speed, labelled with "
                  "schedule, pp, M, checkpointing and ZeRO.", runs)
    if len(runs) < 2:
        fig_.missing.append("fewer than two runs with a memory breakdown")
        fig_.runs = []
        return fig_

    def peak(r: Run) -> tuple[float, bool]:
        measured, theory = _breakdown(r)
        if measured and all(m.get("peak") is not None for m in measured):
            return max(m["peak"] for m in measured) / 2**20, True
        return max(t["peak"] for t in theory) / 2**20, False

    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(comparable(r), []).append(r)
    differ = [d for d in COMPARABLE if len({repr(dim(r, d)) for r in runs}) > 1]
    fig, ax = plt.subplots(figsize=(8, 5.2))
    all_t = [r.metrics.throughput_samples_s for r in runs]
    for i, (_, mine) in enumerate(sorted(groups.items())):
        color = plt.cm.tab10(i % 10)
        points = [(peak(r)[0], r.metrics.throughput_samples_s) for r in mine]
        front = sorted(_pareto(points), key=lambda j: points[j][0])
        for r, (m, t) in zip(mine, points):
            ax.plot(m, t, "o", color=color, mfc=color if peak(r)[1] else "none", ms=6)
        ax.plot([points[j][0] for j in front], [points[j][1] for j in front], "-", color=color, lw=1.2,
                label=label(mine[0], differ) or "Pareto front")
        for j in front:
            c = mine[j].cfg
            ax.annotate(f"{c.schedule.name} pp={c.pp} M={c.microbatches} ckpt={'on' if c.checkpointing else 'off'} "
                        f"zero={c.zero}", points[j], fontsize=6, xytext=(4, 4), textcoords="offset points")
    ax.set(xlabel="peak memory of the fullest rank (MiB)", ylabel="throughput (samples/s)")
    ax.set_xlim(left=0)
    if len(by_mode(runs)) > 1:  # scales apart: a log axis keeps each group's spread visible
        ax.set_yscale("log")
    else:
        lo, hi = min(all_t), max(all_t)
        ax.set_ylim(lo - 0.15 * (hi - lo or hi), hi + 0.15 * (hi - lo or hi))  # the spread, not the axis to 0
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, title="Pareto front of" if differ else None, title_fontsize=6)
    fig_.path = save(fig, out / "memory_vs_throughput.png", fig_.title, runs)
    return fig_
