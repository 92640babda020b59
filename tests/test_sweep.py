"""sweep: `python -m harness -m ...` end to end, then `make report` on its output.

`harness` and `report` run `python -m harness` and `python -m harness.report` in this process
(make test) and in a fresh interpreter (`slow`, make test-all); `make report` runs as a user
types it in both."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.sweep
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_sweep_then_report(tmp_path, harness):
    sweep = tmp_path / "runs" / "sweeps" / "small"
    p = harness("-m", "schedule=gpipe,1f1b", "pp=2,4", "microbatches=2,4", "compute=emulated",
                "cost.fwd_ms_per_layer=1", "steps=1", "warmup_steps=0", "wandb.mode=disabled",
                f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    results = sorted(sweep.rglob("result.json"))
    assert len(results) == 8
    runs = [json.loads(r.read_text()) for r in results]
    assert all(r["status"] == "ok" for r in runs)
    assert {(r["config"]["schedule"]["name"], r["config"]["pp"], r["config"]["microbatches"]) for r in runs} == {
        (s, n, m) for s in ("gpipe", "1f1b") for n in (2, 4) for m in (2, 4)}
    assert "8 ok" in p.stdout

    r = subprocess.run(["make", "-s", "report", f"SWEEP={sweep}", f"REPORTS={tmp_path / 'reports'}"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "reports" / "small"
    index = (out / "index.md").read_text()
    assert "bubble_vs_microbatches.png" in index and (out / "bubble_vs_microbatches.png").stat().st_size > 0
    with open(out / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 8


def test_a_failing_point_does_not_stop_the_sweep(tmp_path, harness, report):
    """A point that plans but fails at run time is recorded failed, the other runs, the sweep
    exits 1 and the report lists it (a point that cannot be planned stops the sweep before any
    job: tests/test_cli.py)."""
    sweep = tmp_path / "sweep"
    p = harness("-m", "pp=1", 'run.fault=null,"raise@rank0,step0"', "microbatches=2", "steps=1", "warmup_steps=0",
                "wandb.mode=disabled", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 1
    assert "injected fault" in p.stdout
    status = sorted(json.loads(r.read_text())["status"] for r in sweep.rglob("result.json"))
    assert status == ["failed", "ok"]
    (sweep / "corrupt").mkdir()
    (sweep / "corrupt" / "result.json").write_text("{not json")
    r = report(str(sweep), "--out", str(tmp_path / "rep"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    index = (tmp_path / "rep" / "sweep" / "index.md").read_text()
    assert "## Not ok" in index and "injected fault" in index and "corrupt/result.json" in index


def test_repeats_are_interleaved_and_the_report_says_what_is_within_the_noise(tmp_path, harness, report):
    """run.repeats=2: every point twice as repeat=0,1, the repeats outermost (a drifting machine
    moves every point alike); each record carries its intervals; the report's noise table
    compares schedules over their repeats."""
    sweep = tmp_path / "rep"
    p = harness("-m", "schedule=gpipe,1f1b", "pp=2", "microbatches=4", "executor=sim", "run.repeats=2", "steps=2",
                "wandb.mode=disabled", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted(sweep.glob("*_*/result.json"), key=lambda f: int(f.parent.name.split("_")[0]))
    runs = [json.loads(f.read_text()) for f in jobs]
    assert [(r["config"]["schedule"]["name"], r["config"]["repeat"]) for r in runs] == [
        ("gpipe", 0), ("1f1b", 0), ("gpipe", 1), ("1f1b", 1)]
    for r in runs:
        lo, hi = r["metrics"]["intervals"]["step_time_s"]
        assert lo <= r["metrics"]["step_time_s"] <= hi
    r = report(str(sweep), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "rep" / "index.md").read_text()
    assert "## Told apart, or not" in md and "n=2 repeats" in md and "fastest" in md


@pytest.mark.parametrize("args,said", [
    (["-m", "pp=2", "run.repeats=0"], "run.repeats=0: must be an integer >= 1"),
    (["-m", "pp=2", "run.repeats=2", "repeat=0,1"], "run.repeats=2 with repeat swept too"),
    (["-m", "pp=2", "run.repeats=1,2"], "run.repeats=1,2: one value per sweep"),
    (["pp=2", "run.repeats=2"], "run.repeats=2: repeats are points of a sweep"),
])
def test_bad_repeats_are_one_line(tmp_path, harness, args, said):
    p = harness(*args, "executor=sim", "wandb.mode=disabled", f"hydra.sweep.dir={tmp_path / 's'}",
                f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert p.returncode == 2 and said in p.stderr and p.stderr.count("harness: error") == 1, p.stderr
