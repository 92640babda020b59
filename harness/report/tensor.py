"""The tensor-parallel figure: throughput, peak memory per rank, bubble and the TP communication
share against tp, at a fixed world size (pp x tp x dp: what tp gains is weighed against the dp
it replaces), one line per group of runs alike in everything else."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from harness.report.figures import Figure, save
from harness.report.runs import Run, dim, mode, ok, run_ids, schedule_label
from harness.report.throughput import samples_s, samples_spread, trend


def world(r: Run) -> int:
    c = r.cfg
    return c.pp * c.tp * c.dp


def global_batch(r: Run) -> int:
    """Samples per step: what a tp line holds fixed while dp (and so B) moves with tp."""
    c = r.cfg
    return c.microbatches * c.microbatch_size * c.dp


def _key(r: Run, fixed: str) -> tuple:
    """What one line holds fixed besides tp: at a fixed world (dp = world / (pp x tp)) or, where
    a sweep has no such pair, at a fixed dp (the world grows with tp)."""
    c = r.cfg
    size = world(r) if fixed == "world" else c.dp
    return (size, c.pp, schedule_label(c), c.microbatches, global_batch(r), dim(r, "model"), mode(r),
            bool(c.checkpointing), c.partition.name, c.zero, c.dtype, bool(c.sequence_parallel))


def tp_lines(runs: list[Run], fixed: str = "world") -> dict[tuple, list[Run]]:
    """Groups of runs alike in everything but tp (and the dp a fixed world implies), with at
    least two values of tp. sequence_parallel needs tp > 1, so the tp=1 runs of a setting also
    start its sequence-parallel line."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(_key(r, fixed), []).append(r)
    for k, mine in list(groups.items()):
        if k[-1] and (plain := groups.get(k[:-1] + (False,))):
            mine += [r for r in plain if r.cfg.tp == 1]
    return {k: sorted(g, key=lambda r: r.cfg.tp) for k, g in groups.items() if len({r.cfg.tp for r in g}) > 1}


def _parts(k: tuple, fixed: str) -> dict[str, str]:
    size, pp, schedule, m, gb, model, how, ckpt, partition, zero, dtype, sp = k
    return {fixed: f"{fixed}={size}", "pp": f"pp={pp}", "schedule": schedule, "M": f"M={m}",
            "global batch": f"global batch {gb}", "model": model, "mode": how, "partition": f"partition={partition}",
            "zero": f"zero={zero}", "dtype": dtype, "checkpointing": "ckpt on" if ckpt else "ckpt off",
            "sequence_parallel": "sequence_parallel" if sp else "no sequence_parallel"}


def labels(keys: list[tuple], fixed: str) -> tuple[dict[tuple, str], str]:
    """({line's key: what sets it apart from the other lines}, what every line shares): a legend
    short enough to read, and nothing left unsaid."""
    parts = {k: _parts(k, fixed) for k in keys}
    names = list(parts[keys[0]])
    differ = [n for n in names if len({p[n] for p in parts.values()}) > 1]
    shared = " ".join(parts[keys[0]][n] for n in names if n not in differ)
    return {k: " ".join(p[n] for n in differ) or "all runs" for k, p in parts.items()}, shared


def _peak_mib(r: Run) -> list[float] | None:
    """Each rank's accounted peak (MiB), measured; None where it was not metered."""
    per_rank = r.metrics.memory.measured_per_rank
    if not per_rank or any(p.get("peak") is None for p in per_rank):
        return None
    return [p["peak"] / 2**20 for p in per_rank]


def tp_comm_share(r: Run) -> float:
    """TP communication's share of the step: the TP gradient sync (tp_sync_s) and, where the record
    has it, the per-block collectives inside F and B (tp_comm_s). tp=1 has none."""
    if r.cfg.tp == 1:
        return 0.0
    m = r.metrics
    comm = (m.tp_sync_s or 0.0) + (m.tp_comm_s or 0.0)  # tp_comm_s: newer records only
    return comm / m.step_time_s


def tensor_parallel(runs: list[Run], out: Path) -> Figure:
    runs = ok(runs)
    fig_ = Figure("Tensor parallelism at a fixed world size",
                  "Against the tensor-parallel degree tp, at a fixed world size pp x tp x dp (dp shrinks as tp grows; "
                  "the global batch is held, so B moves with dp): throughput, the accounted peak memory of the fullest "
                  "rank (dots: every rank), the measured bubble, and TP communication's share of the step (the TP "
                  "gradient sync, tp_sync_s, plus the per-block collectives, tp_comm_s, where recorded; tp=1 has "
                  "none). One line per setting alike in everything else, named in the legend. Under "
                  "compute=emulated a layer's time is what was set, whatever tp: the emulated figure shows the "
                  "schedule and the communication, not tp's split compute.", [])
    if not any(r.cfg.tp > 1 for r in runs):
        fig_.missing.append(f"no runs with tp > 1 (all {len(runs)} ok runs have tp=1)")
        return fig_
    fixed = "world"
    lines = tp_lines(runs, fixed)
    if not lines:
        fixed, lines = "dp", tp_lines(runs, "dp")
        fig_.missing.append("no two runs differ in tp alone at one world size: drawn at a fixed dp instead "
                            "(the world grows with tp)")
    drawn = {id(r) for g in lines.values() for r in g}
    if rest := [r for r in runs if r.cfg.tp > 1 and id(r) not in drawn]:
        fig_.missing.append(f"runs {run_ids(rest)}: no run differs from them in tp alone")
    fig_.runs = [r for r in runs if id(r) in drawn]
    if not lines:
        return fig_
    names, shared = labels(list(lines), fixed)
    fig_.caption += f" Every line: {shared}."
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.4))
    thr, mem, bub, comm = axes
    for k, mine in lines.items():
        lbl = names[k]
        trend(thr, mine, "tp", samples_s, lbl, spread=samples_spread)
        color = thr.lines[-1].get_color()
        if metered := [r for r in mine if _peak_mib(r)]:
            trend(mem, metered, "tp", lambda r: max(_peak_mib(r)), lbl, color=color)
            for r in metered:
                mem.plot([r.cfg.tp] * len(_peak_mib(r)), _peak_mib(r), ".", color=color, ms=3)
        trend(bub, mine, "tp", lambda r: r.metrics.bubble.measured, lbl, color=color)
        trend(comm, mine, "tp", lambda r: 100 * tp_comm_share(r), lbl, color=color)
    tps = sorted({r.cfg.tp for r in fig_.runs})
    for ax, ylabel in ((thr, "throughput (samples/s)"), (mem, "peak memory, fullest rank (MiB)"),
                       (bub, "bubble, measured"), (comm, "TP communication (% of step)")):
        ax.set(xlabel="tensor-parallel degree tp", ylabel=ylabel)
        ax.set_xticks(tps, [str(t) for t in tps])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    thr.legend(fontsize=6)
    if not any(r.metrics.tp_comm_s is not None for r in fig_.runs if r.cfg.tp > 1):
        fig_.missing.append("TP communication: the per-block collectives inside F and B are not in these records "
                            "(only the TP gradient sync, tp_sync_s)")
    fig_.path = save(fig, out / "tensor_parallel.png", fig_.title, fig_.runs)
    return fig_
