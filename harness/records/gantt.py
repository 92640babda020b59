"""The Gantt chart of one step: one row per rank, one bar per action, colored by kind.

Drawn in time linear in the step's events with a few artists whatever their number: the
bars of one kind are one compound path (one PathPatch), and the microbatch numbers are one
collection of glyph outlines, placed only on bars wide enough to hold them. (One barh and one
Text per action cost ~3 ms each: a step of pp=16, M=256 interleaved took 40 s.)
"""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path

import numpy as np

from harness.records.atomic import write_atomic
from harness.measure.trace import COMPUTE, Trace, events_of_step

COLORS = {"F": "#4c72b0", "B": "#55a868", "I": "#64b5cd", "W": "#8172b2", "R": "#dd8452", "optim": "#555555",
          "recv": "#dddddd", "dp_sync": "#c44e52",
          "tp_sync": "#937860"}
LABELS = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weight)", "R": "recompute",
          "recv": "waiting in recv", "dp_sync": "gradient all-reduce",
          "tp_sync": "TP gradient sync", "optim": "optimizer"}
DPI = 110
FONT_PT = 6  # microbatch numbers
# At most this many microbatch numbers are drawn (those on bars wide enough to hold them);
# above it none: a chart that dense is read by its colors.
MAX_LABELS = 2000
# White edges between neighbouring bars, dropped when the median compute bar is narrower than
# this (points): 0.5 pt edges on 1 pt bars would wash the chart out.
EDGE_MIN_BAR_PT = 3.0
# Drawn as an image when the median compute bar is narrower than this (pixels): the paths would
# paint the same pixels, at ~10 us a bar
RASTER_BELOW_PX = 1.0


def plot_gantt(path: Path, trace: Trace, step: int, stage_labels: dict[int, str], title: str) -> None:
    """gantt_figure written to `path`, in its suffix's format (.png, .svg), atomically: a
    temporary file in the same directory, fsync'd, then renamed. A PNG of bars narrower than
    a pixel is the figure drawn without them and their pixels pasted in (matplotlib's image
    path would resample and mask the array: half a second at 65k bars)."""
    fig, raster = _figure(trace, step, stage_labels, title)
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    if fmt == "png":  # the renderer's pixels, encoded by PIL at the fastest compression
        write_atomic(Path(path), lambda f: _paste_png(fig, raster, f), binary=True)
        return
    if raster is not None:
        _place(fig, raster)
    write_atomic(Path(path), lambda f: fig.savefig(f, format=fmt, dpi=DPI), binary=True)


def gantt_figure(trace: Trace, step: int, stage_labels: dict[int, str], title: str):
    """The timeline of one step, one row per rank (labelled with the layers it holds: the
    stage boundaries); compute full height, waits and syncs thin; a legend of the kinds
    present. A matplotlib Figure (no pyplot: nothing global is touched)."""
    fig, raster = _figure(trace, step, stage_labels, title)
    if raster is not None:
        _place(fig, raster)
    return fig


def _place(fig, raster: tuple) -> None:
    img, x0, y0 = raster
    fig.figimage(img, xo=x0, yo=y0, origin="upper", zorder=1)


def _paste_png(fig, raster: tuple | None, f) -> None:
    """The figure drawn, the raster's bars (if any) pasted into its pixels, written as PNG:
    the pixels savefig would write (same Agg renderer), compressed faster: savefig's default
    level took ~a sixth of a 16k-bar chart's time; level 1 writes files ~25% larger."""
    from PIL import Image

    fig.canvas.draw()
    buf = np.asarray(fig.canvas.buffer_rgba())  # the renderer's own pixels, written in place
    if raster is not None:
        img, x0, y0 = raster
        h, w = img.shape[:2]
        top, left = buf.shape[0] - int(round(y0)) - h, int(round(x0))
        region = buf[max(top, 0):top + h, max(left, 0):left + w]
        img = img[:region.shape[0], :region.shape[1]]
        np.copyto(region, img, where=img[..., 3:] > 0)
    Image.fromarray(buf).save(f, format="png", dpi=(DPI, DPI), compress_level=1)


def _figure(trace: Trace, step: int, stage_labels: dict[int, str], title: str) -> tuple:
    """(the Figure, the bars as (RGBA pixels, left, bottom) where they are drawn as an image, else None)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, PathPatch
    from matplotlib.path import Path as MPath

    ev = events_of_step(trace, step)
    if not ev:
        raise ValueError(f"no events in step {step}")
    rank_of = list(map(attrgetter("rank"), ev))
    ranks = sorted(set(rank_of))
    t0 = min(map(attrgetter("start"), ev))
    width = max(6.0, min(16.0, 0.25 * rank_of.count(ranks[0])))

    by_kind: dict[str, list] = {}  # one pass; then per kind, split by category if it has two
    for e in ev:
        lst = by_kind.get(e.kind)
        if lst is None:
            lst = by_kind[e.kind] = []
        lst.append(e)
    groups = []  # (x0, x1 in ms since the step's start, row, microbatch, half height, kind, compute?)
    for kind, lst in by_kind.items():
        if kind not in COLORS:
            continue
        cats = {e.cat for e in lst}
        for compute in sorted({c == COMPUTE for c in cats}):
            sel = lst if len(cats) == 1 else [e for e in lst if (e.cat == COMPUTE) == compute]
            groups.append(((np.array([e.start for e in sel]) - t0) * 1e3, (np.array([e.end for e in sel]) - t0) * 1e3,
                           np.array([e.rank for e in sel], dtype=float), np.array([e.microbatch for e in sel]),
                           0.4 if compute else 0.15, kind, compute))
    groups.sort(key=lambda g: g[6])  # waits and syncs (thin) under compute

    fig = Figure(figsize=(width, 0.6 * len(ranks) + 1.4), dpi=DPI)
    FigureCanvasAgg(fig)  # the layout's text metrics at the dpi the PNG is drawn at, cached for it
    ax = fig.add_subplot()

    # axis limits as barh would autoscale them: x from the first bar's left edge (sticky) to 5%
    # past the last end, y 5% beyond the bars, inverted (rank 0 on top)
    if groups:
        lo = min(float(g[0].min()) for g in groups)
        hi = max(float(g[1].max()) for g in groups)
        ylo = min(float(g[2].min()) - g[4] for g in groups)
        yhi = max(float(g[2].max()) + g[4] for g in groups)
    else:
        lo, hi, ylo, yhi = 0.0, 1.0, ranks[0] - 0.4, ranks[-1] + 0.4
    hi = hi if hi > lo else lo + 1.0
    ax.set_xlim(lo, hi + 0.05 * (hi - lo))
    pad = 0.05 * (yhi - ylo)
    ax.set_ylim(yhi + pad, ylo - pad)
    ax.set_yticks(ranks, [f"rank {r}\n{stage_labels.get(r, '')}" for r in ranks], fontsize=7)
    ax.set_xlabel("ms since step start", labelpad=2)
    # y given: where matplotlib would put it (no ticks on top), without measuring every tick label
    ax.set_title(title, fontsize=9, loc="left", y=1.0)
    fig.legend(handles=[Patch(color=COLORS[k], label=label) for k, label in LABELS.items() if k in by_kind],
               loc="lower center", ncol=7, fontsize=7, frameon=False)
    _margins(fig, width, [f"rank {r}\n{stage_labels.get(r, '')}" for r in ranks], title.count("\n") + 1)

    # points per ms and per row, now that tight_layout has placed the axes
    box = ax.get_position()
    x_lim, y_lim = ax.get_xlim(), ax.get_ylim()
    pt_per_ms = box.width * width * 72 / (x_lim[1] - x_lim[0])
    pt_per_row = box.height * fig.get_figheight() * 72 / abs(y_lim[1] - y_lim[0])
    compute_w = [g[1] - g[0] for g in groups if g[6]]
    edges = bool(compute_w) and float(np.median(np.concatenate(compute_w))) * pt_per_ms >= EDGE_MIN_BAR_PT

    px_per_ms = pt_per_ms * DPI / 72
    if compute_w and float(np.median(np.concatenate(compute_w))) * px_per_ms < RASTER_BELOW_PX:
        # narrower than a pixel: what the rectangles would paint, painted directly (Agg draws a
        # path per bar: half a second at 65k bars; this is one array)
        img = _raster(ax, groups, box.width * width * DPI, box.height * fig.get_figheight() * DPI)
        return fig, (img, box.x0 * width * DPI, box.y0 * fig.get_figheight() * DPI)
    for x0, x1, y, _mb, h, kind, compute in groups:
        # add_artist, not add_patch: the limits are set, and add_patch would walk every segment
        ax.add_artist(PathPatch(_rects(MPath, x0, x1, y - h, y + h), facecolor=COLORS[kind],
                                edgecolor="white" if compute and edges else "none", linewidth=0.5))
    labels = _labels(fig, ax, [g for g in groups if g[6]], pt_per_ms, pt_per_row)
    if labels is not None:
        ax.add_collection(labels, autolim=False)
    return fig, None


def _margins(fig, width: float, ylabels: list[str], title_lines: int) -> None:
    """What tight_layout would leave around the axes, from the text sizes alone: it measures
    every label by drawing the figure, a third of the chart's time. Widths are estimated at
    0.6 em a character (DejaVu Sans averages ~0.55)."""
    height = fig.get_figheight()
    chars = max(len(line) for label in ylabels for line in label.split("\n"))
    left = (chars * 0.6 * 7 + 14) / 72 / width  # tick labels (7 pt) and their ticks
    top = 1 - (title_lines * 9 * 1.2 + 8) / 72 / height  # the title (9 pt)
    bottom = 0.07 + (2 * 10 * 1.2 + 6) / 72 / height  # above the legend: tick labels and the x label
    fig.subplots_adjust(left=min(left, 0.4), right=1 - 8 / 72 / width, top=top, bottom=bottom)


def _coverage(x0: np.ndarray, x1: np.ndarray, row: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[row, pixel] the share of each pixel column its bars cover (bars in pixel units)."""
    x0, x1 = np.clip(x0, 0, width), np.clip(x1, 0, width)
    i0, i1 = np.minimum(x0.astype(int), width - 1), np.minimum(x1.astype(int), width - 1)
    cov = np.zeros((rows, width + 1))
    one = i0 == i1
    np.add.at(cov, (row[one], i0[one]), x1[one] - x0[one])
    many = ~one  # a partial first pixel, whole pixels between, a partial last one
    np.add.at(cov, (row[many], i0[many]), i0[many] + 1 - x0[many])
    np.add.at(cov, (row[many], i1[many]), x1[many] - i1[many])
    full = np.zeros((rows, width + 1))
    np.add.at(full, (row[many], i0[many] + 1), 1.0)
    np.add.at(full, (row[many], i1[many]), -1.0)
    return np.minimum(cov[:, :width] + np.cumsum(full, axis=1)[:, :width], 1.0)


def _raster(ax, groups: list, width_px: float, height_px: float) -> np.ndarray:
    """The bars as one RGBA image of the axes' size in pixels: each pixel the colours of the
    kinds that cover it, in proportion to the time each covers (a 1F1B steady state of
    sub-pixel bars shows its forward and backward shares); waits and syncs under compute, in
    their thin band; transparent where nothing is."""
    from matplotlib.colors import to_rgb

    W, H = max(1, int(round(width_px))), max(1, int(round(height_px)))
    (xl, xr), (yb, yt) = ax.get_xlim(), ax.get_ylim()  # y inverted: yt (top) < yb
    rows = np.unique(np.concatenate([g[2] for g in groups]))
    colour = np.zeros((2, len(rows), W, 3))  # [thin, full] summed colour x coverage
    share = np.zeros((2, len(rows), W))
    half = [0.0, 0.0]
    for x0, x1, y, _mb, h, kind, compute in groups:
        cov = _coverage((x0 - xl) / (xr - xl) * W, (x1 - xl) / (xr - xl) * W, np.searchsorted(rows, y), len(rows), W)
        share[int(compute)] += cov
        colour[int(compute)] += cov[..., None] * np.array(to_rgb(COLORS[kind]))
        half[int(compute)] = h
    # Every pixel row of a rank row's band shows the same line: each line computed once, then the
    # rows filled with it. Where the bands overlap, the thin kinds (waits: what a rank does while
    # not computing) fill the time compute leaves, so each kind shows in proportion to its time.
    mean, alpha = [], []
    for band in (0, 1):
        # the mean colour of the kinds covering a pixel, weighted by time; their coverage
        mean.append(colour[band] / np.maximum(share[band], 1e-12)[..., None])
        alpha.append(np.minimum(share[band], 1.0)[..., None])
    thin_on, compute_on = alpha[0] > 0, alpha[1] > 0
    thin = mean[0] * alpha[0] + (1 - alpha[0])
    over_white = mean[1] * alpha[1] + (1 - alpha[1])
    fill = np.minimum(alpha[0], 1 - alpha[1])
    over_thin = mean[1] * alpha[1] + mean[0] * fill + (1 - alpha[1] - fill)

    def rgba(rgb: np.ndarray, on: np.ndarray) -> np.ndarray:
        return np.concatenate([np.where(on, np.round(rgb * 255), 0), np.where(on, 255, 0)], axis=-1).astype(np.uint8)

    painted = [rgba(thin, thin_on), rgba(over_white, compute_on), rgba(over_thin, compute_on | thin_on)]
    img = np.zeros((H, W, 4), dtype=np.uint8)
    for i, row in enumerate(rows):
        spans = []
        for band in (0, 1):
            r0 = max(int(np.floor((row - half[band] - yt) / (yb - yt) * H)), 0)
            spans.append((r0, max(min(int(np.ceil((row + half[band] - yt) / (yb - yt) * H)), H), r0 + 1)))
        (t0, t1), (c0, c1) = spans
        img[t0:t1] = painted[0][i]
        img[c0:c1] = painted[1][i]
        lo, hi = max(t0, c0), min(t1, c1)
        if lo < hi:
            img[lo:hi] = painted[2][i]
    return img


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


_GLYPHS: dict[str, tuple] = {}  # label -> (its outline centred on (0, 0), in points; its width in points)


def _glyphs(text: str) -> tuple:
    g = _GLYPHS.get(text)
    if g is None:
        from matplotlib.font_manager import FontProperties
        from matplotlib.textpath import TextPath
        from matplotlib.transforms import Affine2D

        p = TextPath((0, 0), text, size=FONT_PT, prop=FontProperties())
        ext = p.get_extents()
        g = _GLYPHS[text] = (p.transformed(Affine2D().translate(-(ext.x0 + ext.x1) / 2, -(ext.y0 + ext.y1) / 2)),
                             ext.width)
    return g


def _labels(fig, ax, groups: list, pt_per_ms: float, pt_per_row: float):
    """The microbatch number on each compute bar wide enough to hold it (1 pt to spare each
    side), white, as one PathCollection of glyph outlines; None when there are none, the rows
    are too low, or there would be more than MAX_LABELS."""
    if not groups or pt_per_row * 0.8 < FONT_PT + 1:
        return None
    x0, x1, y, mb = (np.concatenate([g[i] for g in groups]) for i in range(4))
    width_pt = (x1 - x0) * pt_per_ms
    cand = np.flatnonzero((mb >= 0) & (width_pt >= FONT_PT / 2 + 2))  # narrower than a digit: none
    keep = [i for i in cand.tolist() if _glyphs(str(mb[i]))[1] + 2 <= width_pt[i]]
    if not keep or len(keep) > MAX_LABELS:
        return None
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Affine2D

    idx = np.asarray(keep)
    # outlines in points -> pixels at whatever dpi the figure is drawn at; placed at data offsets
    return PathCollection([_glyphs(str(m))[0] for m in mb[idx].tolist()],
                          offsets=np.column_stack(((x0[idx] + x1[idx]) / 2, y[idx])), offset_transform=ax.transData,
                          transform=Affine2D().scale(1 / 72) + fig.dpi_scale_trans,
                          facecolors="white", edgecolors="none", linewidths=0, zorder=3)
