"""dist: executor=pytorch (torch.distributed.pipelining) runs the same plan as the native
executor: equal losses every step (fp32, 1e-5) and equal accumulated gradients, for every
schedule both have; its trace holds the schedule's compute kinds; failures are one line."""

from __future__ import annotations

import pytest

from harness.config import ConfigError
from harness.job import run_job
from harness.planning.plan import make_plan
from harness.schedules.registry import build, chunks_per_rank
from harness.schedules.csv_io import write_csv

pytestmark = pytest.mark.dist

CASES = [  # (schedule, pp, M); interleaved at v=2; ~2-5 s each on 2 cores
    ("gpipe", 4, 4),
    ("1f1b", 2, 4),
    ("1f1b", 4, 8),
    ("interleaved_1f1b", 2, 4),
    ("zb_h1", 4, 8),
    ("zb_h2", 4, 8),  # no torch class: the plan's actions through torch's CSV loader
    ("zbv", 2, 4),
    ("dualpipev", 2, 4),
]


def _pair(config, tmp_path, name: str, **overrides) -> tuple[dict, dict]:
    """The same config through both executors; the pytorch one checks its gradients too."""
    native = run_job(config(steps=2, **overrides), tmp_path / "native", "test", name)
    peer = run_job(config(steps=2, executor="pytorch", verify_grads=True, **overrides), tmp_path / "peer", "test", name)
    assert native.status == "ok", native.error
    assert peer.status == "ok", peer.error
    return native, peer


@pytest.mark.parametrize("schedule,pp,m", CASES)
def test_pytorch_matches_native(tmp_path, config, schedule, pp, m):
    v = 2 if schedule == "interleaved_1f1b" else 1
    native, peer = _pair(config, tmp_path, schedule, pp=pp, microbatches=m, virtual_stages=v,
                         **{"schedule.name": schedule})
    got = peer.metrics
    assert got.losses == pytest.approx(native.metrics.losses, rel=1e-5)
    assert got.grad_check.max_rel_diff < 1e-5, got.grad_check
    # every compute kind of the schedule was timed, on every stage
    kinds = {a.kind.value for acts in build(schedule, pp, m, v).values() for a in acts}
    assert set(got.mean_op_s) == kinds
    assert all(len(per_stage) == pp * chunks_per_rank(schedule, v) for per_stage in got.mean_op_s.values())
    assert all(0.0 <= b < 1.0 for b in got.bubble.measured_per_rank)
    assert got.p2p_hop_s is not None  # receive waits carry the names of the actions they feed


def test_csv_schedule_through_torch_loader(tmp_path, config):
    """schedule=csv goes through torch's own CSV loader (_PipelineScheduleRuntime._load_csv)."""
    path = tmp_path / "zbv.csv"
    write_csv(path, build("zbv", 2, 4))
    native, peer = _pair(config, tmp_path, "csv", pp=2, microbatches=4,
                         **{"schedule.name": "csv", "schedule.csv_path": str(path)})
    assert peer.metrics.losses == pytest.approx(native.metrics.losses, rel=1e-5)
    assert {"F", "I", "W"} <= set(peer.metrics.mean_op_s)


def test_checkpointing_recompute_is_traced(tmp_path, config):
    native, peer = _pair(config, tmp_path, "ckpt", pp=2, microbatches=4, checkpointing=True)
    assert peer.metrics.losses == pytest.approx(native.metrics.losses, rel=1e-5)
    assert peer.metrics.recompute_s > 0


def test_failing_rank_is_one_line(tmp_path, config):
    result = run_job(config(pp=2, microbatches=4, executor="pytorch", **{"run.fault": "raise@rank1,step1"}), tmp_path, "test",
                     "fault")
    assert result.status == "failed"
    assert "rank 1: RuntimeError: injected fault at rank 1, step 1" in result.error
    assert "\n" not in result.error


@pytest.mark.parametrize("overrides,expected", [
    ({"run.fault": "noaccum@rank0,step0"}, "run.fault=noaccum@rank0,step0: executor=pytorch honours raise, kill, hang, term"),
    ({"dp": 2}, "dp=2: executor=pytorch runs one pipeline"),
])
def test_unsupported_peer_input_refused_before_workers(config, overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        make_plan(config(pp=2, microbatches=4, executor="pytorch", **overrides))
