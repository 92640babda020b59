"""Figures of a sweep. Each says how it was made (compute mode, device, executor)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness import theory  # noqa: E402

MARKERS = {"gpipe": "o", "1f1b": "s"}
# Schedules at the same M are nudged apart on the log axis so their points do not hide each other.
NUDGE = {"gpipe": 0.96, "1f1b": 1.04}


def provenance(runs: list[dict]) -> str:
    ok = [r for r in runs if r["status"] == "ok"]
    modes = sorted({r["config"]["compute"] for r in ok})
    devices = sorted({r["env"]["device"] for r in ok if r.get("env")})
    execs = sorted({r["config"]["executor"] for r in ok})
    return f"compute={','.join(modes)}  device={','.join(devices)}  executor={','.join(execs)}  runs={len(ok)}"


def bubble_vs_microbatches(runs: list[dict], path: Path) -> Path | None:
    """Bubble against M: theory as a curve per N, measured as filled points per schedule,
    simulated (measured op costs) as hollow points; error bars span the measured steps."""
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return None
    depths = sorted({r["config"]["pp"] for r in ok})
    colors = {n: plt.cm.viridis(i / max(1, len(depths) - 1) * 0.85) for i, n in enumerate(depths)}
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ms = sorted({r["config"]["microbatches"] for r in ok})
    grid = list(range(min(ms), max(ms) + 1))
    for n in depths:
        ax.plot(grid, [theory.bubble_fraction("1f1b", n, m) for m in grid], color=colors[n], lw=1.2,
                label=f"theory (N-1)/(M+N-1), N={n}")
    for r in ok:
        c, b = r["config"], r["metrics"]["bubble"]
        n, s = c["pp"], c["schedule"]["name"]
        m = c["microbatches"] * NUDGE.get(s, 1.0)
        steps = b.get("measured_per_step") or [b["measured"]]
        err = [[b["measured"] - min(steps)], [max(steps) - b["measured"]]]
        ax.errorbar(m, b["measured"], yerr=err, fmt=MARKERS.get(s, "D"), color=colors[n], ms=6, capsize=2)
        ax.plot(m, b["simulated"], MARKERS.get(s, "D"), mfc="none", color=colors[n], ms=10, mew=1)
    for s in sorted({r["config"]["schedule"]["name"] for r in ok}):
        ax.plot([], [], MARKERS.get(s, "D"), color="gray", label=f"{s} measured")
    ax.plot([], [], "o", mfc="none", color="gray", ms=10, label="simulated (measured op costs)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("microbatches M")
    ax.set_ylabel("bubble fraction (idle / step window)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"Bubble against microbatches\n{provenance(runs)}", fontsize=9)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".svg"))
    plt.close(fig)
    return path


def memory_per_rank(runs: list[dict], path: Path) -> Path | None:
    """Peak activation memory per rank, measured bars per M, theory (in-flight microbatches
    from the schedule x measured bytes per microbatch) as black ticks; one panel per schedule,
    at the deepest pipeline of the sweep, checkpointing off."""
    ok = [r for r in runs if r["status"] == "ok" and not r["config"].get("checkpointing")
          and (r["metrics"].get("memory") or {}).get("peak_activation_bytes_per_stage")]
    if not ok:
        return None
    n = max(r["config"]["pp"] for r in ok)
    ok = [r for r in ok if r["config"]["pp"] == n]
    schedules = sorted({r["config"]["schedule"]["name"] for r in ok})
    fig, axes = plt.subplots(1, len(schedules), figsize=(5 * len(schedules), 3.8), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], schedules):
        mine = sorted((r for r in ok if r["config"]["schedule"]["name"] == s), key=lambda r: r["config"]["microbatches"])
        width = 0.8 / len(mine)
        for i, r in enumerate(mine):
            mem = r["metrics"]["memory"]
            xs = [rank - 0.4 + width * (i + 0.5) for rank in range(n)]
            ax.bar(xs, [b / 2**20 for b in mem["peak_activation_bytes_per_stage"]], width,
                   label=f"M={r['config']['microbatches']}", color=plt.cm.viridis(i / max(1, len(mine) - 1) * 0.85))
            theory_b = [k * b / 2**20 for k, b in zip(mem["theory_peak_microbatches_per_stage"],
                                                       mem["activation_bytes_per_microbatch_per_stage"])]
            ax.plot(xs, theory_b, "_", color="black", ms=width * 40, mew=2)
        ax.plot([], [], "_", color="black", mew=2, label="theory")
        ax.set_title(f"{s}, N={n}", fontsize=9)
        ax.set_xticks(range(n), [f"rank {r}" for r in range(n)])
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("peak activation memory (MiB)")
    fig.suptitle(f"Activations held for backward, per rank\n{provenance(ok)}", fontsize=9)
    return _save(fig, path)


def checkpointing_tradeoff(runs: list[dict], path: Path) -> Path | None:
    """Each config run with and without checkpointing: peak activation memory (largest
    rank) and step time side by side."""
    ok = [r for r in runs if r["status"] == "ok"]

    def key(r: dict) -> tuple:
        c = r["config"]
        return (c["schedule"]["name"], c["pp"], c["microbatches"], c["microbatch_size"], c["compute"])

    on = {key(r): r for r in ok if r["config"].get("checkpointing")}
    off = {key(r): r for r in ok if not r["config"].get("checkpointing")}
    pairs = sorted(k for k in on if k in off)
    if not pairs:
        return None
    labels = [f"{s} N={n} M={m}" for s, n, m, *_ in pairs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 0.45 * len(pairs) + 2.2))
    y = range(len(pairs))
    for ax, metric, unit, scale in ((a1, "memory", "peak activation MiB (largest rank)", 2**-20),
                                    (a2, "time", "step time (ms)", 1e3)):
        for dy, runs_by, name, color in ((-0.2, off, "off", "#4c72b0"), (0.2, on, "on", "#dd8452")):
            vals = [(max(runs_by[k]["metrics"]["memory"]["peak_activation_bytes_per_stage"]) if metric == "memory"
                     else runs_by[k]["metrics"]["step_time_s"]) * scale for k in pairs]
            ax.barh([i + dy for i in y], vals, 0.4, label=f"checkpointing {name}", color=color)
        ax.set_xlabel(unit)
        ax.set_yticks(list(y), labels if ax is a1 else [""] * len(pairs))
        ax.invert_yaxis()
    a1.legend(fontsize=7)
    shown = [runs_by[k] for k in pairs for runs_by in (on, off)]
    fig.suptitle(f"Checkpointing: memory saved against step time lost\n{provenance(shown)}", fontsize=9)
    return _save(fig, path)
