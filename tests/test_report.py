"""The report: from a real small sweep (with a failed point, a corrupt and a partial record)
to index.md, a standalone index.html, runs.csv and the figures; and, on made-up records,
what a sweep cannot show yet (dp > 1) and mixed compute modes."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest

from harness.records.result import Bubble, Env, Memory, Metrics, Result, measurement_of
from harness.report.build import build_report
from harness.report.figures import provenance
from harness.report.load import load_sweep
from harness.report.runs import Run, schedule_label
from harness.report.throughput import dp_scaling
from harness.report.zero_bubble import _peak_share, zero_bubble_study

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
FIGURES = ("bubble_vs_microbatches", "bubble_measured_vs_theory", "bubble_attribution", "zero_bubble", "memory_per_rank",
           "memory_breakdown", "memory_vs_throughput", "throughput", "partition")


@pytest.fixture
def sweep(tmp_path_factory, harness) -> Path:
    """12 points: dualpipev at M=2 cannot run (it needs M >= 2 * pp) and is skipped, 10 run;
    then a failed record, a corrupt one and a partial one (status ok, no metrics) are added by
    hand. `python -m harness` (and the report) in this process (make test), or fresh ones (`slow`)."""
    path = tmp_path_factory.mktemp("runs") / "small"
    p = harness("-m", "schedule=gpipe,1f1b,dualpipev", "pp=2", "microbatches=2,4", "partition=uniform,params",
                "compute=emulated", "cost.fwd_ms_per_layer=1", "model.hidden=32", "steps=2", "warmup_steps=0",
                "wandb.mode=disabled", "run.skip_invalid=true", f"hydra.sweep.dir={path}", cwd=path.parent)
    assert p.returncode == 0 and "10 ok, 2 skipped" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    (path / "corrupt").mkdir()
    (path / "corrupt" / "result.json").write_text('{"status": "ok", "con')
    ok = json.loads(next(path.glob("0_*/result.json")).read_text())
    (path / "partial").mkdir()
    (path / "partial" / "result.json").write_text(json.dumps({**ok, "metrics": None}))
    (path / "99_failed").mkdir()
    (path / "99_failed" / "result.json").write_text(json.dumps({**ok, "status": "failed", "metrics": None,
                                                                "error": "rank 1: RuntimeError: injected fault"}))
    return path


@pytest.mark.sweep
def test_report_of_a_real_sweep(sweep, tmp_path, report):
    r = report(str(sweep), "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr  # no figure failed
    out = tmp_path / "small"
    md, page = (out / "index.md").read_text(), (out / "index.html").read_text()

    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(list(sweep.rglob("result.json"))) == 13
    assert sorted(r["status"] for r in rows).count("ok") == 10
    assert [r["status"] for r in rows].count("corrupt") == 2

    for text in (md, page):
        assert "Not ok" in text and "injected fault" in text  # the failed point, with its error
        assert "corrupt/result.json" in text and "unreadable" in text
        assert "partial/result.json" in text and "no metrics" in text
        assert "no runs with dp &gt; 1" in text or "no runs with dp > 1" in text
        assert "no pair of runs that differ only in checkpointing" in text
        assert "Made from: compute=emulated  device=cpu  executor=native" in text
    for name in FIGURES:
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.svg").stat().st_size > 0
        assert f"({name}.png)" in md
    gallery = sorted(p.name for p in (out / "gallery").iterdir())
    assert gallery == sorted(f"{s}_{k}.{ext}" for s in ("gpipe", "1f1b", "dualpipev") for k in ("sim", "measured")
                             for ext in ("png", "svg"))
    assert md.index("\n### gpipe\n") < md.index("\n### 1f1b\n") < md.index("\n### dualpipev\n")  # usual order

    # standalone: every image inline, nothing fetched from elsewhere
    srcs = re.findall(r'src="([^"]*)"', page)
    assert len(srcs) == len(FIGURES) + 6 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))
    assert "<link" not in page and "url(" not in page and "<script" not in page
    # the partition table: both scenarios' partitioners, layers per stage from the record
    assert "| params | [4, 4] |" in md and "| uniform | [4, 4] |" in md


def fake(run_id: int, **config) -> Run:
    """A made-up ok record of the current schema, as the report reads it (in job `<run_id>_x`)."""
    c = {"schedule": {"name": "1f1b"}, "pp": 2, "dp": 1, "virtual_stages": 1, "microbatches": 4,
         "microbatch_size": 4, "compute": "emulated", "executor": "native", "device": "cpu",
         "partition": {"name": "uniform"}, "model": {"name": "mlp", "layers": 8, "hidden": 32}} | config
    bubble = 0.2 + 0.01 * run_id
    env = Env(torch="2.13.0", python="3.11", device="cpu", device_name="x86_64", world_size=c["pp"] * c["dp"],
              git_commit=None, hostname="test", cpu_count=2)
    metrics = Metrics(step_time_s=0.1, step_times_s=[0.1], throughput_samples_s=160.0 * c["dp"] / (1 + 0.05 * c["dp"]),
                      throughput_tokens_s=None, losses=[1.0], dp_sync_s=None, dp_sync_share=None,
                      dp_sync_theory_s=None, recompute_s=0.0, p2p_hop_s=None, stage_time_s=[0.03, 0.03],
                      measured_imbalance=1.0, mean_op_s={"F": [0.01, 0.01], "B": [0.02, 0.02]},
                      bubble=Bubble(theory=0.2, simulated=bubble, measured=bubble, measured_per_rank=[bubble] * 2,
                                    measured_per_step=[bubble], measured_per_global_rank=[bubble] * 2),
                      memory=Memory(peak_activation_bytes_per_rank=[2**20, 2**19],
                                    theory_peak_microbatches_per_rank=[2, 1],
                                    activation_bytes_per_microbatch_per_rank=[2**19, 2**19]))
    return Run(Result("ok", None, c, env=env, metrics=metrics,
                      measurement=measurement_of(c["executor"], c["compute"])), f"{run_id}_x")


def test_dp_scaling_draws_when_dp_varies_and_says_so_when_not(tmp_path):
    flat = dp_scaling([fake(0), fake(1, microbatches=8)], tmp_path)
    assert flat.path is None and flat.missing == ["no runs with dp > 1 (all 2 ok runs have dp=1): nothing to scale"]
    runs = [fake(i, dp=dp, microbatches=m) for i, (dp, m) in enumerate([(1, 4), (2, 4), (4, 4), (1, 8), (2, 8)])]
    fig = dp_scaling(runs, tmp_path)
    assert fig.path == tmp_path / "dp_scaling.png" and fig.path.with_suffix(".svg").exists()
    assert fig.held.endswith("runs 0-4") and fig.missing == []


def test_mixed_compute_modes_are_said_in_every_figure(tmp_path):
    runs = [fake(0), fake(1, microbatches=8), fake(2, compute="real"), fake(3, compute="real", microbatches=8)]
    assert provenance(runs) == ("compute=emulated (2), real (2)  device=cpu  executor=native  runs=4  "
                                "MIXED compute: not like for like")
    sweep = tmp_path / "mixed"
    for r in runs:
        (sweep / r.dir).mkdir(parents=True)
        (sweep / r.dir / "result.json").write_text(json.dumps(r.result.to_json()))
    loaded = load_sweep(sweep)
    assert len(loaded.runs) == 4 and not loaded.corrupt
    md = build_report(loaded, tmp_path / "rep").read_text()
    made = [line for line in md.splitlines() if line.startswith("Made from:") and "SVG:" in line]  # figures
    # the bubble curve and the memory bars keep to one setting and list the rest as not drawn;
    # every figure that draws both modes says so
    assert len(made) == 4
    single = ("bubble_vs_microbatches", "memory_per_rank")
    assert all("MIXED compute" in line for line in made if not any(f in line for f in single))
    assert all("MIXED" not in line and "runs=2" in line for line in made if any(f in line for f in single))
    assert "another compute mode" in md and "another model, microbatch size, dp or compute mode" in md
    assert "no runs that differ only in `partition`" in md


def test_zero_bubble_figure_draws_both_bubbles_and_memory_per_schedule(tmp_path):
    """Generated (zb_auto at two limits, each its own series) beside handcrafted; a sweep with
    no zero-bubble schedule says so."""
    def zb(i: int, name: str, m: int, **schedule) -> Run:
        r = fake(i, microbatches=m, schedule={"name": name, **schedule})
        r.metrics.bubble.steady_measured = 0.1 - 0.01 * i
        return r

    none = zero_bubble_study([zb(0, "1f1b", 4)], tmp_path)
    assert none.path is None and "no run of a zero-bubble schedule" in none.missing[0]
    runs = [zb(i, name, m, **extra) for i, (name, m, extra) in enumerate([
        ("zb_h1", 4, {}), ("zb_h1", 8, {}), ("zb_auto", 4, {"memory_limit": 1.0}), ("zb_auto", 8, {"memory_limit": 1.0}),
        ("zb_auto", 4, {"memory_limit": 2.0}), ("zb_auto", 8, {"memory_limit": 2.0})])]
    fig = zero_bubble_study(runs, tmp_path)
    assert fig.path == tmp_path / "zero_bubble.png" and fig.missing == [] and fig.held.endswith("runs 0-5")
    assert {schedule_label(r.cfg) for r in runs} == {"zb_h1", "zb_auto mem=1", "zb_auto mem=2"}
    assert _peak_share(runs[0]) == pytest.approx(1.0)  # 2^20 bytes on rank 0 = pp x 2^19
