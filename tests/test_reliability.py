"""sweep: a sweep survives a failing rank, a killed rank, a hang and an interruption; what
finished keeps its record, no worker outlives its job, and resume=true completes the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sweep
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SMALL = ["microbatches=2", "steps=1", "warmup_steps=0", "model.hidden=32", "wandb.mode=disabled"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for every purpose but its entry; /proc says which
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def records(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep.rglob("result.json"))}


def test_faults_fail_their_job_and_the_next_job_runs(tmp_path):
    sweep = tmp_path / "sweep"
    faults = '"raise@rank1,step0","kill@rank0,step0","hang@rank1,step0",null'
    p = subprocess.run([sys.executable, "-m", "harness", "-m", f"fault={faults}", "pp=2", "timeout_s=10", *SMALL,
                        f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    runs = records(sweep)
    assert len(runs) == 4
    by_fault = {r["config"]["fault"]: r for r in runs.values()}
    assert by_fault[None]["status"] == "ok"
    assert "rank 1: RuntimeError: injected fault" in by_fault["raise@rank1,step0"]["error"]
    assert "rank 0 died" in by_fault["kill@rank0,step0"]["error"]
    assert "timeout_s=10.0 passed" in by_fault["hang@rank1,step0"]["error"]
    for r in runs.values():
        assert len(r["worker_pids"]) == 2
        assert not any(alive(pid) for pid in r["worker_pids"]), r["config"]["fault"]
    assert "1 ok" in p.stdout and "3 failed" in p.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_sweep_keeps_records_and_resumes(tmp_path, sig):
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "harness", "-m", "microbatches=2,3,4,5", "pp=2", "compute=emulated",
            "cost.fwd_ms_per_layer=60", "steps=2", "warmup_steps=0", "model.hidden=32", "wandb.mode=disabled",
            f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (any(r["status"] == "ok" for r in records(sweep).values())
                                               and len([d for d in sweep.glob("*") if d.is_dir()]) >= 2):
        time.sleep(0.2)
    time.sleep(1.5)  # into the second job's run (each takes seconds)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    first = records(sweep)
    assert any(r["status"] == "ok" for r in first.values())
    assert any(r["status"] == "interrupted" for r in first.values()), (proc.returncode, err[-3000:])
    for r in first.values():
        assert not any(alive(pid) for pid in r["worker_pids"])
    ok_before = {k: r["wall_s"] for k, r in first.items() if r["status"] == "ok"}

    p = subprocess.run([*args, "resume=true"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    after = records(sweep)
    assert len(after) == 4 and all(r["status"] == "ok" for r in after.values())
    assert {k: after[k]["wall_s"] for k in ok_before} == ok_before  # not run twice
    assert p.stdout.count("skipped (resume=true)") == len(ok_before)
