"""The report (and resume, and the sweep's summary) against any record: wrong types, missing
records, unreadable files, FIFOs and directories in place of result.json are listed with a
one-line reason, never a crash or a hang; --copy-as only ever writes inside the reports folder."""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.report.__main__ import main
from harness.report.build import build_report, problems
from harness.report.load import MISSING, load_sweep, newest_sweep
from harness.report.tables import row, summary, write_csv
from harness.records.result import RecordError, read
from tests.test_report import fake

ROOT = Path(__file__).resolve().parents[1]


def record(run_id: int = 0, **config) -> dict:
    """A valid record as written to result.json."""
    return fake(run_id, **config).result.to_json()


def bounded(fn, *args, timeout: float = 20):
    """fn(*args) in a thread: a regression that blocks (a FIFO opened for reading) fails the test
    instead of hanging it."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} blocked for {timeout} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _edit(path: str, value):
    """A record with the dotted key set to value."""
    def make(r: dict) -> dict:
        *parents, leaf = path.split(".")
        target = r
        for p in parents:
            target = target[p]
        target[leaf] = value
        return r
    return make


def _drop(path: str):
    def make(r: dict) -> dict:
        *parents, leaf = path.split(".")
        target = r
        for p in parents:
            target = target[p]
        del target[leaf]
        return r
    return make


def _text(text: str):
    return lambda job: (job / "result.json").write_text(text)


def _json(edit):
    return lambda job: (job / "result.json").write_text(json.dumps(edit(record())))


def _fifo(job: Path) -> None:
    os.mkfifo(job / "result.json")


def _dir(job: Path) -> None:
    (job / "result.json").mkdir()
    (job / "result.json" / "x").write_text("{}")


def _nothing(job: Path) -> None:
    (job / ".hydra").mkdir()
    (job / ".hydra" / "config.yaml").write_text("pp: 2\n")
    (job / ".result.json.abc.tmp").write_text('{"status": "o')  # killed while writing it


def _dangling(job: Path) -> None:
    (job / "result.json").symlink_to(job / "nowhere.json")


def _socket(job: Path) -> None:
    cwd, s = os.getcwd(), socket.socket(socket.AF_UNIX)
    os.chdir(job)  # a relative name: a socket's path is short
    try:
        s.bind("result.json")
    finally:
        s.close()  # the file stays
        os.chdir(cwd)


def _big(job: Path) -> None:
    with open(job / "result.json", "wb") as f:
        f.truncate(65 * 2**20)  # sparse: over the size cap without writing it


# (job directory, how its result.json is spoiled, what the report says about it)
BAD = [
    ("10_truncated", _text('{"status": "ok", "con'), "unreadable: JSONDecodeError"),
    ("11_not_object", _text("[1, 2]"), "not a JSON object"),
    ("12_not_utf8", lambda job: (job / "result.json").write_bytes(b'{"status": "\xff"}'), "UnicodeDecodeError"),
    ("13_deep", _text("[" * 100_000 + "]" * 100_000), "RecursionError"),
    ("14_newer", _json(_edit("schema_version", 99)), "schema_version=99: written by a newer harness"),
    ("15_metric_str", _json(_edit("metrics.step_time_s", "fast")), "metrics.step_time_s: str where float belongs"),
    ("16_metric_list", _json(_edit("metrics.bubble.measured_per_rank", [0.1, "x"])),
     "measured_per_rank[1]: str where float belongs"),
    ("17_metric_obj", _json(_edit("metrics.memory", [1])), "metrics.memory: not a JSON object"),
    ("18_status_null", _json(_edit("status", None)), "result.status: null where a value is required"),
    ("19_pp_str", _json(_edit("config.pp", "2")), "config.pp: str where int belongs"),
    ("20_pp_bool", _json(_edit("config.pp", True)), "config.pp: bool where int belongs"),
    ("21_pp_zero", _json(_edit("config.pp", 0)), "config.pp=0: must be >= 1"),
    ("22_m_float", _json(_edit("config.microbatches", 4.0)), "config.microbatches: float where int belongs"),
    ("23_schedule_str", _json(_edit("config.schedule", "1f1b")),
     "config.schedule: str where a JSON object belongs"),
    ("24_schedule_name", _json(_edit("config.schedule.name", 3)), "config.schedule.name: int where str belongs"),
    ("25_ckpt_int", _json(_edit("config.checkpointing", 1)), "config.checkpointing: int where bool belongs"),
    ("26_model_list", _json(_edit("config.model", ["mlp"])), "config.model: list where a JSON object belongs"),
    ("27_compute_null", _json(_edit("config.compute", None)), "config.compute: null where a value is required"),
    ("28_no_schedule", _json(_drop("config.schedule")), "config lacks schedule.name"),
    ("29_no_partition", _json(_drop("config.partition.name")), "config lacks partition.name"),
    ("30_config_list", _json(_edit("config", [])), "result.config: list where dict belongs"),
    ("31_partition_rec", _json(_edit("partition", {"layers_per_stage": "4,4"})),
     "partition.layers_per_stage: str where list belongs"),
    ("32_surrogate", _json(_edit("error", "\ud800")), "not valid UTF-8"),
    ("33_ok_no_metrics", _json(_edit("metrics", None)), "status ok but no metrics"),
    ("34_fifo", _fifo, "unreadable: not a regular file (a FIFO)"),
    ("35_directory", _dir, "unreadable: not a regular file (a directory)"),
    ("36_dangling", _dangling, "unreadable: FileNotFoundError"),
    ("37_too_big", _big, "over the 67108864-byte limit of a record"),
    ("38_killed", _nothing, MISSING),
    ("39_no_hydra", lambda job: None, MISSING),  # a job directory by its name alone
    ("40_huge", _json(_edit("config.pp", 2**40)), "config.pp=1099511627776: more than 1024"),
    ("41_device", lambda job: (job / "result.json").symlink_to("/dev/zero"), "(a character device)"),
    ("42_socket", _socket, "(a socket)"),
]


@pytest.fixture(scope="module")
def bad_sweep(tmp_path_factory) -> Path:
    """Two good runs, then one job directory per way of spoiling a record."""
    sweep = tmp_path_factory.mktemp("runs") / "bad"
    for i in range(2):
        (sweep / f"{i}_x").mkdir(parents=True)
        (sweep / f"{i}_x" / "result.json").write_text(json.dumps(record(i, microbatches=4 * (i + 1))))
    (sweep / "gallery").mkdir()  # not a job directory: not listed
    for name, spoil, _ in BAD:
        (sweep / name).mkdir()
        spoil(sweep / name)
    return sweep


def test_every_bad_record_is_listed_with_its_reason(bad_sweep):
    sweep = bounded(load_sweep, bad_sweep)
    assert sorted(r.dir for r in sweep.runs) == ["0_x", "1_x"]
    listed = dict(sweep.corrupt)
    assert len(listed) == len(sweep.corrupt) == len(BAD)
    for name, _, reason in BAD:
        why = listed[f"{name}/result.json"]
        assert reason in why and "\n" not in why, (name, why)


def test_the_report_is_built_and_lists_them(bad_sweep, tmp_path):
    sweep = bounded(load_sweep, bad_sweep)
    md = bounded(build_report, sweep, tmp_path / "rep").read_text()
    html = (tmp_path / "rep" / "index.html").read_text()
    assert f"2 ok, 0 not ok, {len(BAD)} corrupt or partial records" in md
    for name, _, reason in BAD:
        line = next(li for li in md.splitlines() if li.startswith(f"- `{name}/result.json`: "))
        assert reason.replace("\ud800", "") in line
        assert f"{name}/result.json" in html
    with open(tmp_path / "rep" / "runs.csv") as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    assert rows["0_x"]["status"] == rows["1_x"]["status"] == "ok"
    assert rows["38_killed"]["status"] == rows["39_no_hydra"]["status"] == "missing"
    assert rows["38_killed"]["error"] == MISSING
    assert rows["34_fifo"]["status"] == "corrupt" and "FIFO" in rows["34_fifo"]["error"]
    assert len(rows) == 2 + len(BAD)


def test_read_never_opens_a_fifo_nor_a_directory(bad_sweep):
    for name, reason in (("34_fifo", "a FIFO"), ("35_directory", "a directory")):
        with pytest.raises(RecordError, match=reason):
            bounded(read, bad_sweep / name / "result.json")


def test_resume_reads_a_fifo_as_not_ok(bad_sweep):
    from harness.frontend.app import resume_skips
    from harness.config import Config

    asked = OmegaConf.structured(Config)
    for job in ("34_fifo", "13_deep", "0_x"):  # unreadable, too deep, ok but without its trace and Gantt
        assert bounded(resume_skips, bad_sweep / job, asked) is None


def test_the_sweep_summary_counts_missing_and_corrupt_without_blocking(bad_sweep, capsys):
    from harness.frontend.callbacks import SweepSummary

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(bad_sweep)}}})
    with pytest.raises(SystemExit) as exit_:
        bounded(SweepSummary().on_multirun_end, config)
    assert exit_.value.code == 1
    out = capsys.readouterr()
    # it reads what result.read reads: a config the report refuses still says ok
    assert "17 ok" in out.out and "2 missing" in out.out and "16 corrupt" in out.out
    assert "38_killed" in out.err and "34_fifo" in out.err


def test_newest_sweep_skips_what_it_cannot_stat(tmp_path):
    (tmp_path / "sweeps" / "a" / "0_x").mkdir(parents=True)
    (tmp_path / "sweeps" / "a" / "0_x" / "result.json").symlink_to(tmp_path / "gone")
    (tmp_path / "sweeps" / "b" / "0_x").mkdir(parents=True)
    (tmp_path / "sweeps" / "b" / "0_x" / "result.json").write_text("{}")
    assert newest_sweep(tmp_path) in (tmp_path / "sweeps" / "a", tmp_path / "sweeps" / "b")
    os.mkfifo(tmp_path / "sweeps" / "b" / "0_x" / "fifo")
    assert bounded(newest_sweep, tmp_path).parent == tmp_path / "sweeps"


def _to_v1(r: dict) -> None:
    """r as version 1 wrote it (see test_result)."""
    del r["schema_version"]
    b, mem = r["metrics"]["bubble"], r["metrics"]["memory"]
    b["measured_per_stage"], b["measured_per_rank"] = b.pop("measured_per_rank"), b.pop("measured_per_global_rank")
    for k in list(mem):
        mem[k.replace("_per_rank", "_per_stage")] = mem.pop(k)


# Odd but schema-valid: the report reads them as they are.
ODD = [
    ("nan", lambda r: r["metrics"].update(step_time_s=math.nan, throughput_samples_s=math.nan,
                                          bubble={**r["metrics"]["bubble"], "measured": math.nan})),
    ("inf", lambda r: r["metrics"].update(step_time_s=math.inf, measured_imbalance=-math.inf)),
    ("zero_step", lambda r: r["metrics"].update(step_time_s=0.0, throughput_samples_s=0.0)),
    ("empty_lists", lambda r: r["metrics"].update(step_times_s=[], stage_time_s=[], losses=[], mean_op_s={},
                                                  bubble={**r["metrics"]["bubble"], "measured_per_rank": [],
                                                          "measured_per_step": [], "measured_per_global_rank": []})),
    ("none_lists", lambda r: r["metrics"].update(losses=None, memory={
        "peak_activation_bytes_per_rank": None, "theory_peak_microbatches_per_rank": [None, None],
        "activation_bytes_per_microbatch_per_rank": None})),
    ("empty_peaks", lambda r: r["metrics"]["memory"].update(peak_activation_bytes_per_rank=[])),
    ("no_env", lambda r: r.update(env=None, partition=None, plan=None)),
    ("partition_odd", lambda r: r.update(partition={"layers_per_stage": [], "predicted_cost_per_stage": [],
                                                    "imbalance": math.nan, "extra": {"x": [1]}})),
    ("config_extra", lambda r: r["config"].update(future_key={"a": [1, 2]}, schedule={"name": "1f1b", "new": 1})),
    ("config_minimal", lambda r: r.update(config={k: r["config"][k] for k in (
        "schedule", "pp", "microbatches", "microbatch_size", "compute", "executor", "partition", "model")})),
    ("unknown_schedule", lambda r: r["config"].update(schedule={"name": "my|schedule\nx"})),
    ("large_values", lambda r: r["config"].update(microbatches=4096, microbatch_size=2**30)),
    ("failed_pp0", lambda r: r.update(status="failed", error="pp=0: must be an integer >= 1", metrics=None,
                                      config={**r["config"], "pp": 0})),
    ("odd_status", lambda r: r.update(status="weird", error=None)),
    ("v1", lambda r: _to_v1(r)),
]


def _odd_sweep(root: Path, cases) -> Path:
    sweep = root / "odd"
    for i, (name, edit) in enumerate(cases):
        r = record(i, microbatches=2 ** (i % 4 + 1), executor="native" if i % 2 else "pytorch")
        edit(r)
        (sweep / f"{i}_{name}").mkdir(parents=True)
        (sweep / f"{i}_{name}" / "result.json").write_text(json.dumps(r))
    (sweep / "12").mkdir()  # a job id with no overrides
    (sweep / "12" / "result.json").write_text(json.dumps(record(12)))
    return sweep


@pytest.mark.parametrize("name,edit", ODD, ids=[n for n, _ in ODD])
def test_odd_values_are_reported_not_fatal(name, edit, tmp_path):
    sweep = bounded(load_sweep, _odd_sweep(tmp_path, [(name, edit)]))
    assert not sweep.corrupt, sweep.corrupt
    assert len(sweep.runs) == 2
    for r in sweep.runs:
        row(r)
    summary(sweep.runs)
    problems(sweep)
    write_csv(sweep, tmp_path / "runs.csv")


def test_a_report_of_every_odd_value_at_once(tmp_path, capsys):
    sweep = bounded(load_sweep, _odd_sweep(tmp_path, ODD))
    assert not sweep.corrupt and len(sweep.runs) == len(ODD) + 1
    md = bounded(build_report, sweep, tmp_path / "rep", timeout=120).read_text()
    assert "Not ok" in md and "pp=0: must be an integer >= 1" in md
    with open(tmp_path / "rep" / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == len(ODD) + 1


def test_an_empty_sweep_and_an_unlistable_directory(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    sweep = load_sweep(empty)
    assert sweep.runs == [] and sweep.corrupt == []
    build_report(sweep, tmp_path / "rep")
    locked = tmp_path / "locked"
    (locked / "3_x").mkdir(parents=True)
    listing = os.scandir

    def scandir(path):  # as chmod 0 would, for root too
        if Path(path).name == "3_x":
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    sweep = load_sweep(locked)
    monkeypatch.undo()
    assert sweep.corrupt == [("3_x/", "unreadable directory: PermissionError: Permission denied")]
    build_report(sweep, tmp_path / "rep2")
    with open(tmp_path / "rep2" / "runs.csv") as f:
        assert [(r["run"], r["status"]) for r in csv.DictReader(f)] == [("3_x/", "corrupt")]


# --copy-as


@pytest.fixture
def reports(tmp_path) -> tuple[Path, Path]:
    """A sweep of one good run, and a reports folder whose parent holds a folder that must survive."""
    sweep = tmp_path / "runs" / "s1"
    (sweep / "0_x").mkdir(parents=True)
    (sweep / "0_x" / "result.json").write_text(json.dumps(record(0)))
    out = tmp_path / "work" / "reports"
    out.mkdir(parents=True)
    (tmp_path / "work" / "keep.txt").write_text("mine")
    (out / "notes").mkdir()
    (out / "notes" / "todo.txt").write_text("mine")
    return sweep, out


@pytest.mark.parametrize("name", ["..", ".", "a/b", "", "/tmp/x", "../x", "a\nb", "notes", "s1", "file.txt"])
def test_copy_as_refuses_anything_but_a_report_folder(reports, name, capsys):
    sweep, out = reports
    (out / "file.txt").write_text("mine")
    before = sorted(p for p in out.parent.rglob("*"))
    assert main([str(sweep), "--out", str(out), "--copy-as", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith("harness.report: error: --copy-as") and err.count("\n") == 1, err
    assert sorted(p for p in out.parent.rglob("*")) == before  # nothing written, nothing deleted


def test_copy_as_a_plain_name_replaces_only_an_earlier_copy(reports, capsys):
    sweep, out = reports
    assert main([str(sweep), "--out", str(out), "--copy-as", "example"]) == 0
    assert (out / "example" / "index.md").is_file() and (out / "s1" / "index.md").is_file()
    (out / "example" / "stale.png").write_text("old")  # not --copy-as's: kept (issue 28)
    marker = out / "example" / ".harness-copy.json"  # what it wrote: replaced, whether this report has it or not
    listed = json.loads(marker.read_text())
    marker.write_text(json.dumps({**listed, "files": listed["files"] + ["gone.png"]}))
    (out / "example" / "gone.png").write_text("an earlier copy's")
    assert main([str(sweep), "--out", str(out), "--copy-as", "example"]) == 0
    assert (out / "example" / "stale.png").read_text() == "old" and not (out / "example" / "gone.png").exists()
    assert (out / "notes" / "todo.txt").read_text() == (out.parent / "keep.txt").read_text() == "mine"
    assert "1 runs (0 corrupt, 0 missing)" in capsys.readouterr().out


def test_a_sweep_named_dot_reports_under_its_own_name(reports):
    sweep, out = reports
    cwd = os.getcwd()
    os.chdir(sweep)
    try:
        assert main([".", "--out", str(out)]) == 0
    finally:
        os.chdir(cwd)
    assert (out / "s1" / "index.md").is_file() and not (out / "index.md").exists()


@pytest.mark.subprocess
def test_the_cli_exit_status(reports):
    sweep, out = reports
    p = subprocess.run([sys.executable, "-m", "harness.report", str(sweep), "--out", str(out), "--copy-as", ".."],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "not a plain folder name" in p.stderr and not (out / "s1").exists()


def test_a_section_that_fails_says_so_and_the_report_stands(tmp_path, capsys):
    """The native/pytorch table divides by pytorch's step time: 0.0 in a record is schema-valid."""
    sweep = tmp_path / "peer"
    for i, executor in enumerate(("native", "pytorch")):
        r = record(i, executor=executor)
        r["metrics"]["step_time_s"] = 0.0
        (sweep / f"{i}_x").mkdir(parents=True)
        (sweep / f"{i}_x" / "result.json").write_text(json.dumps(r))
    md = build_report(load_sweep(sweep), tmp_path / "rep").read_text()
    assert "## Peer section\n" in md and "Not drawn: failed: ZeroDivisionError" in md
    assert "## Schedule gallery" in md  # what follows it is still there
    assert "warning: peer_section: ZeroDivisionError" in capsys.readouterr().err
