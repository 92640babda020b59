"""Trace -> measured metrics, with theory and simulation beside them (DESIGN.md sec. 4).

Step window: earliest pipeline-compute start to latest pipeline-compute end of the step
over all ranks. Bubble of a rank: 1 - its compute time in the window / window length.

tp > 1: an action's compute time is its span less the TP collectives traced inside it
(trace.compute_s), so the measured bubble holds the TP communication, and the attribution's
communication part explains it: its simulation with communication adds each action's
measured TP collectives to the action's span without counting them as compute.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from itertools import compress, repeat
from operator import eq
from dataclasses import replace

import numpy as np
import torch

from harness.planning import theory
from harness.measure.execution import Execution, clock_record
from harness.planning.flops import flops_of
from harness.config import Config
from harness.planning.plan import Plan
from harness.measure.intervals import ORDER_STATISTICS, SIMULATED, median_interval
from harness.records.result import Attribution, Bubble, Budget, GradCheck, Intervals, Memory, Metrics
from harness.schedules.ir import Kind
from harness.schedules.registry import spec
from harness.simulate import engine
from harness.simulate.cost import CostModel
from harness.simulate.pricing import dp_sync_theory_s
from harness.measure.columns import Columns
from harness.measure.trace import TP, Trace


def window(trace: Trace) -> tuple[float, float]:
    ev = [e for e in trace if e.in_window]
    return min(e.start for e in ev), max(e.end for e in ev)


# The figures below read the trace a column at a time (harness/measure/columns.py: no Python call
# per event, issue #39); each is the figure the per-event definition gives, to the bit: sums
# add in trace order (np.bincount adds its weights in order), means are fsum's (order-free),
# a min or max over a non-finite time is Python's own.


def _extreme(pick, values: np.ndarray) -> float:
    """min or max of `values`, as Python's builtin gives it (ValueError where empty; a NaN
    counts where it comes first, is passed over after)."""
    if len(values) and np.isfinite(values).all():
        return float(np.min(values) if pick is min else np.max(values))
    return pick(values.tolist())


def bubble_per_rank(step_trace: Trace | Columns, ranks: int, pp: int | None = None) -> list[float]:
    """Idle fraction of each rank over one step's window. With dp replicas (global rank =
    replica * pp + pipeline rank) each pipeline has its own window: one replica starting
    late is the gradient sync's cost (dp_sync), not its peers' bubble."""
    c = _columns(step_trace)
    pp = pp or ranks
    busy = _busy(c, ranks)
    replica = c.rank_array // pp
    out = []
    for d in range(ranks // pp):
        mine = c.in_window & (replica == d)
        t0, t1 = _extreme(min, c.start[mine]), _extreme(max, c.end[mine])
        out += [1.0 - busy[r] / (t1 - t0) for r in range(d * pp, (d + 1) * pp)]
    return out


def steady_per_rank(step_trace: Trace | Columns, ranks: int, pp: int | None = None) -> list[float]:
    """Idle fraction of each rank had steps overlapped: 1 - its compute / the longest span of a
    rank of its pipeline (first compute start to last compute end; engine.steady_bubble)."""
    c = _columns(step_trace)
    pp = pp or ranks
    busy = _busy(c, ranks)
    win = c.in_window
    # Python's min(first, start) from inf and max(last, end) from 0.0 pass over a NaN, as fmin and fmax do
    first, last = np.full(ranks, np.inf), np.zeros(ranks)
    np.fmin.at(first, c.rank_array[win], c.start[win])
    np.fmax.at(last, c.rank_array[win], c.end[win])
    first, last = first.tolist(), last.tolist()
    out = []
    for d in range(ranks // pp):
        mine = range(d * pp, (d + 1) * pp)
        period = max((last[r] - first[r] for r in mine if busy[r]), default=0.0)
        out += [1.0 - busy[r] / period if period > 0 else 0.0 for r in mine]
    return out


def _columns(trace: Trace | Columns) -> Columns:
    return trace if isinstance(trace, Columns) else Columns.of(trace)


def _busy(c: Columns, ranks: int) -> list[float]:
    """Each rank's compute seconds in the window (summed in trace order)."""
    win = c.in_window
    return np.bincount(c.rank_array[win], weights=c.compute_s[win], minlength=ranks)[:ranks].tolist()


def step_time(step_trace: Trace | Columns) -> float:
    """Whole step, optimizer included: first event start to last event end, any rank."""
    c = _columns(step_trace)
    return _extreme(max, c.end) - _extreme(min, c.start)


def mean_costs(trace: Trace | Columns, stages: int, tp: bool = False) -> dict[str, list[float]]:
    """Measured mean compute seconds per stage and action kind, over the trace's compute
    actions (their TP collectives left out); tp=True: the mean seconds of the TP collectives
    inside them instead ({} where none were traced)."""
    c = _columns(trace)
    if tp and not c.tp_inside:
        return {}
    rows = np.flatnonzero(c.in_window)
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as Python's float gives it, unremarked
        values = (c.dur - c.compute_s if tp else c.compute_s)[rows]
    kinds = [c.kind[i] for i in rows.tolist()]
    code = {k: i for i, k in enumerate(dict.fromkeys(kinds))}  # the kinds in order of first appearance
    stage = np.array(c.stage, dtype=np.int64)[rows]
    ok = (stage >= 0) & (stage < stages)
    group = (np.fromiter(map(code.__getitem__, kinds), np.int64, len(kinds)) * stages + stage)[ok]
    order = np.argsort(group, kind="stable")
    ids, heads, counts = np.unique(group[order], return_index=True, return_counts=True)
    values = values[ok][order]
    mean = {g: math.fsum(values[h:h + n].tolist()) / n for g, h, n in zip(ids.tolist(), heads.tolist(),
                                                                         counts.tolist())}
    # a set built as the per-event version builds it: its order is the dict's (and the record's)
    return {k: [mean.get(code[k] * stages + s, 0.0) for s in range(stages)] for k in {k for k in code}}


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


def measured_cost_model(plan: Plan, costs: dict[str, list[float]], trace: Trace) -> CostModel:
    """The run's own measured mean op costs per stage and kind and, with dp > 1 or tp > 1,
    each stage's mean measured gradient sync (dp_sync plus tp_sync, after its last backward);
    its messages priced as the plan prices them."""
    stages = len(plan.stage_layers)
    modeled = plan.sim_cost()
    sync: tuple[float, ...] = ()
    if plan.config.dp > 1 or plan.config.tp > 1:
        acc: dict[tuple[str, int], list[float]] = defaultdict(list)
        for e in trace:
            if e.kind in ("dp_sync", "tp_sync"):
                acc[(e.kind, e.stage)].append(e.dur)
        sync = tuple(sum((statistics.fmean(acc[(k, s)]) for k in ("dp_sync", "tp_sync") if acc[(k, s)]), 0.0)
                     for s in range(stages))
    return CostModel(fwd_s=tuple(costs.get("F", [0.0] * stages)), bwd_s=tuple(costs.get("B", [0.0] * stages)),
                     input_grad_s=tuple(costs["I"]) if "I" in costs else None,
                     weight_grad_s=tuple(costs["W"]) if "W" in costs else None,
                     p2p_latency_s=modeled.p2p_latency_s, p2p_bandwidth_Bps=modeled.p2p_bandwidth_Bps,
                     message_bytes=modeled.message_bytes, fwd_hop_s=modeled.fwd_hop_s, bwd_hop_s=modeled.bwd_hop_s,
                     sync_s=sync)


def simulated_bubble(plan: Plan, cost: CostModel) -> float:
    """The bubble of this plan's schedule, simulated on `cost`, measured as the runs are."""
    return engine.bubble(plan.compiled, cost, plan.timing(cost))


def with_tp(cost: CostModel, tp: dict[str, list[float]]) -> CostModel:
    """`cost` with each action's measured TP collectives (mean_costs(tp=True)) added to it."""
    def plus(base: tuple[float, ...] | None, kind: str) -> tuple[float, ...] | None:
        extra = tp.get(kind)
        return base if base is None or extra is None else tuple(b + x for b, x in zip(base, extra))

    return replace(cost, fwd_s=plus(cost.fwd_s, "F"), bwd_s=plus(cost.bwd_s, "B"),
                   input_grad_s=plus(cost.igrad if "I" in tp else cost.input_grad_s, "I"),
                   weight_grad_s=plus(cost.wgrad if "W" in tp else cost.weight_grad_s, "W"))


def bubbles_less_tp(plan: Plan, cost: CostModel, tp: dict[str, list[float]]) -> tuple[float, float]:
    """(bubble, steady bubble) simulated on `cost` (with_tp's: actions that hold their TP
    collectives), each rank's compute counted without them, as the trace's is measured
    (engine.bubble and engine.steady_bubble, their busy time less the TP seconds)."""
    c = plan.compiled
    per = engine.spans(c, cost, plan.timing(cost))
    codes = {engine.F: "F", engine.B: "B", engine.I: "I", engine.W: "W"}
    comm = [sum(n * tp[codes[k]][s] for (k, s), n in counts.items() if codes[k] in tp) for counts in c.kind_counts]
    ran = [x for x, rows in zip(per, c.by_rank) if rows]
    window = max(x[1] for x in ran) - min(x[0] for x in ran) if ran else 0.0
    period = max((t1 - t0 for t0, t1, _ in per), default=0.0)
    bubble = sum(1.0 - (x[2] - m) / window for x, m in zip(per, comm)) / len(per) if window > 0 else 0.0
    steady = sum(1.0 - (x[2] - m) / period for x, m in zip(per, comm)) / len(per) if period > 0 else 0.0
    return bubble, steady


def theory_costs(plan: Plan, costs: dict[str, list[float]]) -> tuple[float, float]:
    """(B / F, W / B) for the theory: the modeled costs where the run held actions to them
    (compute=emulated, or a simulated executor), else the measured ones, averaged over stages."""
    if plan.config.compute == "emulated" or plan.simulated:
        m = plan.emulated_cost
        f, b, w = sum(m.fwd_s), sum(m.bwd_s), sum(m.weight_grad_s or (x / 2 for x in m.bwd_s))
    else:
        f = sum(costs.get("F", [0.0]))
        b = sum(costs["B"]) if "B" in costs else sum(costs.get("I", [0.0])) + sum(costs.get("W", [0.0]))
        w = sum(costs["W"]) if "W" in costs else b / 2
    if f <= 0 or b <= 0:
        return 2.0, 0.5  # nothing to go by (an empty stage): the default shape
    return b / f, min(1.0, w / b)


def bubble_theory(plan: Plan, costs: dict[str, list[float]]) -> tuple[theory.Theory | None, dict]:
    """The schedule's bubble on equal stages and free communication, in the run's costs
    (harness/planning/theory.py: a closed form, or the simulator's ideal, labelled); a CSV schedule
    gets its built-in's when it is one. None where the schedule has no theory."""
    c = plan.config
    bwd_over_fwd, share = theory_costs(plan, costs)
    used = {"bwd_over_fwd": bwd_over_fwd, "weight_grad_share": share}
    try:
        if spec(c.schedule.name).build is None:  # a schedule as data: a built-in's theory, or the simulated ideal
            return theory.bubble_of_schedule(plan.schedule, c.microbatches, bwd_over_fwd, share, plan.compiled), used
        return theory.bubble(c.schedule.name, c.pp, c.microbatches, c.virtual_stages, bwd_over_fwd, share,
                             plan.compiled), used
    except (KeyError, ValueError):
        return None, used


def attribution(measured: float, schedule: float, no_comm: float, with_comm: float) -> Attribution:
    """The measured bubble split into what explains it, each part the step from one model to
    the next: the schedule (theory on equal stages), imbalance (the simulator on the run's
    measured per-stage costs without communication), communication (the same with the
    measured hop) and overhead (measured minus that simulation: the runtime, jitter). The
    parts sum to the measured bubble exactly. Where a model comes out below the one before
    it (noise on equal stages), its part is zero and the difference passes to the next."""
    no_comm = max(schedule, no_comm)
    with_comm = max(no_comm, with_comm)
    return Attribution(schedule=schedule, imbalance=no_comm - schedule, communication=with_comm - no_comm,
                       overhead=measured - with_comm)


def quartiles(values: list[float]) -> list[float]:
    """[25th, 75th] percentile: the interquartile range of a run's measured steps."""
    if len(values) < 2:
        return [values[0], values[0]] if values else []
    q = statistics.quantiles(values, n=4, method="inclusive")
    return [q[0], q[2]]


def grad_check(pipeline: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> GradCheck:
    """Largest relative difference, over parameters, between the pipeline's accumulated
    gradient and the single-process full-batch one: max |g - r| / max |r|."""
    if set(pipeline) != set(reference):
        raise ValueError(f"parameters differ: {sorted(set(pipeline) ^ set(reference))[:5]}")
    worst, where = 0.0, None
    for name, r in reference.items():
        d = float((pipeline[name] - r).abs().max() / r.abs().max().clamp_min(1e-30))
        if not math.isfinite(d):  # a NaN compares false with everything: it must not hide
            d = math.inf
        if d >= worst:
            worst, where = d, name
    return GradCheck(max_rel_diff=worst, worst_param=where, params=len(reference))


# verify_grads: the largest relative difference from one process a job may show, per dtype (its
# rounding; tests/test_precision_optimizer.py holds runs to a fifth of it)
GRAD_TOLERANCE = {"fp32": 1e-4, "bf16": 1e-1, "fp16": 1e-2}


def verdict(c: Config, m: Metrics) -> tuple[str, str | None]:
    """(status, error) of a job that ran: `diverged` where a loss is not finite (its timings
    stand), `failed` where verify_grads found the gradients off by more than the dtype's
    tolerance, else `ok`."""
    bad = [i for i, x in enumerate(m.losses or []) if x is None or not math.isfinite(x)]
    if bad:
        return "diverged", (f"the loss is not finite from step {bad[0]} (lr={c.lr:g}, dtype={c.dtype}); "
                            "its timings are measured, its losses null from there")
    if m.grad_check is not None:
        m.grad_check.tolerance = tol = GRAD_TOLERANCE[c.dtype]
        if not m.grad_check.max_rel_diff <= tol:
            return "failed", (f"verify_grads: the accumulated gradients differ from one process's by "
                              f"{m.grad_check.max_rel_diff:.3g} (relative, in {m.grad_check.worst_param}), beyond "
                              f"{c.dtype}'s tolerance {tol:g}")
    return "ok", None


def dp_sync(plan: Plan, trace: Trace, steps: list[int]) -> float | None:
    """Median over steps of the longest per-rank total of gradient-sync tails (dp_sync
    events: from the last bucket's all-reduce launch to the end of the backward)."""
    if plan.config.dp == 1:
        return None
    return _sync_s(trace, steps, "dp_sync")


def _sync_s(trace: Trace, steps: list[int], kind: str, cat: str | None = None) -> float:
    """Median over steps of the longest per-rank total of `kind` events (cat given: of the
    events of that category)."""
    per_step = []
    for s in steps:
        totals: dict[int, float] = defaultdict(float)
        for e in trace:
            if e.step == s and (e.cat == cat if cat else e.kind == kind):
                totals[e.rank] += e.dur
        per_step.append(max(totals.values(), default=0.0))
    return statistics.median(per_step)


def memory_per_rank(plan: Plan, run: Execution) -> dict:
    """Every byte of every global rank, measured (what its runner accounted) beside theory,
    and whether each fits memory_budget_gib."""
    theory_bytes = [r.as_dict() for r in plan.theory_per_rank()]  # tp > 1: TP rank 0's, as measured
    measured = [r.memory_breakdown for r in run.reports] if run.reports else None
    cuda = [r.cuda_memory for r in run.reports] if run.reports and all(r.cuda_memory for r in run.reports) else None
    budget = None
    if plan.config.memory_budget_gib is not None:
        limit = int(plan.config.memory_budget_gib * 2**30)
        use_measured = measured is not None and all(m and m.get("peak") is not None for m in measured)
        peaks = [m["peak"] for m in measured] if use_measured else [t["peak"] for t in theory_bytes]
        budget = Budget(limit, "measured" if use_measured else "theory", [p <= limit for p in peaks],
                        [limit - p for p in peaks])
    return {"measured_per_rank": measured, "theory_per_rank": theory_bytes, "cuda_per_rank": cuda, "budget": budget}


def over_budget(plan: Plan) -> str | None:
    """Why theory says this plan cannot fit memory_budget_gib (the fullest rank), or None."""
    if plan.config.memory_budget_gib is None:
        return None
    limit = plan.config.memory_budget_gib * 2**30
    ranks = plan.theory_per_rank()
    worst = max(range(len(ranks)), key=lambda g: ranks[g].peak)
    r = ranks[worst]
    if r.peak <= limit:
        return None
    gib = lambda b: f"{b / 2**30:.3g} GiB"  # noqa: E731
    return (f"memory_budget_gib={plan.config.memory_budget_gib}: theory puts rank {worst} at {gib(r.peak)} "
            f"(params {gib(r.params)}, grads {gib(r.grads)}, optimizer {gib(r.optimizer)}, activations "
            f"{gib(r.activations)} at peak)")


def _inflight(plan: Plan, rank: int) -> int:
    """The schedule's peak in-flight (stage, microbatch) count on a rank, replayed from its
    actions (each built-in's closed form equals it: tests/test_schedules.py)."""
    return max(sum(h) for h in plan.replays[rank].helds)


def compute_metrics(plan: Plan, run: Execution, device_name: str | None = None,
                    columns: Columns | None = None) -> Metrics:
    """The run's figures; `columns`: run.trace as Columns, where the caller has them."""
    c = plan.config
    trace = run.trace
    cols = Columns.of(trace) if columns is None else columns
    step = np.array(cols.step, dtype=np.int64)
    measured_steps = [s for s in sorted(set(cols.step)) if s >= c.warmup_steps]
    repeats = run.step_repeats  # executor=sim: one measured step stands for every identical one
    steps = [cols.take(step == s) for s in measured_steps]
    times = [step_time(t) for t in steps] * repeats
    measured = step >= c.warmup_steps
    measured_trace = trace if measured.all() else list(compress(trace, measured.tolist()))
    measured_cols = cols.take(measured)
    st = statistics.median(times)
    costs = mean_costs(measured_cols, len(plan.stage_layers))
    # measured compute per microbatch of each stage: F + B (or F + I + W)
    stage_times = [sum(v[s] for v in costs.values()) for s in range(len(plan.stage_layers))]
    sync = dp_sync(plan, measured_trace, measured_steps)
    # tp > 1: the TP collectives inside the actions (None where none were traced: executor=sim)
    tp_comm = _sync_s(measured_trace, measured_steps, "", TP) if c.tp > 1 and any(
        e.cat == TP for e in measured_trace) else None
    samples = c.microbatches * c.microbatch_size * c.dp
    bubble, hop = _bubble(plan, run, steps, repeats, costs, measured_trace, measured_cols)
    seq = getattr(c.model, "seq", None)
    t_lo, t_hi, coverage = median_interval(times)
    simulated = repeats > 1 or plan.simulated  # every step alike: the interval is a point, held exactly
    intervals = Intervals(
        level=1.0 if simulated else coverage, method=SIMULATED if simulated else ORDER_STATISTICS,
        steps=len(times), step_time_s=[t_lo, t_hi],
        bubble=list(median_interval(bubble.measured_per_step)[:2]), throughput_samples_s=[samples / t_hi, samples / t_lo])
    return Metrics(
        intervals=intervals,
        step_time_s=st,
        step_times_s=times,
        step_time_iqr_s=quartiles(times),
        model_step_s=plan.modeled_step_s(),
        flops=flops_of(plan, st, device_name),
        throughput_samples_s=samples / st,
        # token models: tokens per second too (samples x seq), the figure LM people compare
        throughput_tokens_s=samples * seq / st if seq else None,
        losses=run.losses,
        bubble=bubble,
        dp_sync_s=sync,
        dp_sync_share=None if sync is None else sync / st,
        dp_sync_theory_s=dp_sync_theory_s(plan.sim_cost(), plan.compiled.owner, c.pp),
        memory=_memory(plan, run),
        recompute_s=sum(measured_cols.dur[np.fromiter(map(eq, measured_cols.kind, repeat("R")), bool,
                                                      len(measured_cols))].tolist()) / len(measured_steps),
        p2p_hop_s=hop,
        stage_time_s=stage_times,
        measured_imbalance=max(stage_times) / statistics.fmean(stage_times) if any(stage_times) else None,
        mean_op_s={k: v for k, v in costs.items() if k in {x.value for x in Kind}},
        **clock_record(run, measured_trace),
        tp_sync_s=_sync_s(measured_trace, measured_steps, "tp_sync") if c.tp > 1 else None,
        tp_comm_s=tp_comm,
        tp_comm_share=None if tp_comm is None else tp_comm / st,
    )


def _bubble(plan: Plan, run: Execution, steps: list[Columns], repeats: int, costs: dict[str, list[float]],
            measured_trace: Trace, measured_cols: Columns) -> tuple[Bubble, float | None]:
    """The bubble measured (each measured step's events: `steps`), simulated on the measured
    costs, in theory, and why (attribution); and the measured hop (None: none measured)."""
    pp = plan.config.pp
    per_step = [bubble_per_rank(t, run.ranks, pp) for t in steps] * repeats
    per_global = [statistics.fmean(b[r] for b in per_step) for r in range(run.ranks)]
    # global rank = replica * pp + pipeline rank: average each pipeline rank over replicas
    per_rank = [statistics.fmean(per_global[p::pp]) for p in range(pp)]
    step_bubbles = [statistics.fmean(b) for b in per_step]
    steady = statistics.fmean(statistics.fmean(steady_per_rank(t, run.ranks, pp)) for t in steps)
    measured = statistics.fmean(per_rank)
    if plan.simulated:  # the simulation is the measurement: its own cost model, no hop measured
        hop, own = None, plan.sim_cost()
        with_comm = own
    else:
        hop, own = hop_latency(measured_trace), measured_cost_model(plan, costs, measured_trace)
        # with the measured hop, or, with none measured, the hops as the plan prices them
        with_comm = own if hop is None else replace(own, p2p_latency_s=hop, p2p_bandwidth_Bps=float("inf"),
                                                    fwd_hop_s=None, bwd_hop_s=None)
    no_comm = simulated_bubble(plan, own.without_comm())
    # tp > 1: the TP collectives measured inside each action join the simulation with communication
    tp = {} if plan.simulated else mean_costs(measured_cols, len(plan.stage_layers), tp=True)
    if tp:
        with_comm = with_tp(with_comm, tp)
        simulated, steady_simulated = bubbles_less_tp(plan, with_comm, tp)
    else:
        simulated = simulated_bubble(plan, with_comm)
        steady_simulated = engine.steady_bubble(plan.compiled, with_comm, plan.timing(with_comm))
    ideal, ideal_costs = bubble_theory(plan, costs)
    return Bubble(
        theory=None if ideal is None else ideal.value,
        theory_source=None if ideal is None else ideal.source,
        theory_costs=ideal_costs,
        simulated=simulated,
        measured=measured,
        measured_per_rank=per_rank,
        measured_per_step=step_bubbles,
        measured_step_iqr=quartiles(step_bubbles),
        measured_per_global_rank=per_global,
        attribution=None if ideal is None else attribution(measured, ideal.value, no_comm, simulated),
        steady_measured=steady,
        steady_simulated=steady_simulated,
    ), hop


def _memory(plan: Plan, run: Execution) -> Memory:
    """Activations as replica 0's ranks metered them (None where the executor cannot), theory's
    in-flight microbatches, CUDA's peaks, and every byte of every rank (memory_per_rank)."""
    replica0 = run.reports[:plan.config.pp]
    metered = bool(replica0) and all(r.peak_activation_bytes is not None for r in replica0)
    cuda = [r.cuda_max_memory_allocated for r in replica0]
    return Memory(
        peak_activation_bytes_per_rank=[r.peak_activation_bytes for r in replica0] if metered else None,
        # in (stage, microbatch) units: for chunked schedules one chunk's activations
        theory_peak_microbatches_per_rank=[_inflight(plan, r) for r in range(plan.config.pp)],
        activation_bytes_per_microbatch_per_rank=[r.activation_bytes_per_microbatch for r in replica0]
        if metered else None,
        cuda_max_memory_allocated_per_rank=cuda if cuda and None not in cuda else None,
        **memory_per_rank(plan, run),
    )
