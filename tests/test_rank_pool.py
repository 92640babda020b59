"""A sweep whose jobs run in its own process runs them on shared rank processes (RankPool,
harness/runtime/launch.py): the next job runs on the same ranks, a failed job ends them (the
next starts fresh ones), none outlives the sweep, and every record is complete."""

from __future__ import annotations

import json

import pytest

from tests.test_reliability import alive, records

pytestmark = pytest.mark.sweep
SMALL = ["pp=2", "steps=1", "warmup_steps=0", "model.hidden=32", "wandb.mode=disabled", "compute=real"]


def test_jobs_share_ranks_until_one_fails_and_every_record_is_complete(tmp_path, run_harness):
    sweep = tmp_path / "sweep"
    ran = run_harness("-m", "microbatches=2,4", "run.fault=null,raise@rank1,step0", *SMALL, f"hydra.sweep.dir={sweep}",
                      cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr[-2000:]  # the two faults failed their jobs
    runs = [r for _, r in sorted(records(sweep).items())]
    assert [(r["config"]["microbatches"], r["status"]) for r in runs] == [(2, "ok"), (2, "failed"), (4, "ok"),
                                                                           (4, "failed")]
    pids = [tuple(r["worker_pids"]) for r in runs]
    assert pids[0] == pids[1] and pids[2] == pids[3]  # the next job ran on the same ranks...
    assert not set(pids[0]) & set(pids[2])  # ...until one failed: its ranks were ended, fresh ones started
    assert not any(alive(p) for ps in pids for p in ps)  # and none outlived the sweep
    for job in sorted(sweep.glob("*_*")):
        result = json.loads((job / "result.json").read_text())
        if result["status"] == "ok":
            assert {"trace.json", "gantt.png"} <= {f.name for f in job.iterdir()}
            assert result["trace_json"]["events_written"] > 0
    log = (sweep / "sweep.log").read_text().splitlines()
    assert len(log) == 4 and sum("(real): bubble measured" in line for line in log) == 2, log
