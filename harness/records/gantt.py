"""The Gantt chart of one step: one row per rank, one bar per action, colored by kind.

Laid out once (gantt_layout.py), drawn by one of two renderers: the PNG every job writes, drawn
into a numpy array (gantt_png.py: 8x cheaper than the matplotlib figure at 16,384 actions, whose
fixed cost was most of a job's records), and a matplotlib Figure for SVG and for the report
(here), with the same size, axes, limits, ticks and colours. In the Figure the bars of one kind are one
compound path (one PathPatch) and the microbatch numbers one collection of glyph outlines;
bars narrower than a pixel are one image of their pixels (gantt_raster.py). (One barh and one
Text per action cost ~3 ms each: a step of pp=16, M=256 interleaved took 40 s.)
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.records.atomic import write_atomic
from harness.records.gantt_layout import (AXIS_PT, COLORS, DPI, FONT_PT, LABEL_PT, LABELS, TITLE_PT, Chart, chart,
                                          microbatch_labels)
from harness.records.gantt_png import write_png
from harness.records.gantt_raster import raster
from harness.measure.trace import Trace

__all__ = ["COLORS", "DPI", "LABELS", "gantt_figure", "plot_gantt"]

# Drawn as an image when the median compute bar is narrower than this (pixels): the paths would
# paint the same pixels, at ~10 us a bar
RASTER_BELOW_PX = 1.0


def plot_gantt(path: Path, trace: Trace, step: int, stage_labels: dict[int, str], title: str) -> None:
    """The chart of `step` written to `path`, in its suffix's format (.png by gantt_png.py,
    anything else, e.g. .svg, by matplotlib's savefig), atomically: a temporary file in the
    same directory, fsync'd, then renamed."""
    c = chart(trace, step, stage_labels, title)
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    if fmt == "png":
        write_atomic(Path(path), lambda f: write_png(c, f), binary=True)
        return
    fig = _figure(c)
    write_atomic(Path(path), lambda f: fig.savefig(f, format=fmt, dpi=DPI), binary=True)


def gantt_figure(trace: Trace, step: int, stage_labels: dict[int, str], title: str):
    """The timeline of one step, one row per rank (labelled with the layers it holds: the
    stage boundaries); compute full height, waits and syncs thin; a legend of the kinds
    present. A matplotlib Figure (no pyplot: nothing global is touched)."""
    return _figure(chart(trace, step, stage_labels, title))


def _figure(c: Chart):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, PathPatch
    from matplotlib.path import Path as MPath

    fig = Figure(figsize=(c.width, c.height), dpi=DPI)
    FigureCanvasAgg(fig)  # the layout's text metrics at the dpi the PNG is drawn at, cached for it
    ax = fig.add_subplot()
    ax.set_xlim(*c.xlim)
    ax.set_ylim(*c.ylim)
    ax.set_yticks(c.ranks, c.row_labels, fontsize=LABEL_PT)
    ax.set_xlabel("ms since step start", labelpad=2, fontsize=AXIS_PT)
    # y given: where matplotlib would put it (no ticks on top), without measuring every tick label
    ax.set_title(c.title, fontsize=TITLE_PT, loc="left", y=1.0)
    fig.legend(handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in c.kinds],
               loc="lower center", ncol=7, fontsize=LABEL_PT, frameon=False)
    left, bottom, right, top = c.box
    fig.subplots_adjust(left=left, bottom=bottom, right=right, top=top)

    median = c.median_compute_ms()
    if median is not None and median * c.pt_per_ms * DPI / 72 < RASTER_BELOW_PX:
        # narrower than a pixel: what the rectangles would paint, painted directly (Agg draws a
        # path per bar: half a second at 65k bars; this is one array)
        w, h = (right - left) * c.width * DPI, (top - bottom) * c.height * DPI
        img = raster(c, max(1, int(round(w))), max(1, int(round(h))), edges=False)
        fig.figimage(img, xo=left * c.width * DPI, yo=bottom * c.height * DPI, origin="upper", zorder=1)
        return fig
    edges = c.edges()
    for g in c.groups:
        # add_artist, not add_patch: the limits are set, and add_patch would walk every segment
        ax.add_artist(PathPatch(_rects(MPath, g.x0, g.x1, g.row - g.half, g.row + g.half), facecolor=COLORS[g.kind],
                                edgecolor="white" if g.compute and edges else "none", linewidth=0.5))
    labels = _labels(fig, ax, c)
    if labels is not None:
        ax.add_collection(labels, autolim=False)
    return fig


def _rects(MPath, x0, x1, y0, y1):
    """One path of n closed rectangles (nonzero fill; each one stroked)."""
    n = len(x0)
    v = np.empty((n, 5, 2))
    v[:, 0, 0] = v[:, 3, 0] = v[:, 4, 0] = x0
    v[:, 1, 0] = v[:, 2, 0] = x1
    v[:, 0, 1] = v[:, 1, 1] = v[:, 4, 1] = y0
    v[:, 2, 1] = v[:, 3, 1] = y1
    codes = np.full((n, 5), MPath.LINETO, dtype=MPath.code_type)
    codes[:, 0], codes[:, 4] = MPath.MOVETO, MPath.CLOSEPOLY
    return MPath(v.reshape(-1, 2), codes.reshape(-1))


@lru_cache(maxsize=4096)
def _glyphs(text: str):
    """The label's outline centred on (0, 0), in points."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    from matplotlib.transforms import Affine2D

    p = TextPath((0, 0), text, size=FONT_PT, prop=FontProperties())
    ext = p.get_extents()
    return p.transformed(Affine2D().translate(-(ext.x0 + ext.x1) / 2, -(ext.y0 + ext.y1) / 2))


def _labels(fig, ax, c: Chart):
    """The microbatch numbers that fit, white, as one PathCollection of glyph outlines; None
    when none fit."""
    spots = microbatch_labels(c)
    if not spots:
        return None
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Affine2D

    # outlines in points -> pixels at whatever dpi the figure is drawn at; placed at data offsets
    return PathCollection([_glyphs(text) for _x, _y, text in spots], offsets=[(x, y) for x, y, _t in spots],
                          offset_transform=ax.transData,
                          transform=Affine2D().scale(1 / 72) + fig.dpi_scale_trans,
                          facecolors="white", edgecolors="none", linewidths=0, zorder=3)
