"""wandb: a sweep with wandb.mode=offline writes one run per job, read back from the binary
log wandb writes (<job dir>/wandb/offline-run-*/run-*.wandb), with everything it stages inside
the job directory; and wandb never changes a job's status or a sweep's exit code: online
without an API key, or with the host unreachable or hanging, a job is ok within seconds, logged
offline instead, with one warning line. No test reaches the network."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2 as pb

from harness.records import wandb_log
from tests.test_trace_json import check_trace

ROOT = Path(__file__).resolve().parents[1]
BLOCK, HEADER = 32768, 7  # wandb's LevelDB-style log: 32 KiB blocks, 7-byte record headers
FULL, LAST = 1, 4


def records(path: Path) -> Iterator[pb.Record]:
    """wandb 0.31 has no Python reader for its run log any more (it moved into the Go
    wandb-core), so read the framing here: a 7-byte file header (":W&B", magic 0xBEE1,
    version 0), then records of (crc32, length, type) + payload that never straddle a block
    boundary (FIRST/MIDDLE/LAST pieces do), each a serialized wandb.proto Record."""
    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), data[:7]
    pos, payload = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # the tail of a block too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        payload += data[pos + HEADER:pos + HEADER + n]
        pos += HEADER + n
        if kind in (FULL, LAST):
            r = pb.Record()
            r.ParseFromString(payload)
            payload = b""
            yield r


def key(item) -> str:
    """Summary/history items carry a flat key, or a nested path (wandb's own `_step`, media)."""
    return item.key or "/".join(item.nested_key)


def flat_keys(d: dict, prefix: str = "") -> set[str]:
    """result.json's metric names joined by "/", and "<key>/max" for lists of numbers but losses:
    the documented naming (wandb_log.log_wandb)."""
    out: set[str] = set()
    for k, v in d.items():
        if isinstance(v, dict):
            out |= flat_keys(v, f"{prefix}{k}/")
        else:
            out.add(prefix + k)
            if k != "losses" and isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
                out.add(f"{prefix}{k}/max")
    return out


@pytest.mark.sweep
def test_offline_sweep_writes_one_run_per_job_with_the_result_names(tmp_path, harness):
    """`python -m harness` in this process (make test), or a fresh one (`slow`)."""
    sweep = tmp_path / "wbsweep"
    p = harness("-m", "pp=2", "microbatches=2,4", "compute=emulated", "cost.fwd_ms_per_layer=1", "model.hidden=32",
                "steps=2", "warmup_steps=1", "wandb.mode=offline", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted(d for d in sweep.iterdir() if (d / "result.json").exists())
    assert len(jobs) == 2
    for job in jobs:
        result = json.loads((job / "result.json").read_text())
        assert result["status"] == "ok", result["error"]
        (run_dir,) = (job / "wandb").glob("offline-run-*")  # one run per job, under the job dir
        assert result["wandb_dir"] == str(run_dir)
        recs = list(records(next(run_dir.glob("run-*.wandb"))))
        (run,) = [r.run for r in recs if r.HasField("run")]
        assert (run.run_group, run.job_type) == ("wbsweep", "1f1b")
        assert run.display_name == job.name.split("_", 1)[1]  # the override string
        config = {i.key: json.loads(i.value_json) for i in run.config.update}
        assert config["microbatches"] == result["config"]["microbatches"] and config["schedule"]["name"] == "1f1b"

        summary = {key(i): json.loads(i.value_json) for r in recs if r.HasField("summary") for i in r.summary.update}
        names = flat_keys(result["metrics"])
        assert {"bubble/measured", "bubble/theory", "bubble/simulated", "step_time_s", "throughput_samples_s",
                "memory/peak_activation_bytes_per_rank", "memory/peak_activation_bytes_per_rank/max"} <= names
        assert names - summary.keys() == set()
        m = result["metrics"]
        peaks = m["memory"]["peak_activation_bytes_per_rank"]
        assert summary["bubble/measured"] == pytest.approx(m["bubble"]["measured"])
        assert summary["memory/peak_activation_bytes_per_rank"] == peaks
        assert summary["memory/peak_activation_bytes_per_rank/max"] == max(peaks)
        assert summary["status"] == "ok"
        assert (summary["gantt/_type"], summary["stages/_type"]) == ("image-file", "table-file")
        assert summary["stages/nrows"] == 2

        losses = [json.loads(i.value_json) for r in recs if r.HasField("history") for i in r.history.item
                  if key(i) == "loss"]
        assert losses == pytest.approx(m["losses"])
        assert_per_step_history(recs, result, job)
        assert [r.artifact.type for r in recs if r.HasField("artifact") and r.artifact.type == "trace"] == ["trace"]
        (table,) = (run_dir / "files" / "media" / "table").glob("stages_*.table.json")
        t = json.loads(table.read_text())
        assert t["columns"] == ["rank", "layers", "bubble_measured", "peak_activation_bytes", "mean_fwd_s",
                                "mean_bwd_s"]
        assert [row[0] for row in t["data"]] == [0, 1] and all(row[4] > 0 and row[5] > 0 for row in t["data"])


def assert_per_step_history(recs: list, result: dict, job: Path) -> None:
    """The run's history read back from its .wandb file: a row per step against `step`
    (define_metric), the loss at every step, warm-up included, and at each measured step its
    time, bubble, throughput and peak activation bytes, as result.json and trace.json have them;
    and the job's trace.json passes the trace-event schema check, with its flows and step slices."""
    m, warmup = result["metrics"], result["config"]["warmup_steps"]
    rows: dict[int, dict] = {}
    for r in recs:
        if r.HasField("history"):
            row = {key(i): json.loads(i.value_json) for i in r.history.item}
            rows.setdefault(row["_step"], {}).update(row)
    axes = {r.metric.name: r.metric.step_metric for r in recs if r.HasField("metric") and r.metric.name}
    assert {k: axes.get(k) for k in ("loss", "per_step/time_s", "per_step/bubble", "per_step/throughput_samples_s",
                                     "per_step/peak_activation_bytes")} == dict.fromkeys(
        ("loss", "per_step/time_s", "per_step/bubble", "per_step/throughput_samples_s",
         "per_step/peak_activation_bytes"), "step")
    assert sorted(rows) == list(range(warmup + len(m["step_times_s"])))
    assert all(row["step"] == s for s, row in rows.items())  # the x-axis is the training step
    measured = [rows[warmup + i] for i in range(len(m["step_times_s"]))]
    assert [row["per_step/time_s"] for row in measured] == pytest.approx(m["step_times_s"])
    assert [row["per_step/bubble"] for row in measured] == pytest.approx(m["bubble"]["measured_per_step"])
    samples = result["config"]["microbatches"] * result["config"]["microbatch_size"] * result["config"]["dp"]
    assert [row["per_step/throughput_samples_s"] for row in measured] == pytest.approx(
        [samples / t for t in m["step_times_s"]])
    assert [row["per_step/tflops_per_device"] for row in measured] == pytest.approx(
        [m["flops"]["model_per_step"] / t / (result["config"]["pp"] * result["config"]["dp"]) / 1e12
         for t in m["step_times_s"]])
    assert all("per_step/time_s" not in rows[s] for s in range(warmup))  # warm-up: the loss alone
    # memory per step: each rank's largest over the measured steps is result.json's peak
    peaks = m["memory"]["peak_activation_bytes_per_rank"]
    per_rank = [[row[f"per_step/peak_activation_bytes/rank_{r}"] for row in measured] for r in range(len(peaks))]
    assert [max(p) for p in per_rank] == peaks
    assert [row["per_step/peak_activation_bytes"] for row in measured] == [max(p) for p in zip(*per_rank)]

    data = json.loads((job / "trace.json").read_text())
    found = check_trace(data)
    pp, steps = result["config"]["pp"], warmup + len(m["step_times_s"])
    assert sorted(found["steps"]) == [(0, r, s) for r in range(pp) for s in range(steps)]
    # every activation and gradient between the two ranks: 2 x M per step, from a send
    assert len(found["flows"]) == 2 * result["config"]["microbatches"] * steps
    assert all(src[3]["name"].startswith("send ") for src, _ in found["bound"].values())
    assert data["otherData"]["step0_wall_clock"] and data["metadata"]["step0_wall_clock"]


# One job (executor=sim: no workers) in a fresh interpreter with a fake HOME and no WANDB_*
# variables but the test's: wandb keeps process-wide state (settings, credentials, its service).
# Prints the Result and the seconds spent in log_wandb.
DRIVER = """
import json, sys, time
from pathlib import Path
import harness.records.wandb_log as wl

inner, spent = wl.log_wandb, []

def timed(*args, **kwargs):
    start = time.monotonic()
    try:
        return inner(*args, **kwargs)
    finally:
        spent.append(time.monotonic() - start)

wl.log_wandb = timed  # before harness.job imports it
from harness.config import Config
from harness.job import run_job

c = Config()
c.executor, c.pp, c.microbatches, c.wandb.mode = "sim", 2, 2, sys.argv[2]
r = run_job(c, Path(sys.argv[1]), "wbgroup", "job")
print(json.dumps({"status": r.status, "error": r.error, "wandb_dir": r.wandb_dir, "wandb_s": spent}))
"""


def clean_env(home: Path, **wandb: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "XDG_"))}
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT), **wandb}


def run_one(tmp_path: Path, mode: str, **wandb: str) -> tuple[dict, list[str], Path, Path]:
    """(what the driver printed, the stderr lines that are harness warnings, job dir, fake HOME)."""
    home, job = tmp_path / "home", tmp_path / "job"
    home.mkdir()
    p = subprocess.run([sys.executable, "-c", DRIVER, str(job), mode], cwd=tmp_path, env=clean_env(home, **wandb),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["status"] == "ok", out["error"]
    assert json.loads((job / "result.json").read_text())["status"] == "ok"
    return out, [line for line in p.stderr.splitlines() if line.startswith("harness: warning")], job, home


def nothing_outside(home: Path) -> None:
    """wandb wrote nothing under the user's home (~/.local/share/wandb, ~/.cache/wandb, ...)
    nor in the working directory (home's parent: ./wandb, ./artifacts)."""
    assert [p for p in home.rglob("*") if "wandb" in p.name] == []
    assert not (home.parent / "wandb").exists() and not (home.parent / "artifacts").exists()


def assert_fell_back_offline(out: dict, warnings: list[str], job: Path, why: str) -> None:
    assert len(out["wandb_s"]) == 1 and out["wandb_s"][0] < 10, out  # fail fast: not wandb's 90 s
    (warning,) = warnings
    assert re.fullmatch(rf"harness: warning: wandb: {why}.*; logged offline to wandb/offline-run-\S+ instead "
                        rf"\(`wandb sync` it later\); records are in {re.escape(str(job))}", warning), warning
    (run_dir,) = (job / "wandb").glob("offline-run-*")
    assert out["wandb_dir"] == str(run_dir)
    assert json.loads((job / "result.json").read_text())["wandb_dir"] == str(run_dir)


def staged(run_dir: Path) -> list[str]:
    """The local files the run's artifacts point at (what `wandb sync` uploads)."""
    recs = records(next(run_dir.glob("run-*.wandb")))
    return [c.local_path for r in recs if r.HasField("artifact") for c in r.artifact.manifest.contents]


@pytest.mark.sweep
@pytest.mark.subprocess
@pytest.mark.slow  # make test: the online sweep without a key checks the same of each of its jobs
def test_online_without_an_api_key_is_ok_logged_offline_with_one_warning(tmp_path):
    out, warnings, job, home = run_one(tmp_path, "online")
    assert_fell_back_offline(out, warnings, job, r"no API key for \S+ \(`wandb login`, or WANDB_API_KEY\)")
    nothing_outside(home)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the with ends: nothing listens there


@pytest.mark.sweep
@pytest.mark.subprocess
@pytest.mark.slow  # make test: reach_problem on a closed port (below) and the no-key sweep's offline fallback
def test_online_with_a_key_and_an_unreachable_host_is_ok_within_seconds(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    out, warnings, job, home = run_one(tmp_path, "online", WANDB_API_KEY="x" * 40, WANDB_BASE_URL=url)
    assert_fell_back_offline(out, warnings, job, rf"cannot reach {re.escape(url)} \(ConnectionRefusedError")
    nothing_outside(home)


@pytest.mark.sweep
@pytest.mark.subprocess
def test_online_with_a_host_that_never_answers_gives_up_after_the_init_timeout(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))  # accepts connections, answers nothing
    held: list[socket.socket] = []

    def hold() -> None:
        try:
            while True:
                held.append(server.accept()[0])
        except OSError:  # closed
            pass

    threading.Thread(target=hold, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        start = time.monotonic()
        out, warnings, job, home = run_one(tmp_path, "online", WANDB_API_KEY="x" * 40, WANDB_BASE_URL=url,
                                           WANDB_INIT_TIMEOUT="2")
        assert time.monotonic() - start < 60  # the process's exit too (wandb's telemetry off)
    finally:
        server.close()
        for c in held:
            c.close()
    assert_fell_back_offline(out, warnings, job, r"online wandb.init failed \(CommError")
    nothing_outside(home)


@pytest.mark.sweep
@pytest.mark.subprocess
@pytest.mark.slow  # make test: the online sweep without a key falls back to offline runs and checks the same
def test_offline_run_stages_its_artifacts_inside_the_job_dir(tmp_path):
    out, warnings, job, home = run_one(tmp_path, "offline")
    assert warnings == []
    run_dir = Path(out["wandb_dir"])
    assert run_dir.parent == job / "wandb" and run_dir.name.startswith("offline-run-")
    files = staged(run_dir)
    assert len(files) >= 2  # trace.json and the stages table
    for f in files:  # `wandb sync` of the job directory finds them, wherever HOME is
        assert Path(f).is_relative_to(job / "wandb" / "data") and Path(f).is_file(), f
    assert any(Path(f).read_bytes() == (job / "trace.json").read_bytes() for f in files)
    nothing_outside(home)


@pytest.mark.sweep
@pytest.mark.subprocess
def test_online_sweep_without_an_api_key_exits_0_with_its_summary(tmp_path):
    """Each job: ok, logged offline instead with one warning, its artifacts staged inside the
    job directory, nothing under HOME (what the two `slow` tests below check of one job)."""
    sweep, home = tmp_path / "wbsweep", tmp_path / "home"
    home.mkdir()
    p = subprocess.run([sys.executable, "-m", "harness", "-m", "executor=sim", "pp=2", "microbatches=2,4",
                        "wandb.mode=online", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=clean_env(home),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "2 ok" in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])
    warnings = [line for line in p.stderr.splitlines() if line.startswith("harness: warning")]
    assert len(warnings) == 2 and all("harness: warning: wandb: no API key" in w for w in warnings), p.stderr
    jobs = sorted(d for d in sweep.iterdir() if (d / "result.json").exists())
    assert len(jobs) == 2
    for job in jobs:
        (warning,) = [w for w in warnings if w.endswith(f"; records are in {job}")]
        assert re.fullmatch(r"harness: warning: wandb: no API key for \S+ \(`wandb login`, or WANDB_API_KEY\).*; "
                            r"logged offline to wandb/offline-run-\S+ instead \(`wandb sync` it later\); records are "
                            rf"in {re.escape(str(job))}", warning), warning
        result = json.loads((job / "result.json").read_text())
        (run_dir,) = (job / "wandb").glob("offline-run-*")
        assert result["status"] == "ok" and result["wandb_dir"] == str(run_dir)
        files = staged(run_dir)
        assert len(files) >= 2  # trace.json and the stages table
        for f in files:
            assert Path(f).is_relative_to(job / "wandb" / "data") and Path(f).is_file(), f
        assert any(Path(f).read_bytes() == (job / "trace.json").read_bytes() for f in files)
    nothing_outside(home)


def test_reach_problem_is_bounded_when_the_host_never_answers(monkeypatch):
    calls, answered, release = [], [], threading.Event()

    def blackhole(address, timeout=None):
        calls.append(address)
        release.wait(60)  # answers nothing until the test has its verdict
        answered.append(address)
        raise TimeoutError("timed out")

    monkeypatch.setattr(wandb_log, "_unreachable", {})
    monkeypatch.setattr(wandb_log.socket, "create_connection", blackhole)
    for env in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(env, raising=False)
    try:
        why = wandb_log.reach_problem("https://wandb.example:8443", timeout=0.3)
        assert answered == []  # it gave up while the connection still hung (no wall-clock bound: a busy machine)
        assert why == "cannot reach https://wandb.example:8443 (no answer within 0.3 s)"
        assert wandb_log.reach_problem("https://wandb.example:8443", timeout=0.3) == why  # remembered: no wait
        assert calls == [("wandb.example", 8443)]
    finally:
        release.set()


def test_reach_problem_of_a_closed_port_is_connection_refused(monkeypatch):
    """What an online job with a key and nobody listening says before it logs offline instead
    (the `slow` test above runs that job whole)."""
    monkeypatch.setattr(wandb_log, "_unreachable", {})
    for env in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(env, raising=False)
    url = f"http://127.0.0.1:{closed_port()}"
    why = wandb_log.reach_problem(url, timeout=2)
    assert why is not None and why.startswith(f"cannot reach {url} (ConnectionRefusedError"), why


def test_reach_problem_connects_through_the_proxy(monkeypatch):
    seen = []
    monkeypatch.setattr(wandb_log, "_unreachable", {})
    monkeypatch.setattr(wandb_log.socket, "create_connection", lambda address, timeout=None: seen.append(address)
                        or socket.socket())
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert wandb_log.reach_problem("https://api.wandb.ai", timeout=1) is None
    assert seen == [("proxy.example", 3128)]


def test_log_wandb_never_raises_and_restores_the_environment(monkeypatch, tmp_path, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full\nsecond line")

    monkeypatch.setattr(wandb_log, "_write_run", broken)
    for k in wandb_log.WANDB_DIRS:
        monkeypatch.delenv(k, raising=False)
    assert wandb_log.log_wandb({}, tmp_path, "g", "n", "offline", "p", None) is None
    err = capsys.readouterr().err.splitlines()
    assert err == [f"harness: warning: wandb: the offline run could not be written (RuntimeError: disk full "
                   f"second line); records are in {tmp_path}"]
    assert not any(k in os.environ for k in wandb_log.WANDB_DIRS)
    assert wandb_log.log_wandb({}, tmp_path, "g", "n", "disabled", "p", None) is None
    assert capsys.readouterr().err == ""


def test_history_rows_per_step_from_the_record_and_the_trace(tmp_path):
    """What log_wandb logs per step, from a record alone (executor=sim's shape: one simulated
    step repeated, no loss, no memory metered) and with trace.json's per-step peaks."""
    from harness.measure.trace_json import write_trace_json
    from harness.measure.trace import COMPUTE, Event

    metrics = {"step_time_s": 0.5, "step_times_s": [0.5, 0.4, 0.625], "throughput_samples_s": 16.0,
               "throughput_tokens_s": 16.0 * 128, "losses": [2.0, 1.5, 1.25, 1.0],
               "bubble": {"measured_per_step": [0.2, 0.1, 0.3]},
               "flops": {"tflops_per_device": 2.0, "mfu": 0.25, "model_per_step": 4e12}}
    result = {"config": {"warmup_steps": 1, "pp": 2}, "metrics": metrics}
    rows = wandb_log.history_rows(result)
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and [r["loss"] for r in rows] == [2.0, 1.5, 1.25, 1.0]
    assert set(rows[0]) == {"step", "loss"}  # a warm-up step: its loss alone
    assert [r["per_step/time_s"] for r in rows[1:]] == [0.5, 0.4, 0.625]
    assert [r["per_step/bubble"] for r in rows[1:]] == [0.2, 0.1, 0.3]
    assert [r["per_step/throughput_samples_s"] for r in rows[1:]] == pytest.approx([16.0, 20.0, 12.8])
    assert [r["per_step/throughput_tokens_s"] for r in rows[1:]] == pytest.approx([2048, 2560, 1638.4])
    assert [r["per_step/tflops_per_device"] for r in rows[1:]] == pytest.approx([2.0, 2.5, 1.6])
    assert [r["per_step/mfu"] for r in rows[1:]] == pytest.approx([0.25, 0.3125, 0.2])
    assert not any("per_step/peak_activation_bytes" in r for r in rows)  # no trace.json: nothing metered
    assert set(wandb_log.PER_STEP_METRICS) >= {k for r in rows for k in r if k.startswith("per_step/")}

    # executor=sim: no losses, the one simulated step repeated
    sim = {"config": {"warmup_steps": 2, "pp": 2}, "metrics": {**metrics, "losses": None, "throughput_tokens_s": None,
                                                               "step_times_s": [0.5] * 3}}
    assert [r["step"] for r in wandb_log.history_rows(sim)] == [2, 3, 4]
    assert all("loss" not in r and "per_step/throughput_tokens_s" not in r for r in wandb_log.history_rows(sim))

    # memory per measured step: trace.json's per-step peaks of replica 0's pipeline ranks
    trace = [Event(r, s, f"{r}F0", COMPUTE, "F", r, 0, s + 0.1 * r, s + 0.1 * r + 0.05) for s in range(4)
             for r in range(4)]
    memory = [(r, s, s + 0.1 * r, 1000 * (s + 1) + r) for s in range(4) for r in range(4)]  # ranks 2, 3: replica 1
    write_trace_json(tmp_path / "trace.json", trace, memory, pp=2)
    rows = wandb_log.history_rows(result, tmp_path)
    assert [r.get("per_step/peak_activation_bytes") for r in rows] == [None, 2001, 3001, 4001]
    assert [(r["per_step/peak_activation_bytes/rank_0"], r["per_step/peak_activation_bytes/rank_1"])
            for r in rows[1:]] == [(2000, 2001), (3000, 3001), (4000, 4001)]
    assert "per_step/peak_activation_bytes/rank_2" not in rows[1]
