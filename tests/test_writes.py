"""sweep: nothing lost, one writer, resume by content (issue 28, the writes half). Each case
found adversarially, kept here: executor=sim jobs run in this process (`run_harness`), a
second writer held by a raw flock of this test (another open file: another harness, to the
kernel), a full disk injected through the harness's own write path (run.fault=enospc@records) or
Hydra's (its config save), never by filling a disk."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from tests.conftest import megatron_runnable_rank

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
        os.ftruncate(self.fd, 0)
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
        p = run_harness("-m", "microbatches=2,4,8,16", *SIM, "run.resume=true", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert p.stdout.count("skipped (run.resume=true)") == 2
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

def test_resume_reruns_what_changed_says_why_and_matches_points_by_their_identity(tmp_path, run_harness,
                                                                                    monkeypatch):
    from harness.records import identity
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
    p = run_harness("-m", "microbatches=4,2", *args, "run.resume=true", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.count("skipped (run.resume=true)") == 2, p.stdout
    assert records(sweep) == first
    # the model's source changed: both run again, and the summary says why
    model.write_text(model.read_text() + "\n# changed\n")
    p = run_harness("-m", "microbatches=4,2", *args, "run.resume=true", cwd=tmp_path)
    assert p.returncode == 0 and "skipped (run.resume=true)" not in p.stdout
    assert "2 run again" in p.stdout and "model.target changed" in p.stdout, p.stdout
    assert len(records(sweep)) == 4  # new directories (the new numbers): the old records stand beside them
    report = load_sweep(sweep)
    assert sorted(r.cfg.microbatches for r in report.runs) == [2, 4]  # one per point: the newest
    assert sorted(old for old, _ in report.superseded) == sorted(first)
    assert "superseded by a newer record of the same point" in p.stdout
    # a new commit reruns everything, and says so
    monkeypatch.setattr(identity, "code_version", lambda: {"commit": "f" * 40, "dirty": False, "diff_sha256": None,
                                                       "untracked_sha256": None})
    p = run_harness("-m", "microbatches=4,2", *args, "run.resume=true", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.count("running it again") == 2, p.stdout
    assert "the code changed (commit " in p.stdout


def test_resume_keeps_diverged_and_skipped_records_unless_rerun_names_them(tmp_path, run_harness):
    sweep = tmp_path / "s"
    args = ["-m", "microbatches=2,4", *SIM, f"hydra.sweep.dir={sweep}"]
    assert run_harness(*args, cwd=tmp_path).returncode == 0
    job = sweep / f"0_{DIRNAME.format(2)}" / "result.json"
    data = json.loads(job.read_text())
    job.write_text(json.dumps({**data, "status": "diverged", "error": "the loss is not finite from step 0"}))
    p = run_harness(*args, "run.resume=true", cwd=tmp_path)
    assert p.stdout.count("skipped (run.resume=true)") == 2 and "diverged in an earlier run" in p.stdout, p.stdout
    p = run_harness(*args, "run.resume=true", "run.rerun=diverged", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.count("skipped (run.resume=true)") == 1
    assert "its record says diverged (run.rerun=diverged)" in p.stdout and json.loads(job.read_text())["status"] == "ok"
    p = run_harness(*args, "run.resume=true", "run.rerun=everything", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "run.rerun=everything: unknown" in p.stderr, p.stderr


FIXED_CODE = {"commit": "c" * 40, "dirty": False, "diff_sha256": None, "untracked_sha256": None}


def test_resume_reruns_nothing_for_the_same_points_however_written(tmp_path, run_harness, monkeypatch):
    """A point is its resolved config without run control (harness/records/identity.py): its
    values reordered, written `02` for 2, an explicit default added, or a run.* key changed, a
    resume finds every record and runs nothing, writes no record and makes no directory."""
    from harness.records import identity

    monkeypatch.setattr(identity, "code_version", lambda: FIXED_CODE)
    sweep = tmp_path / "s"
    args = [*SIM, f"hydra.sweep.dir={sweep}", "run.resume=true"]
    assert run_harness("-m", "microbatches=2,4", *args, cwd=tmp_path).returncode == 0

    def jobs() -> dict:  # every file of every job directory (the sweep's own files are rewritten by each run)
        return {k: v for k, v in snapshot(sweep).items() if os.sep in k}

    before = jobs()
    for again in (["microbatches=4,2"], ["microbatches=02,4"], ["microbatches=2,4", "lr=0.01", "dp=1"],
                  ["microbatches=2,4", "run.max_processes=8", "run.timeout_s=30", "wandb.project=other"]):
        p = run_harness("-m", *again, *args, cwd=tmp_path)
        assert p.returncode == 0 and p.stdout.count("skipped (run.resume=true)") == 2, (again, p.stdout, p.stderr)
        assert "running it again" not in p.stdout, again
        assert jobs() == before and len([d for d in sweep.iterdir() if d.is_dir()]) == 2, again
    # a point that differs in what is measured is another point: it runs
    p = run_harness("-m", "microbatches=2,4", "lr=0.02", *args, cwd=tmp_path)
    assert p.returncode == 0 and "skipped" not in p.stdout and len(records(sweep)) == 4, p.stdout


def test_resume_reruns_a_point_whose_custom_model_helper_changed_and_says_why(tmp_path, run_harness, monkeypatch):
    """A custom model's module and the modules of the user's tree it imports are read by the
    run: a changed helper reruns the points of that model, saying which file changed; with the
    helper put back, the records made from it match again (the record judged is the one made
    from what is asked, not the newest on disk) and nothing runs."""
    import sys

    from harness.records import identity

    monkeypatch.setattr(identity, "code_version", lambda: FIXED_CODE)
    code = tmp_path / "code"
    code.mkdir()
    helper = code / "idt_helpers.py"
    helper.write_text("WIDTH_FACTOR = 1\n")
    model = (ROOT / "examples" / "my_model.py").read_text()
    (code / "idt_model.py").write_text(model.replace("import torch\n", "import torch\n\nimport idt_helpers  # noqa: F401\n", 1))
    monkeypatch.syspath_prepend(str(code))
    for name in ("idt_model", "idt_helpers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    sweep = tmp_path / "s"
    args = [*SIM, "model=custom", "model.target=idt_model:build", f"hydra.sweep.dir={sweep}", "run.resume=true"]
    try:
        assert run_harness("-m", "microbatches=2,4", *args, cwd=tmp_path).returncode == 0
        first = records(sweep)
        files = next(iter(first.values()))["provenance"]["files"]
        assert files["model.target:idt_helpers"]["path"] == str(helper.resolve()), files
        assert files["model.target"]["path"] == str((code / "idt_model.py").resolve())
        helper.write_text("WIDTH_FACTOR = 2\n")  # reordered too: the new records go to new job directories
        p = run_harness("-m", "microbatches=4,2", *args, cwd=tmp_path)
        assert p.returncode == 0 and p.stdout.count("running it again") == 2, p.stdout
        assert "model.target:idt_helpers changed" in p.stdout and "idt_helpers.py: sha256" in p.stdout, p.stdout
        assert len(records(sweep)) == 4
        p = run_harness("-m", "microbatches=4,2", *args, cwd=tmp_path)  # nothing changed since: the new ones stand
        assert p.stdout.count("skipped (run.resume=true)") == 2 and len(records(sweep)) == 4, p.stdout
        assert not any(f"in an earlier run ({job})" in p.stdout for job in first), p.stdout
        helper.write_text("WIDTH_FACTOR = 1\n")  # back as the first records were made
        p = run_harness("-m", "microbatches=4,2", *args, cwd=tmp_path)
        assert p.stdout.count("skipped (run.resume=true)") == 2 and len(records(sweep)) == 4, p.stdout
        assert all(f"in an earlier run ({job})" in p.stdout for job in first), p.stdout  # the first records
    finally:
        for name in ("idt_model", "idt_helpers"):
            sys.modules.pop(name, None)


def _as_schema_5(data: dict) -> dict:
    """A current record as a schema-5 harness wrote it: run control at the top of its config,
    its provenance's point its overrides, no identity, no untracked files' hash."""
    from harness.config import MOVED

    config = {k: v for k, v in data["config"].items() if k != "run"}
    config.update({k: data["config"]["run"][k] for k in MOVED})
    prov = {k: v for k, v in data["provenance"].items() if k != "identity"}
    prov["point"] = f"executor=sim microbatches={data['config']['microbatches']} pp=2 steps=1 warmup_steps=0"
    prov["code"] = {k: v for k, v in prov["code"].items() if k != "untracked_sha256"}
    return {**data, "config": config, "provenance": prov, "schema_version": 5}


def test_an_older_schemas_records_are_read_with_their_identity_and_resume_keeps_them(tmp_path, run_harness,
                                                                                     monkeypatch):
    from harness.records import identity
    from harness.records.result import read

    monkeypatch.setattr(identity, "code_version", lambda: FIXED_CODE)
    sweep = tmp_path / "s"
    args = ["-m", "microbatches=2,4", *SIM, f"hydra.sweep.dir={sweep}"]
    assert run_harness(*args, cwd=tmp_path).returncode == 0
    for path in sorted(sweep.rglob("result.json")):
        new = json.loads(path.read_text())
        path.write_text(json.dumps(_as_schema_5(new)))
        old = read(path)  # upgraded on read: run control under config.run, the point and identity computed
        assert old.config["run"]["timeout_s"] == new["config"]["run"]["timeout_s"] and "timeout_s" not in old.config
        assert old.provenance["point"] == new["provenance"]["point"] == identity.point_hash(new["config"])
        assert old.provenance["identity"] == new["provenance"]["identity"]
    p = run_harness(*args, "run.resume=true", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.count("skipped (run.resume=true)") == 2, p.stdout


def test_identity_is_the_resolved_config_without_run_control():
    from harness.config import set_keys
    from harness.frontend.compose import compose_config
    from harness.records.identity import point_hash, point_ids

    default = point_hash(compose_config([]))
    assert point_hash(compose_config(["pp=04"])) == default  # 4 is the default, written as 04
    assert point_hash(compose_config(["pp=4", "run.fault=term@end", "run.repeats=3", "wandb.mode=online"])) == default
    assert point_hash(compose_config(["pp=2"])) != default
    assert point_hash(compose_config(["repeat=1"])) != default  # the repeat label is the point's, repeats are not
    assert point_hash(set_keys(compose_config([]), lr=1)) == point_hash(compose_config(["lr=1.0"]))  # int or float
    assert point_ids(["a", "b", None, "a", "a"]) == ["a", "b", None, "a #2", "a #3"]


def test_the_harnesss_untracked_files_are_part_of_what_a_record_was_made_from(tmp_path, monkeypatch):
    """code_version hashes git's untracked (not ignored) files of the harness beside its diff:
    a new module nobody committed changes what a run was made from, and resume says so."""
    import subprocess

    from harness.job import content_changed
    from harness.records import identity
    from harness.records.result import Result

    repo = tmp_path / "repo"
    pkg = repo / "harness"
    pkg.mkdir(parents=True)
    (pkg / "core.py").write_text("X = 1\n")
    (repo / ".gitignore").write_text("*.pyc\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    monkeypatch.setattr(identity, "HARNESS", pkg)
    clean = identity.code_version.__wrapped__()
    assert clean["untracked_sha256"] is None and clean["dirty"] is False
    (pkg / "cached.pyc").write_bytes(b"ignored")
    (pkg / "new.py").write_text("Y = 1\n")
    one = identity.code_version.__wrapped__()
    assert one["untracked_sha256"] and one["dirty"] is True and one["diff_sha256"] is None
    (pkg / "new.py").write_text("Y = 2\n")
    two = identity.code_version.__wrapped__()
    assert two["untracked_sha256"] not in (None, one["untracked_sha256"])
    stored = Result("ok", None, {}, provenance={"code": one, "files": {}})
    assert content_changed(stored, {}, {"code": one, "files": {}}) is None
    assert "the harness's untracked files differ" in content_changed(stored, {}, {"code": two, "files": {}})


# -- 5. a full disk fails the job that hit it; the sweep ends with its summary ---------------------

def test_a_full_disk_fails_its_job_with_a_record_and_the_summary_names_it(tmp_path, run_harness):
    sweep = tmp_path / "s"
    p = run_harness("-m", "run.fault=null,enospc@records,null", "microbatches=2", *SIM, f"hydra.sweep.dir={sweep}",
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


# -- 6. nothing deleted that the harness did not make (issue 35) -----------------------------------

def test_a_run_dir_named_like_a_torchrun_scratch_dir_is_the_users_and_stays(tmp_path, run_harness):
    import tempfile

    # the old launcher removed any hydra.run.dir starting with /tmp/harness-torchrun- at exit
    mine = Path(tempfile.mkdtemp(prefix="harness-torchrun-", dir="/tmp"))
    try:
        (mine / "notes.txt").write_text("mine")
        assert run_harness(*SIM, "microbatches=2", f"hydra.run.dir={mine}", cwd=tmp_path).returncode == 0
        assert (mine / "notes.txt").read_text() == "mine" and (mine / "result.json").is_file()
        p = run_harness(*SIM, "model.layers=1", f"hydra.run.dir={mine / 'x'}", cwd=tmp_path)  # a refusal too
        assert p.returncode == 2 and (mine / "notes.txt").read_text() == "mine"
    finally:
        shutil.rmtree(mine)


def test_a_torchrun_rank_gets_a_scratch_dir_of_its_own_removed_by_identity(tmp_path):
    from harness.frontend.cli import torchrun_overrides

    argv, problem, scratch = torchrun_overrides(["pp=2"], {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "t"})
    assert problem is None and scratch is not None and f"hydra.run.dir={scratch.path}" in argv
    assert scratch.path.name.startswith("harness-torchrun-t-rank1-") and scratch.path.is_dir()
    # another directory put at its path (the same name, not the same directory; the inode reused) is not removed
    shutil.rmtree(scratch.path)
    scratch.path.mkdir()
    (scratch.path / "theirs").write_text("x")
    assert not scratch.remove() and (scratch.path / "theirs").exists()
    (scratch.path / "theirs").unlink()
    scratch.path.rmdir()
    # a link at its path is not followed
    target = tmp_path / "t"
    target.mkdir()
    (target / "keep").write_text("x")
    scratch.path.symlink_to(target)
    assert not scratch.remove() and (target / "keep").exists()
    scratch.path.unlink()
    _, _, own = torchrun_overrides([], {"RANK": "1", "WORLD_SIZE": "2"})
    (own.path / "x").write_text("scratch")
    assert own.remove() and not own.path.exists()
    assert torchrun_overrides([], {"RANK": "0", "WORLD_SIZE": "2"})[2] is None


# -- 7. every sweep job a directory of its own -----------------------------------------------------

@pytest.mark.parametrize("subdir,said", [
    ("x", "get the same job directory x"), (".", "is the sweep's directory itself"),
    ("..", "leaves the sweep's directory"), ("../../${hydra.job.num}", "leaves the sweep's directory"),
    ("/tmp/elsewhere${hydra.job.num}", "leaves the sweep's directory"),
    ("${hydra.job.override_dirname}", "get the same job directory"),  # fault is excluded from the dirname
])
def test_a_subdir_that_is_not_each_points_own_is_refused_before_any_job(tmp_path, run_harness, subdir, said):
    sweep = tmp_path / "s"
    p = run_harness("-m", "microbatches=2,4", "run.fault=null,null", *SIM, f"hydra.sweep.dir={sweep}",
                    f"hydra.sweep.subdir={subdir}", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and said in p.stderr, p.stderr
    assert "nothing written" in p.stderr and list(tmp_path.iterdir()) == []


def test_a_resume_in_another_order_never_writes_over_another_points_record(tmp_path, run_harness):
    sweep = tmp_path / "s"
    args = [*SIM, f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}"]  # job dirs by number alone
    assert run_harness("-m", "microbatches=2,4", *args, cwd=tmp_path).returncode == 0
    p = run_harness("-m", "microbatches=4,2", *args, "run.resume=true", cwd=tmp_path)  # found by content: nothing runs
    assert p.returncode == 0 and p.stdout.count("skipped (run.resume=true)") == 2, p.stderr
    before = snapshot(sweep)
    # a new point first: it would be job 0, whose directory holds microbatches=2's record
    p = run_harness("-m", "microbatches=8,2,4", *args, "run.resume=true", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"would write into {sweep / '0'}, which holds the record of another point" in p.stderr
    assert {k: v for k, v in snapshot(sweep).items() if k != ".harness.lock"} == {
        k: v for k, v in before.items() if k != ".harness.lock"}  # the lock: this harness's pid, nothing else
    assert json.loads((sweep / "0" / "result.json").read_text())["config"]["microbatches"] == 2


def test_a_second_sweep_on_a_running_sweeps_directory_is_refused(tmp_path, run_harness):
    sweep = tmp_path / "s"
    args = ["-m", "microbatches=2", *SIM, f"hydra.sweep.dir={sweep}"]
    assert run_harness(*args, cwd=tmp_path).returncode == 0
    before = snapshot(sweep)
    with Held(sweep):  # the first sweep, still running: its lock on the sweep's directory
        for extra in ([], ["run.resume=true"], ["microbatches=2,4"]):
            p = run_harness(*args, *extra, cwd=tmp_path)
            assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
            assert "is being written by another harness (pid 4242)" in p.stderr
    assert {k: v for k, v in snapshot(sweep).items() if k != ".harness.lock"} == {
        k: v for k, v in before.items() if k != ".harness.lock"}


# -- 8. no link followed, no FIFO opened, where the harness writes ---------------------------------

def test_atomic_writes_refuse_links_and_fifos_and_leave_nothing_half_written(tmp_path):
    from harness.records.atomic import UnsafeTarget, write_atomic, write_json_atomic, write_text

    theirs = tmp_path / "theirs.txt"
    theirs.write_text("theirs")
    (tmp_path / "link").symlink_to(theirs)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name, what in (("link", "a symlink"), ("fifo", "a FIFO"), ("dir", "a directory")):
        with pytest.raises(UnsafeTarget) as e:
            write_text(tmp_path / name, "x")
        assert str(e.value) == f"{tmp_path / name}: {what} is there, not replaced (allowed: a regular file or nothing)"
    assert theirs.read_text() == "theirs"
    write_json_atomic(tmp_path / "r.json", {"a": float("nan")})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": None, "nulls": ["a: nan written as null (not a finite number)"]}

    def half(f):
        f.write("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(tmp_path / "r.json", half)
    assert json.loads((tmp_path / "r.json").read_text())["a"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "fifo", "link", "r.json", "theirs.txt"]
    assert oct((tmp_path / "r.json").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("where,name,kind", [
    ("sweep", "multirun.yaml", "link"), ("sweep", "sweep.log", "fifo"), ("sweep", ".harness.lock", "link"),
    ("sweep", "sweep.json", "fifo"), ("job", "", "link"), ("job", "result.json", "link"),
    ("job", ".hydra/config.yaml", "link"), ("job", "app.log", "fifo"), ("run", ".harness.lock", "link"),
    ("run", "result.json", "fifo"), ("run", "trace.json", "link"), ("run", ".hydra", "link"),
])
def test_a_link_or_fifo_where_a_run_writes_is_refused_in_one_line(tmp_path, run_harness, where, name, kind):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "file").write_text("theirs")
    sweep, run = tmp_path / "s", tmp_path / "r"
    place = {"sweep": sweep, "job": sweep / f"0_{DIRNAME.format(2)}", "run": run}[where] / name
    place.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(place)
    else:
        place.symlink_to(theirs if name in ("", ".hydra") else theirs / "file")
    before = snapshot(tmp_path)
    args = ["-m", "microbatches=2", f"hydra.sweep.dir={sweep}"] if where != "run" else [f"hydra.run.dir={run}"]
    p = run_harness(*args, *SIM, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"{'a FIFO' if kind == 'fifo' else 'a symlink'}" in p.stderr and "not replaced" in p.stderr, p.stderr
    assert snapshot(tmp_path) == before and (theirs / "file").read_text() == "theirs"


def test_hydras_own_output_subdir_is_checked_where_it_is(tmp_path, run_harness):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    run = tmp_path / "r"
    run.mkdir()
    (run / "meta").symlink_to(theirs)  # hydra.output_subdir=meta: Hydra would write its config files there
    p = run_harness(*SIM, f"hydra.run.dir={run}", "hydra.output_subdir=meta", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and f"{run / 'meta'}: a symlink" in p.stderr, p.stderr
    assert list(theirs.iterdir()) == []


def test_report_export_and_profile_outputs_never_write_through_a_link(tmp_path, capsys):
    from harness.profile import write_profile
    from harness.report.__main__ import main

    theirs = tmp_path / "theirs.txt"
    theirs.write_text("theirs")
    sweep = tmp_path / "s"
    (sweep / "0_x" / ".hydra").mkdir(parents=True)
    out = tmp_path / "out"
    (out / "s").mkdir(parents=True)
    (out / "s" / "runs.csv").symlink_to(theirs)
    assert main([str(sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs.csv: a symlink is there, not replaced" in err, err
    (tmp_path / "p.json").symlink_to(theirs)
    assert "a symlink is there" in write_profile(tmp_path / "p.json", {"x": 1})
    from harness.export.__main__ import main as export

    capsys.readouterr()
    advice = ROOT / "reports" / "advise_example" / "advice.json"
    rank = megatron_runnable_rank(advice)  # a point Megatron would take: the link, not the schedule, refuses it
    assert export(["--to", "megatron", f"{advice}#{rank}", "--out", str(tmp_path / "p.json"), "--nearest"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a symlink is there, not replaced" in err, err
    assert theirs.read_text() == "theirs"


# -- 9. --copy-as: the new copy beside the old, swapped in by renames ------------------------------

def test_copy_as_on_a_full_disk_leaves_the_old_copy_and_its_marker(tmp_path, capsys, monkeypatch):
    from harness.report import __main__ as report

    sweep = tmp_path / "s"
    (sweep / "0_x" / ".hydra").mkdir(parents=True)
    out = tmp_path / "out"
    argv = [str(sweep), "--out", str(out), "--copy-as", "example"]
    assert report.main(argv) == 0
    copy = out / "example"
    (copy / "notes.txt").write_text("mine")  # a file of the user's in the copy: carried over
    (copy / "mine").mkdir()
    (copy / "mine" / "link").symlink_to("../notes.txt")
    assert report.main(argv) == 0 and (copy / "notes.txt").read_text() == "mine"
    assert os.readlink(copy / "mine" / "link") == "../notes.txt"
    before = snapshot(copy)
    assert report.MARKER in before
    copied = []
    write = report._copy_file

    def full(src, dst):
        if len(copied) == 1:  # the second file: half of it written, then no space
            Path(dst).write_bytes(Path(src).read_bytes()[:3])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        copied.append(dst)
        write(src, dst)

    monkeypatch.setattr(report, "_copy_file", full)
    capsys.readouterr()
    assert report.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "the earlier copy is unchanged" in err, err
    assert snapshot(copy) == before
    assert sorted(p.name for p in out.iterdir()) == ["example", "s"]  # no temporary directory left
    monkeypatch.setattr(report, "_copy_file", write)
    assert report.main(argv) == 0 and snapshot(copy).keys() == before.keys()
    assert sorted(p.name for p in out.iterdir()) == ["example", "s"]  # the old copy removed
