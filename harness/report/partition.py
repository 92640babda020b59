"""Partition comparison: runs that differ only in `partition`, grouped by everything else
they vary (the scenario: model, profile, compute; and schedule, pp, M, ...)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt

from harness.report.doc import Block, Heading, Table
from harness.report.figures import Figure, save
from harness.report.runs import Run, dim, label, ok, run_id, varying

HEAD = ["partition", "layers per stage", "predicted slowest stage", "cost unit", "predicted imbalance",
        "measured slowest stage (ms)", "measured imbalance", "bubble measured", "samples/s", "run"]


def groups(runs: list[Run]) -> dict[str, list[Run]]:
    """Scenario label -> its runs, for scenarios holding at least two partitions."""
    runs = ok(runs)
    others = [d for d in varying(runs) if d != "partition"]
    out: dict[str, list[Run]] = defaultdict(list)
    for r in sorted(runs, key=lambda r: str(dim(r, "partition"))):
        out[label(r, others) or "all runs"].append(r)
    return {k: v for k, v in out.items() if len({dim(r, "partition") for r in v}) > 1}


def _stage_ms(r: Run) -> list[float]:
    return [t * 1e3 for t in r.metrics.stage_time_s or []]


def row(r: Run) -> list[object]:
    p, m = r.partition, r.metrics
    pred, st = p.get("predicted_cost_per_stage"), _stage_ms(r)
    return [dim(r, "partition"), str(p.get("layers_per_stage", "–")), max(pred) if pred else None, p.get("cost_unit"),
            p.get("imbalance"), max(st) if st else None, m.measured_imbalance, m.bubble.measured,
            m.throughput_samples_s, run_id(r)]


def tables(runs: list[Run]) -> list[Block]:
    blocks: list[Block] = []
    for scenario, runs in groups(runs).items():
        blocks += [Heading(scenario, 3), Table(HEAD, [row(r) for r in runs])]
    return blocks


def partition_figure(runs: list[Run], out: Path) -> Figure:
    by_scenario = groups(runs)
    runs = [r for rs in by_scenario.values() for r in rs]
    fig_ = Figure("Partition comparison",
                  "Per scenario (what the runs hold fixed), one colour per partitioner. Left: measured time per "
                  "stage (F + B of one microbatch), labelled with the stage's layer count; the tallest bar is the "
                  "slowest stage, which sets the pipeline's pace. Right: throughput, labelled with the measured "
                  "bubble. The table under it gives the predicted slowest stage in the partitioner's own unit.", runs)
    if not by_scenario:
        fig_.missing.append("no runs that differ only in `partition`")
        return fig_
    fig, axes = plt.subplots(len(by_scenario), 2, figsize=(11, 3.4 * len(by_scenario)), squeeze=False,
                             gridspec_kw={"width_ratios": [2, 1]})
    colors = {p: plt.cm.tab10(i % 10) for i, p in enumerate(sorted({str(dim(r, "partition")) for r in runs}))}
    for (scenario, mine), (left, right) in zip(by_scenario.items(), axes):
        width = 0.8 / len(mine)
        for i, r in enumerate(mine):
            color = colors[str(dim(r, "partition"))]
            st, lps = _stage_ms(r), r.partition.get("layers_per_stage") or []
            xs = [s - 0.4 + width * (i + 0.5) for s in range(len(st))]
            bars = left.bar(xs, st, width, color=color, label=dim(r, "partition"))
            if len(lps) == len(st):
                left.bar_label(bars, [str(n) for n in lps], fontsize=6)
            right.bar(i, r.metrics.throughput_samples_s, color=color)
            right.text(i, r.metrics.throughput_samples_s, f"bubble {r.metrics.bubble.measured:.2f}",
                       ha="center", va="bottom", fontsize=7)
        left.set_xticks(range(max(len(_stage_ms(r)) for r in mine)))
        left.set(xlabel="stage (bar label: layers)", ylabel="measured ms per microbatch (F+B)")
        left.set_title(scenario, fontsize=8, loc="left")
        left.legend(fontsize=7)
        right.set_xticks(range(len(mine)), [dim(r, "partition") for r in mine], fontsize=7)
        right.set_ylabel("throughput (samples/s)")
        right.margins(y=0.15)
    fig_.path = save(fig, out / "partition.png", fig_.title, runs)
    return fig_
