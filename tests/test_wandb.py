"""wandb: a sweep with wandb.mode=offline writes one run per job, read back from the binary
log wandb writes (<job dir>/wandb/offline-run-*/run-*.wandb)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2 as pb

pytestmark = pytest.mark.sweep
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
    the documented naming (record.log_wandb)."""
    out: set[str] = set()
    for k, v in d.items():
        if isinstance(v, dict):
            out |= flat_keys(v, f"{prefix}{k}/")
        else:
            out.add(prefix + k)
            if k != "losses" and isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
                out.add(f"{prefix}{k}/max")
    return out


def test_offline_sweep_writes_one_run_per_job_with_the_result_names(tmp_path):
    sweep = tmp_path / "wbsweep"
    p = subprocess.run([sys.executable, "-m", "harness", "-m", "pp=2", "microbatches=2,4", "compute=emulated",
                        "cost.fwd_ms_per_layer=1", "model.hidden=32", "steps=2", "warmup_steps=1",
                        "wandb.mode=offline", f"hydra.sweep.dir={sweep}"],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=300)
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
        assert [r.artifact.type for r in recs if r.HasField("artifact") and r.artifact.type == "trace"] == ["trace"]
        (table,) = (run_dir / "files" / "media" / "table").glob("stages_*.table.json")
        t = json.loads(table.read_text())
        assert t["columns"] == ["rank", "layers", "bubble_measured", "peak_activation_bytes", "mean_fwd_s",
                                "mean_bwd_s"]
        assert [row[0] for row in t["data"]] == [0, 1] and all(row[4] > 0 and row[5] > 0 for row in t["data"])
