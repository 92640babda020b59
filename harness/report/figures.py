"""What every figure shares: the Figure record (what it shows, which runs, what is missing),
the provenance line, schedule colours, and saving as PNG + SVG."""

from __future__ import annotations

import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.planning import theory  # noqa: E402
from harness.records.atomic import write_atomic  # noqa: E402
from harness.report.runs import Run, dim, ok, run_ids, schedule_label  # noqa: E402
from harness.schedules.registry import SCHEDULES  # noqa: E402


@dataclass
class Figure:
    title: str
    caption: str  # what it shows and how to read it
    runs: list[Run]  # the runs drawn
    path: Path | None = None  # the PNG (an SVG beside it); None: nothing to draw
    missing: list[str] = field(default_factory=list)  # what is not drawn, and why
    notes: list[str] = field(default_factory=list)  # what a reader must know to read it: model against measured

    @property
    def held(self) -> str:
        return f"{provenance(self.runs)}; runs {run_ids(self.runs)}" if self.runs else "no runs"


PROVENANCE = ("compute", "device", "executor")  # dims (harness/report/runs.py DIMS) saying how times were made


def provenance(runs: list[Run]) -> str:
    """How the runs were made: compute mode, device, executor, tp where it differs, and how many. Where runs
    disagree the line counts each value and says MIXED: their figures are not like for like
    (emulated costs are what was set, real costs what this machine did)."""
    runs = ok(runs)
    parts, mixed = [], []
    for key in PROVENANCE:
        counts = Counter(dim(r, key) for r in runs)
        if len(counts) > 1:
            mixed.append(key)
            parts.append(f"{key}=" + ", ".join(f"{v} ({n})" for v, n in sorted(counts.items())))
        else:
            parts.append(f"{key}={next(iter(counts), '-')}")
    if len(tps := Counter(dim(r, "tp") for r in runs)) > 1:  # named only where the runs differ in it
        parts.append("tp=" + ", ".join(f"{v} ({n})" for v, n in sorted(tps.items())))
    line = "  ".join(parts) + f"  runs={len(runs)}"
    return line + (f"  MIXED {'/'.join(mixed)}: not like for like" if mixed else "")


def schedule_order(labels: set[str]) -> list[str]:
    """Schedule labels (`gpipe`, `interleaved_1f1b v=2`) in the registry's order, GPipe first."""
    order = list(SCHEDULES)
    return sorted(labels, key=lambda s: (order.index(s.split()[0]) if s.split()[0] in order else len(order), s))


def schedule_colors(runs: list[Run]) -> dict[str, tuple]:
    """Each schedule's registered colour; a label seen twice (interleaved_1f1b at two V) or a
    schedule without one gets the next colour no registered schedule uses."""
    taken = {s.color for s in SCHEDULES.values() if s.color}
    spare = (c for c in (matplotlib.colors.to_hex(plt.cm.tab20(i)) for i in range(20)) if c not in taken)
    out, used = {}, set()
    for label in schedule_order({schedule_label(r.cfg) for r in runs}):
        own = getattr(SCHEDULES.get(label.split()[0]), "color", None)
        out[label] = own if own and own not in used else next(spare, "0.5")
        used.add(out[label])
    return out


def theory_or_none(schedule: str, n: int, m: int, v: int) -> float | None:
    try:
        return theory.bubble_fraction(schedule, n, m, v)
    except (KeyError, ValueError):
        return None


def log2_x(ax, values) -> None:
    """A log2 x axis ticked at the values drawn, written as plain numbers (8, not 2^3)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(values)), [str(v) for v in sorted(set(values))])
    ax.minorticks_off()


def say(ax, text: str) -> None:
    """An empty panel says why it is empty."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="0.35", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def save(fig, path: Path, title: str, runs: list[Run]) -> Path:
    """Title with the provenance line, then PNG and SVG side by side."""
    fig.suptitle(f"{title}\n" + textwrap.fill(provenance(runs), int(fig.get_figwidth() * 13)), fontsize=9)
    fig.tight_layout()
    # atomically, never through a link at either name (harness/records/atomic.py)
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True)
    write_atomic(path.with_suffix(".svg"), lambda f: fig.savefig(f, format="svg"), binary=True)
    plt.close(fig)
    return path
