"""The job's records besides result.json: the Gantt chart (harness/records/gantt.py) and trace.json
(harness/measure/trace_json.py write_trace_json): what they show, the cap on trace.json, atomic writes."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from harness.records.gantt import COLORS, DPI, gantt_figure, plot_gantt
from harness.records.atomic import write_atomic, write_json_atomic
from harness.measure.trace_json import read_trace, write_trace_json
from harness.schedules.registry import build
from harness.simulate.cost import CostModel
from harness.simulate.engine import simulate
from harness.measure.trace import COMM, COMPUTE, WAIT, Event

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _native_like(steps: int = 2, pp: int = 2, m: int = 4) -> list[Event]:
    """A simulated 1F1B step per step, with what the native executor adds: a wait in recv
    before each rank > 0's forwards, sends (not drawn), a dp_sync and the optimizer."""
    one = simulate(build("1f1b", pp, m), CostModel.uniform(pp))
    span = max(e.end for e in one) + 0.01
    out = []
    for s in range(steps):
        o = s * span
        for e in one:
            out.append(Event(e.rank, s, e.name, e.cat, e.kind, e.stage, e.microbatch, e.start + o, e.end + o))
            if e.kind == "F" and e.rank > 0:
                out.append(Event(e.rank, s, f"recv {e.name}", WAIT, "recv", e.stage, e.microbatch,
                                 e.start + o - 0.001, e.start + o))
            if e.kind == "F" and e.rank < pp - 1:
                out.append(Event(e.rank, s, f"send {e.name}", COMM, "send", e.stage, e.microbatch,
                                 e.end + o, e.end + o))
        end = max(e.end for e in one) + o
        for r in range(pp):
            out.append(Event(r, s, f"dp_sync {r}", COMM, "dp_sync", r, -1, end, end + 0.002))
            out.append(Event(r, s, "optim", COMPUTE, "optim", -1, -1, end + 0.002, end + 0.004))
    return out


def _legend(fig) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def test_gantt_figure_legend_rows_and_labels():
    trace = _native_like()
    fig = gantt_figure(trace, 1, {0: "layers 0-3", 1: "layers 4-7"}, "title")
    assert _legend(fig) == ["forward", "backward", "waiting in recv", "gradient all-reduce", "optimizer"]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0\nlayers 0-3", "rank 1\nlayers 4-7"]
    assert ax.get_ylim()[0] > ax.get_ylim()[1]  # rank 0 on top
    assert ax.get_xlim()[0] == 0 and ax.get_xlabel() == "ms since step start"
    # one patch per (kind, height) drawn, whatever the number of actions; sends are not drawn
    bars = list(ax.patches)
    assert len(bars) == 5
    assert {p.get_facecolor()[:3] for p in bars} == {
        tuple(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)) for c in ("#4c72b0", "#55a868", "#dddddd", "#c44e52",
                                                                         "#555555")}
    # microbatch numbers on the F and B bars: 16 actions, each wide enough here
    (labels,) = ax.collections
    assert len(labels.get_paths()) == 2 * 2 * 4


def test_gantt_dense_step_has_no_labels_and_no_edges():
    """pp=16, M=256 interleaved: 1024 actions a rank on 16 inches, none wide enough for its
    number; the bars' white edges would wash the colors out, so they are off."""
    trace = simulate(build("interleaved_1f1b", 16, 256, 2), CostModel.uniform(32))
    fig = gantt_figure(trace, 0, {}, "dense")
    ax = fig.axes[0]
    assert len(ax.collections) == 0
    assert len(ax.patches) == 2 and all(p.get_linewidth() == 0 or p.get_edgecolor()[3] == 0 for p in ax.patches)
    assert _legend(fig) == ["forward", "backward"]


def test_gantt_sub_pixel_bars_blend_by_the_time_each_kind_covers():
    """Bars narrower than a pixel are painted as an image: each pixel the kinds' colours in
    proportion to the time each covers. Here forward and backward alternate with idle gaps as
    long (half the time covered: half white), and rank 1 waits in recv through every gap, in
    its thin band, which shows through where compute leaves it."""
    d, n = 1e-6, 20_000
    trace = []
    for i in range(n):
        kind, t = "FB"[i % 2], 2 * i * d
        for r in (0, 1):
            trace.append(Event(r, 0, f"0{kind}{i}", COMPUTE, kind, r, i, t, t + d))
        trace.append(Event(1, 0, f"recv {i}", WAIT, "recv", 1, i, t + d, t + 2 * d))
    fig = gantt_figure(trace, 0, {}, "dense")
    (image,) = fig.images
    img = np.asarray(image.get_array())
    rgb = {k: np.array([int(COLORS[k][i:i + 2], 16) for i in (1, 3, 5)]) for k in ("F", "B", "recv")}
    compute = (rgb["F"] + rgb["B"]) / 2
    w = img.shape[1]
    lines = {}  # each distinct painted pixel row, averaged over the middle half of the step
    for y in range(img.shape[0]):
        if img[y, w // 2, 3] == 255:
            lines.setdefault(tuple(img[y, w // 2, :3]), img[y, w // 4:3 * w // 4, :3].mean(axis=0))
    assert 0 < sum(img[:, w // 2, 3] == 255) < img.shape[0]  # the bands, and transparent rows between them
    half_white, half_recv = compute / 2 + 255 / 2, compute / 2 + rgb["recv"] / 2
    assert len(lines) == 2, lines  # rank 0 and rank 1 outside its thin band; rank 1 inside it
    assert sorted(lines.values(), key=sum)[0] == pytest.approx(half_recv, abs=2)
    assert sorted(lines.values(), key=sum)[1] == pytest.approx(half_white, abs=2)


def test_plot_gantt_png_and_svg(tmp_path: Path):
    trace = _native_like()
    for name in ("g.png", "g.svg"):
        plot_gantt(tmp_path / name, trace, 1, {}, "title")
    assert (tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC
    svg = ET.parse(tmp_path / "g.svg").getroot()
    assert svg.tag.endswith("svg")
    text = (tmp_path / "g.svg").read_text()
    for label in ("forward", "backward", "waiting in recv", "gradient all-reduce", "optimizer"):
        assert f"<!-- {label} -->" in text  # matplotlib names each text it draws as paths
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.png", "g.svg"]  # no temporary file left


def test_plot_gantt_refuses_a_missing_step(tmp_path: Path):
    with pytest.raises(ValueError, match="no events in step 7"):
        plot_gantt(tmp_path / "g.png", _native_like(), 7, {}, "title")
    assert list(tmp_path.iterdir()) == []


def _steps(trace_json: Path) -> dict:
    data = json.loads(trace_json.read_text())
    ev = [e for e in data["traceEvents"] if e.get("cat") != "step"]  # the actions and samples, not step slices
    return {"X": sorted({e["args"]["step"] for e in ev if e["ph"] == "X"}),
            "C": [e for e in ev if e["ph"] == "C"], "M": [e for e in ev if e["ph"] == "M"],
            "n": sum(e["ph"] in "XC" for e in ev), "cap": data["otherData"]["trace_cap"]}


def _memory(trace) -> list[tuple[int, int, float, int]]:
    """One activation sample per rank and step, at the step's first event of that rank."""
    first: dict = {}
    for e in trace:
        if (e.rank, e.step) not in first or e.start < first[(e.rank, e.step)]:
            first[(e.rank, e.step)] = e.start
    return [(r, s, t, 2**20 * (r + 1)) for (r, s), t in sorted(first.items())]


def test_trace_json_fields_and_round_trip(tmp_path: Path):
    trace = _native_like(steps=2)
    memory = _memory(trace)
    kept = write_trace_json(tmp_path / "trace.json", trace, memory, pp=2)
    assert kept == {"steps_kept": [0, 1], "steps_dropped": 0, "events_written": len(trace) + len(memory),
                    "events_dropped": 0, "max_events": 200_000, "truncated_step": None}
    data = json.loads((tmp_path / "trace.json").read_text())
    assert data["displayTimeUnit"] == "ms" and data["otherData"]["trace_cap"] == kept
    ev = data["traceEvents"]
    assert [e["args"]["name"] for e in ev if e["ph"] == "M"] == [
        "pipeline (dp replica 0)", "rank 0 (pipeline rank 0)", "rank 1 (pipeline rank 1)"]
    x = [e for e in ev if e["ph"] == "X" and e["cat"] != "step"]
    assert x[0] == {"ph": "X", "name": trace[0].name, "cat": trace[0].cat, "pid": 0, "tid": trace[0].rank,
                    "ts": round(trace[0].start * 1e9) / 1e3,  # whole ns, as us
                    "dur": (round(trace[0].end * 1e9) - round(trace[0].start * 1e9)) / 1e3,
                    "args": {"step": 0, "kind": trace[0].kind, "stage": trace[0].stage,
                             "microbatch": trace[0].microbatch}}
    c = [e for e in ev if e["ph"] == "C"]
    assert c[-1] == {"ph": "C", "name": "activations rank 1", "pid": 0, "tid": 1, "ts": round(memory[-1][2] * 1e9) / 1e3,
                     "args": {"MiB": 2.0}}
    back = read_trace(tmp_path / "trace.json")
    assert [(e.rank, e.step, e.name, e.cat, e.kind, e.stage, e.microbatch) for e in back] == [
        (e.rank, e.step, e.name, e.cat, e.kind, e.stage, e.microbatch) for e in trace]
    assert all(math.isclose(a.end, b.end, rel_tol=0, abs_tol=1e-9) for a, b in zip(back, trace))  # to the ns


def test_trace_json_over_the_cap_keeps_the_last_whole_steps(tmp_path: Path):
    trace = _native_like(steps=5)
    memory = _memory(trace)
    per_step = len(trace) // 5 + len(memory) // 5
    kept = write_trace_json(tmp_path / "trace.json", trace, memory, pp=2, max_events=2 * per_step + per_step // 2)
    assert kept == {"steps_kept": [3, 4], "steps_dropped": 3, "events_written": 2 * per_step,
                    "events_dropped": 3 * per_step, "max_events": 2 * per_step + per_step // 2, "truncated_step": None}
    got = _steps(tmp_path / "trace.json")
    assert got["X"] == [3, 4] and got["n"] == 2 * per_step and got["cap"] == kept
    assert sorted({e["ts"] for e in got["C"]}) == sorted({t * 1e6 for _r, s, t, _b in memory if s >= 3})
    assert len(got["M"]) == 3  # the tracks are still named


def test_trace_json_a_step_over_the_cap_alone_is_cut_in_time_order(tmp_path: Path):
    trace = _native_like(steps=3)
    last = [e for e in trace if e.step == 2]
    kept = write_trace_json(tmp_path / "trace.json", trace, (), pp=2, max_events=10)
    assert kept == {"steps_kept": [2], "steps_dropped": 2, "events_written": 10, "events_dropped": len(trace) - 10,
                    "max_events": 10, "truncated_step": 2}
    x = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
         if e["ph"] == "X" and e["cat"] != "step"]
    assert sorted(e["ts"] for e in x) == sorted(round(e.start * 1e9) / 1e3 for e in last)[:10]


def test_trace_json_uncapped_and_non_finite_numbers(tmp_path: Path):
    trace = _native_like(steps=3)
    kept = write_trace_json(tmp_path / "t.json", trace, (), max_events=None)
    assert kept["steps_kept"] == [0, 1, 2] and kept["events_dropped"] == 0
    bad = [Event(0, 0, "F\"0\n", COMPUTE, "F", 0, 0, 0.0, math.inf), Event(0, 0, "1F0", COMPUTE, "F", 0, 0, 0.0, 0.5)]
    write_trace_json(tmp_path / "bad.json", bad, [(0, 0, math.nan, 1)])
    ev = json.loads((tmp_path / "bad.json").read_text())["traceEvents"]  # strict JSON: no NaN/Infinity
    assert [e.get("dur") for e in ev if e["ph"] == "X"] == [None, 0.5e6]
    assert ev[2]["name"] == "F\"0\n" and [e["ts"] for e in ev if e["ph"] == "C"] == [None]


def test_atomic_writes_leave_no_temporary_file(tmp_path: Path):
    write_json_atomic(tmp_path / "r.json", {"a": 1})
    write_trace_json(tmp_path / "trace.json", _native_like(), ())
    plot_gantt(tmp_path / "gantt.png", _native_like(), 0, {}, "t")

    def boom(f):
        f.write(b"half a fi")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(tmp_path / "gantt.png", boom, binary=True)
    assert (tmp_path / "gantt.png").read_bytes()[:8] == PNG_MAGIC  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gantt.png", "r.json", "trace.json"]
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}


def _png(path: Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def _frame(img: np.ndarray) -> tuple[int, int, int, int]:
    """The axes' frame: the first and last rows and columns that are black over most of the image."""
    dark = img.sum(axis=2) < 100
    rows, cols = np.flatnonzero(dark.mean(axis=1) > 0.5), np.flatnonzero(dark.mean(axis=0) > 0.5)
    return cols[0], rows[0], cols[-1], rows[-1]


def _hex(colour: str) -> np.ndarray:
    return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])


def test_png_draws_title_labels_ticks_legend_and_bars_where_they_belong(tmp_path: Path):
    """The PNG is drawn without matplotlib (gantt_png.py): a known step's bars must start and end
    at the x its times map to (x axis 0 to 5% past the last end), on their rank's row, with the
    title above the frame, the rank labels left of it, the ticks and the legend below."""
    trace = [Event(0, 0, "0F0", COMPUTE, "F", 0, 0, 0.0, 0.010), Event(0, 0, "0B0", COMPUTE, "B", 0, 0, 0.020, 0.040),
             Event(1, 0, "1F0", COMPUTE, "F", 1, 0, 0.010, 0.020), Event(1, 0, "1B0", COMPUTE, "B", 1, 0, 0.030, 0.040)]
    plot_gantt(tmp_path / "g.png", trace, 0, {0: "layers 0-3", 1: "layers 4-7"}, "a known step\nsecond line")
    img = _png(tmp_path / "g.png")
    assert img.shape[:2] == (round(2.6 * DPI), round(6 * DPI))
    left, top, right, bottom = _frame(img)
    assert 0 < left < right < img.shape[1] and 0 < top < bottom < img.shape[0]
    x_of = lambda ms: left + ms / 42.0 * (right - left)  # xlim (0, 40 ms + 5%)
    for rank in (0, 1):
        line = img[round(top + (rank + 0.49) / 1.98 * (bottom - top))]  # ylim (1.49, -0.49): 5% beyond the bars
        for kind, t0, t1 in [(e.kind, e.start * 1e3, e.end * 1e3) for e in trace if e.rank == rank]:
            cols = np.flatnonzero((np.abs(line - _hex(COLORS[kind])).sum(axis=1) < 30))
            cols = cols[(cols > x_of(t0) - 3) & (cols < x_of(t1) + 3)]
            assert abs(cols[0] - x_of(t0)) <= 2 and abs(cols[-1] - x_of(t1)) <= 2, (rank, kind, cols[[0, -1]])
        white = (line[round(x_of(t0)):round(x_of(t1))] > 200).all(axis=1)  # the B bar's microbatch number
        assert 0 < white.sum() < 0.2 * (x_of(t1) - x_of(t0))
    ink = lambda region: (region.sum(axis=2) < 300).sum()
    assert ink(img[:top - 2, left:]) > 100  # two lines of title
    assert ink(img[top:bottom, :left - 6]) > 100  # the rank labels
    assert ink(img[bottom + 2:bottom + 40, left:right]) > 50  # tick labels and the axis label
    legend = img[bottom + 40:]
    for kind in ("F", "B"):
        assert (np.abs(legend - _hex(COLORS[kind])).sum(axis=2) < 10).sum() > 50, kind


def test_png_reads_as_the_figure(tmp_path: Path):
    """The PNG and matplotlib's Figure (the SVG's, the report's) are laid out from one Chart:
    the same size and frame, and the bars paint the same pixels, to antialiasing."""
    trace = simulate(build("1f1b", 4, 8), CostModel.uniform(4))
    labels = {r: f"layer {r}" for r in range(4)}
    plot_gantt(tmp_path / "ours.png", trace, 0, labels, "1f1b")
    gantt_figure(trace, 0, labels, "1f1b").savefig(tmp_path / "savefig.png", format="png", dpi=DPI)
    ours, theirs = _png(tmp_path / "ours.png"), _png(tmp_path / "savefig.png")
    assert ours.shape == theirs.shape and _frame(ours) == _frame(theirs)
    left, top, right, bottom = _frame(ours)
    edge = np.zeros(theirs.shape[:2], dtype=bool)  # where matplotlib's colours change
    edge[:, 1:] |= np.abs(np.diff(theirs, axis=1)).sum(axis=2) > 30
    edge[1:] |= np.abs(np.diff(theirs, axis=0)).sum(axis=2) > 30
    near = np.zeros_like(edge)
    for dy in range(-2, 3):
        for dx in range(-2, 3):
            near |= np.roll(edge, (dy, dx), axis=(0, 1))
    differ = np.abs(ours - theirs).sum(axis=2) > 60
    inside = (slice(top + 2, bottom - 1), slice(left + 2, right - 1))
    assert differ[inside].mean() < 0.1  # bar edges and glyphs: antialiased (or snapped) otherwise
    assert not (differ & ~near)[inside].any()  # nowhere else


@pytest.mark.parametrize("ms", [0.004, 33.0, 33_000.0, 1.6e6])
def test_png_ticks_are_matplotlibs(ms: float):
    """The PNG's x ticks and their labels: matplotlib's locator and formatter on the same axes."""
    from harness.records.gantt_layout import chart
    from harness.records.gantt_png import x_ticks

    trace = [Event(0, 0, "0F0", COMPUTE, "F", 0, 0, 0.0, ms / 1e3)]
    ax = gantt_figure(trace, 0, {}, "t").axes[0]
    ticks, texts, offset = x_ticks(chart(trace, 0, {}, "t"))
    lo, hi = ax.get_xlim()
    theirs = [t for t in ax.get_xticks().tolist() if lo <= t <= hi]
    assert ticks == pytest.approx(theirs)
    fmt = ax.xaxis.get_major_formatter()
    assert texts == [t.replace("\u2212", "-") for t in fmt.format_ticks(theirs)] and offset == fmt.get_offset()


def test_png_writer_round_trips(tmp_path: Path):
    from PIL import Image

    from harness.records.png import write_png

    pixels = np.random.default_rng(0).integers(0, 256, (37, 51, 3), dtype=np.uint8)
    with open(tmp_path / "p.png", "wb") as f:
        write_png(pixels, f, DPI)
    back = Image.open(tmp_path / "p.png")
    assert back.mode == "RGB" and (np.asarray(back) == pixels).all()
    assert back.info["dpi"] == pytest.approx((DPI, DPI), abs=0.01)
    with pytest.raises(ValueError, match="expected uint8"):
        write_png(pixels.astype(np.float32), f, DPI)
