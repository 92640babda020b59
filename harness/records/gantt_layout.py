"""What the Gantt chart of one step shows and where, shared by its two renderers (the PNG,
gantt_png.py; the matplotlib Figure for SVG and the report, gantt.py): the bars grouped by kind,
the figure's size, the axes' place in it and their limits, the microbatch numbers that fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from harness.measure.trace import COMPUTE, Trace, events_of_step

COLORS = {"F": "#4c72b0", "B": "#55a868", "I": "#64b5cd", "W": "#8172b2", "R": "#dd8452", "optim": "#555555",
          "recv": "#dddddd", "dp_sync": "#c44e52",
          "tp_sync": "#937860"}
LABELS = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weight)", "R": "recompute",
          "recv": "waiting in recv", "dp_sync": "gradient all-reduce",
          "tp_sync": "TP gradient sync", "optim": "optimizer"}
DPI = 110
# font sizes (points): microbatch numbers, rank labels and the legend, the title, the x axis
FONT_PT, LABEL_PT, TITLE_PT, AXIS_PT = 6, 7, 9, 10
# At most this many microbatch numbers are drawn (those on bars wide enough to hold them);
# above it none: a chart that dense is read by its colors.
MAX_LABELS = 2000
# White edges between neighbouring bars, dropped when the median compute bar is narrower than
# this (points): 0.5 pt edges on 1 pt bars would wash the chart out.
EDGE_MIN_BAR_PT = 3.0
COMPUTE_HALF, THIN_HALF = 0.4, 0.15  # half a bar's height, in rows: compute; waits and syncs


class Bars(NamedTuple):
    """The bars of one kind and height: times in ms since the step's start."""
    x0: np.ndarray
    x1: np.ndarray
    row: np.ndarray  # the rank, as float
    microbatch: np.ndarray
    half: float
    kind: str
    compute: bool


@dataclass(frozen=True)
class Chart:
    """One step's chart, laid out: what either renderer draws, in data units and figure fractions."""
    groups: list[Bars]  # waits and syncs (thin) first, compute over them
    ranks: list[int]
    kinds: list[str]  # the legend's, in LABELS' order
    row_labels: list[str]  # "rank r\n<its layers>", one per rank
    title: str
    width: float  # inches
    height: float
    xlim: tuple[float, float]
    ylim: tuple[float, float]  # (bottom, top): inverted, rank 0 on top
    box: tuple[float, float, float, float]  # the axes: left, bottom, right, top, as fractions of the figure

    @property
    def pt_per_ms(self) -> float:
        return (self.box[2] - self.box[0]) * self.width * 72 / (self.xlim[1] - self.xlim[0])

    @property
    def pt_per_row(self) -> float:
        return (self.box[3] - self.box[1]) * self.height * 72 / abs(self.ylim[1] - self.ylim[0])

    def median_compute_ms(self) -> float | None:
        widths = [g.x1 - g.x0 for g in self.groups if g.compute]
        return float(np.median(np.concatenate(widths))) if widths else None

    def edges(self) -> bool:
        """White edges between the compute bars: only where they are wide enough."""
        median = self.median_compute_ms()
        return median is not None and median * self.pt_per_ms >= EDGE_MIN_BAR_PT


def chart(trace: Trace, step: int, stage_labels: dict[int, str], title: str) -> Chart:
    """The chart of `step`: one row per rank, labelled with `stage_labels` (its layers); 6 to 16
    inches wide (a quarter inch per action of the first rank), 0.6 inch a rank high."""
    ev = events_of_step(trace, step)
    if not ev:
        raise ValueError(f"no events in step {step}")
    n = len(ev)  # columns of the events, each read in one pass at C speed
    start, end = (np.fromiter(map(attrgetter(a), ev), float, n) for a in ("start", "end"))
    rank = np.fromiter(map(attrgetter("rank"), ev), float, n)
    microbatch = np.fromiter(map(attrgetter("microbatch"), ev), np.int64, n)
    kinds = list(map(attrgetter("kind"), ev))
    code = {k: i for i, k in enumerate(dict.fromkeys(kinds))}  # kinds in order of appearance
    kind = np.fromiter(map(code.__getitem__, kinds), np.int64, n)
    compute = np.fromiter(map(COMPUTE.__eq__, map(attrgetter("cat"), ev)), bool, n)
    ranks = np.unique(rank).astype(int).tolist()
    t0 = float(start.min())
    width = max(6.0, min(16.0, 0.25 * int(np.count_nonzero(rank == ranks[0]))))
    height = 0.6 * len(ranks) + 1.4

    groups = []  # per kind drawn, and per category (compute full height, else thin)
    for k, i in code.items():
        if k not in COLORS:
            continue
        of_kind = kind == i
        for full in (False, True):
            sel = of_kind & (compute == full)
            if sel.any():
                groups.append(Bars((start[sel] - t0) * 1e3, (end[sel] - t0) * 1e3, rank[sel], microbatch[sel],
                                   COMPUTE_HALF if full else THIN_HALF, k, full))
    groups.sort(key=attrgetter("compute"))  # waits and syncs (thin) under compute

    # axis limits as barh would autoscale them: x from the first bar's left edge (sticky) to 5%
    # past the last end, y 5% beyond the bars, inverted (rank 0 on top)
    if groups:
        lo = min(float(g.x0.min()) for g in groups)
        hi = max(float(g.x1.max()) for g in groups)
        ylo = min(float(g.row.min()) - g.half for g in groups)
        yhi = max(float(g.row.max()) + g.half for g in groups)
    else:
        lo, hi, ylo, yhi = 0.0, 1.0, ranks[0] - COMPUTE_HALF, ranks[-1] + COMPUTE_HALF
    hi = hi if hi > lo else lo + 1.0
    pad = 0.05 * (yhi - ylo)
    row_labels = [f"rank {r}\n{stage_labels.get(r, '')}" for r in ranks]
    return Chart(groups, ranks, [k for k in LABELS if k in code], row_labels, title, width, height,
                 (lo, hi + 0.05 * (hi - lo)), (yhi + pad, ylo - pad),
                 _margins(width, height, row_labels, title.count("\n") + 1))


def _margins(width: float, height: float, row_labels: list[str], title_lines: int) -> tuple:
    """The axes' box (left, bottom, right, top; fractions of the figure): what tight_layout
    would leave around them, from the text sizes alone (tight_layout measures every label by
    drawing the figure, a third of a matplotlib chart's time). Widths are estimated at 0.6 em
    a character (DejaVu Sans averages ~0.55)."""
    chars = max(len(line) for label in row_labels for line in label.split("\n"))
    left = (chars * 0.6 * LABEL_PT + 14) / 72 / width  # tick labels and their ticks
    top = 1 - (title_lines * TITLE_PT * 1.2 + 8) / 72 / height
    bottom = 0.07 + (2 * AXIS_PT * 1.2 + 6) / 72 / height  # above the legend: tick labels and the x label
    return min(left, 0.4), bottom, 1 - 8 / 72 / width, top


@lru_cache(maxsize=4096)
def ink_width_pt(text: str) -> float:
    """A microbatch number's ink width at FONT_PT, from its glyph outlines (matplotlib's
    TextPath): both renderers label the same bars."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    return TextPath((0, 0), text, size=FONT_PT, prop=FontProperties()).get_extents().width


def microbatch_labels(c: Chart) -> list[tuple[float, float, str]]:
    """(x in ms, row, text): the microbatch number of each compute bar wide enough to hold it
    (its ink and 1 pt to spare each side); none when the rows are too low for the font or
    there would be more than MAX_LABELS."""
    compute = [g for g in c.groups if g.compute]
    if not compute or c.pt_per_row * 0.8 < FONT_PT + 1:
        return []
    x0, x1, y, mb = (np.concatenate([g[i] for g in compute]) for i in range(4))
    bar_pt = (x1 - x0) * c.pt_per_ms
    cand = np.flatnonzero((mb >= 0) & (bar_pt >= FONT_PT / 2 + 2))  # narrower than a digit: none
    keep = [i for i in cand.tolist() if ink_width_pt(str(mb[i])) + 2 <= bar_pt[i]]
    if len(keep) > MAX_LABELS:
        return []
    return [(float(x0[i] + x1[i]) / 2, float(y[i]), str(mb[i])) for i in keep]
