"""The Gantt chart as a PNG: the bars' pixels (gantt_raster.py), the frame and ticks as slices of
the same array, the text stamped from PIL's glyphs, encoded by png.py.

Why not matplotlib: every job writes this chart, and a matplotlib figure's cost is fixed
whatever the number of bars: the Figure and its axes, tick and text layout, ~80 text artists,
the Agg draw and PNG encode, ~0.2 s in all (a 16,384-action step's chart: 0.23 s CPU, ~0.02 s
of it the bars). Here the text is a few ms of FreeType (matplotlib's own DejaVu Sans) and the
rest numpy. Caching a drawn matplotlib frame and blitting the bars into it was the alternative
weighed: the frame depends on the ranks, their labels, the title and the x range, which differ
job to job, so such a cache would rarely hit. SVG and the report's Figure stay matplotlib's
(gantt.py), laid out from the same Chart, so the two read alike: the same size, axes box,
limits, ticks (matplotlib's own locator), fonts, sizes and colours.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

import numpy as np

from harness.records import png
from harness.records.gantt_layout import (AXIS_PT, COLORS, DPI, FONT_PT, LABEL_PT, LABELS, TITLE_PT, Chart,
                                          microbatch_labels)
from harness.records.gantt_raster import raster

PX_PER_PT = DPI / 72
TICK_PT, PAD_PT, TITLE_PAD_PT, XLABEL_PAD_PT = 3.5, 3.5, 6.0, 2.0  # matplotlib's defaults (labelpad as gantt.py's)
LINE_SPACING = 1.2  # in font sizes, as matplotlib's
BLACK, WHITE = (0, 0, 0), (255, 255, 255)


def write_png(c: Chart, f: BinaryIO) -> None:
    """The chart, drawn into one RGB array. (Drawing with ImageDraw on a PIL copy of the array
    costs two copies of the image, one of them PIL's tobytes: ~25 ms at 4M pixels.)"""
    W, H = round(c.width * DPI), round(c.height * DPI)
    left, right = c.box[0] * W, c.box[2] * W
    top, bottom = (1 - c.box[3]) * H, (1 - c.box[1]) * H  # pixel rows, from the top
    ax_l, ax_t, ax_r, ax_b = round(left), round(top), round(right), round(bottom)
    pixels = np.full((H, W, 3), 255, dtype=np.uint8)
    if c.groups:
        raster(c, ax_r - ax_l, ax_b - ax_t, c.edges(), out=pixels[ax_t:ax_b, ax_l:ax_r])

    def x_px(ms: float) -> float:
        return left + (ms - c.xlim[0]) / (c.xlim[1] - c.xlim[0]) * (right - left)

    def y_px(row: float) -> float:
        return top + (row - c.ylim[1]) / (c.ylim[0] - c.ylim[1]) * (bottom - top)

    for x, row, text in microbatch_labels(c):
        _text(pixels, (x_px(x), y_px(row)), text, FONT_PT, WHITE, "mm")

    tick, pad = TICK_PT * PX_PER_PT, PAD_PT * PX_PER_PT
    line = max(1, round(0.8 * PX_PER_PT))  # matplotlib's 0.8 pt axes and tick lines
    for x0, y0, x1, y1 in ((ax_l, ax_t, ax_r, ax_t), (ax_l, ax_b, ax_r, ax_b), (ax_l, ax_t, ax_l, ax_b),
                           (ax_r, ax_t, ax_r, ax_b)):  # the frame, over the bars
        _fill(pixels, x0, y0, x1 + line, y1 + line, BLACK)

    for r, label in zip(c.ranks, c.row_labels):
        y = round(y_px(r))
        _fill(pixels, ax_l - tick, y, ax_l, y + line, BLACK)
        _text(pixels, (ax_l - tick - pad, y), label, LABEL_PT, BLACK, "rm", "center")

    ticks, texts, offset = x_ticks(c)
    ascent, descent = _ascent(AXIS_PT), _descent(AXIS_PT)
    for t, text in zip(ticks, texts):
        x = round(x_px(t))
        _fill(pixels, x, ax_b, x + line, ax_b + tick, BLACK)
        _text(pixels, (x, ax_b + tick + pad + ascent), text, AXIS_PT, BLACK, "ms")
    labels_end = ax_b + tick + pad + ascent + descent
    if offset:
        _text(pixels, (ax_r, labels_end + ascent), offset, AXIS_PT, BLACK, "rs")
    _text(pixels, ((ax_l + ax_r) / 2, labels_end + XLABEL_PAD_PT * PX_PER_PT + ascent), "ms since step start",
          AXIS_PT, BLACK, "ms")
    _text(pixels, (ax_l, ax_t - TITLE_PAD_PT * PX_PER_PT - _descent(TITLE_PT)), c.title, TITLE_PT, BLACK, "ls")
    _legend(pixels, c)
    png.write_png(pixels, f, DPI)


def x_ticks(c: Chart) -> tuple[list[float], list[str], str]:
    """matplotlib's automatic ticks for the x axis (its locator, as many as fit three font sizes
    apart, at most 9 intervals), their labels, and the offset text ("1e6") where matplotlib's
    ScalarFormatter would write one (ticks of 1e6 and above, or under 1e-4)."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = c.xlim
    axes_pt = (c.box[2] - c.box[0]) * c.width * 72
    nbins = int(np.clip(math.floor(axes_pt / (AXIS_PT * 3)), 1, 9))
    slack = 1e-9 * (hi - lo)
    ticks = [t for t in MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi).tolist()
             if lo - slack <= t <= hi + slack]
    big = max((abs(t) for t in ticks), default=0.0)
    order = math.floor(math.log10(big)) if big > 0 else 0
    scale, offset = (10.0 ** order, f"1e{order}") if order >= 6 or order <= -5 else (1.0, "")
    step = (ticks[1] - ticks[0]) / scale if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    if any(abs(round(t / scale, decimals + 1) - round(t / scale, decimals)) > 1e-12 for t in ticks):
        decimals += 1  # steps of 2.5
    return ticks, [f"{t / scale:.{decimals}f}" for t in ticks], offset


def _fill(pixels: np.ndarray, x0: float, y0: float, x1: float, y1: float, rgb: tuple) -> None:
    """A rectangle, its corners rounded to whole pixels (as matplotlib snaps lines and patches)."""
    pixels[max(round(y0), 0):max(round(y1), 0), max(round(x0), 0):max(round(x1), 0)] = rgb


@lru_cache(maxsize=8)
def _font(pt: float):
    """DejaVu Sans, matplotlib's default font, from matplotlib's own data (no second copy)."""
    import matplotlib
    from PIL import ImageFont

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"),
                              pt * PX_PER_PT)


def _ascent(pt: float) -> float:
    """A line's box above its baseline as matplotlib's layout measures it: the height of "l"."""
    return -_font(pt).getbbox("l", anchor="ls")[1]


def _descent(pt: float) -> float:
    """...and below it: the depth of "p"."""
    return _font(pt).getbbox("p", anchor="ls")[3]


@lru_cache(maxsize=1024)  # the microbatch numbers, tick labels and rank labels recur; a title ~10 KB
def _mask(text: str, pt: float, anchor: str) -> tuple[np.ndarray, int, int]:
    """One line's coverage (0..255) as an array, and its top left relative to the anchor point
    (PIL's anchors: "ls" left on the baseline, "mm" centred, ...)."""
    from PIL import Image, ImageDraw

    font = _font(pt)
    x0, y0, x1, y1 = font.getbbox(text, anchor=anchor)
    img = Image.new("L", (max(1, math.ceil(x1 - x0)), max(1, math.ceil(y1 - y0))))
    ImageDraw.Draw(img).text((-x0, -y0), text, font=font, fill=255, anchor=anchor)
    return np.asarray(img), math.floor(x0), math.floor(y0)


def _stamp(pixels: np.ndarray, x: float, y: float, text: str, pt: float, ink: tuple, anchor: str) -> None:
    """One line blended into the pixels in its ink, by its glyphs' coverage; clipped at the edges."""
    mask, dx, dy = _mask(text, pt, anchor)
    px, py = round(x) + dx, round(y) + dy
    h, w = mask.shape
    x0, y0 = max(px, 0), max(py, 0)
    region = pixels[y0:max(py + h, 0), x0:max(px + w, 0)]
    a = mask[y0 - py:y0 - py + region.shape[0], x0 - px:x0 - px + region.shape[1], None] / np.float32(255)
    region[:] = region * (1 - a) + np.asarray(ink, dtype=np.float32) * a + 0.5


def _text(pixels: np.ndarray, xy: tuple[float, float], text: str, pt: float, ink: tuple, anchor: str,
          align: str = "left") -> None:
    """`text` at `xy`, anchored there by PIL's two-letter anchor. A block of lines is laid out
    as matplotlib's: 1.2 font sizes apart, its vertical anchor "m" (the block's middle) or "s"
    (the last line's baseline), each line aligned left, center or right within the block."""
    lines = text.split("\n")
    if len(lines) == 1:
        _stamp(pixels, *xy, text, pt, ink, anchor)
        return
    font, (x, y) = _font(pt), xy
    pitch = LINE_SPACING * font.size
    span = (len(lines) - 1) * pitch
    first = y - span if anchor[1] == "s" else y - (span + _descent(pt) - _ascent(pt)) / 2  # its baseline
    block = max(font.getlength(s) for s in lines)
    left = x - {"l": 0.0, "m": block / 2, "r": block}[anchor[0]]
    h_anchor, at = {"left": ("l", left), "center": ("m", left + block / 2), "right": ("r", left + block)}[align]
    for i, s in enumerate(lines):
        _stamp(pixels, at, first + i * pitch, s, pt, ink, h_anchor + "s")


def _legend(pixels: np.ndarray, c: Chart) -> None:
    """matplotlib's figure legend at lower center, ncol=7, no frame: a colour patch (2 x 0.7 em)
    and its label per kind present, filled column by column as matplotlib fills them."""
    if not c.kinds:
        return
    H, W = pixels.shape[:2]
    font = _font(LABEL_PT)
    em = font.size
    ncol = min(7, len(c.kinds))
    rows, large = divmod(len(c.kinds), ncol)
    columns, i = [], 0
    for col in range(ncol):
        n = rows + (col < large)
        columns.append(c.kinds[i:i + n])
        i += n
    col_w = [max(2.8 * em + font.getlength(LABELS[k]) for k in col) for col in columns]
    total = sum(col_w) + 2.0 * em * (len(columns) - 1)  # columnspacing 2 em
    row_h = LINE_SPACING * em
    y_top = H - (0.5 + 0.4) * em - max(map(len, columns)) * row_h  # borderaxespad 0.5 em, borderpad 0.4 em
    x = (W - total) / 2
    for col, w in zip(columns, col_w):
        for j, k in enumerate(col):
            y = y_top + (j + 0.5) * row_h
            rgb = tuple(int(COLORS[k][d:d + 2], 16) for d in (1, 3, 5))
            _fill(pixels, x, y - 0.35 * em, x + 2.0 * em, y + 0.35 * em, rgb)
            _text(pixels, (x + 2.8 * em, y), LABELS[k], LABEL_PT, BLACK, "lm")  # handletextpad 0.8 em
        x += w + 2.0 * em
