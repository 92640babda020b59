"""The Gantt chart's bars as pixels: one RGBA image of the axes' size, each pixel the colours of
the kinds that cover it in proportion to the time each covers. Linear in the bars (a few numpy
passes), whatever their width: drawing a path per bar cost ~10 us a bar in Agg."""

from __future__ import annotations

import numpy as np

from harness.records.gantt_layout import COLORS, Chart


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])


def _coverage(x0: np.ndarray, x1: np.ndarray, row: np.ndarray, rows: int, width: int) -> np.ndarray:
    """[row, pixel] the share of each pixel column its bars cover (bars in pixel units)."""
    x0, x1 = np.clip(x0, 0, width), np.clip(x1, 0, width)
    i0, i1 = np.minimum(x0.astype(int), width - 1), np.minimum(x1.astype(int), width - 1)
    n = rows * (width + 1)
    base = row * (width + 1)
    one = i0 == i1
    many = ~one  # a partial first pixel, whole pixels between, a partial last one
    cov = np.bincount(np.concatenate([base[one] + i0[one], base[many] + i0[many], base[many] + i1[many]]),
                      np.concatenate([x1[one] - x0[one], i0[many] + 1 - x0[many], x1[many] - i1[many]]), n)
    full = (np.bincount(base[many] + i0[many] + 1, minlength=n)
            - np.bincount(base[many] + i1[many], minlength=n)).reshape(rows, width + 1)
    return np.minimum(cov.reshape(rows, width + 1)[:, :width] + np.cumsum(full, axis=1)[:, :width], 1.0)


def raster(c: Chart, width_px: int, height_px: int, edges: bool, out: np.ndarray | None = None) -> np.ndarray:
    """The bars as one RGBA image of the axes' size in pixels: each pixel the colours of the
    kinds that cover it, in proportion to the time each covers (a 1F1B steady state of
    sub-pixel bars shows its forward and backward shares); waits and syncs under compute, in
    their thin band; transparent where nothing is. `edges`: a white pixel column where a
    compute bar starts or ends (where they are wide enough to tell apart). `out`: the axes'
    pixels of a white RGB image, painted in place (no second image to composite) and returned."""
    W, H = max(1, width_px), max(1, height_px)
    (xl, xr), (yb, yt) = c.xlim, c.ylim  # y inverted: yt (top) < yb
    rows = np.unique(np.concatenate([g.row for g in c.groups]))
    colour = np.zeros((2, len(rows), W, 3))  # [thin, full] summed colour x coverage
    share = np.zeros((2, len(rows), W))
    half = [0.0, 0.0]
    edge = np.zeros((len(rows), W), dtype=bool)
    for g in c.groups:
        px0, px1, row = (g.x0 - xl) / (xr - xl) * W, (g.x1 - xl) / (xr - xl) * W, np.searchsorted(rows, g.row)
        cov = _coverage(px0, px1, row, len(rows), W)
        share[int(g.compute)] += cov
        colour[int(g.compute)] += cov[..., None] * _rgb(COLORS[g.kind])
        half[int(g.compute)] = g.half
        if edges and g.compute:
            edge[row, np.clip(px0.astype(int), 0, W - 1)] = True  # the pixel the edge falls in
            edge[row, np.clip(px1.astype(int), 0, W - 1)] = True
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
        if out is not None:  # white where nothing is
            return np.where(on, np.round(rgb * 255), 255).astype(np.uint8)
        return np.concatenate([np.where(on, np.round(rgb * 255), 0), np.where(on, 255, 0)], axis=-1).astype(np.uint8)

    painted = [rgba(thin, thin_on), rgba(over_white, compute_on), rgba(over_thin, compute_on | thin_on)]
    painted[1][edge & compute_on[..., 0]] = painted[2][edge & compute_on[..., 0]] = 255
    img = np.zeros((H, W, 4), dtype=np.uint8) if out is None else out
    for i, row in enumerate(rows):
        spans = []
        for band in (0, 1):
            r0 = max(round((row - half[band] - yt) / (yb - yt) * H), 0)  # edges on whole pixels, as Agg snaps them
            spans.append((r0, max(min(round((row + half[band] - yt) / (yb - yt) * H), H), r0 + 1)))
        (t0, t1), (c0, c1) = spans
        img[t0:t1] = painted[0][i]
        img[c0:c1] = painted[1][i]
        lo, hi = max(t0, c0), min(t1, c1)
        if lo < hi:
            img[lo:hi] = painted[2][i]
    return img
