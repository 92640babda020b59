"""Compute throughput per device: achieved TFLOP/s (model FLOPs) against the microbatch size
B, and MFU where the device's peak is known (harness/planning/flops.py). Only runs whose times a device
made (measured, compute=real): an emulated run's times are what was set and a simulated run's
what the cost model priced, so their TFLOP/s says nothing a device did."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from harness.report.figures import Figure, log2_x, save, say
from harness.records.result import Flops
from harness.report.runs import Run, by_device, dim, ok, run_ids, series


def _flops(r: Run) -> Flops | None:
    return r.result.metrics.flops if r.result.metrics is not None else None


def compute_rate(runs: list[Run], out: Path) -> Figure:
    runs = [r for r in ok(runs) if _flops(r) is not None]
    fig_ = Figure("Compute throughput per device",
                  "Achieved TFLOP/s per device (model FLOPs: 3 x forward per microbatch, x M x dp, over the median "
                  "step and pp x dp devices) against the microbatch size B (left), and MFU (the share of the device's "
                  "dense peak, harness/planning/devices.py) where the peak is known (right; HFU dotted: with checkpointing's "
                  "recompute). Larger microbatches keep each op busier; the bubble and communication take the rest. "
                  "Runs with compute=emulated or executor=sim are left out: their times are what was set or modeled.", runs)
    shown = [r for r in runs if by_device(r)]
    if rest := [r for r in runs if not by_device(r)]:
        fig_.missing.append(f"runs {run_ids(rest)}: compute=emulated or executor=sim (times set or modeled, not "
                            "a device's)")
    fig_.runs = shown
    if not shown:
        fig_.missing.append("no run with measured compute (compute=real) recorded FLOPs")
        return fig_
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    with_peak = [r for r in shown if _flops(r).mfu is not None]
    # a CPU's rates read better in GFLOP/s
    k, unit = (1e3, "GFLOP/s") if max(_flops(r).tflops_per_device for r in shown) < 0.1 else (1.0, "TFLOP/s")
    for lbl, mine in series(shown, "B", always=("compute", "executor")).items():
        xs = [dim(r, "B") for r in mine]
        left.plot(xs, [_flops(r).tflops_per_device * k for r in mine], "o-", ms=4, lw=1.2, label=lbl)
        if peaked := [r for r in mine if r in with_peak]:
            line = right.plot([dim(r, "B") for r in peaked], [100 * _flops(r).mfu for r in peaked], "o-", ms=4,
                              lw=1.2, label=lbl)
            right.plot([dim(r, "B") for r in peaked], [100 * _flops(r).hfu for r in peaked], ":", lw=1,
                       color=line[0].get_color())
    left.set(xlabel="microbatch size B", ylabel=f"{unit} per device (model FLOPs)")
    right.set(xlabel="microbatch size B", ylabel="MFU (%)")
    for ax in (left, right) if with_peak else (left,):
        log2_x(ax, [dim(r, "B") for r in shown])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    if not with_peak:
        notes = "; ".join(sorted({_flops(r).note or "" for r in shown}))
        say(right, f"MFU n/a: {notes}")
        fig_.missing.append(f"MFU: n/a ({notes})")
    fig_.path = save(fig, out / "compute.png", fig_.title, shown)
    return fig_
