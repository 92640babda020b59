"""The executor seam: a new executor is one file plus one registry entry, and config
validation reads what the registry says it supports."""

from __future__ import annotations

import pytest

from harness.config import ConfigError
from harness.job import run_job
from harness.planning.plan import make_plan
from harness.measure.reference import reference_losses
from harness.runtime.registry import EXECUTORS
from tests.toy_executor import TOY


def test_registry_lists_every_executor_with_its_capabilities():
    assert {"native", "pytorch", "sim"} <= set(EXECUTORS)
    assert EXECUTORS["native"].dp and EXECUTORS["native"].memory and EXECUTORS["native"].transport
    assert not EXECUTORS["pytorch"].dp and EXECUTORS["sim"].simulated and EXECUTORS["sim"].run is not None


@pytest.mark.dist
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b"])
def test_a_toy_executor_from_the_registry_alone_runs_and_equals_one_process(tmp_path, config, schedule):
    v = 2 if schedule == "interleaved_1f1b" else 1
    c = config(pp=2, microbatches=4, virtual_stages=v, executor=TOY.name, **{"schedule.name": schedule})
    result = run_job(c, tmp_path, "test", "toy")
    assert result.status == "ok", result.error
    assert result.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    assert result.metrics.memory.peak_activation_bytes_per_rank is None  # not metered: None, never 0
    assert 0 < result.metrics.bubble.measured < 1


@pytest.mark.parametrize("overrides,expected", [
    ({"dp": 2}, "dp=2: executor=toy runs one pipeline (allowed: dp=1, or executor=native, sim)"),
    ({"schedule.name": "zbv"}, "schedule=zbv: executor=toy runs no split backward (I/W)"),
    ({"run.fault": "noaccum@rank0,step0"}, "run.fault=noaccum@rank0,step0: executor=toy honours raise, kill, hang, term"),
])
def test_validation_reads_the_registry(config, overrides, expected):
    with pytest.raises(ConfigError) as err:
        make_plan(config(executor=TOY.name, **overrides))
    assert str(err.value) == expected


def test_an_untested_torch_is_refused_where_torch_internals_are_used(config, monkeypatch):
    from harness.runtime import compat

    monkeypatch.setattr(compat.torch, "__version__", "9.9.0")
    monkeypatch.delenv(compat.ALLOW_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"^executor=pytorch: torch 9.9.0: untested .* set HARNESS_ALLOW_UNTESTED"):
        make_plan(config(pp=2, microbatches=4, executor="pytorch"))
    make_plan(config(pp=2, microbatches=4))  # native without dp uses no torch internals
    monkeypatch.setenv(compat.ALLOW_ENV, "1")
    make_plan(config(pp=2, microbatches=4, executor="pytorch"))
