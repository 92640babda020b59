"""sweep: nothing lost, one writer, resume by content (issue 28, the writes half). Each case
found adversarially, kept here: executor=sim jobs run in this process (`run_harness`), a
second writer held by a raw flock of this test (another open file: another harness, to the
kernel), a full disk injected through the harness's own write path (fault=enospc@records) or
Hydra's (its config save), never by filling a disk."""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.sweep
ROOT = Path(__file__).resolve().parents[1]
SIM = ["executor=sim", "pp=2", "steps=1", "warmup_steps=0", "wandb.mode=disabled"]
DIRNAME = "executor=sim,microbatches={},pp=2,steps=1,warmup_steps=0"  # Hydra's override_dirname of SIM + microbatches


def snapshot(d: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under d: its modification time (ns) and bytes."""
    return {str(f.relative_to(d)): (f.stat().st_mtime_ns, f.read_bytes()) for f in sorted(d.rglob("*")) if f.is_file()}


def records(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep.rglob("result.json"))}


class Held:
    """Another harness writing `directory`: its lock file flocked on an open file of our own."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(directory / ".harness.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(self.fd, b"4242")

    def __enter__(self) -> "Held":
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


# -- 1. one writer per directory, sweep jobs included ---------------------------------------------

def test_a_run_into_a_sweeps_job_or_a_locked_directory_touches_nothing(tmp_path, run_harness):
    sweep = tmp_path / "s"
    assert run_harness("-m", "microbatches=2", *SIM, f"hydra.sweep.dir={sweep}", cwd=tmp_path).returncode == 0
    job = sweep / f"0_{DIRNAME.format(2)}"
    before = snapshot(sweep)
    for where in (job, sweep):  # a finished sweep's job (its record would be replaced), the sweep itself
        p = run_harness("microbatches=4", *SIM, f"hydra.run.dir='{where}'", cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.count("harness: error") == 1, p.stderr
        assert "whose records are the sweep's" in p.stderr
    assert snapshot(sweep) == before
    # a directory another harness writes (or one below it): refused before Hydra writes .hydra/ there
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("the first run's\n")
    with Held(run):
        before = snapshot(run)
        for where in (run, run / "inside"):
            p = run_harness(*SIM, f"hydra.run.dir={where}", cwd=tmp_path)
            assert p.returncode == 2 and "is being written by another harness (pid 4242)" in p.stderr, p.stderr
        assert snapshot(run) == before and not (run / "inside").exists()


def test_a_resume_that_meets_a_locked_job_goes_on_and_says_so(tmp_path, run_harness):
    sweep = tmp_path / "s"
    assert run_harness("-m", "microbatches=2,4", *SIM, f"hydra.sweep.dir={sweep}", cwd=tmp_path).returncode == 0
    locked = sweep / f"2_{DIRNAME.format(8)}"
    with Held(locked):
        p = run_harness("-m", "microbatches=2,4,8,16", *SIM, "resume=true", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert p.stdout.count("skipped (resume=true)") == 2
    assert f"harness: locked: {locked.name}: not run" in p.stderr and "harness: not ok: " + locked.name in p.stderr
    runs = records(sweep)
    assert runs[f"3_{DIRNAME.format(16)}"]["status"] == "ok"  # the job after it ran
    assert [f.name for f in locked.iterdir()] == [".harness.lock"]  # nothing of this sweep's in it


# -- 2. a refusal writes nothing; unsafe directories -------------------------------------------------

def test_an_invalid_run_writes_nothing_and_replaces_no_record(tmp_path, run_harness):
    run = tmp_path / "run"
    ok = run_harness(*SIM, "microbatches=2", f"hydra.run.dir={run}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    before = snapshot(run)
    p = run_harness(*SIM, "microbatches=2", "model.layers=1", "wandb.mode=offline", f"hydra.run.dir={run}",
                    cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("harness: error") == 1 and "model's 1 layers" in p.stderr, p.stderr
    assert snapshot(run) == before  # the ok record, its trace and Gantt, .hydra/ as they were; no wandb run
    fresh = tmp_path / "fresh"
    p = run_harness(*SIM, "model.layers=1", "wandb.mode=offline", f"hydra.run.dir={fresh}", cwd=tmp_path)
    assert p.returncode == 2 and not fresh.exists()
    p = run_harness("-m", "model.layers=8,1", *SIM, f"hydra.sweep.dir={tmp_path / 'sw'}", cwd=tmp_path)
    assert p.returncode == 2 and not (tmp_path / "sw").exists()  # an invalid sweep: not even its directory


@pytest.mark.parametrize("where,said", [
    ("", "empty"), ("/", "the file system's root"), (".", "the current directory"), ("~", "the home directory"),
    (str(ROOT), "the harness's source"), (str(ROOT / "harness" / "x"), "inside the harness's source"),
    (str(ROOT / "tests" / "x"), "tracked by git"), (str(ROOT.parent), "the harness's source"),
])
def test_an_unsafe_directory_is_no_place_for_records(tmp_path, where, said):
    from harness.records.locks import unsafe_dir

    assert said in unsafe_dir(where, str(tmp_path))
    assert unsafe_dir("runs/x", str(tmp_path)) is None and unsafe_dir(str(ROOT / "runs" / "x"), str(tmp_path)) is None


def test_an_unsafe_run_or_sweep_directory_is_refused_in_one_line(tmp_path, run_harness):
    for args in (["hydra.run.dir="], ["hydra.run.dir=."], ["-m", "hydra.sweep.dir=/"]):
        p = run_harness(*args, *SIM, cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "nothing written" in p.stderr, p.stderr
        assert list(tmp_path.iterdir()) == []


# -- 3. --copy-as deletes only what it wrote -------------------------------------------------------

def test_copy_as_refuses_a_report_it_did_not_write(tmp_path, capsys):
    from harness.report.__main__ import MARKER, main

    sweep = tmp_path / "s"
    (sweep / "0_x" / ".hydra").mkdir(parents=True)  # a job killed before its record: a sweep all the same
    mine = tmp_path / "out" / "example"
    mine.mkdir(parents=True)
    (mine / "index.md").write_text("a report of my own")  # what the old --copy-as took for its own and deleted
    (mine / "notes.txt").write_text("mine")
    before = snapshot(mine)
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--copy-as", "example"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no {MARKER}" in err, err
    assert snapshot(mine) == before


# -- 4. resume by content; one record per point ----------------------------------------------------

def test_resume_reruns_what_changed_says_why_and_matches_points_by_their_overrides(tmp_path, run_harness,
                                                                                     monkeypatch):
    from harness.records import record
    from harness.report.load import load_sweep

    model = tmp_path / "m.py"
    model.write_text((ROOT / "examples" / "my_model.py").read_text())
    custom = ["model=custom", f"model.target={model}:build"]
    sweep = tmp_path / "s"
    args = [*SIM, *custom, f"hydra.sweep.dir={sweep}"]
    assert run_harness("-m", "microbatches=2,4", *args, cwd=tmp_path).returncode == 0
    first = records(sweep)
    assert all(r["provenance"]["files"]["model.target"]["sha256"] for r in first.values())
    # reordered: the same points, found whatever their number; nothing runs, no directory is made
    p = run_harness("-m", "microbatches=4,2", *args, "resume=true", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.count("skipped (resume=true)") == 2, p.stdout
    assert records(sweep) == first
    # the model's source changed: both run again, and the summary says why
    model.write_text(model.read_text() + "\n# changed\n")
    p = run_harness("-m", "microbatches=4,2", *args, "resume=true", cwd=tmp_path)
    assert p.returncode == 0 and "skipped (resume=true)" not in p.stdout
    assert "2 run again" in p.stdout and "model.target changed" in p.stdout, p.stdout
    assert len(records(sweep)) == 4  # new directories (the new numbers): the old records stand beside them
    report = load_sweep(sweep)
    assert sorted(r["config"]["microbatches"] for r in report.runs) == [2, 4]  # one per point: the newest
    assert sorted(old for old, _ in report.superseded) == sorted(first)
    assert "superseded by a newer record of the same point" in p.stdout
    # a new commit reruns everything, and says so
    monkeypatch.setattr(record, "code_version", lambda: {"commit": "f" * 40, "dirty": False, "diff_sha256": None})
    p = run_harness("-m", "microbatches=4,2", *args, "resume=true", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.count("running it again") == 2, p.stdout
    assert "the code changed (commit " in p.stdout


def test_resume_keeps_diverged_and_skipped_records_unless_rerun_names_them(tmp_path, run_harness):
    sweep = tmp_path / "s"
    args = ["-m", "microbatches=2,4", *SIM, f"hydra.sweep.dir={sweep}"]
    assert run_harness(*args, cwd=tmp_path).returncode == 0
    job = sweep / f"0_{DIRNAME.format(2)}" / "result.json"
    data = json.loads(job.read_text())
    job.write_text(json.dumps({**data, "status": "diverged", "error": "the loss is not finite from step 0"}))
    p = run_harness(*args, "resume=true", cwd=tmp_path)
    assert p.stdout.count("skipped (resume=true)") == 2 and "diverged in an earlier run" in p.stdout, p.stdout
    p = run_harness(*args, "resume=true", "rerun=diverged", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.count("skipped (resume=true)") == 1
    assert "its record says diverged (rerun=diverged)" in p.stdout and json.loads(job.read_text())["status"] == "ok"
    p = run_harness(*args, "resume=true", "rerun=everything", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "rerun=everything: unknown" in p.stderr, p.stderr


# -- 5. a full disk fails the job that hit it; the sweep ends with its summary ---------------------

def test_a_full_disk_fails_its_job_with_a_record_and_the_summary_names_it(tmp_path, run_harness):
    sweep = tmp_path / "s"
    p = run_harness("-m", "fault=null,enospc@records,null", "microbatches=2", *SIM, f"hydra.sweep.dir={sweep}",
                    cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    runs = records(sweep)
    assert [r["status"] for r in runs.values()] == ["ok", "failed"]  # the third was never started
    assert runs[sorted(runs)[1]]["error"].startswith("disk full: No space left on device")
    hit = sorted(runs)[1]
    assert f"harness: disk full: {hit} hit it" in p.stderr and "1 point(s) not run" in p.stderr, p.stderr
    assert f"harness: not ok: {hit}" in p.stderr


def test_a_full_disk_under_hydras_own_writes_is_named_too(tmp_path, run_harness, monkeypatch):
    from hydra.core import utils

    save = utils._save_config

    def full(cfg, filename, output_dir):
        if "microbatches=4" in str(output_dir):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(output_dir / filename))
        return save(cfg, filename, output_dir)

    monkeypatch.setattr(utils, "_save_config", full)
    sweep = tmp_path / "s"
    p = run_harness("-m", "microbatches=2,4,8", *SIM, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    hit = f"1_{DIRNAME.format(4)}"
    assert f"harness: disk full: {hit} hit it" in p.stderr and "harness: sweep " in p.stdout, p.stderr
    assert records(sweep)[hit]["error"].startswith("disk full:")  # where space allows


def test_a_job_whose_records_find_no_space_at_all_fails_without_raising(tmp_path, monkeypatch, config):
    from harness import job
    from harness.records import atomic

    write = atomic.write_atomic

    def full(path, *a, **k):
        if Path(path).name == "result.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return write(path, *a, **k)

    monkeypatch.setattr(atomic, "write_atomic", full)
    r = job.run_job(config(executor="sim", pp=2, microbatches=2), tmp_path, "t", "full")
    assert r.status == "failed" and r.error.startswith("disk full") and "no record written" in r.error
    assert not (tmp_path / "result.json").exists()
