"""TP collectives inside the actions (issue 36): traced as their own slices (category tp,
harness/parallel/tp_trace.py), left out of the actions' compute time, counted in the bubble
attribution's communication part, and recorded (metrics.tp_comm_s, tp_comm_share; wandb's
summary takes every metric).

Pure: the measured bubble with TP slices nested in the actions equals the simulator's with
the same TP seconds (bubbles_less_tp), so the attribution's communication part holds them.
dist: at tp=2 pp=2 (model=gpt, tiny) every block issues Megatron's two collectives per
direction (all-reduces; under sequence parallelism two all-gathers and two reduce-scatters,
tests/test_tp_runs.py's zbv run), and the losses stay those of one process."""

from __future__ import annotations

import json
import statistics
from collections import Counter

import pytest

from harness.job import run_job
from harness.measure.metrics import bubble_per_rank, bubbles_less_tp, mean_costs, steady_per_rank, with_tp
from harness.measure.reference import reference_losses
from harness.measure.trace import TP, Event, compute_s, tp_inside
from harness.planning.plan import make_plan
from harness.records.wandb_log import summary_metrics
from harness.simulate import engine
from harness.simulate.cost import CostModel

GPT = {"model.name": "gpt", "model.layers": 2, "model.hidden": 32, "model.heads": 4, "model.seq": 8,
       "model.vocab": 64}


def _nest_tp(trace: list[Event], tp: dict[str, float]) -> list[Event]:
    """`trace` with a TP slice of tp[kind] seconds at the start of each compute action."""
    out = list(trace)
    for e in trace:
        if e.in_window and tp.get(e.kind):
            out.append(Event(e.rank, e.step, f"tp {e.name} L0 all_reduce", TP, f"tp_{e.kind}", e.stage,
                             e.microbatch, e.start, e.start + tp[e.kind]))
    return out


def test_an_action_computes_its_span_less_the_tp_collectives_inside_it():
    f = Event(0, 0, "0F0", "compute", "F", 0, 0, 1.0, 2.0)
    tp = [Event(0, 0, "tp 0F0 L1 all_reduce", TP, "tp_F", 0, 0, 1.2, 1.3),
          Event(0, 0, "tp 0F0 L1 all_reduce", TP, "tp_F", 0, 0, 1.5, 1.7)]
    other = Event(1, 0, "0F0", "compute", "F", 0, 0, 1.0, 2.0)  # another rank's F: its own slices only
    inside = tp_inside([f, other, *tp])
    assert compute_s(f, inside) == pytest.approx(0.7) and compute_s(other, inside) == pytest.approx(1.0)
    assert mean_costs([f, *tp], 1) == {"F": [pytest.approx(0.7)]}
    assert mean_costs([f, *tp], 1, tp=True) == {"F": [pytest.approx(0.3)]}
    assert mean_costs([f], 1, tp=True) == {}  # none traced (tp=1, executor=sim)


@pytest.mark.parametrize("schedule", ["1f1b", "zb_h1"])
def test_the_measured_bubble_with_tp_slices_is_the_simulated_one_less_them(config, schedule):
    """The simulator's actions hold their TP seconds (with_tp); nested as slices in its trace,
    bubble_per_rank and steady_per_rank measure exactly what bubbles_less_tp computes, and more than without TP."""
    plan = make_plan(config(pp=4, microbatches=6, **{"schedule.name": schedule}))
    base = CostModel.uniform(4, fwd_s=1.0, bwd_s=2.0)
    tp = {"F": [0.3] * 4, "B": [0.5] * 4, "I": [0.25] * 4}
    held = with_tp(base, tp)
    bubble, steady = bubbles_less_tp(plan, held, tp)
    trace = _nest_tp(engine.trace(plan.compiled, held), {k: v[0] for k, v in tp.items()})
    assert statistics.fmean(bubble_per_rank(trace, 4)) == pytest.approx(bubble, abs=1e-12)
    assert bubble > engine.bubble(plan.compiled, base)
    no_tp = {k: [0.0] * 4 for k in tp}
    assert bubbles_less_tp(plan, base, no_tp) == pytest.approx(
        (engine.bubble(plan.compiled, base), engine.steady_bubble(plan.compiled, base)))
    assert statistics.fmean(steady_per_rank(trace, 4)) == pytest.approx(steady, abs=1e-12)


def _collectives(trace: list[dict]) -> dict[tuple[int, int, str, int, int], Counter]:
    """(rank, step, kind, layer, microbatch) -> Counter of collectives, from trace.json's tp slices."""
    out: dict = {}
    for e in trace:
        if e.get("cat") == TP:
            layer = int(e["name"].split()[2][1:])
            key = (e["tid"], e["args"]["step"], e["args"]["kind"], layer, e["args"]["microbatch"])
            out.setdefault(key, Counter())[e["name"].split()[3]] += 1
    return out


@pytest.mark.dist
def test_tp2_pp2_traces_two_all_reduces_per_block_and_direction_and_attributes_them(tmp_path, config):
    c = config(pp=2, tp=2, steps=2, microbatches=2, microbatch_size=2, verify_grads=True,
               **GPT, **{"schedule.name": "1f1b"})
    result = run_job(c, tmp_path, "test", "tp")
    assert result.status == "ok", result.error
    m = result.metrics
    assert m.losses == pytest.approx(reference_losses(c)[0], rel=1e-5, abs=1e-5)  # tracing changes no numerics
    assert m.grad_check.max_rel_diff < 1e-5
    model = make_plan(c).model.model
    found = _collectives(json.loads((tmp_path / "trace.json").read_text())["traceEvents"])
    blocks = [i for i in range(4) if model.kind(i) == "block"]
    for rank, layers in ((0, (0, 1)), (1, (2, 3))):  # a TP group's rank 0 stands for it
        for step in range(c.warmup_steps + c.steps):
            for mb in range(c.microbatches):
                for i in layers:
                    if i in blocks:  # Megatron: after attention's and the MLP's row-parallel linears, and mirrored
                        assert found[(rank, step, "tp_F", i, mb)] == Counter(all_reduce=2)
                        assert found[(rank, step, "tp_B", i, mb)] == Counter(all_reduce=2)
    assert found[(0, 0, "tp_F", 0, 0)] == Counter(all_reduce=1)  # the vocabulary-parallel embedding
    assert found[(1, 0, "tp_F", 3, 0)] == Counter(all_gather=1)  # the LM head's logits
    assert found[(1, 0, "tp_B", 3, 0)] == Counter(all_reduce=1)  # its input gradient
    # each slice inside its action, one at a time (each collective waited before the next: no
    # overlap counted twice), so every action's compute is positive
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = {(e["tid"], e["args"]["step"], e["name"]): e for e in events if e.get("cat") == "compute"}
    for rank in (0, 1):
        tp = sorted((e for e in events if e.get("cat") == TP and e["tid"] == rank), key=lambda e: e["ts"])
        for e, after in zip(tp, tp[1:] + [None]):
            action = spans[(rank, e["args"]["step"], e["name"].split()[1])]
            assert action["ts"] <= e["ts"] and e["ts"] + e["dur"] <= action["ts"] + action["dur"] + 1e-3
            assert after is None or e["ts"] + e["dur"] <= after["ts"] + 1e-3
    assert all(x > 0 for v in m.mean_op_s.values() for x in v)
    assert m.tp_comm_s > 0 and 0 < m.tp_comm_share < 1 and m.tp_sync_s is not None
    a = m.bubble.attribution
    assert a.schedule + a.imbalance + a.communication + a.overhead == pytest.approx(m.bubble.measured)
    assert a.communication > 0  # the TP collectives, taken out of the actions' compute
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["config"]["tp"] == 2 and record["config"]["sequence_parallel"] is False
    summary = summary_metrics(record["metrics"])
    assert summary["tp_comm_s"] == pytest.approx(m.tp_comm_s) and "tp_comm_share" in summary
