"""sweep: a sweep survives a failing rank, a killed rank, a hang, an interruption at any
moment and the death of the harness itself; what finished keeps its record, no process
outlives its job, one writer per directory, and run.resume=true completes the rest. Signals
come from the harness's own hooks (run.fault=term@launch|records) or, for kill -9, while a job
hangs (run.fault=hang) after its running.json appears: never after a sleep, never a race.

`harness` runs `python -m harness` in this process (make test) and in a fresh interpreter
(`slow`, make test-all); kill -9 of the harness needs a process of its own in both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sweep
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SMALL = ["microbatches=2", "steps=1", "warmup_steps=0", "model.hidden=32", "wandb.mode=disabled", "compute=real"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for every purpose but its entry; /proc says which
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (the forkserver, the resource tracker, the ranks)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def records(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep.rglob("result.json"))}


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_faults_fail_their_job_and_the_next_job_runs(tmp_path, harness):
    sweep = tmp_path / "sweep"
    faults = '"raise@rank1,step0","kill@rank0,step0","hang@rank1,step0",null'
    p = harness("-m", f"run.fault={faults}", "pp=2", "run.timeout_s=4", *SMALL, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 1, p.stderr[-2000:]
    runs = records(sweep)
    assert len(runs) == 4
    by_fault = {r["config"]["run"]["fault"]: r for r in runs.values()}
    assert by_fault[None]["status"] == "ok"
    assert "rank 1: RuntimeError: injected fault" in by_fault["raise@rank1,step0"]["error"]
    assert "rank 0 died" in by_fault["kill@rank0,step0"]["error"]
    assert "run.timeout_s=4.0 passed" in by_fault["hang@rank1,step0"]["error"]
    for r in runs.values():
        assert len(r["worker_pids"]) == 2
        assert not any(alive(pid) for pid in r["worker_pids"]), r["config"]["run"]["fault"]
    assert "1 ok" in p.stdout and "3 failed" in p.stdout


# the second job's status after SIGTERM at each phase boundary (harness/runtime/faults.py term@PHASE)
MOMENTS = {"start": None, "plan": "interrupted", "launch": "interrupted", "records": "interrupted", "end": "ok"}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_signal_at_any_moment_is_recorded_and_resume_completes(tmp_path, harness, moment):
    """SIGTERM at each phase boundary of the second job (before it plans, once planned, while its
    ranks start, between its trace.json and its result.json, once its records are written): the
    sweep stops there (exit 130, the third job never starts), that job says interrupted where it
    had begun (none before it plans; ok after its records), no process is left, the first keeps
    its record, and run.resume=true runs only what is missing (the fault is a test hook, not part of
    a job's identity)."""
    sweep = tmp_path / "sweep"
    first = harness("-m", f"run.fault=null,term@{moment},null", "pp=2", *SMALL, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert first.returncode == 130, first.stderr[-2000:]
    runs = records(sweep)
    want = ["ok"] + ([MOMENTS[moment]] if MOMENTS[moment] else [])
    assert [runs[k]["status"] for k in sorted(runs)] == want, runs.keys()
    assert not any(alive(pid) for r in runs.values() for pid in r["worker_pids"])
    ok_wall = runs[sorted(runs)[0]]["wall_s"]

    again = harness("-m", "run.fault=null,null,null", "pp=2", *SMALL, "run.resume=true", f"hydra.sweep.dir={sweep}",
                    cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    after = records(sweep)
    assert len(after) == 3 and all(r["status"] == "ok" for r in after.values())
    assert after[sorted(after)[0]]["wall_s"] == ok_wall  # not run twice
    assert again.stdout.count("skipped (run.resume=true)") == want.count("ok")
    for job in after:
        assert {"trace.json", "gantt.png"} <= {f.name for f in (sweep / job).iterdir()}


def test_killing_the_harness_leaves_no_process_and_resume_completes(tmp_path, run_harness):
    """kill -9 of the main process mid-job (the job hangs until then: run.fault=hang): its
    forkserver and ranks die with it (within 10 s, checked by pid); a second writer into the
    busy sweep is refused; resume reruns the job and runs the one never started."""
    sweep = tmp_path / "sweep"
    args = ["-m", "microbatches=2,4", "pp=2", "steps=1", "warmup_steps=0", "model.hidden=32", "wandb.mode=disabled",
            "compute=real", "run.timeout_s=600", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args, "run.fault=hang@rank1,step0"], cwd=tmp_path,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job = next(iter(sorted(sweep.glob("0_*"))), None) if sweep.exists() else None
        deadline = time.monotonic() + 120
        while job is None:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
            job = next(iter(sorted(sweep.glob("0_*"))), None) if sweep.exists() else None
        wait_for(job / "running.json", proc)
        second = run_harness(*args, cwd=tmp_path)
        assert second.returncode == 2 and "is being written by another harness" in second.stderr, second.stderr
        assert proc.poll() is None  # still hanging: only the kill ends it
        left = descendants(proc.pid)
        assert set(json.loads((job / "running.json").read_text())["worker_pids"]) <= left
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in left if alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (job / "result.json").exists()  # the killed job has no record: the report lists it missing
    again = run_harness(*args, "run.resume=true", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert all(r["status"] == "ok" for r in records(sweep).values()) and len(records(sweep)) == 2


def test_a_signal_whose_raise_was_lost_is_honoured_at_the_next_boundary():
    """Python drops a KeyboardInterrupt raised inside a finalizer ("Exception ignored in: ...");
    the handler remembers the signal, and every phase boundary raises it again."""
    import signal as sig

    from harness.frontend import signals

    before = {s: sig.getsignal(s) for s in (sig.SIGINT, sig.SIGTERM)}
    try:
        signals.install()
        signals.check()  # nothing seen: goes on
        try:
            sig.getsignal(sig.SIGTERM)(sig.SIGTERM, None)
        except KeyboardInterrupt:
            pass  # lost, as in a weakref callback
        with pytest.raises(KeyboardInterrupt):
            signals.check()
        signals.install()  # a new command forgets it
        signals.check()
    finally:
        for s, handler in before.items():
            sig.signal(s, handler)
