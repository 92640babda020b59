"""advice.png: predicted throughput against peak memory per GPU, one colour per schedule, the
Pareto front, the best point, the usable memory per GPU as a line. The axes are the fitting
points' (and the line's), with a margin: points over the budget would stretch them to where
nothing can run (a 70B search's go to hundreds of GiB), so they are counted in a note on the
figure instead of drawn."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.records.atomic import write_atomic

from .search import GIB, Prediction, Problem, Ranking

MARGIN = 0.06  # of each axis' span, on both sides


@dataclass(frozen=True)
class Frame:
    xlim: tuple[float, float]  # GiB
    ylim: tuple[float, float]  # tokens (or samples) per second
    left_out: str | None  # what is not drawn, in words (None: every point is)


def _span(lo: float, hi: float, floor: float = 0.0) -> tuple[float, float]:
    pad = MARGIN * (hi - lo) if hi > lo else 0.05 * abs(hi) or 1.0  # one point: a window around it
    return max(floor, lo - pad), hi + pad


def left_out(p: Problem, r: Ranking) -> str | None:
    """`N points over the X GiB budget (up to Y GiB) not drawn`, or None when all fit."""
    over = [x for x in r.predictions if not x.fits]
    if not over:
        return None
    return (f"{len(over):,} point{'s' if len(over) > 1 else ''} over the {p.cluster.usable_bytes / GIB:.1f} GiB "
            f"budget (up to {max(x.memory.peak for x in over) / GIB:.1f} GiB) not drawn")


def frame(p: Problem, r: Ranking) -> Frame:
    """The axes' limits: the fitting points' memory and the usable-memory line on x, their
    throughput on y, each with a margin."""
    k = p.tokens_per_sample or 1
    fit = r.fitting
    mem = [x.memory.peak / GIB for x in fit]
    tput = [x.throughput_samples_s * k for x in fit]
    return Frame(_span(min(mem), max(max(mem), p.cluster.usable_bytes / GIB)), _span(min(tput), max(tput)),
                 left_out(p, r))


def _xy(xs: list[Prediction], k: int) -> tuple[list[float], list[float]]:
    return [x.memory.peak / GIB for x in xs], [x.throughput_samples_s * k for x in xs]


def figure(p: Problem, r: Ranking, path: Path, title: str) -> Frame:
    """Draw advice.png at `path`; returns the limits the axes were drawn with, read back from them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    k = p.tokens_per_sample or 1
    want = frame(p, r)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    schedules = sorted({x.point.schedule for x in r.fitting})
    colors = dict(zip(schedules, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for s in schedules:
        ax.scatter(*_xy([x for x in r.fitting if x.point.schedule == s], k), s=8, color=colors[s], alpha=0.6,
                   label=f"{s} ({sum(x.point.schedule == s for x in r.fitting)})")
    front = sorted((x for x in r.fitting if x.pareto), key=lambda x: x.memory.peak)
    ax.plot(*_xy(front, k), "k.-", lw=1, label="Pareto front")
    best = r.fitting[0]
    ax.scatter(*_xy([best], k), marker="*", s=220, c="gold", edgecolors="k", zorder=5,
               label=f"best: {best.point.label()}")
    ax.axvline(p.cluster.usable_bytes / GIB, color="r", ls="--", lw=1,
               label=f"usable memory per GPU ({p.cluster.usable_bytes / GIB:.1f} GiB)")
    ax.set_xlim(*want.xlim)
    ax.set_ylim(*want.ylim)
    ax.set_xlabel("peak memory on the fullest GPU (GiB, predicted)")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_ylabel(("tokens" if p.tokens_per_sample else "samples") + " per second (predicted)")
    ax.set_title(f"{title}\n{p.cluster.name}, global batch {p.global_batch}: {len(r.fitting):,} of "
                 f"{len(r.predictions):,} points fit (simulated)", fontsize=9)
    # what is not drawn heads the legend: it goes where the points leave room
    ax.legend(fontsize=7, loc="best", title=want.left_out, title_fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format=Path(path).suffix.lstrip(".") or "png", dpi=120), binary=True)
    drawn = Frame(tuple(ax.get_xlim()), tuple(ax.get_ylim()), want.left_out)
    plt.close(fig)
    return drawn
