"""Figures compare like with like (issue #38): no line joins runs that differ in anything but
the plotted axis, titles are unique, TFLOP/s and MFU only where a device made the times, no
absolute path in a report, the runs table fits a 1,280 px page, and a model that disagrees with
its measurement says so. On made-up records (no runs): each test draws at most one figure."""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.axes
import matplotlib.pyplot as plt
import pytest

from harness.records.result import Bubble, Env, Flops, Intervals, Memory, Metrics, Result, measurement_of
from harness.report import build
from harness.report.build import FIGURES, header
from harness.report.doc import markdown
from harness.report.html import STYLE, page
from harness.report.load import Sweep
from harness.report.memory import memory_vs_throughput
from harness.report.runs import Run
from harness.report.tables import summary
from harness.report.tensor import tensor_parallel, tp_lines
from harness.report.modelled import disagreement
from harness.report.throughput import dp_scaling, throughput


def fake(i: int, throughput_s: float | None = None, dp_sync: tuple[float, float] | None = None,
         **config) -> Run:
    """A made-up ok record in job `<i>_x`, its throughput unique to it (so a drawn point names its run)."""
    c = {"schedule": {"name": "1f1b"}, "pp": 2, "dp": 1, "tp": 1, "virtual_stages": 1, "microbatches": 4,
         "microbatch_size": 4, "compute": "emulated", "executor": "native", "device": "cpu",
         "partition": {"name": "uniform"}, "model": {"name": "mlp", "layers": 8, "hidden": 32}} | config
    ranks = c["pp"] * c["dp"]
    per_rank = [{"params": 2**20, "grads": 2**20, "optimizer": 0, "activations": 2**19 * (1 + i % 3),
                 "peak": 2**21 + 2**19 * (1 + i % 3)}] * ranks
    thr = throughput_s if throughput_s is not None else 100.0 + 7.0 * i
    metrics = Metrics(
        step_time_s=0.1, step_times_s=[0.1, 0.1, 0.1], throughput_samples_s=thr, throughput_tokens_s=None,
        losses=[1.0], dp_sync_s=dp_sync and dp_sync[0], dp_sync_share=None, dp_sync_theory_s=dp_sync and dp_sync[1],
        recompute_s=0.0, p2p_hop_s=None, stage_time_s=[0.03] * c["pp"], measured_imbalance=1.0,
        mean_op_s={"F": [0.01] * c["pp"], "B": [0.02] * c["pp"]},
        bubble=Bubble(theory=0.2, simulated=0.21, measured=0.2 + 0.01 * i, measured_per_rank=[0.2] * c["pp"],
                      measured_per_step=[0.2], measured_per_global_rank=[0.2] * ranks),
        memory=Memory(peak_activation_bytes_per_rank=[2**20] * c["pp"], theory_peak_microbatches_per_rank=[2, 1],
                      activation_bytes_per_microbatch_per_rank=[2**19] * c["pp"], measured_per_rank=per_rank,
                      theory_per_rank=per_rank),
        flops=Flops(model_per_step=1e9, hardware_per_step=1e9, tflops_per_device=8.4e-05,
                    hardware_tflops_per_device=8.4e-05, peak_tflops_per_device=None, mfu=None, hfu=None, device=None,
                    source="model"),
        intervals=Intervals(level=0.95, method="bootstrap", steps=3, step_time_s=[0.099, 0.101], bubble=[0.19, 0.21],
                            throughput_samples_s=[thr * 0.99, thr * 1.01]),
        tp_sync_s=0.004 if c["tp"] > 1 else None)
    env = Env(torch="2.13.0", python="3.11", device="cpu", device_name="x86_64", world_size=ranks * c["tp"],
              git_commit=None, hostname="test", cpu_count=2)
    return Run(Result("ok", None, c, env=env, metrics=metrics, measurement=measurement_of(c["executor"], c["compute"])),
               f"{i}_x")


@pytest.fixture(autouse=True)
def unsaved(monkeypatch):
    """Figures drawn but not written (PNG + SVG cost seconds a figure): what is drawn is what is tested."""
    from harness.report import memory, tensor, throughput as module

    def save(fig, path: Path, title: str, runs: list[Run]) -> Path:
        plt.close(fig)
        return path

    for m in (memory, tensor, module):
        monkeypatch.setattr(m, "save", save)


@pytest.fixture
def lines(monkeypatch) -> list[list[float]]:
    """The y values of every line a figure draws through two points or more."""
    drawn: list[list[float]] = []
    plot = matplotlib.axes.Axes.plot

    def spy(self, *args, **kw):
        ys = [a for a in args if isinstance(a, list)]
        if len(ys) >= 2 and len(ys[1]) >= 2:
            drawn.append([float(y) for y in ys[1]])
        return plot(self, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    return drawn


def joined(drawn: list[list[float]], runs: list[Run]) -> list[set[str]]:
    """The runs each drawn line passes through, told by their (unique) throughput."""
    by_t = {r.metrics.throughput_samples_s: r.dir for r in runs}
    return [{by_t[y] for y in ys if y in by_t} for ys in drawn]


def test_a_pareto_front_never_joins_runs_of_different_batch_or_model(tmp_path, lines):
    # runs 0-2 alike (mlp, B=4); 3-4 at B=8; 5-6 another model: three fronts, none across them
    runs = [fake(0), fake(1, microbatches=8), fake(2, schedule={"name": "gpipe"}),
            fake(3, microbatch_size=8), fake(4, microbatch_size=8, microbatches=8),
            fake(5, model={"name": "gpt", "layers": 4, "hidden": 64}),
            fake(6, model={"name": "gpt", "layers": 4, "hidden": 64}, microbatches=8)]
    fig = memory_vs_throughput(runs, tmp_path)
    assert fig.path is not None
    groups = [{"0_x", "1_x", "2_x"}, {"3_x", "4_x"}, {"5_x", "6_x"}]
    fronts = [j for j in joined(lines, runs) if len(j) > 1]
    assert fronts and all(any(j <= g for g in groups) for j in fronts), fronts


def test_throughput_lines_never_join_runs_that_differ_in_b_or_tp(tmp_path, lines):
    runs = [fake(0), fake(1, microbatches=8), fake(2, microbatch_size=8), fake(3, microbatch_size=8, microbatches=8),
            fake(4, tp=2), fake(5, tp=2, microbatches=8)]
    throughput(runs, tmp_path)
    across = [j for j in joined(lines, runs) if len(j) > 1]
    assert across and all(j in ({"0_x", "1_x"}, {"2_x", "3_x"}, {"4_x", "5_x"}, {"0_x", "2_x"}, {"1_x", "3_x"})
                          for j in across), across


def test_tp_lines_hold_the_world_and_the_global_batch():
    # world 4: tp=1 x dp=2 (B=2) and tp=2 x dp=1 (B=4) at a global batch of 16, and tp=2 with sequence
    # parallelism; run 3 has another global batch and run 4 another model: neither joins them
    runs = [fake(0, dp=2, microbatch_size=2), fake(1, tp=2), fake(2, tp=2, sequence_parallel=True),
            fake(3, tp=2, microbatch_size=8), fake(4, tp=2, model={"name": "gpt", "layers": 4, "hidden": 64})]
    groups = sorted(sorted(r.dir for r in g) for g in tp_lines(runs).values())
    assert groups == [["0_x", "1_x"], ["0_x", "2_x"]]
    assert tp_lines([fake(0), fake(1, tp=2)]) == {}  # world 2 against 4: not at one world size
    assert [sorted(r.dir for r in g) for g in tp_lines([fake(0), fake(1, tp=2)], "dp").values()] == [["0_x", "1_x"]]


def test_the_tp_figure_draws_and_names_what_it_leaves_out(tmp_path):
    runs = [fake(0, dp=2, microbatch_size=2), fake(1, tp=2), fake(2, tp=2, microbatch_size=8)]
    fig = tensor_parallel(runs, tmp_path)
    assert fig.path == tmp_path / "tensor_parallel.png" and {r.dir for r in fig.runs} == {"0_x", "1_x"}
    assert any("runs 2: no run differs from them in tp alone" in m for m in fig.missing), fig.missing
    assert "world=4" in fig.caption and "global batch 16" in fig.caption
    assert "tp=1 (1), 2 (1)" in fig.held  # the provenance line (and so the figure's title) names tp
    flat = tensor_parallel([fake(0)], tmp_path)
    assert flat.path is None and flat.missing == ["no runs with tp > 1 (all 1 ok runs have tp=1)"]


def test_every_figure_has_its_own_title(tmp_path):
    titles = [make([], tmp_path).title for make in FIGURES]
    assert len(set(titles)) == len(titles), titles


def test_no_tflops_or_mfu_for_emulated_or_simulated_runs():
    runs = [fake(0), fake(1, executor="sim"), fake(2, compute="real")]
    tables = [b for b in summary(runs) if hasattr(b, "rows")]
    measured = tables[-1]
    col = measured.head.index("TFLOP/s/dev")
    assert [row[col] for row in measured.rows] == ["n/a", "n/a", pytest.approx(8.4e-05)]
    assert "8.4e-05" not in markdown(summary(runs[:2]))


def test_the_report_names_no_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside, outside = tmp_path / "runs" / "sweeps" / "s1", tmp_path.parent / "elsewhere" / "s2"
    for where, shown in ((inside, "runs/sweeps/s1"), (outside, "s2")):
        where.mkdir(parents=True)
        blocks = header(Sweep(where.resolve(), [fake(0)]))
        text = markdown(blocks) + page(blocks, "t", tmp_path)
        assert f"Source: `{shown}`" in markdown(blocks)
        assert str(tmp_path) not in text and not re.search(r"`/[^`]*`", text)


class _Tables(HTMLParser):
    """Every table's rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.tables[-1][-1].append("")

    def handle_data(self, data):
        if self.tables and self.tables[-1] and self.tables[-1][-1]:
            self.tables[-1][-1][-1] += data


def test_the_runs_table_fits_a_1280_px_page():
    """No browser here (playwright's browsers come from a CDN): the page is held to its structure.
    Every cell wraps anywhere (so no table needs more than the page), and, wrapped at spaces only,
    each table's narrowest layout (each column as wide as its longest word at 12 px, ~7 px a character, plus
    padding and border) is within the page's 1,200 px."""
    long = {"model": {"name": "gpt", "layers": 12, "hidden": 768}, "checkpointing": True}
    runs = [fake(i, **long) for i in range(3)]
    for r in runs:  # overrides the way Hydra names a job's directory
        r.dir = f"{r.dir[0]}_checkpointing=true,compute=emulated,model=gpt,microbatch_size=4,pp=2,schedule=1f1b"
    parser = _Tables()
    parser.feed(page(summary(runs), "t", Path(".")))
    assert len(parser.tables) == 2
    assert re.search(r"th, td \{[^}]*overflow-wrap: anywhere", STYLE) and "max-width: 1200px" in STYLE
    assert "table-layout: fixed" not in STYLE  # auto: a column as wide as its content needs, no wider
    for table in parser.tables:
        assert len(table[0]) <= 12
        widest = [max(len(w) for row in table for w in (row[k].split() or [""])) for k in range(len(table[0]))]
        assert sum(7 * n + 14 for n in widest) <= 1200, widest


def _trace(job: Path, sync_ms_per_step: dict[int, list[float]]) -> None:
    """A trace.json with one dp_sync event per rank and step (the durations given, in ms)."""
    events = [{"ph": "X", "name": "dp_sync 0", "cat": "comm", "pid": 0, "tid": rank, "ts": 1e6 * step, "dur": ms * 1e3,
               "args": {"step": step, "kind": "dp_sync", "stage": 0, "microbatch": -1}}
              for step, per_rank in sync_ms_per_step.items() for rank, ms in enumerate(per_rank)]
    job.mkdir(parents=True)
    (job / "trace.json").write_text(json.dumps({"traceEvents": events}))


def test_a_model_outside_the_measured_interval_is_said_with_its_factor(tmp_path):
    said = "75.0% interval, order statistics of the median, n=3 steps"
    assert disagreement("sync", 0.0157, 0.015, 0.016, said, 0.00163, "ms", 1e3) == (
        f"sync: measured 15.7 ms (interval 15-16: {said}) is 9.63x the model's 1.63 ms: outside the interval")
    assert disagreement("sync", 0.0157, 0.001, 0.02, said, 0.00163, "ms", 1e3) is None
    runs = [fake(0, dp=1, warmup_steps=1), fake(1, dp=2, dp_sync=(0.0157, 0.00163), warmup_steps=1),
            fake(2, dp=4, dp_sync=(0.0160, 0.0150), warmup_steps=1)]
    # step 0 is warm-up (not measured); per measured step the longest rank's total, as metrics.dp_sync_s
    _trace(tmp_path / "1_x", {0: [90.0, 1.0], 1: [15.0, 15.7], 2: [16.0, 3.0], 3: [2.0, 15.9]})
    _trace(tmp_path / "2_x", {1: [14.0, 1.0, 1.0, 1.0], 2: [16.0] * 4, 3: [18.0] * 4})
    for r in runs:
        r.sweep = tmp_path
    fig = dp_scaling(runs, tmp_path)
    sync = [n for n in fig.notes if "gradient sync" in n]
    assert len(sync) == 1 and "dp=2" in sync[0] and "9.63x the model's" in sync[0], fig.notes
    assert "(interval 15.7-16: 75.0% interval, order statistics of the median, n=3 steps)" in sync[0]
    md = markdown(build.figure_section(fig))
    assert "Modelled against measured" in md and "9.63x" in md
    for r in runs:  # no trace to read: no interval, so no claim either way
        r.sweep = None
    assert not [n for n in dp_scaling(runs, tmp_path).notes if "gradient sync" in n]


def test_a_replay_headline_keeps_to_the_profiled_models_units():
    """profile= with emulated compute: the FLOPs are the profiled model's, the tokens the stand-in's
    sequence; the headline gives no tokens/s beside the profiled model's TFLOP/s."""
    r = fake(0, profile="data/llama70b_h200_derived_block_profile.json", model={"name": "gpt", "layers": 4,
                                                                                "hidden": 64, "seq": 64})
    r.metrics.throughput_tokens_s = 6400.0
    r.metrics.flops.source = "profile=data/llama70b_h200_derived_block_profile.json (fwd_flops per layer)"
    line = r.result.headline()
    assert "tokens/s" not in line.split("(the profiled")[0] and "the profiled model's" in line
    r.result.measurement = "measured"
    assert "6400 tokens/s" in r.result.headline()


def test_attribution_bars_stand_in_groups_named_by_letter(tmp_path, monkeypatch):
    from harness.records.result import Attribution
    from harness.report import attribution

    monkeypatch.setattr(attribution, "save", lambda fig, path, title, runs: path)
    runs = [fake(0), fake(1, microbatch_size=8), fake(2), fake(3, compute="real")]
    for r in runs:
        r.metrics.bubble.attribution = Attribution(0.2, 0.01, 0.01, 0.0)
    fig = attribution.bubble_attribution(runs, tmp_path)
    assert fig.path is not None and fig.missing == []
    ax = plt.gcf().axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    # each group's bars side by side, each tick with its group's letter, the legend saying what a letter holds
    assert [t[-3:] for t in ticks] == ["[A]", "[A]", "[B]", "[C]"], ticks
    assert "[A] B=4 compute=emulated" in legend and "[C] B=8 compute=emulated" in legend, legend
    plt.close("all")


EXAMPLE = Path(__file__).resolve().parents[1] / "reports" / "example"


def test_the_committed_example_compares_like_with_like():
    """reports/example/ (the README's figures) as committed: no absolute path of the machine that
    made it, unique section titles, no TFLOP/s for a run whose times no device made, every table
    within the page, and the tp figure drawn."""
    md, html = (EXAMPLE / "index.md").read_text(), (EXAMPLE / "index.html").read_text()
    marker = (EXAMPLE / ".harness-copy.json").read_text()
    for text in (md, html, marker, (EXAMPLE / "runs.csv").read_text()):
        assert not re.search(r"(?<![\w.])/(tmp|home|work|root|Users|private|var)/", text)
    titles = re.findall(r"^## (.+)$", md, re.M)
    assert len(titles) == len(set(titles)), titles
    rows = list(csv.DictReader((EXAMPLE / "runs.csv").open()))
    assert rows and all(not r["tflops_per_device"] and not r["mfu"] for r in rows
                        if r["compute"] == "emulated" or r["executor"] == "sim")
    parser = _Tables()
    parser.feed(html)
    for table in parser.tables:
        widest = [max(len(w) for row in table for w in (row[k].split() or [""])) for k in range(len(table[0]))]
        assert sum(7 * n + 14 for n in widest) <= 1200, (table[0], widest)
    assert "## Tensor parallelism at a fixed world size" in md and (EXAMPLE / "tensor_parallel.png").is_file()
