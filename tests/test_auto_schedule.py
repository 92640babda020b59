"""The zero-bubble schedule generator (harness/schedules/auto.py): every order it makes is valid,
holds no rank past its memory limit, passes the NCCL rules under the safe transport, is never
slower than ZB-H1 at 1.0 (nor ZB-H2 at 2.0) on the costs it was built for, and runs for real
through schedule=csv like one process."""

from __future__ import annotations

import random

import pytest

from harness.job import run_job
from harness.reference import reference_losses
from harness.schedules import p2p
from harness.schedules.auto import generate, limit_of, main
from harness.schedules.csv_io import write_csv
from harness.schedules.ir import replay_inflight
from harness.schedules.registry import build
from harness.schedules.validate import validate
from harness.simulate import engine
from harness.simulate.cost import CostModel


def gpt_like(n: int, hop: float = 0.03) -> CostModel:
    """Equal stages shaped like a GPT layer: I about F, W about F / 2, a hop of 3% of F."""
    return CostModel((1.0,) * n, (1.5,) * n, (1.0,) * n, (0.5,) * n, fwd_hop_s=(hop,) * n, bwd_hop_s=(hop,) * n)


def random_costs(rng: random.Random, n: int) -> CostModel:
    f = tuple(rng.uniform(0.5, 2) for _ in range(n))
    i = tuple(x * rng.uniform(0.5, 2) for x in f)
    w = tuple(x * rng.uniform(0.1, 1.5) for x in f)
    hop = tuple(rng.uniform(0, 0.3) for _ in range(n))
    return CostModel(f, tuple(a + b for a, b in zip(i, w)), i, w, fwd_hop_s=hop, bwd_hop_s=hop)


@pytest.mark.grid
def test_every_order_is_valid_and_within_its_memory_limit():
    rng = random.Random(0)
    for n in range(1, 7):
        for m in range(1, 3 * n + 2):
            for memory_limit in (1 / n, 0.5, 1.0, 1.5, 2.0):
                cost = random_costs(rng, n)
                g = generate(n, m, cost, memory_limit)
                validate(g.schedule, n, m)
                assert max(replay_inflight(acts) for acts in g.schedule.values()) <= g.limit == limit_of(memory_limit, n)
                assert g.step_s == pytest.approx(engine.step_time(engine.compile_schedule(g.schedule), cost))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_never_slower_than_the_handcrafted_ones_on_its_costs(n):
    for m in (n, 2 * n, 3 * n, 4 * n):
        cost = gpt_like(n)

        def step(name: str) -> float:
            return engine.step_time(engine.compile_schedule(build(name, n, m)), cost)

        assert generate(n, m, cost, 1.0).step_s <= step("zb_h1") + 1e-12
        assert generate(n, m, cost, 2.0).step_s <= min(step("zb_h1"), step("zb_h2")) + 1e-12


def test_twice_the_memory_reaches_the_synchronous_floor_on_gpt_like_costs():
    """At 2.0 and M >= 4N the bubble is within 5% of the floor a step with a barrier has (the
    last stage's (N-1) F + hops before its first input, README), below ZB-H1's."""
    for n in (4, 8):
        for m in (4 * n, 8 * n):
            cost = gpt_like(n)
            g = generate(n, m, cost, 2.0)
            floor = (n - 1) * (1.0 + 0.03) + m * 2.5
            assert g.step_s <= 1.05 * floor
            assert g.step_s < engine.step_time(engine.compile_schedule(build("zb_h1", n, m)), cost)


@pytest.mark.parametrize("n,m", [(2, 4), (4, 8), (4, 16)])
def test_orders_pass_the_nccl_rules_with_the_safe_transport(n, m):
    g = generate(n, m, gpt_like(n), 2.0)
    for dp in (1, 2):
        p2p.check(g.schedule, "safe", "nccl", n, dp)
        p2p.check(g.schedule, "safe", "nccl", n, dp, single_tag=True)


def test_generation_time_is_recorded_and_small():
    g = generate(8, 64, gpt_like(8), 2.0)
    assert 0 < g.seconds < 30 and g.candidates >= 2


def test_cli_writes_a_csv_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    out = tmp_path / "auto.csv"
    assert main(["--pp", "4", "--microbatches", "8", "--memory-limit", "2", "-o", str(out)]) == 0
    assert "zb_auto pp=4 M=8 memory_limit=2 (8 microbatches per rank)" in capsys.readouterr().out and out.exists()
    for bad in (["--pp", "4", "--microbatches", "8", "--memory-limit", "0"], ["--pp", "0", "--microbatches", "8"]):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.slow  # make test runs the same order through schedule=zb_auto below
@pytest.mark.dist
def test_a_generated_order_runs_like_one_process(tmp_path, config):
    path = tmp_path / "auto.csv"
    write_csv(path, generate(4, 8, gpt_like(4), 2.0).schedule)
    c = config(pp=4, microbatches=8, steps=2, verify_grads=True, **{"schedule.name": "csv",
                                                                    "schedule.csv_path": str(path)})
    result = run_job(c, tmp_path / "run", "test", "auto")
    assert result.status == "ok", result.error
    assert result.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    assert result.metrics.grad_check.max_rel_diff < 1e-5


@pytest.mark.dist
def test_a_generated_order_with_data_parallelism_trains_like_one_process(tmp_path, config):
    """pp=2 x dp=2 through schedule=csv: each W-stage all-reduces after its last W."""
    path = tmp_path / "auto.csv"
    write_csv(path, generate(2, 4, gpt_like(2), 2.0).schedule)
    c = config(pp=2, dp=2, microbatches=4, steps=2, verify_grads=True, **{"schedule.name": "csv",
                                                                          "schedule.csv_path": str(path)})
    result = run_job(c, tmp_path / "run", "test", "auto-dp")
    assert result.status == "ok", result.error
    assert result.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    assert result.metrics.grad_check.max_rel_diff < 1e-5 and result.metrics.dp_sync_s > 0


@pytest.mark.dist
@pytest.mark.parametrize("executor", ["native", "pytorch"])
def test_schedule_zb_auto_is_generated_for_the_plans_costs_and_trains_like_one_process(tmp_path, config, executor):
    """schedule=zb_auto: generated in planning on the plan's priced costs (its note says how and
    how long), run by the native runner and by torch's CSV loader, losses as one process's."""
    c = config(pp=4, microbatches=8, steps=2, executor=executor, verify_grads=executor == "pytorch",
               **{"schedule.name": "zb_auto", "schedule.memory_limit": 2.0})
    result = run_job(c, tmp_path, "test", executor)
    assert result.status == "ok", result.error
    assert result.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    note = next(n for n in result.plan.notes if n.startswith("schedule=zb_auto"))
    assert "8 microbatches per rank" in note and "generated in" in note
    assert max(replay_inflight(acts) for acts in result.plan.schedule_actions().values()) <= 8


@pytest.mark.parametrize("overrides,said", [
    ({"schedule.memory_limit": 0.1}, "schedule.memory_limit=0.1: in units of 1F1B's peak, pp=4 microbatches"),
    ({"schedule.costs": "measured"}, "schedule.costs=measured: no result.json there (allowed: model, or a prior run"),
    ({"virtual_stages": 2}, "virtual_stages=2: zb_auto has one stage per rank (allowed: 1)"),
])
def test_zb_auto_bad_input_is_one_line(config, overrides, said):
    from harness.config import ConfigError
    from harness.plan import make_plan

    with pytest.raises(ConfigError) as e:
        make_plan(config(pp=4, microbatches=8, **{"schedule.name": "zb_auto"}, **overrides))
    assert said in str(e.value) and "\n" not in str(e.value)


def test_zb_auto_takes_a_prior_runs_measured_costs(tmp_path, config):
    """schedule.costs=<run dir>: the prior run's per-stage F, I, W (3 ms a layer here) and
    hop are what the generator times its candidates on."""
    from harness.plan import make_plan

    prior = config(pp=4, microbatches=8, executor="sim", steps=1, **{"schedule.name": "zb_h1"})
    prior.cost.fwd_ms_per_layer = 3.0
    assert run_job(prior, tmp_path / "prior", "t", "p").status == "ok"
    plan = make_plan(config(pp=4, microbatches=8, executor="sim", **{"schedule.name": "zb_auto",
                                                                     "schedule.costs": str(tmp_path / "prior"),
                                                                     "schedule.memory_limit": 2.0}))
    note = next(n for n in plan.notes if n.startswith("schedule=zb_auto"))
    assert f"on {tmp_path / 'prior'}'s measured costs" in note
    with pytest.raises(Exception, match="no result.json there"):
        make_plan(config(pp=4, microbatches=8, **{"schedule.name": "zb_auto", "schedule.costs": str(tmp_path)}))
