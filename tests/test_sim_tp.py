"""executor=sim at tp > 1 (issue 36 item 3, issue 37 item 1): the TP collectives per layer kind
and direction on the link the TP group spans, added to each stage's F, B and I; messages of a
sequence shard under sequence parallelism; and (dist) an emulated tp=2 run's measured step
against the simulated one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.config import LinkConfig
from harness.frontend.compose import compose_config
from harness.job import run_job
from harness.planning.plan import make_plan
from harness.simulate import pricing
from tests.jitter import oversleep, stretch

GPT = {"model.name": "gpt", "model.layers": 4, "model.hidden": 32, "model.heads": 4, "model.seq": 8,
       "model.vocab": 64, "pp": 2, "compute": "emulated", "cost.fwd_ms_per_layer": 10.0}
LINK = LinkConfig(latency_s=1e-4, bandwidth_Bps=1e9)


def test_a_block_costs_two_all_reduces_or_with_sequence_parallelism_twice_the_steps():
    nbytes = 4 * 8 * 32 * 2  # B x seq x hidden in bf16
    one = 2 * (1e-4 + nbytes / 4 / 1e9) * 3  # ring all-reduce over 4: 2 (n-1) steps of a latency and 1/n of the bytes
    assert pricing.tp_collectives_s(4, 32, 8, 4, 2, LINK) == pytest.approx(2 * one)
    sp = pricing.tp_collectives_s(4, 32, 8, 4, 2, LINK, sequence_parallel=True)
    assert sp == pytest.approx(2 * one)  # 2 x (all-gather + reduce-scatter): the same steps and bytes
    assert pricing.tp_collectives_s(1, 32, 8, 4, 2, LINK) == 0.0


@pytest.mark.parametrize("kind, fwd, bwd", [
    ("block", 2, 2), ("embed", 1, 0), ("head", None, 1)])
def test_each_layer_kind_prices_its_own_collectives(kind, fwd, bwd):
    act, logits = 1e6, 8e6
    ar = pricing.collective_s("all_reduce", 2, act, LINK)
    f, b = pricing.layer_collectives_s(kind, 0, 1, 2, act, logits, LINK, False)
    assert b == pytest.approx(bwd * ar)
    assert f == pytest.approx(fwd * ar if fwd is not None else pricing.collective_s("all_gather", 2, logits, LINK))


def test_mlp_pairs_all_reduce_once_each_way():
    per = [pricing.layer_collectives_s("linear", i, 4, 2, 1e6, 0.0, LINK, False) for i in range(4)]
    ar = pricing.collective_s("all_reduce", 2, 1e6, LINK)
    assert [f for f, _ in per] == [0.0, ar, 0.0, ar] and [b for _, b in per] == [ar, 0.0, ar, 0.0]


def test_sim_adds_the_collectives_to_f_b_and_i_not_w(config):
    flat = make_plan(config(executor="sim", **GPT, **{"schedule.name": "zb_h1"}))
    base = flat.sim_cost()
    plan = make_plan(config(executor="sim", tp=2, **GPT, **{"schedule.name": "zb_h1"}))
    cost, tp_s = plan.sim_cost(), pricing.plan_tp_collectives(plan.config, plan.model, list(plan.stage_layers))
    assert all(f > 0 and b > 0 for f, b in tp_s)
    assert cost.fwd_s == pytest.approx([f + t for f, (t, _) in zip(base.fwd_s, tp_s)])
    assert cost.input_grad_s == pytest.approx([i + t for i, (_, t) in zip(base.input_grad_s, tp_s)])
    assert cost.weight_grad_s == pytest.approx(base.weight_grad_s)
    assert plan.modeled_step_s() > flat.modeled_step_s()


def test_the_tp_link_is_the_node_s_inside_and_the_network_s_across():
    c = compose_config(["executor=sim", "tp=8", "cluster=dgx_a100_80gb"])
    assert pricing.tp_link(c) == c.cluster.intra
    wide = replace(c, tp=16, cluster=replace(c.cluster, nodes=2))
    assert pricing.tp_link(wide) == wide.cluster.inter
    assert pricing.tp_link(replace(c, cluster=None)).latency_s == c.comm.latency_s


def test_sequence_parallelism_sends_a_sequence_shard(config):
    whole = make_plan(config(executor="sim", tp=2, **GPT)).sim_cost().message_bytes
    shard = make_plan(config(executor="sim", tp=2, sequence_parallel=True, **GPT)).sim_cost().message_bytes
    assert [2 * s for s in shard] == list(whole)


@pytest.mark.slow  # 4 processes with DTensor stages: ~15 s here; the unit tests above keep the pricing covered
@pytest.mark.dist
def test_an_emulated_tp2_run_measures_the_simulated_step(tmp_path, config):
    """pp=2 x tp=2 (4 processes), emulated compute, the same comm.* for both: the real gloo
    collectives run inside each held action, the simulator adds comm.*'s price for them (a few
    % of the step here, `hidden`), so simulated / measured sits between the dp study's floor
    (tests/test_numbers.py: measured loses to the model by hops and jitter) and 1.02 x that.
    20 ms a layer: DTensor's real math on gloo takes a few ms a layer on CPU, which a shorter
    hold would not cover (seen: 0.99 at 20 ms, 0.81 at 5 ms on the busy 2-core VM)."""
    c = config(tp=2, microbatches=4, steps=2, **{**GPT, "cost.fwd_ms_per_layer": 20.0})
    r = run_job(c, tmp_path, "test", "tp2")
    assert r.status == "ok", r.error
    simulated = make_plan(replace(c, executor="sim")).modeled_step_s()
    assert r.metrics.model_step_s == pytest.approx(simulated, rel=1e-9)
    hidden = simulated / make_plan(replace(c, executor="sim", tp=1)).modeled_step_s()  # what the holds hide
    ratio = simulated / r.metrics.step_time_s
    assert 0.8 / stretch(oversleep(c, r.metrics)) < ratio <= 1.02 * hidden, (ratio, hidden)


def test_a_profile_at_another_tp_is_said_to_be_taken_unsplit(config):
    plan = make_plan(config(executor="sim", tp=2, profile="data/gpt2_h200_profile.json",
                            **{**GPT, "model.layers": 12, "model.hidden": 64}))
    assert any("its times are at tp=1, taken as a TP rank's at tp=2" in n for n in plan.notes)
