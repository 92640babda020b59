"""The zero-bubble schedule generator (harness/schedules/auto.py): every order it makes is valid,
holds no rank past its memory limit, passes the NCCL rules under the safe transport, is never
worse than ZB-H1 at 1.0 (nor ZB-H2 at 2.0) on the costs it was built for, reaches the zero-bubble
paper's near-zero bubble at 2.0, and runs for real through schedule=csv like one process, within
its limit by the native meter."""

from __future__ import annotations

import random

import pytest

from harness.job import run_job
from harness.measure.reference import reference_losses
from harness.schedules import p2p
from harness.schedules.auto import generate, limit_of, peak_memory
from harness.schedules.csv_io import write_csv
from harness.schedules.generate import main
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
            for memory_limit in (x for x in (1 / n, 0.5, 1.0, 1.5, 2.0) if x >= 1 / n):
                cost = random_costs(rng, n)
                w = tuple(rng.uniform(0.2, 1.0) for _ in range(n))
                g = generate(n, m, cost, memory_limit, w)
                validate(g.schedule, n, m)
                assert g.limit == limit_of(memory_limit, n)
                assert all(peak_memory(g.schedule[s], w[s]) <= g.limit + 1e-9 for s in range(n))
                c = engine.compile_schedule(g.schedule)
                assert g.period_s == pytest.approx(engine.period(c, cost))
                assert g.step_s == pytest.approx(engine.step_time(c, cost))


def period(name: str, n: int, m: int, cost: CostModel) -> float:
    return engine.period(engine.compile_schedule(build(name, n, m)), cost)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_never_worse_than_the_handcrafted_ones_on_its_costs(n):
    """The objective, the period, at most ZB-H1's at 1.0 and ZB-H2's at 2.0 (which it holds)."""
    for m in (n, 2 * n, 3 * n, 4 * n):
        cost = gpt_like(n)
        assert generate(n, m, cost, 1.0).period_s <= period("zb_h1", n, m, cost) + 1e-12
        assert generate(n, m, cost, 2.0).period_s <= min(period("zb_h1", n, m, cost),
                                                         period("zb_h2", n, m, cost)) + 1e-12


@pytest.mark.parametrize("n", [4, 8, 16])
def test_twice_the_memory_has_near_zero_bubble_where_a_deferred_w_keeps_half(n):
    """The zero-bubble paper's ZB-2p (arXiv 2401.10241 sec. 5): at 2.0 on GPT-like costs and a
    deferred W keeping half a microbatch's activations, the bubble of overlapped steps is under
    1% for M >= 4N and under half ZB-H2's at M = 3N; at 1.0 never above ZB-H1's."""
    cost = gpt_like(n)
    for m in (4 * n, 8 * n):
        g = generate(n, m, cost, 2.0, 0.5)
        assert engine.steady_bubble(engine.compile_schedule(g.schedule), cost) < 0.01, (n, m)
    g = generate(n, 3 * n, cost, 2.0, 0.5)
    h2 = engine.steady_bubble(engine.compile_schedule(build("zb_h2", n, 3 * n)), cost)
    assert engine.steady_bubble(engine.compile_schedule(g.schedule), cost) < h2 / 2
    for m in (n, 3 * n, 4 * n):
        ours = engine.steady_bubble(engine.compile_schedule(generate(n, m, cost, 1.0, 0.5).schedule), cost)
        assert ours <= engine.steady_bubble(engine.compile_schedule(build("zb_h1", n, m)), cost) + 1e-12


@pytest.mark.parametrize("n,m", [(2, 4), (4, 8), (4, 16)])
def test_orders_pass_the_nccl_rules_with_the_safe_transport(n, m):
    """Safe under NCCL's rules; eager runs on gloo (tags match any order) and deadlocks on NCCL,
    as 1F1B does, which the plan refuses before any worker starts."""
    g = generate(n, m, gpt_like(n), 2.0, 0.5)
    for dp in (1, 2):
        p2p.check(g.schedule, "safe", "nccl", n, dp)
        p2p.check(g.schedule, "safe", "nccl", n, dp, single_tag=True)
    p2p.check(g.schedule, "eager", "gloo", n, 1)
    with pytest.raises(p2p.P2PError, match="deadlock"):
        p2p.check(g.schedule, "eager", "nccl", n, 1)


def test_generation_time_is_recorded_and_small():
    g = generate(8, 64, gpt_like(8), 2.0)
    assert 0 < g.seconds < 30 and g.candidates >= 2


def test_cli_writes_a_csv_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    out = tmp_path / "auto.csv"
    assert main(["--pp", "4", "--microbatches", "8", "--memory-limit", "2", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("zb_auto pp=4 M=8 memory_limit=2 (8 microbatches per rank") and out.exists()
    assert "with steps overlapped" in said and "in a step that starts at a barrier" in said
    for bad in (["--pp", "4", "--microbatches", "8", "--memory-limit", "0"], ["--pp", "0", "--microbatches", "8"],
                ["--pp", "4", "--microbatches", "8", "--w-memory", "1.5"]):
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
def test_schedule_zb_auto_is_generated_for_the_plans_costs_and_trains_bit_identically_to_gpipe(tmp_path, config):
    """schedule=zb_auto: generated in planning on the plan's priced costs (its note says how and
    how long), run by the native runner and by torch's CSV loader; losses bit-identical to
    GPipe's, the native meter's peaks within the limit."""
    def run(name: str, executor: str = "native", **extra):
        c = config(pp=4, microbatches=8, steps=2, executor=executor, **{"schedule.name": name}, **extra)
        result = run_job(c, tmp_path / f"{name}-{executor}", "test", executor)
        assert result.status == "ok", result.error
        return result

    gpipe = run("gpipe").metrics.losses
    ran = {executor: run("zb_auto", executor, **{"schedule.memory_limit": 2.0}) for executor in ("native", "pytorch")}
    for executor, result in ran.items():
        assert result.metrics.losses == gpipe, executor
        note = next(n for n in result.plan.notes if n.startswith("schedule=zb_auto"))
        assert "8 microbatches' activations per rank" in note and "generated in" in note
    mem = ran["native"].metrics.memory
    for peak, per_mb in zip(mem.peak_activation_bytes_per_rank, mem.activation_bytes_per_microbatch_per_rank):
        assert peak <= 8 * per_mb  # 2 x 1F1B's peak on stage 0, in each rank's own microbatches


@pytest.mark.dist
def test_zb_auto_holds_its_limit_in_measured_bytes_where_a_deferred_w_keeps_less(tmp_path, config):
    """GPT-2 with eager attention: a deferred W keeps about half of what the F held (the T x T
    scores go at the I), so the limit buys more Fs in flight; the meter's peak per rank is
    within the limit and equals memory theory's."""
    c = config(pp=4, microbatches=12, steps=1, **{"schedule.name": "zb_auto", "schedule.memory_limit": 1.5},
               **{"model.name": "hf", "model.arch": "gpt2", "model.attention": "eager", "model.layers": 4,
                  "model.hidden": 32, "model.heads": 4, "model.seq": 64, "model.vocab": 64})
    result = run_job(c, tmp_path, "test", "limit")
    assert result.status == "ok", result.error
    mem = result.metrics.memory
    for r, (peak, per_mb) in enumerate(zip(mem.peak_activation_bytes_per_rank,
                                           mem.activation_bytes_per_microbatch_per_rank)):
        assert peak <= 1.5 * 4 * per_mb * 1.001, r
        assert peak == pytest.approx(mem.theory_per_rank[r]["activations"], rel=0.02), r
    # more than 1F1B's N - rank in flight somewhere: what the smaller deferred W bought
    assert max(mem.theory_peak_microbatches_per_rank) > 4


@pytest.mark.parametrize("overrides,said", [
    ({"schedule.memory_limit": 0.1}, "schedule.memory_limit=0.1: in units of 1F1B's peak, pp=4 microbatches"),
    ({"schedule.costs": "measured"}, "schedule.costs=measured: no result.json there (allowed: model, or a prior run"),
    ({"virtual_stages": 2}, "virtual_stages=2: zb_auto has one stage per rank (allowed: 1)"),
])
def test_zb_auto_bad_input_is_one_line(config, overrides, said):
    from harness.config import ConfigError
    from harness.planning.plan import make_plan

    with pytest.raises(ConfigError) as e:
        make_plan(config(pp=4, microbatches=8, **{"schedule.name": "zb_auto"}, **overrides))
    assert said in str(e.value) and "\n" not in str(e.value)


def test_zb_auto_takes_a_prior_runs_measured_costs(tmp_path, config):
    """schedule.costs=<run dir>: the prior run's per-stage F, I, W (3 ms a layer here) and
    hop are what the generator times its candidates on."""
    from harness.planning.plan import make_plan

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
