"""The search: every point of schedule x pp x dp x M (B from the global batch) x v x
checkpointing x ZeRO x placement, each a harness Config, its predicted step time and memory per
GPU, what fits, ranked.

A point is the problem's config (executor=sim, the cluster, the model, dtype, optimizer,
profile) with the point's keys set. Whether the harness can run it is the harness's own
validation (harness/checks.py: a schedule's requirements, more stages than layers, split
backwards with dp > 1, ZeRO-1 without replicas, too many actions...); what it predicts is
`python -m harness executor=sim cluster=<preset>` on that config: the plan (harness/plan.py),
priced by harness/simulate/pricing.py, timed by the one simulator (harness/simulate/engine.py),
its memory by harness/memory_theory.py. So a printed point's overrides, run with executor=sim,
reproduce its prediction exactly (tests/test_advise.py).

Two choices of the search's own, not of validity: at pp=1 only 1f1b (one stage has nothing to
overlap: every schedule takes its time, with at least its memory), and placements that put
every message and every all-reduce on the same links are one point (pp_inner kept).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from harness.checks import validate
from harness.config import PLACEMENTS, Config, ConfigError, planned_microbatch_size, set_keys
from harness.flops import flops_of
from harness.memory_theory import Layout, RankBytes, fullest
from harness.model.built import BuiltModel
from harness.plan import Plan, host_cores, make_plan
from harness.result import Flops
from harness.schedules.registry import SCHEDULES, built_in, chunks_per_rank
from harness.simulate import engine, links

GIB = 2**30


class AdviseError(ValueError):
    """An input the advisor cannot plan for; str() is one line naming why (exit 2)."""


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

    def config(self, base: Config) -> Config:
        """`base` with this point's keys (B set by its global batch, dp x M x B, as the printed
        commands set it)."""
        return replace(base, schedule=replace(base.schedule, name=self.schedule), pp=self.pp, dp=self.dp,
                       microbatches=self.microbatches, global_batch=self.dp * self.microbatches * self.microbatch_size,
                       virtual_stages=self.virtual_stages, checkpointing=self.checkpointing, zero=self.zero,
                       placement=self.placement)

    def label(self) -> str:
        v = f" v={self.virtual_stages}" if SCHEDULES[self.schedule].reads_virtual_stages else ""
        return (f"{self.schedule} pp={self.pp} dp={self.dp} M={self.microbatches} B={self.microbatch_size}{v}"
                f"{' ckpt' if self.checkpointing else ''}{' zero1' if self.zero else ''}"
                f"{' dp_inner' if self.placement == 'dp_inner' else ''}")

    @classmethod
    def of(cls, c: Config) -> "Point":
        """The point a harness Config runs."""
        b = planned_microbatch_size(c)
        v = c.virtual_stages if SCHEDULES[c.schedule.name].reads_virtual_stages else 1
        return cls(c.schedule.name, c.pp, c.microbatches, v, c.dp, b, c.checkpointing, c.zero, c.placement)


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
    return sum(links.crosses(c.cluster, c.placement, owner[s], owner[s + 1], c.pp, c.dp)
               for s in range(len(owner) - 1) if owner[s] != owner[s + 1])


@dataclass(frozen=True)
class Space:
    schedules: tuple[str, ...] = ()  # () : every built-in
    pp: tuple[int, ...] | None = None  # None: every divisor of the GPUs
    dp: tuple[int, ...] | None = None  # None: gpus / pp
    microbatch_sizes: tuple[int, ...] | None = None  # None: every divisor of global_batch / dp
    virtual_stages: tuple[int, ...] = (2, 4)
    checkpointing: tuple[bool, ...] = (False, True)
    zero: tuple[int, ...] = (0, 1)
    placements: tuple[str, ...] = PLACEMENTS
    gpus: int | None = None  # GPUs a point uses (pp x dp); None: the whole cluster
    max_microbatches: int = 1024
    max_microbatch_size: int = 64


@dataclass
class Problem:
    config: Config  # every point's base: executor=sim, the cluster, the model, dtype, optimizer, profile, compute
    model: BuiltModel  # built once, for every point
    global_batch: int
    overrides: list[str]  # what the printed commands say besides the point's keys (python -m harness keys)
    cluster_keys: list[str]  # cluster=<preset> and cluster.* as given: what prices a point (executor=sim)
    notes: list[str] = field(default_factory=list)

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


def enumerate_points(p: Problem, space: Space) -> tuple[list[Point], dict[str, int], dict[str, str]]:
    """Every point of the space the harness can run (its own validation), and how many were
    left out for each reason (with one example each)."""
    cl = p.cluster
    gpus = space.gpus or cl.gpus
    if gpus < 1:
        raise AdviseError(f"--gpus {gpus}: must be >= 1")
    if gpus > cl.gpus:
        raise AdviseError(f"--gpus {gpus}: the cluster has {cl.gpus} ({cl.nodes} x {cl.gpus_per_node})")
    schedules = space.schedules or built_in()
    for name in schedules:
        if name not in built_in():
            raise AdviseError(f"--schedules {name}: unknown (allowed: {', '.join(built_in())})")
    for pl in space.placements:
        if pl not in PLACEMENTS:
            raise AdviseError(f"--placements {pl}: unknown (allowed: {', '.join(PLACEMENTS)})")
    pps = space.pp or tuple(_divisors(gpus))
    pairs = [(pp, gpus // pp) for pp in pps if pp >= 1 and gpus % pp == 0]
    if space.dp:
        pairs = [(pp, dp) for pp in pps for dp in space.dp if pp >= 1 and dp >= 1 and pp * dp <= gpus]
    if not pairs:
        raise AdviseError(f"--pp {list(pps)}: none divides the {gpus} GPUs (pp x dp must use them all; "
                          f"allowed pp: {_divisors(gpus)})")
    gb = p.global_batch
    if not any(gb % dp == 0 for _, dp in pairs):
        raise AdviseError(f"--global-batch {gb}: no data-parallel degree here divides it (dp in "
                          f"{sorted({dp for _, dp in pairs})}; allowed: a multiple of one of them)")
    dropped: dict[str, int] = {}
    example: dict[str, str] = {}

    def drop(why: str, what: str) -> None:
        dropped[why] = dropped.get(why, 0) + 1
        example.setdefault(why, what)

    points: list[Point] = []
    signatures = {(pl, pp, dp): _placement_signature(cl, pl, pp, dp) for pp, dp in pairs for pl in space.placements}
    for pp, dp in pairs:
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
                for v in space.virtual_stages if SCHEDULES[name].reads_virtual_stages else (1,):
                    if pp == 1 and name != "1f1b" and "1f1b" in schedules:
                        drop("pp=1: the same step as 1f1b's, with at least its memory", f"{name} pp=1 dp={dp}")
                        continue
                    seen: set = set()
                    for pl in space.placements:
                        sig = signatures[(pl, pp, dp)]
                        if sig in seen:
                            continue
                        seen.add(sig)
                        for ck in space.checkpointing:
                            for z in space.zero:
                                pt = Point(name, pp, m, v, dp, b, ck, z, pl)
                                try:
                                    validate(pt.config(p.config), 0, p.model)
                                except ConfigError as e:
                                    drop(_reason(str(e)), f"{pt.label()}: {e}")
                                    continue
                                points.append(pt)
    return points, dropped, example


def _placement_signature(cl, placement: str, pp: int, dp: int) -> tuple:
    """Which rank pairs talk across nodes and which replica groups span nodes: placements with
    the same signature price every message and collective the same."""
    nodes = [[links.node(cl, g) for g in links.replicas(placement, r, pp, dp)] for r in range(pp)]
    pairs = tuple(any(a != b for a, b in zip(nodes[r], nodes[q])) for r in range(pp) for q in range(pp))
    groups = tuple(len(set(n)) > 1 for n in nodes)
    return pairs, groups


def evaluate(p: Problem, pt: Point) -> Prediction:
    return _prediction(make_plan(pt.config(p.config), 0, p.model))


@dataclass
class Result:
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
        groups.setdefault((pt.schedule, pt.pp, pt.microbatches, pt.virtual_stages), []).append(pt)
    return list(groups.values())


def search(p: Problem, space: Space, progress: Callable[[int, int], None] | None = None,
           workers: int | None = None) -> Result:
    """Every point predicted, ranked; AdviseError (one line) when there is nothing to rank.
    With workers > 1 the points are split by schedule over forked processes (the per-layer
    memory traces are made first, here, and inherited)."""
    t0 = time.perf_counter()
    points, dropped, examples = enumerate_points(p, space)
    if not points:
        why = "; ".join(f"{n} x {k} (e.g. {examples[k]})" for k, n in sorted(dropped.items(), key=lambda kv: -kv[1]))
        raise AdviseError(f"the search space is empty after the constraints: {why or 'nothing to search'}")
    workers = host_cores() if workers is None else workers
    if workers < 1:
        raise AdviseError(f"--workers {workers}: must be >= 1")
    groups = _groups(points)
    memory = make_plan(points[0].config(p.config), 0, p.model).memory()
    for b in sorted({pt.microbatch_size for pt in points}):
        memory.warm(b)
    preds: list[Prediction] = []
    if workers > 1 and len(points) >= 200:
        import multiprocessing as mp

        # the largest schedules first, so the pool ends together
        groups.sort(key=lambda g: -len(g) * g[0].pp * g[0].microbatches * g[0].chunks)
        with mp.get_context("fork").Pool(workers, initializer=_init_worker, initargs=(p,)) as pool:
            for out in pool.imap_unordered(_evaluate_group, groups):
                preds += out
                if progress:
                    progress(len(preds), len(points))
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
