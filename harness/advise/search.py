"""The search: every point of schedule x pp x dp x M (B from the global batch) x v x
checkpointing x ZeRO x placement, its predicted step time and memory per GPU, what fits, ranked.

One point's prediction (`evaluate`):
- stages: partition=profile's split (min_max of each layer's F + B seconds at the point's B),
  or equal layer counts without a profile (profiles.py);
- step time: the schedule simulated exactly (fastsim.py, the engine's semantics) on each
  stage's F and B (I = (1 - w) B, W = w B for split backwards, w = cost.weight_grad_share),
  plus, with checkpointing, the stage's forward again inside its backward (the recompute; not
  under the harness's compute=emulated replay, which holds B to its modeled cost whatever runs
  inside); every message (the activation, B x the model's activation shape, in dtype) priced by
  the link between the two GPUs it joins (intra- or inter-node, cluster.py), the slowest replica
  counting; each stage's ring all-reduce of its gradients inside its last backward, over the
  links its replicas span; then per rank the optimizer step (memory-bound) and, with ZeRO-1,
  the all-gather of the updated shards; the step is the last rank's end plus the executor's
  per-step overhead (cluster.overhead, measured for cluster=here, zero elsewhere);
- memory: the fullest GPU's parameters, gradients, optimizer state and peak activations, as
  harness/memory_theory.py counts them (memory.py).
Points the harness cannot run are not searched: a schedule's own requirements (builders.py),
more stages than layers, split-backward schedules with dp > 1 (DDP never sees a deferred W),
ZeRO-1 without replicas, more than MAX_ACTIONS actions; at pp=1 only 1f1b (one stage has
nothing to overlap: every schedule takes its time, with at least its memory). Placements that put every message and
every all-reduce on the same links are one point (pp_inner kept).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from harness.config import MAX_ACTIONS, Config
from harness.precision import Precision
from harness.schedules.registry import SCHEDULES as REGISTERED
from harness.schedules.registry import built_in, chunks_per_rank, requirements

from . import fastsim
from .cluster import GIB, PLACEMENTS, AdviseError, ClusterConfig
from .memory import LayerMemory, RankPeak, peak_per_gpu
from .profiles import LayerCosts

SCHEDULES = built_in()


@dataclass(frozen=True, order=True)
class Point:
    schedule: str
    pp: int
    microbatches: int
    virtual_stages: int
    dp: int
    microbatch_size: int
    checkpointing: bool
    zero: int
    placement: str

    @property
    def chunks(self) -> int:
        return chunks_per_rank(self.schedule, self.virtual_stages)

    def overrides(self) -> dict[str, object]:
        """The harness's keys for this point (global_batch sets B = it / (dp x M))."""
        return {"schedule": self.schedule, "pp": self.pp, "dp": self.dp, "microbatches": self.microbatches,
                "microbatch_size": self.microbatch_size, "virtual_stages": self.virtual_stages,
                "checkpointing": self.checkpointing, "zero": self.zero, "placement": self.placement}

    def label(self) -> str:
        v = f" v={self.virtual_stages}" if self.schedule == "interleaved_1f1b" else ""
        return (f"{self.schedule} pp={self.pp} dp={self.dp} M={self.microbatches} B={self.microbatch_size}{v}"
                f"{' ckpt' if self.checkpointing else ''}{' zero1' if self.zero else ''}"
                f"{' dp_inner' if self.placement == 'dp_inner' else ''}")


@dataclass
class Prediction:
    point: Point
    step_time_s: float
    throughput_samples_s: float
    memory: RankPeak
    fits: bool
    pipeline_s: float  # the last rank's end of its pipeline actions (all-reduces inside)
    allreduce_s: float  # the largest stage all-reduce
    optimizer_s: float  # the largest rank's optimizer step (+ ZeRO-1 all-gather)
    bubble: float  # mean over ranks of 1 - compute / pipeline_s
    cross_node_boundaries: int  # stage boundaries whose messages cross nodes (worst replica)
    layers_per_stage: tuple[int, ...] = ()
    rank: int | None = None
    pareto: bool = False

    def as_dict(self, tokens_per_sample: int | None = None) -> dict:
        d = {"overrides": self.point.overrides(), "label": self.point.label(), "rank": self.rank,
             "step_time_s": self.step_time_s, "throughput_samples_s": self.throughput_samples_s,
             "peak_bytes_per_gpu": self.memory.peak, "peak_gib_per_gpu": self.memory.peak / GIB, "fits": self.fits,
             "pareto": self.pareto, "memory": self.memory.as_dict(), "pipeline_s": self.pipeline_s,
             "allreduce_s": self.allreduce_s, "optimizer_s": self.optimizer_s, "bubble": self.bubble,
             "cross_node_boundaries": self.cross_node_boundaries, "layers_per_stage": list(self.layers_per_stage)}
        if tokens_per_sample:
            d["throughput_tokens_s"] = self.throughput_samples_s * tokens_per_sample
        return d


@dataclass
class Space:
    """What is searched; None: everything the cluster and the model allow."""

    schedules: tuple[str, ...] = SCHEDULES
    pp: tuple[int, ...] | None = None
    dp: tuple[int, ...] | None = None
    microbatch_sizes: tuple[int, ...] | None = None
    virtual_stages: tuple[int, ...] = (2, 4)  # interleaved_1f1b's chunks per rank
    checkpointing: tuple[bool, ...] = (False, True)
    zero: tuple[int, ...] = (0, 1)
    placements: tuple[str, ...] = PLACEMENTS
    gpus: int | None = None  # GPUs a point uses (pp x dp); None: the whole cluster
    max_microbatches: int = 1024
    max_microbatch_size: int = 64


@dataclass
class Problem:
    config: Config  # the model, dtype, optimizer, cost.* of the harness
    cluster: ClusterConfig
    global_batch: int
    costs: LayerCosts
    memory: LayerMemory | None
    emulated: bool = False  # predicting the harness's compute=emulated replay (recompute not timed)
    tokens_per_sample: int | None = None
    notes: list[str] = field(default_factory=list)
    # rank_ends by its inputs: points that differ only in what comes after the pipeline (ZeRO-1:
    # the optimizer's state and all-gather) share one simulation
    ends_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_layers(self) -> int:
        return self.costs.num_layers


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_points(p: Problem, space: Space) -> tuple[list[Point], dict[str, int], dict[str, str]]:
    """Every point of the space the harness can run, and how many were left out for each
    reason (with one example each)."""
    c = p.cluster
    gpus = space.gpus or c.gpus
    if gpus > c.gpus:
        raise AdviseError(f"--gpus {gpus}: the cluster has {c.gpus} ({c.nodes} x {c.gpus_per_node})")
    for name in space.schedules:
        if name not in built_in():
            raise AdviseError(f"--schedules {name}: unknown (allowed: {', '.join(built_in())})")
    for pl in space.placements:
        if pl not in PLACEMENTS:
            raise AdviseError(f"--placements {pl}: unknown (allowed: {', '.join(PLACEMENTS)})")
    pps = space.pp or tuple(_divisors(gpus))
    pairs = [(pp, gpus // pp) for pp in pps if gpus % pp == 0]
    if space.dp:
        pairs = [(pp, dp) for pp in pps for dp in space.dp if pp * dp <= gpus]
    if not pairs:
        raise AdviseError(f"--pp {list(pps)}: none divides the {gpus} GPUs (pp x dp must use them all; "
                          f"allowed pp: {_divisors(gpus)})")
    gb = p.global_batch
    if gb < 1:
        raise AdviseError(f"--global-batch {gb}: must be >= 1")
    if not any(gb % dp == 0 for _, dp in pairs):
        raise AdviseError(f"--global-batch {gb}: no data-parallel degree here divides it (dp in "
                          f"{sorted({dp for _, dp in pairs})}; allowed: a multiple of one of them)")
    dropped: dict[str, int] = {}
    example: dict[str, str] = {}

    def drop(why: str, what: str) -> None:
        dropped[why] = dropped.get(why, 0) + 1
        example.setdefault(why, what)

    points: list[Point] = []
    L = p.num_layers
    for pp, dp in pairs:
        if gb % dp:
            drop("global batch not divisible by dp", f"global_batch={gb}, dp={dp}")
            continue
        per_replica = gb // dp
        sizes = space.microbatch_sizes or tuple(b for b in _divisors(per_replica) if b <= space.max_microbatch_size)
        for b in sizes:
            if per_replica % b:
                drop("B does not divide global_batch / dp", f"B={b}, global_batch / dp = {per_replica}")
                continue
            m = per_replica // b
            if m > space.max_microbatches:
                drop(f"M > --max-microbatches {space.max_microbatches}", f"pp={pp} dp={dp} B={b}: M={m}")
                continue
            for name in space.schedules:
                vs = space.virtual_stages if name == "interleaved_1f1b" else (1,)
                for v in vs:
                    what = f"{name} pp={pp} dp={dp} M={m} B={b} v={v}"
                    if pp == 1 and name != "1f1b" and "1f1b" in space.schedules:
                        # one stage: nothing to overlap, every order takes 1F1B's time with at least its memory
                        drop("pp=1: the same step as 1f1b's, with at least its memory", what)
                        continue
                    if (why := requirements(name, pp, m, v)) is not None:
                        drop("the schedule's own requirements", f"{what}: {why}")
                        continue
                    chunks = chunks_per_rank(name, v)
                    if pp * chunks > L:
                        drop("more stages than layers", f"{what}: {pp * chunks} stages, {L} layers")
                        continue
                    if dp > 1 and REGISTERED[name].split_backward:
                        drop("split backward (I/W) with dp > 1 (DDP never sees a deferred W)", what)
                        continue
                    if pp * chunks * m * 3 > MAX_ACTIONS:
                        drop(f"more than {MAX_ACTIONS:,} actions", what)
                        continue
                    seen: set = set()
                    for pl in space.placements:
                        sig = _placement_signature(c, pl, pp, dp, chunks, name)
                        if sig in seen:
                            continue
                        seen.add(sig)
                        for ck in space.checkpointing:
                            for z in space.zero:
                                if z and dp == 1:
                                    drop("zero=1 with dp=1 (no replicas to shard over)", what)
                                    continue
                                points.append(Point(name, pp, m, v, dp, b, ck, z, pl))
    return points, dropped, example


def _gpus_of_rank(c: ClusterConfig, placement: str, rank: int, pp: int, dp: int) -> list[int]:
    return [c.gpu_of(placement, rank, k, pp, dp) for k in range(dp)]


def _placement_signature(c: ClusterConfig, placement: str, pp: int, dp: int, chunks: int, name: str) -> tuple:
    """Which rank pairs talk across nodes and which replica groups span nodes: placements with
    the same signature price every message and collective the same."""
    nodes = [[c.node(g) for g in _gpus_of_rank(c, placement, r, pp, dp)] for r in range(pp)]
    pairs = tuple(any(a != b for a, b in zip(nodes[r], nodes[q])) for r in range(pp) for q in range(pp))
    groups = tuple(len(set(n)) > 1 for n in nodes)
    return pairs, groups


def _bytes_touched(c: Config) -> int:
    """Bytes the optimizer step reads and writes per parameter: the gradient, the fp32 copy it
    steps (master or parameter) read and written, AdamW's two moments read and written (SGD's
    momentum buffer), and in low precision the parameter written back."""
    pb = Precision(c.dtype).bytes
    state = 16 if c.optimizer.name == "adamw" else (8 if c.optimizer.momentum > 0 else 0)
    return pb + 8 + state + (pb if Precision(c.dtype).master_weights else 0)


def evaluate(p: Problem, pt: Point) -> Prediction:
    c, cl = p.config, p.cluster
    S = pt.pp * pt.chunks
    st = p.costs.stages(pt.microbatch_size, S)
    comp = fastsim.compiled(pt.schedule, pt.pp, pt.microbatches, pt.virtual_stages)
    owner = comp.owner
    w = c.cost.weight_grad_share
    world = pt.pp * pt.dp
    fwd, bwd = list(st.fwd), list(st.bwd)
    if not p.emulated and cl.overhead.real_fwd_scale:  # a real run's actions against the profile's layers
        kf, kb = cl.overhead.at("real_fwd_scale", world), cl.overhead.at("real_bwd_scale", world)
        fwd, bwd = [kf * f for f in fwd], [kb * b for b in bwd]
    rec = [0.0] * S if (not pt.checkpointing or p.emulated) else fwd
    igrad = [(1 - w) * b + r for b, r in zip(bwd, rec)]
    wgrad = [w * b for b in bwd]
    bwd_full = [b + r for b, r in zip(bwd, rec)]
    nbytes = p.memory.act_bytes(pt.microbatch_size) if p.memory else 0
    # per boundary: the worst replica's link between the two ranks
    gpus = [_gpus_of_rank(cl, pt.placement, r, pt.pp, pt.dp) for r in range(pt.pp)]

    def hop(r: int, q: int) -> tuple[float, bool]:
        if r == q:
            return 0.0, False
        crosses = any(cl.node(a) != cl.node(b) for a, b in zip(gpus[r], gpus[q]))
        return cl.p2p_s(nbytes, not crosses, world), crosses

    fwd_hop, bwd_hop, crossing = [0.0] * S, [0.0] * S, 0
    for s in range(S - 1):
        t, x = hop(owner[s], owner[s + 1])
        fwd_hop[s] = bwd_hop[s + 1] = t
        crossing += x
    pb = Precision(c.dtype).bytes
    stage_params = ([sum(p.memory.params[a:e]) for a, e in st.bounds] if p.memory
                    else [0] * S)
    skew = cl.overhead.at("allreduce_s", world)
    sync = [cl.allreduce_s(pb * stage_params[s], gpus[owner[s]]) + skew if pt.dp > 1 else 0.0 for s in range(S)]
    overhead = cl.overhead.at("action_s", world) if p.emulated else 0.0
    args = (fwd, bwd_full, igrad, wgrad, fwd_hop, bwd_hop, sync, overhead, cl.overhead.at("send_s", world),
            cl.overhead.at("recv_s", world))
    key = (pt.schedule, pt.pp, pt.microbatches, pt.virtual_stages, repr(args))
    ends = p.ends_cache.get(key)
    if ends is None:
        if len(p.ends_cache) > 4096:
            p.ends_cache.clear()
        ends = p.ends_cache[key] = fastsim.rank_ends(comp, *args)
    touched = _bytes_touched(c)
    opt = [0.0] * pt.pp
    for s in range(S):
        r = owner[s]
        opt[r] += stage_params[s] * touched / cl.memory_bandwidth_Bps
        if pt.zero and pt.dp > 1:
            opt[r] += cl.allgather_s(pb * stage_params[s], gpus[r])
    step = max(e + o for e, o in zip(ends, opt)) + cl.overhead.at("step_s", world)
    pipeline = max(ends)
    busy = [0.0] * pt.pp
    for s in range(S):
        busy[owner[s]] += pt.microbatches * (fwd[s] + bwd_full[s])
    bubble = sum(1 - b / pipeline for b in busy) / pt.pp if pipeline > 0 else 0.0
    if p.memory is not None:
        mem = peak_per_gpu(p.memory, pt.schedule, pt.pp, pt.microbatches, pt.virtual_stages, pt.dp, pt.zero,
                           st.bounds, pt.microbatch_size, pt.checkpointing, c.checkpoint_every)
    else:
        mem = RankPeak(0, 0, 0, 0, 0, 0)
    return Prediction(pt, step, p.global_batch / step, mem, mem.peak <= cl.usable_bytes, pipeline, max(sync),
                      max(opt), bubble, crossing, tuple(e - a for a, e in st.bounds))


@dataclass
class Result:
    predictions: list[Prediction]  # ranked: fitting points by throughput, then the rest
    dropped: dict[str, int]
    examples: dict[str, str]
    seconds: float

    @property
    def fitting(self) -> list[Prediction]:
        return [x for x in self.predictions if x.fits]


_WORKER: Problem | None = None  # the problem a forked worker evaluates (inherited, never pickled)


def _evaluate_group(points: list[Point]) -> list[Prediction]:
    assert _WORKER is not None
    return [evaluate(_WORKER, pt) for pt in points]


def _groups(points: list[Point]) -> list[list[Point]]:
    """Points sharing one schedule (name, pp, M, v), each group's compiled schedule built once."""
    groups: dict[tuple, list[Point]] = {}
    for pt in sorted(points):
        groups.setdefault((pt.schedule, pt.pp, pt.microbatches, pt.virtual_stages), []).append(pt)
    return list(groups.values())


def default_workers() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def search(p: Problem, space: Space, progress: Callable[[int, int], None] | None = None,
           workers: int | None = None) -> Result:
    """Every point predicted, ranked; AdviseError (one line) when there is nothing to rank.
    With workers > 1 the points are split by schedule over forked processes (the per-layer
    memory traces are made first, here, and inherited)."""
    global _WORKER
    t0 = time.perf_counter()
    points, dropped, examples = enumerate_points(p, space)
    if not points:
        why = "; ".join(f"{n} x {k} (e.g. {examples[k]})" for k, n in sorted(dropped.items(), key=lambda kv: -kv[1]))
        raise AdviseError(f"the search space is empty after the constraints: {why or 'nothing to search'}")
    workers = default_workers() if workers is None else workers
    groups = _groups(points)
    if p.memory is not None:
        for b in sorted({pt.microbatch_size for pt in points}):
            p.memory.warm(b)
    preds: list[Prediction] = []
    if workers > 1 and len(points) >= 200:
        import multiprocessing as mp

        # the largest schedules first, so the pool ends together
        groups.sort(key=lambda g: -len(g) * g[0].pp * g[0].microbatches * g[0].chunks)
        _WORKER = p
        try:
            with mp.get_context("fork").Pool(workers) as pool:
                for out in pool.imap_unordered(_evaluate_group, groups):
                    preds += out
                    if progress:
                        progress(len(preds), len(points))
        finally:
            _WORKER = None
    else:
        for g in groups:
            preds += [evaluate(p, pt) for pt in g]
            if progress:
                progress(len(preds), len(points))
    rank(preds)
    if not any(x.fits for x in preds):
        raise AdviseError(nothing_fits(p, preds))
    return Result(preds, dropped, examples, time.perf_counter() - t0)


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
    if static > usable:
        what = ("its parameters alone" if m.params > usable else
                "its parameters + gradients" if m.params + m.grads > usable else
                "its parameters + gradients + optimizer state")
        why = f"{what} ({gib(static if what.endswith('state') else m.params + (m.grads if 'gradients' in what else 0))}) exceed it"
    else:
        why = f"the activations ({gib(m.peak - static)}) do not fit beside {gib(static)} of weights and state"
    return (f"no point fits cluster {cl.name}'s {gib(usable)} per GPU ({cl.memory_per_gpu_gib:g} GiB - "
            f"{cl.memory_reserve_gib:g} reserved): the smallest, {x.point.label()}, needs {gib(m.peak)} on "
            f"pipeline rank {m.rank} ({parts}); {why} (more GPUs, ZeRO, checkpointing, or a smaller model)")
