"""result.json's schema: typed records that round-trip, older records upgraded on read,
and a one-line reason for anything else."""

from __future__ import annotations

import json

import pytest

from harness.records.result import SCHEMA_VERSION, RecordError, Result, read
from tests.test_report import fake


def test_a_record_round_trips_and_carries_its_version(tmp_path):
    record = fake(0).result.to_json()
    assert record["schema_version"] == SCHEMA_VERSION
    (tmp_path / "result.json").write_text(json.dumps(record))
    result = read(tmp_path / "result.json")
    assert result.to_json() == record
    assert result.metrics.bubble.measured_per_rank == [0.2, 0.2]


def test_a_version_1_record_is_upgraded_on_read():
    """Version 1 named per-rank lists `_per_stage` and the global ranks' bubbles `measured_per_rank`."""
    v2 = fake(0).result.to_json()
    v1 = json.loads(json.dumps(v2))
    del v1["schema_version"]
    b, mem = v1["metrics"]["bubble"], v1["metrics"]["memory"]
    b["measured_per_stage"], b["measured_per_rank"] = b.pop("measured_per_rank"), b.pop("measured_per_global_rank")
    for k in list(mem):
        mem[k.replace("_per_rank", "_per_stage")] = mem.pop(k)
    assert Result.from_json(v1).to_json() == v2


def test_a_version_2_record_says_whether_it_was_simulated():
    """Version 2 had no plan.simulated: executor=sim was the one simulated executor then."""
    for executor, simulated in (("sim", True), ("native", False)):
        v2 = fake(0).result.to_json()
        v2["schema_version"], v2["config"]["executor"] = 2, executor
        del v2["measurement"]  # a later field: derived from the plan on reading
        v2["plan"] = {"stage_layers": [[0, 4], [4, 8]], "partition": {}, "stage_rank": {"0": 0, "1": 1},
                      "device": "cpu", "backend": "gloo", "emulated_cost": {}}
        got = Result.from_json(v2)
        assert got.plan.simulated is simulated and got.simulated is simulated and got.schema_version == SCHEMA_VERSION
        assert got.measurement == ("simulated" if simulated else "emulated")


@pytest.mark.parametrize("edit,reason", [
    (lambda r: r.update(schema_version=SCHEMA_VERSION + 1), "written by a newer harness"),
    (lambda r: r["metrics"].pop("bubble"), "result.metrics.bubble: missing"),
    (lambda r: r["metrics"].update(step_time_s="fast"), "result.metrics.step_time_s: str where float belongs"),
    (lambda r: r.update(status=None), "result.status: null where a value is required"),
    (lambda r: r.update(measurement="guessed"), "measurement='guessed': unknown (allowed: measured, emulated"),
])
def test_a_bad_record_is_one_line(edit, reason):
    record = fake(0).result.to_json()
    edit(record)
    with pytest.raises(RecordError) as err:
        Result.from_json(record)
    assert reason in str(err.value) and "\n" not in str(err.value)
