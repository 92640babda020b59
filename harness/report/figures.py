"""Figures of a sweep. Each says how it was made (compute mode, device, executor)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness import theory  # noqa: E402

def provenance(runs: list[dict]) -> str:
    """How the figure's runs were made: compute mode, device, executor, and how many."""
    ok = [r for r in runs if r["status"] == "ok"]
    modes = sorted({r["config"]["compute"] for r in ok})
    devices = sorted({r["env"]["device"] for r in ok if r.get("env")})
    execs = sorted({r["config"]["executor"] for r in ok})
    return f"compute={','.join(modes)}  device={','.join(devices)}  executor={','.join(execs)}  runs={len(ok)}"


SCHEDULE_ORDER = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev", "csv")


def _schedule_colors(names: set[str]) -> dict[str, tuple]:
    ordered = sorted(names, key=lambda s: (SCHEDULE_ORDER.index(s) if s in SCHEDULE_ORDER else 99, s))
    return {s: plt.cm.tab10(i % 10) for i, s in enumerate(ordered)}


def _label(c: dict) -> str:
    name = c["schedule"]["name"]
    return f"{name} v={c['virtual_stages']}" if name == "interleaved_1f1b" else name


def bubble_vs_microbatches(runs: list[dict], path: Path) -> Path | None:
    """Bubble against M, one panel per pipeline depth N, one colour per schedule: its closed
    form as a line, measured as filled points (bars: spread over measured steps), the
    simulator on the run's measured op costs as hollow points."""
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return None
    depths = sorted({r["config"]["pp"] for r in ok})
    colors = _schedule_colors({_label(r["config"]) for r in ok})
    fig, axes = plt.subplots(1, len(depths), figsize=(5.2 * len(depths), 4.2), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], depths):
        mine = [r for r in ok if r["config"]["pp"] == n]
        ms = sorted({r["config"]["microbatches"] for r in mine})
        grid = list(range(min(ms), max(ms) + 1))
        shown: set[str] = set()
        for r in mine:
            c = r["config"]
            label, color = _label(c), colors[_label(c)]
            if label not in shown:
                shown.add(label)
                pts = [(m, theory_or_none(c["schedule"]["name"], n, m, c["virtual_stages"])) for m in grid]
                pts = [(m, t) for m, t in pts if t is not None]
                if pts:
                    ax.plot(*zip(*pts), color=color, lw=1.2, alpha=0.8)
                ax.plot([], [], "o", color=color, label=label)
            b = r["metrics"]["bubble"]
            steps = b.get("measured_per_step") or [b["measured"]]
            m = c["microbatches"]
            ax.errorbar(m, b["measured"], yerr=[[b["measured"] - min(steps)], [max(steps) - b["measured"]]],
                        fmt="o", color=color, ms=5, capsize=2)
            ax.plot(m, b["simulated"], "o", mfc="none", color=color, ms=10, mew=1)
        ax.plot([], [], "-", color="gray", label="theory (closed form)")
        ax.plot([], [], "o", color="gray", label="measured")
        ax.plot([], [], "o", mfc="none", color="gray", ms=10, label="simulated (measured op costs)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("microbatches M")
        ax.set_title(f"N = {n}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("bubble fraction (idle / step window)")
    fig.suptitle(f"Bubble against microbatches\n{provenance(ok)}", fontsize=9)
    return _save(fig, path)


def theory_or_none(schedule: str, n: int, m: int, v: int) -> float | None:
    try:
        return theory.bubble_fraction(schedule, n, m, v)
    except (KeyError, ValueError):
        return None


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
