"""The search: every point of schedule x pp x tp x dp x M (B from the global batch) x v x
checkpointing x ZeRO x placement, each a harness Config, its predicted step time and memory per
GPU, what fits, ranked. tp runs over the degrees the model allows within a node, sequence
parallelism on (`tensor_degrees`, Space.sequence_parallel); with a profile, a point at tp > 1
is priced on its TP rank's profile (Problem.tp_profiles, the CLI's --tp-profiles). Points whose
weights alone cannot fit are left out before they are planned (`weight_bound`).

A point is the problem's config (executor=sim, the cluster, the model, dtype, optimizer,
profile) with the point's keys set. Whether the harness can run it is the harness's own
validation (harness/planning/checks.py: a schedule's requirements, more stages than layers, split
backwards with dp > 1, ZeRO-1 without replicas, too many actions...); what it predicts is
`python -m harness executor=sim cluster=<preset>` on that config: the plan (harness/planning/plan.py),
priced by harness/simulate/pricing.py, timed by the one simulator (harness/simulate/engine.py),
its memory by harness/planning/memory_theory.py. So a printed point's overrides, run with executor=sim,
reproduce its prediction exactly (tests/test_advise.py).

Two choices of the search's own, not of validity: at pp=1 only 1f1b (one stage has nothing to
overlap: every schedule takes its time, with at least its memory), and placements that put
every message and every all-reduce on the same links are one point (pp_inner kept).

A schedule made from each point's costs (its registry entry's needs=COSTS: schedule=zb_auto,
harness/schedules/auto.py, a zero-bubble order generated in planning for the point's own priced
costs, each rank holding at most `schedule.memory_limit` x pp microbatches' activations) is
searched beside the built-ins. Its decisions (the README's planner section), asked of its entry,
never its name:
- An entry with a memory limit (its `limit_key`: zb_auto's memory_limit) is searched at two limits
  per point (Space.memory_limits None), in steps of 1/pp (L microbatches per rank, limit L / pp):
  1.0, the zero-bubble paper's ZB-1p (1F1B's pp on its first rank), and the largest L the memory
  budget allows, at most min(M, 2 pp) (M: no rank holds more; 2 pp: the paper's ZB-2p, past which
  it finds nothing to gain). That L comes from the memory theory alone (`holding`: each rank's
  parameters, gradients, optimizer state and ZeRO shard, L of its stage's microbatches held whole
  or deferred between I and W, a checkpointed backward's recompute; `budget_limit`: a few
  evaluations, never an order generated per L). Every order the generator makes holds at most L,
  so the point fits whatever order it picks; at L + 1 a rank could pass the budget
  (tests/test_advise.py). Limits that hold as many microbatches (min(L, M)) are one point (1.0
  kept); where 1.0 holds more than the budget allows, or not one microbatch fits, the schedule is
  left out there with that reason. The limit is L / pp exactly, printed as Python writes the
  float (0.5625, 1.3333333333333333), read back as L. `--memory-limits 1 2`
  (Space.memory_limits) tries exactly the limits given, over budget or not.
- Only where it can rank in the top k (Space.auto_top, the CLI's --top): making an order costs up
  to seconds a point (the entry's plan_cost), so these points are predicted after the others and
  made only where `auto_bound`, a lower bound of their step from the priced costs alone, beats the
  k-th fastest fitting point of the others; the rest are left out with that reason. No order
  within the limit could enter the top k there, so the top k are what making every point would
  give.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from harness.advise.errors import MEMORY_LIMITS_ALLOWED, AdviseError  # noqa: F401 - also imported from here
from harness.planning.checks import check_stages, validate
from harness.config import DTYPE_BYTES, PLACEMENTS, Config, ConfigError, planned_microbatch_size, set_keys
from harness.parallel.checks import tp_problem
from harness.planning.flops import flops_of
from harness.planning.memory_theory import (Layout, RankBytes, Replay, fullest, layer_memory, optimizer_bytes,
                                           replay)
from harness.model.built import BuiltModel
from harness.planning.plan import Plan, emulated_costs, host_cores, make_partition, make_plan
from harness.planning.point import Point
from harness.records.result import Flops
from harness.schedules.ir import Action, Kind
from harness.schedules.registry import COSTS, SCHEDULES, searchable
from harness.simulate import engine, links
from harness.simulate.cost import CostModel
from harness.simulate.pricing import message_bytes_of, plan_tp_collectives, price

GIB = 2**30


def limit_text(x: float) -> str:
    """A memory limit as the commands print it: the shortest text Python reads back as the same
    float (1, 1.5, 0.375, 1.3333333333333333: L / pp exactly, so the harness reads L)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclass
class Prediction:
    point: Point
    step_time_s: float
    throughput_samples_s: float
    memory: RankBytes  # the fullest GPU's
    memory_rank: int  # its pipeline rank
    fits: bool
    pipeline_s: float  # the last rank's end of its pipeline actions (all-reduces inside)
    allreduce_s: float  # the largest stage all-reduce
    optimizer_s: float  # the largest rank's optimizer step (+ ZeRO-1 all-gather)
    bubble: float  # mean over ranks of 1 - compute / the step window (as a run measures it)
    cross_node_boundaries: int  # stage boundaries whose messages cross nodes (worst replica)
    layers_per_stage: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()  # what its plan says the user should know (the profile's expansion...)
    flops: Flops | None = None  # TFLOP/s per GPU, MFU, HFU at the predicted step
    rank: int | None = None
    pareto: bool = False

    def as_dict(self, tokens_per_sample: int | None = None) -> dict:
        d = {"overrides": self.point.overrides(), "label": self.point.label(), "rank": self.rank,
             "step_time_s": self.step_time_s, "throughput_samples_s": self.throughput_samples_s,
             "peak_bytes_per_gpu": self.memory.peak, "peak_gib_per_gpu": self.memory.peak / GIB, "fits": self.fits,
             "memory_limit": self.point.memory_limit,
             "pareto": self.pareto, "memory": {**self.memory.as_dict(), "rank": self.memory_rank},
             "pipeline_s": self.pipeline_s, "allreduce_s": self.allreduce_s, "optimizer_s": self.optimizer_s,
             "bubble": self.bubble, "cross_node_boundaries": self.cross_node_boundaries,
             "layers_per_stage": list(self.layers_per_stage)}
        u = self.flops
        if u is not None:
            d |= {"tflops_per_device": u.tflops_per_device, "mfu": u.mfu, "hfu": u.hfu}
        if tokens_per_sample:
            d["throughput_tokens_s"] = self.throughput_samples_s * tokens_per_sample
        return d


def predict(c: Config, model: BuiltModel | None = None) -> Prediction:
    """What `python -m harness executor=sim` predicts for `c` (its cluster's links, or comm.*):
    the plan's modeled step (the one simulator on the priced costs) and the fullest GPU's bytes
    (the memory theory). ConfigError (one line) if the harness cannot run `c`."""
    c = replace(c, executor="sim")
    plan = make_plan(c, 0, model)
    return _prediction(plan)


def _prediction(plan: Plan) -> Prediction:
    c = plan.config
    cost = plan.sim_cost()
    end = plan.timing(cost)
    step = engine.step_time(plan.compiled, cost, end)
    mem, where = fullest(plan.memory(), c, Layout(plan.stage_layers, plan.replays))
    usable = c.cluster.usable_bytes if c.cluster is not None else math.inf
    samples = c.dp * c.microbatches * c.microbatch_size
    return Prediction(Point.of(c), step, samples / step, mem, where, mem.peak <= usable,
                      max(engine.rank_ends(plan.compiled, cost, end)), max(cost.sync_s, default=0.0),
                      max(cost.optimizer_s, default=0.0), engine.bubble(plan.compiled, cost, end),
                      _crossings(plan), tuple(b - a for a, b in plan.stage_layers), plan.notes,
                      flops_of(plan, step))


def _crossings(plan: Plan) -> int:
    c, owner = plan.config, plan.compiled.owner
    if c.cluster is None:
        return 0
    nodes = [_nodes(c.cluster, c.placement, r, c.pp, c.dp, c.tp) for r in range(c.pp)]
    return sum(nodes[owner[s]] != nodes[owner[s + 1]] for s in range(len(owner) - 1) if owner[s] != owner[s + 1])


@dataclass(frozen=True)
class Space:
    schedules: tuple[str, ...] = ()  # () : every schedule made from counts or costs (registry.searchable)
    pp: tuple[int, ...] | None = None  # None: every divisor of the GPUs
    dp: tuple[int, ...] | None = None  # None: gpus / pp
    microbatch_sizes: tuple[int, ...] | None = None  # None: every divisor of global_batch / dp
    virtual_stages: tuple[int, ...] = (2, 4)
    checkpointing: tuple[bool, ...] = (False, True)
    zero: tuple[int, ...] = (0, 1)
    placements: tuple[str, ...] = PLACEMENTS
    gpus: int | None = None  # GPUs a point uses (pp x tp x dp); None: the whole cluster
    tp: tuple[int, ...] | None = None  # None: every degree the model allows, up to a node's GPUs (tp_across_nodes)
    tp_across_nodes: bool = False  # let a TP group span nodes (tp > gpus_per_node); by default it stays in one
    sequence_parallel: tuple[bool, ...] = (True,)  # at tp > 1 (tp=1 runs none): on, as Megatron and torchtitan
    max_microbatches: int = 1024
    max_microbatch_size: int = 64
    # of the schedules that take one (their entry's limit_key); None: 1.0 and the budget's largest (module doc)
    memory_limits: tuple[float, ...] | None = None
    auto_top: int = 5  # orders made from costs only where they could rank in this top (`search`; the CLI: --top)
    prune: bool = True  # leave out, unpriced, points whose weights alone cannot fit (`weight_bound`)


@dataclass
class Problem:
    config: Config  # every point's base: executor=sim, the cluster, the model, dtype, optimizer, profile, compute
    model: BuiltModel  # built once, for every point
    global_batch: int
    overrides: list[str]  # what the printed commands say besides the point's keys (python -m harness keys)
    cluster_keys: list[str]  # cluster=<preset> and cluster.* as given: what prices a point (executor=sim)
    notes: list[str] = field(default_factory=list)
    # (tp, sequence_parallel) -> the profile of one TP rank there (--tp-profiles); the config's own is tp=1's
    tp_profiles: dict[tuple[int, bool], str] = field(default_factory=dict)

    def profile_at(self, tp: int, sequence_parallel: bool) -> str | None:
        """The profile a point at (tp, sequence_parallel) is priced on: the config's at tp=1, else the
        --tp-profiles one; None where there is none (no profile: cost.* stands for a TP rank's)."""
        if tp == 1 or not self.config.profile:
            return self.config.profile
        return self.tp_profiles.get((tp, sequence_parallel))

    def config_of(self, pt: Point) -> Config:
        """The point's harness Config: the base's keys, its own, and the profile of its TP rank."""
        c = pt.config(self.config)
        profile = self.profile_at(pt.tp, pt.sequence_parallel)
        return c if profile == c.profile else replace(c, profile=profile)

    @property
    def cluster(self):
        assert self.config.cluster is not None
        return self.config.cluster

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def tokens_per_sample(self) -> int | None:
        return getattr(self.config.model, "seq", None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _reason(message: str) -> str:
    """A refusal's kind: its line with the numbers left out (`microbatches=N: dualpipev needs...`)."""
    return re.sub(r"\b\d+\b", "N", message.split(" (")[0])


def _degrees(p: Problem, space: Space) -> tuple[tuple[str, ...], list[tuple[int, int, int]]]:
    """The space's schedules and its (pp, tp, dp) triples, each flag checked against the cluster
    and the global batch: a bad flag is one AdviseError naming it, before any point is made."""
    cl = p.cluster
    gpus = space.gpus or cl.gpus
    if gpus < 1:
        raise AdviseError(f"--gpus {gpus}: must be >= 1")
    if gpus > cl.gpus:
        raise AdviseError(f"--gpus {gpus}: the cluster has {cl.gpus} ({cl.nodes} x {cl.gpus_per_node})")
    schedules = space.schedules or searchable()
    for name in schedules:
        if name not in searchable():
            raise AdviseError(f"--schedules {name}: unknown (allowed: {', '.join(searchable())})")
    for x in space.memory_limits or ():
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise AdviseError(f"--memory-limits {x!r}: {MEMORY_LIMITS_ALLOWED}")
    for pl in space.placements:
        if pl not in PLACEMENTS:
            raise AdviseError(f"--placements {pl}: unknown (allowed: {', '.join(PLACEMENTS)})")
    tps = tensor_degrees(p, space, gpus)
    pps = space.pp or tuple(_divisors(gpus))
    triples = [(pp, tp, gpus // (pp * tp)) for pp in pps for tp in tps if pp >= 1 and gpus % (pp * tp) == 0]
    if space.dp:
        triples = [(pp, tp, dp) for pp in pps for tp in tps for dp in space.dp
                   if pp >= 1 and dp >= 1 and pp * tp * dp <= gpus]
    if not triples:
        raise AdviseError(f"--pp {list(pps)}: none divides the {gpus} GPUs at tp in {list(tps)} (pp x tp x dp must "
                          f"use them all; allowed pp: {_divisors(gpus)})")
    gb = p.global_batch
    if not any(gb % dp == 0 for _, _, dp in triples):
        raise AdviseError(f"--global-batch {gb}: no data-parallel degree here divides it (dp in "
                          f"{sorted({dp for _, _, dp in triples})}; allowed: a multiple of one of them)")
    return tuple(schedules), triples


def enumerate_points(p: Problem, space: Space) -> tuple[list[Point], dict[str, int], dict[str, str], list[Point]]:
    """Every point of the space the harness can run (its own validation), how many were left
    out for each reason (with one example each), and those left out because their weights
    alone cannot fit (`weight_bound`, with space.prune), smallest bound first."""
    schedules, triples = _degrees(p, space)
    cl, gb = p.cluster, p.global_batch
    dropped: dict[str, int] = {}
    example: dict[str, str] = {}

    def drop(why: str, what: str) -> None:
        dropped[why] = dropped.get(why, 0) + 1
        example.setdefault(why, what)

    points: list[Point] = []
    heavy: list[tuple[int, Point]] = []
    signatures = {(pl, pp, tp, dp): _placement_signature(cl, pl, pp, dp, tp)
                  for pp, tp, dp in triples for pl in space.placements}
    for pp, tp, dp in triples:
        if gb % dp:
            drop("global batch not divisible by dp", f"global_batch={gb}, dp={dp}")
            continue
        per_replica = gb // dp
        sizes = space.microbatch_sizes or tuple(b for b in _divisors(per_replica) if b <= space.max_microbatch_size)
        for b in sizes:
            if b < 1 or per_replica % b:
                drop("B does not divide global_batch / dp", f"B={b}, global_batch / dp = {per_replica}")
                continue
            m = per_replica // b
            if m > space.max_microbatches:
                drop(f"M > --max-microbatches {space.max_microbatches}", f"pp={pp} dp={dp} B={b}: M={m}")
                continue
            for name in schedules:
                entry = SCHEDULES[name]
                for v in space.virtual_stages if entry.reads_virtual_stages else (1,):
                    if pp == 1 and name != "1f1b" and "1f1b" in schedules:
                        drop("pp=1: the same step as 1f1b's, with at least its memory", f"{name} pp=1 dp={dp}")
                        continue
                    seen: set = set()
                    for pl, ck, z, sp in itertools.product(space.placements, space.checkpointing, space.zero,
                                                           space.sequence_parallel if tp > 1 else (False,)):
                        sig = signatures[(pl, pp, tp, dp)]
                        if (sig, ck, z, sp) in seen:
                            continue
                        seen.add((sig, ck, z, sp))
                        pt = Point(name, pp, m, v, dp, b, ck, z, pl, 1.0 if entry.limit_key else None, tp, sp)
                        points += _admit(p, space, pt, drop, heavy)
    return points, dropped, example, [pt for _, pt in sorted(heavy)]


def _admit(p: Problem, space: Space, pt: Point, drop: Callable[[str, str], None],
           heavy: list[tuple[int, Point]]) -> list[Point]:
    """The runnable points `pt` stands for: none when the harness's validation refuses it (a
    reason dropped) or its weights alone exceed the usable memory (with space.prune: added to
    `heavy` with that bound); a memory-limited schedule's, one per limit (`_limited`)."""
    entry = SCHEDULES[pt.schedule]
    if p.config.profile and p.profile_at(pt.tp, pt.sequence_parallel) is None:
        drop(NO_TP_PROFILE, f"{pt.label()}: no --tp-profiles file at tp={pt.tp}"
                            f"{' with sequence_parallel' if pt.sequence_parallel else ''}")
        return []
    try:
        c = p.config_of(pt)
        validate(c, 0, p.model)
        if entry.needs == COSTS:  # its stages, which the plan checks once it is made
            check_stages(c, pt.pp * entry.chunks(pt.virtual_stages), p.num_layers)
    except ConfigError as e:
        drop(_reason(str(e)), f"{pt.label()}: {e}")
        return []
    usable = p.cluster.usable_bytes
    if space.prune and (bound := weight_bound(p, c)) > usable:
        heavy.append((bound, pt))
        drop(WEIGHTS_DO_NOT_FIT, f"{pt.label()}: at least {bound / GIB:.1f} GiB, {usable / GIB:.1f} GiB usable")
        return []
    return _limited(p, space, pt, drop) if entry.limit_key else [pt]


NO_TP_PROFILE = ("tp > 1: the profile times a tp=1 rank; no --tp-profiles profile of this TP degree's rank "
                 "(python -m harness.advise.derive --tp N --sequence-parallel writes a derived one)")
WEIGHTS_DO_NOT_FIT = ("its parameters, gradients and optimizer state alone exceed the usable memory (a lower bound "
                      "of the memory theory's, not priced)")


def weight_bound(p: Problem, c: Config) -> int:
    """A lower bound of the fullest GPU's peak at `c` from the parameters alone, no partition,
    trace or replay: some pipeline rank holds at least the mean share of the parameters, and
    each of its TP ranks at least a tp-th of that (a split weight's shard; replicated ones are
    whole), P = params // (pp x tp); at its last backward its parameters, their gradients
    (dtype) and the optimizer state (fp32 masters in low precision; ZeRO-1's largest shard at
    least a dp-th of the moments) are all held (harness/planning/memory_theory.py's rank_bytes,
    activations counted as 0). A point past the usable bytes cannot fit whatever its schedule
    or activations, so the search leaves it out unpriced (tests/test_advise.py holds the bound
    under the theory's peak)."""
    per = (p.model.total_params or 0) // (c.pp * c.tp)
    shard = -(-per // c.dp) if c.zero and c.dp > 1 else per
    return 2 * DTYPE_BYTES[c.dtype] * per + optimizer_bytes([shard], [per], c)


def holding(p: Problem, c: Config, held: int) -> RankBytes:
    """The fullest GPU of a schedule with a memory limit (zb_auto) at `c` when a rank may hold `held`
    microbatches (from F to W): the memory theory's bytes (harness/planning/memory_theory.py:
    parameters, gradients live, optimizer state and ZeRO shard, a checkpointed backward's
    recompute) of the most any order within that count can hold on one stage per rank: `held` whole, or any mix of whole and deferred ones (between I and
    W, what the deferred W keeps). No order is generated."""
    if c.global_batch is not None:
        c = replace(c, microbatch_size=planned_microbatch_size(c))
    return _holding(p, c, tuple(make_partition(c, p.model, c.pp).bounds), held)


def _holding(p: Problem, c: Config, bounds: tuple, held: int) -> RankBytes:
    mem = layer_memory(p.model, c.dtype, p.cluster.device)
    one = _holding_replay(held)
    return fullest(mem, c, Layout(bounds, tuple(replace(one, stages=(r,)) for r in range(c.pp))))[0]


@functools.lru_cache(maxsize=512)
def _holding_replay(held: int) -> Replay:
    """A rank that makes its gradients (F, I, W of one microbatch), takes `held` (F...), turns
    them one by one from whole to deferred (I...: each with its recompute) and frees them (W...):
    its replay passes through every extreme of the region (whole + deferred <= held), so its peak,
    priced by the memory theory, is the most any order within the count holds (replayed once per
    count, on stage 0; a rank's is the same on its own stage)."""
    F, I, W = Kind.F, Kind.I, Kind.W  # noqa: E741
    return replay([Action(0, k, 0) for k in (F, I, W)]
                  + [Action(0, k, i) for k in (F, I, W) for i in range(1, held + 1)])


def budget_limit(p: Problem, c: Config, cap: int) -> int:
    """The most microbatches per rank (<= cap) whose `holding` fits the cluster's usable bytes per
    GPU; 0 if not one does. `holding` is convex in the count (the largest of linear parts), so the
    line through the counts 1 and 2 reaches the budget at or after the answer: checked there,
    bisected below it where it does not fit."""
    return _budget(p, c, cap)[0]


def _budget(p: Problem, c: Config, cap: int) -> tuple[int, int]:
    """budget_limit, and the bytes of holding one."""
    if c.global_batch is not None:
        c = replace(c, microbatch_size=planned_microbatch_size(c))
    bounds = tuple(make_partition(c, p.model, c.pp).bounds)
    usable = p.cluster.usable_bytes
    one = _holding(p, c, bounds, 1).peak
    if one > usable or cap <= 1:
        return (0 if one > usable else cap), one
    slope = _holding(p, c, bounds, 2).peak - one
    hi = cap if slope <= 0 else min(cap, 1 + (usable - one) // slope)
    if hi <= 1 or _holding(p, c, bounds, hi).peak <= usable:
        return max(1, hi), one
    lo, hi = 1, hi - 1  # holding(lo) fits; the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _holding(p, c, bounds, mid).peak <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo, one


def _limited(p: Problem, space: Space, pt: Point, drop: Callable[[str, str], None]) -> list[Point]:
    """The points of a schedule with a memory limit (its entry's limit_key; zb_auto's) at its limits (the module
    doc): one per number of microbatches a rank may hold (min(L, M)); limits the budget does not allow, left
    out with the reason."""
    pp, m, name = pt.pp, pt.microbatches, pt.schedule
    out: list[Point] = []
    seen: set[int] = set()
    if space.memory_limits is not None:
        for x in space.memory_limits:
            q = replace(pt, memory_limit=float(x))
            try:
                validate(p.config_of(q), 0, p.model)
            except ConfigError as e:
                drop(_reason(str(e)), f"{q.label()}: {e}")
                continue
            held = min(x * pp, m)  # microbatches a rank may hold: the limit x 1F1B's peak (pp)
            if held in seen:
                drop(f"{name}: a memory limit holding as many microbatches as one before it",
                     f"{q.label()}: {held} per rank")
                continue
            seen.add(held)
            out.append(q)
        return out
    c = p.config_of(pt)
    most, one = _budget(p, c, min(m, 2 * pp))
    if most < 1:
        drop(f"{name}: not one microbatch per rank fits the memory budget (memory theory)",
             f"{pt.label()}: {one / GIB:.1f} GiB holding 1, {p.cluster.usable_bytes / GIB:.1f} GiB usable")
        return out
    ones = min(pp, m)  # what memory_limit=1 holds
    if ones <= most:
        out.append(pt)
    else:
        drop(f"{name}: {SCHEDULES[name].limit_key}=1 holds more microbatches than the memory budget allows "
             "(memory theory)",
             f"{pt.label()}: {ones} per rank, the budget allows {most}")
    if most != ones:
        out.append(replace(pt, memory_limit=most / pp))
    return out


def auto_bound(p: Problem, pt: Point) -> float:
    """A lower bound of the predicted step at `pt` of a schedule made from costs (zb_auto's), from
    its priced costs alone (no order made): on each rank r, from its first input on (the forward
    chain before it, hops included), the larger of
    - its busy time, M x (F + I + W) on its stage, then its all-reduce, and
    - M x T_r / units: each microbatch holds one microbatch's activations on rank r at least from
      its F's end to its I's (or B's) start, T_r (its forward and backward chain through the later
      stages, hops included), and the rank holds at most units = its memory limit x pp
      microbatches at once (M without a limit);
    then its optimizer step and the per-step overhead. Every order within the limit takes at
    least this long (the simulator runs a rank's actions one at a time). 0 (no bound) for a
    schedule with more than one stage per rank."""
    if pt.chunks != 1:
        return 0.0
    c = p.config_of(pt)
    c = replace(c, microbatch_size=planned_microbatch_size(c))
    cost = _priced(p, c)
    n, m = c.pp, c.microbatches
    fwd_hop, bwd_hop = cost.hops(n)
    F, I, W = cost.fwd_s, cost.igrad, cost.wgrad  # noqa: E741
    sync = cost.sync_s or (0.0,) * n
    opt = cost.optimizer_s or (0.0,) * n
    units = pt.memory_limit * n if pt.memory_limit is not None else m
    start, bound = 0.0, 0.0
    for r in range(n):
        # F_r's output reaches r + 1, runs forward to the last stage, and its gradient back to r
        chain = sum(fwd_hop[s] for s in range(r, n - 1)) + sum(F[s] + I[s] + bwd_hop[s] for s in range(r + 1, n))
        window = max(m * (F[r] + I[r] + W[r]) + sync[r], m * chain / units)
        bound = max(bound, start + window + opt[r])
        start += F[r] + fwd_hop[r]
    return bound + cost.step_overhead_s


def _priced(p: Problem, c: Config) -> CostModel:
    """The costs an order made from costs is made for at `c` (plan.costed_inputs' pricing; zb_auto's
    schedule.costs=model): the partition's modeled costs priced on one stage per rank."""
    bounds = make_partition(c, p.model, c.pp).bounds
    modeled, _ = emulated_costs(c, bounds, p.model)
    stage_params = [sum(p.model.layer_params[a:b]) // c.tp for a, b in bounds]  # a TP rank's share
    return price(c, modeled, tuple(range(c.pp)), stage_params, message_bytes_of(c, p.model),
                 plan_tp_collectives(c, p.model, list(bounds)))


def _nodes(cl, placement: str, r: int, pp: int, dp: int, tp: int) -> list[tuple[int, ...]]:
    """The nodes of pipeline rank r's TP groups, one per replica: a (replica, stage) slot's TP
    ranks are tp consecutive GPUs (tp innermost, harness/runtime/groups.py)."""
    return [tuple(links.node(cl, g * tp + t) for t in range(tp)) for g in links.replicas(placement, r, pp, dp)]


def _placement_signature(cl, placement: str, pp: int, dp: int, tp: int = 1) -> tuple:
    """Which rank pairs talk across nodes, which replica groups and which TP groups span nodes:
    placements with the same signature price every message and collective the same."""
    nodes = [_nodes(cl, placement, r, pp, dp, tp) for r in range(pp)]
    pairs = tuple(any(a != b for a, b in zip(nodes[r], nodes[q])) for r in range(pp) for q in range(pp))
    groups = tuple(any(len({g[t] for g in n}) > 1 for t in range(tp)) for n in nodes)
    tensor = any(len(set(t)) > 1 for n in nodes for t in n)
    return pairs, groups, tensor


def tensor_degrees(p: Problem, space: Space, gpus: int) -> tuple[int, ...]:
    """The tp degrees searched: --tp as given, else every divisor of the GPUs the model allows
    (harness/parallel/checks.py: heads, KV heads, hidden, FFN, vocabulary) within a node
    (all of them with tp_across_nodes). AdviseError (one line) for a given degree the model or
    the cluster refuses."""
    node = p.cluster.gpus_per_node
    if space.tp is None:
        return tuple(t for t in _divisors(gpus) if (space.tp_across_nodes or t <= node)
                     and tp_problem(p.config.model, t) is None)
    for t in space.tp:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1 or gpus % t:
            raise AdviseError(f"--tp {t}: must divide the {gpus} GPUs (allowed: {_divisors(gpus)})")
        if t > node and not space.tp_across_nodes:
            raise AdviseError(f"--tp {t}: a TP group would span nodes of {node} GPUs (allowed: tp <= {node}, or "
                              "--tp-across-nodes)")
        if problem := tp_problem(p.config.model, t):
            raise AdviseError(f"--tp {t}: {problem}")
    return tuple(space.tp)


def evaluate(p: Problem, pt: Point) -> Prediction:
    return _prediction(make_plan(p.config_of(pt), 0, p.model))


@dataclass
class Ranking:
    """What a search found: every prediction, ranked, and what it left out and why."""
    predictions: list[Prediction]  # ranked: fitting points by throughput, then the rest
    dropped: dict[str, int]
    examples: dict[str, str]
    seconds: float

    @property
    def fitting(self) -> list[Prediction]:
        return [x for x in self.predictions if x.fits]


class _Worker:
    """A forked searcher's problem: set by the pool's initializer in the child, which inherits
    the parent's warm caches (schedules, traces) by fork instead of having them pickled."""
    problem: Problem | None = None


def _init_worker(p: Problem) -> None:
    _Worker.problem = p


def _evaluate_group(points: list[Point]) -> list[Prediction]:
    assert _Worker.problem is not None
    return [evaluate(_Worker.problem, pt) for pt in points]


def _groups(points: list[Point]) -> list[list[Point]]:
    """Points sharing one schedule (name, pp, M, v): its compiled schedule built once."""
    groups: dict[tuple, list[Point]] = {}
    for pt in sorted(points):
        key = (pt.schedule, pt.pp, pt.microbatches, pt.virtual_stages)
        made = SCHEDULES[pt.schedule].needs == COSTS  # made from the point's own costs: its own group
        groups.setdefault(key + ((pt,) if made else ()), []).append(pt)
    return list(groups.values())


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _work(group: list[Point]) -> float:
    """A group's relative cost: its schedule's actions per point, times its entry's plan_cost (zb_auto's: ~10
    candidate orders generated and simulated)."""
    pt = group[0]
    return len(group) * pt.pp * pt.microbatches * pt.chunks * SCHEDULES[pt.schedule].plan_cost


def search(p: Problem, space: Space, progress: Callable[[int, int], None] | None = None,
           workers: int | None = None) -> Ranking:
    """Every point predicted, ranked; AdviseError (one line) when there is nothing to rank.
    With workers > 1 the points are split by schedule over forked processes (the per-layer
    memory traces are made first, here, and inherited). The points of schedules made from costs
    (zb_auto's) come last: each is made only where its lower bound (`auto_bound`) beats the
    space's `auto_top`-th fastest fitting point of the others; the rest are left out with that
    reason."""
    t0 = time.perf_counter()
    points, dropped, examples, heavy = enumerate_points(p, space)
    if not points and heavy:  # nothing but points too heavy to fit: the lightest one says why
        raise AdviseError(nothing_fits(p, [evaluate(p, heavy[0])]))
    if not points:
        why = "; ".join(f"{n} x {k} (e.g. {examples[k]})" for k, n in sorted(dropped.items(), key=lambda kv: -kv[1]))
        raise AdviseError(f"the search space is empty after the constraints: {why or 'nothing to search'}")
    workers = host_cores() if workers is None else workers
    if workers < 1:
        raise AdviseError(f"--workers {workers}: must be >= 1")
    memory = layer_memory(p.model, p.config.dtype, p.cluster.device)  # what each point's plan.memory() is
    split = any(SCHEDULES[pt.schedule].split_backward for pt in points)
    for tp, sp, b in sorted({(pt.tp, pt.sequence_parallel, pt.microbatch_size) for pt in points}):
        memory.at(tp, sp).warm(b, split)  # each TP degree's layer traces too (tp > 1: its layers split alone)
    auto = [pt for pt in points if SCHEDULES[pt.schedule].needs == COSTS]  # made per point: predicted last
    others = [pt for pt in points if SCHEDULES[pt.schedule].needs != COSTS]
    total = [len(points)]
    preds: list[Prediction] = []

    def done(out: list[Prediction]) -> None:
        preds.extend(out)
        if progress:
            progress(len(preds), total[0])

    def keep(auto: list[Point]) -> list[Point]:
        """The points made from costs that could rank in the top `auto_top` beside the others' predictions."""
        top = max(1, space.auto_top)
        steps = sorted(x.step_time_s for x in preds if x.fits)
        if len(steps) < top or not auto:
            return auto
        worst = steps[top - 1]
        kept = []
        for pt in auto:
            bound = auto_bound(p, pt)
            if bound < worst:
                kept.append(pt)
            else:
                why = f"{pt.schedule}: its lower bound is slower than the {_nth(top)} fastest point of the others"
                dropped[why] = dropped.get(why, 0) + 1
                examples.setdefault(why, f"{pt.label()}: at least {bound:.4g} s a step, the {_nth(top)} {worst:.4g} s")
        total[0] -= len(auto) - len(kept)
        return kept

    if workers > 1 and len(points) >= 200:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers, initializer=_init_worker, initargs=(p,)) as pool:
            for phase in (others, None):
                groups = _groups(keep(auto) if phase is None else phase)
                groups.sort(key=lambda g: -_work(g))  # the largest schedules first, so the pool ends together
                for out in pool.imap_unordered(_evaluate_group, groups):
                    done(out)
    else:
        for phase in (others, None):
            for g in _groups(keep(auto) if phase is None else phase):
                done([evaluate(p, pt) for pt in g])
    rank(preds)
    if not any(x.fits for x in preds):
        raise AdviseError(nothing_fits(p, preds))
    return Ranking(preds, dropped, examples, time.perf_counter() - t0)


def rank(preds: list[Prediction]) -> None:
    """Fitting points by predicted throughput (ties: less memory), numbered from 1; the rest
    after, unranked. Marks the Pareto front (no fitting point is both faster and smaller)."""
    preds.sort(key=lambda x: (not x.fits, -x.throughput_samples_s, x.memory.peak, x.point))
    best_mem = math.inf
    for i, x in enumerate(preds):
        x.rank = i + 1 if x.fits else None
        if x.fits and x.memory.peak < best_mem:  # faster than everything below it, smaller than everything above
            x.pareto, best_mem = True, x.memory.peak


def nothing_fits(p: Problem, preds: list[Prediction]) -> str:
    """One line: the smallest point, what it holds, and which component alone does not fit."""
    cl = p.cluster
    usable = cl.usable_bytes
    x = min(preds, key=lambda q: q.memory.peak)
    m = x.memory
    gib = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    static = m.params + m.grads + m.optimizer
    parts = (f"parameters {gib(m.params)}, gradients {gib(m.grads)}, optimizer state {gib(m.optimizer)}, "
             f"activations {gib(m.peak - static)}")
    if m.params > usable:
        why = f"its parameters alone ({gib(m.params)}) exceed it"
    elif m.params + m.grads > usable:
        why = f"its parameters + gradients ({gib(m.params + m.grads)}) exceed it"
    elif static > usable:
        why = f"its parameters + gradients + optimizer state ({gib(static)}) exceed it"
    else:
        why = f"the activations ({gib(m.peak - static)}) do not fit beside {gib(static)} of weights and state"
    return (f"no point fits cluster {cl.name}'s {gib(usable)} per GPU ({cl.memory_per_gpu_gib:g} GiB - "
            f"{cl.memory_reserve_gib:g} reserved): the smallest, {x.point.label()}, needs {gib(m.peak)} on "
            f"pipeline rank {x.memory_rank} ({parts}); {why} (more GPUs, ZeRO, checkpointing, or a smaller model)")


def with_model(c: Config, described: dict) -> Config:
    """`c` with the model a profile describes (its model.* keys)."""
    keys = {f"model.{k}": v for k, v in described.items() if k != "name"}
    return set_keys(c, **{"model.name": described.get("name", c.model.name)}, **keys)
