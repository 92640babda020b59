"""Trace -> measured metrics, with theory and simulation beside them (DESIGN.md sec. 4).

Step window: earliest pipeline-compute start to latest pipeline-compute end of the step
over all ranks. Bubble of a rank: 1 - its compute time in the window / window length.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from harness import theory
from harness.model import get_model
from harness.plan import Plan, layer_params
from harness.schedules.ir import Kind
from harness.simulate.engine import simulate
from harness.result import Bubble, GradCheck, Memory, Metrics
from harness.trace import Trace, events_of_step, step_numbers

if TYPE_CHECKING:
    from harness.runtime.launch import Execution


def window(trace: Trace) -> tuple[float, float]:
    ev = [e for e in trace if e.in_window]
    return min(e.start for e in ev), max(e.end for e in ev)


def bubble_per_rank(step_trace: Trace, ranks: int, pp: int | None = None) -> list[float]:
    """Idle fraction of each rank over one step's window. With dp replicas (global rank =
    replica * pp + pipeline rank) each pipeline has its own window: one replica starting
    late is the gradient sync's cost (dp_sync), not its peers' bubble."""
    pp = pp or ranks
    busy = [0.0] * ranks
    for e in step_trace:
        if e.in_window:
            busy[e.rank] += e.dur
    out = []
    for d in range(ranks // pp):
        t0, t1 = window([e for e in step_trace if e.rank // pp == d])
        out += [1.0 - busy[r] / (t1 - t0) for r in range(d * pp, (d + 1) * pp)]
    return out


def step_time(step_trace: Trace) -> float:
    """Whole step, optimizer included: first event start to last event end, any rank."""
    return max(e.end for e in step_trace) - min(e.start for e in step_trace)


def mean_costs(trace: Trace, stages: int) -> dict[str, list[float]]:
    """Measured mean seconds per stage and action kind, over the trace's compute actions."""
    acc: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in trace:
        if e.in_window:
            acc[(e.kind, e.stage)].append(e.dur)
    return {k: [statistics.fmean(acc[(k, s)]) if acc[(k, s)] else 0.0 for s in range(stages)]
            for k in {k for k, _ in acc}}


def hop_latency(trace: Trace) -> float | None:
    """Median seconds from a producer's compute end to its consumer's compute start, over
    the messages whose receiver was already waiting (so the gap is all communication:
    posting the send, the transfer, waking the receiver). None if there were none."""
    compute = {(e.step, e.name): e for e in trace if e.in_window}
    recv_start = {(e.step, e.name[5:]): e.start for e in trace if e.kind == "recv"}
    gaps = []
    for (step, name), consumer in compute.items():
        s, mb = consumer.stage, consumer.microbatch
        if consumer.kind == "F":
            producer = compute.get((step, f"{s - 1}F{mb}"))
        else:
            producer = compute.get((step, f"{s + 1}B{mb}")) or compute.get((step, f"{s + 1}I{mb}"))
        posted = recv_start.get((step, name))
        if producer and posted is not None and posted <= producer.end:
            gaps.append(consumer.start - producer.end)
    return statistics.median(gaps) if gaps else None


def simulated_bubble(plan: Plan, measured: Trace) -> float:
    """The simulator fed with this run's own measured mean op costs per stage and kind, and
    its measured hop latency (or, with none measured, comm.latency_s + bytes / bandwidth)."""
    stages = len(plan.stage_layers)
    costs = mean_costs(measured, stages)
    hop = hop_latency(measured)
    model = replace(plan.sim_cost(), fwd_s=tuple(costs.get("F", [0.0] * stages)),
                    bwd_s=tuple(costs.get("B", [0.0] * stages)),
                    input_grad_s=tuple(costs["I"]) if "I" in costs else None,
                    weight_grad_s=tuple(costs["W"]) if "W" in costs else None)
    if hop is not None:
        model = replace(model, p2p_latency_s=hop, p2p_bandwidth_Bps=float("inf"))
    sim = simulate(plan.schedule, model)
    return statistics.fmean(bubble_per_rank(sim, plan.config.pp))


def grad_check(pipeline: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> GradCheck:
    """Largest relative difference, over parameters, between the pipeline's accumulated
    gradient and the single-process full-batch one: max |g - r| / max |r|."""
    if set(pipeline) != set(reference):
        raise ValueError(f"parameters differ: {sorted(set(pipeline) ^ set(reference))[:5]}")
    worst, where = 0.0, None
    for name, r in reference.items():
        d = float((pipeline[name] - r).abs().max() / r.abs().max().clamp_min(1e-30))
        if d >= worst:
            worst, where = d, name
    return GradCheck(max_rel_diff=worst, worst_param=where, params=len(reference))


def dp_sync(plan: Plan, trace: Trace, steps: list[int]) -> float | None:
    """Median over steps of the longest per-rank total of gradient-sync tails (dp_sync
    events: from the last bucket's all-reduce launch to the end of the backward)."""
    if plan.config.dp == 1:
        return None
    per_step = []
    for s in steps:
        totals: dict[int, float] = defaultdict(float)
        for e in trace:
            if e.step == s and e.kind == "dp_sync":
                totals[e.rank] += e.dur
        per_step.append(max(totals.values(), default=0.0))
    return statistics.median(per_step)


def ring_allreduce_s(plan: Plan) -> float:
    """Ring all-reduce of the largest pipeline rank's fp32 gradients over dp replicas:
    2 (dp - 1) steps of latency, and 2 (dp - 1) / dp of the bytes over the link
    (Patarasuk & Yuan 2009), with comm.latency_s and comm.bandwidth_Bps."""
    c = plan.config
    params = layer_params(get_model(c.model))
    per_rank = defaultdict(int)
    for s, (a, b) in enumerate(plan.stage_layers):
        per_rank[plan.stage_rank[s]] += sum(params[a:b])
    nbytes = 4 * max(per_rank.values())
    return 2 * (c.dp - 1) * c.comm.latency_s + 2 * (c.dp - 1) / c.dp * nbytes / c.comm.bandwidth_Bps


def _theory(fn, *args):
    """A closed form, or None where there is none (schedule=csv, or outside its domain)."""
    try:
        return fn(*args)
    except (KeyError, ValueError):
        return None


def compute_metrics(plan: Plan, run: "Execution") -> Metrics:
    c = plan.config
    trace = run.trace
    measured_steps = [s for s in step_numbers(trace) if s >= c.warmup_steps]
    per_step = [bubble_per_rank(events_of_step(trace, s), run.ranks, c.pp) for s in measured_steps]
    per_global = [statistics.fmean(b[r] for b in per_step) for r in range(run.ranks)]
    # global rank = replica * pp + pipeline rank: average each pipeline rank over replicas
    per_rank = [statistics.fmean(per_global[p::c.pp]) for p in range(c.pp)]
    times = [step_time(events_of_step(trace, s)) for s in measured_steps]
    measured_trace = [e for e in trace if e.step >= c.warmup_steps]
    st = statistics.median(times)
    costs = mean_costs(measured_trace, len(plan.stage_layers))
    # measured compute per microbatch of each stage: F + B (or F + I + W)
    stage_times = [sum(v[s] for v in costs.values()) for s in range(len(plan.stage_layers))]
    sync = dp_sync(plan, measured_trace, measured_steps)
    replica0 = run.reports[:c.pp]
    metered = bool(replica0) and all(r.peak_activation_bytes is not None for r in replica0)
    cuda = [r.cuda_max_memory_allocated for r in replica0]
    samples = c.microbatches * c.microbatch_size * c.dp
    return Metrics(
        step_time_s=st,
        step_times_s=times,
        throughput_samples_s=samples / st,
        # gpt: tokens per second too (samples x seq), the figure LM people compare
        throughput_tokens_s=samples * c.model.seq / st if c.model.name == "gpt" else None,
        losses=run.losses,
        bubble=Bubble(
            theory=_theory(theory.bubble_fraction, c.schedule.name, c.pp, c.microbatches, c.virtual_stages),
            simulated=simulated_bubble(plan, measured_trace),
            measured=statistics.fmean(per_rank),
            measured_per_rank=per_rank,
            measured_per_step=[statistics.fmean(b) for b in per_step],
            measured_per_global_rank=per_global,
        ),
        dp_sync_s=sync,
        dp_sync_share=None if sync is None else sync / st,
        dp_sync_theory_s=ring_allreduce_s(plan) if c.dp > 1 else None,
        memory=Memory(
            peak_activation_bytes_per_rank=[r.peak_activation_bytes for r in replica0] if metered else None,
            # in (stage, microbatch) units: for chunked schedules one chunk's activations
            theory_peak_microbatches_per_rank=[_theory(theory.peak_inflight_microbatches, c.schedule.name, c.pp,
                                                       c.microbatches, r, c.virtual_stages) for r in range(c.pp)],
            activation_bytes_per_microbatch_per_rank=[r.activation_bytes_per_microbatch for r in replica0]
            if metered else None,
            cuda_max_memory_allocated_per_rank=cuda if cuda and None not in cuda else None,
        ),
        recompute_s=sum(e.dur for e in measured_trace if e.kind == "R") / len(measured_steps),
        p2p_hop_s=hop_latency(measured_trace),
        stage_time_s=stage_times,
        measured_imbalance=max(stage_times) / statistics.fmean(stage_times) if any(stage_times) else None,
        mean_op_s={k: v for k, v in costs.items() if k in {x.value for x in Kind}},
    )
