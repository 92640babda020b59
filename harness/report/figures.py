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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".svg"))
    plt.close(fig)
    return path
