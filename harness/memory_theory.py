"""Theory of every byte a pipeline rank holds, from the plan alone: parameters, gradients,
optimizer state, activations held for backward, and the transient peak.

Sources, per component (bytes per parameter in brackets):
- parameters: the rank's layers' parameter count x bytes of `dtype` (fp32 4, bf16/fp16 2);
- gradients: the same (accumulated in `dtype`);
- optimizer state (Rajbhandari et al., 2020, "ZeRO", sec. 3: the "K" bytes per parameter):
  SGD keeps nothing (a momentum buffer with momentum > 0), AdamW two moments, in fp32 where
  low precision keeps fp32 master copies (K = 12: master 4 + moments 8), else in fp32
  (K = 8), plus a 4-byte step counter per parameter tensor; ZeRO-1 shards the moments across
  the dp replicas as torch's ZeroRedundancyOptimizer does (parameters, largest first, each to
  the replica holding the fewest so far); the masters stay whole on every replica (torch's
  ZeRO-1 steps full copies of the parameters it is given);
- activations: the schedule's peak in-flight (stage, microbatch) pairs (replayed from the
  rank's action list: M for GPipe, N - rank for 1F1B) x the bytes one holds from its F to its
  backward: what autograd saves, its kept input and output, counted by running one microbatch
  through the stage (real tensors for a small stage on CPU; FakeTensorMode otherwise: shapes,
  dtypes and storages, no memory), the way the runtime's meter counts them (each storage
  once, parameters excluded); with checkpointing, what the checkpoint keeps (segment inputs
  and the output);
- peak: parameters + optimizer state + the largest sum, over the rank's actions in order, of
  activations held and gradients live (they appear at the stage's first backward), plus with
  checkpointing one segment's recompute during a backward. Replay of the rank's own action
  list, so GPipe's M held at once and 1F1B's N - rank both come out.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from harness import compat
from harness.model import get_model
from harness.model.checkpoint import CheckpointedStage
from harness.precision import Precision
from harness.schedules.ir import Kind


@dataclass(frozen=True)
class RankBytes:
    params: int
    grads: int
    optimizer: int
    activations: int
    peak: int

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "peak": self.peak}


@dataclass(frozen=True)
class StageActivations:
    kept: int  # bytes one (stage, microbatch) holds from its F to its backward
    recompute: int  # checkpointing: the largest segment's saved bytes, live during its backward


def stage_activations(plan, stage: int) -> StageActivations:
    return _stage_activations(_stage(plan, stage))


def _stage(plan, stage: int) -> "_Stage":
    c = plan.config
    a, b = plan.stage_layers[stage]
    return _Stage(c.model, a, b, stage == 0, stage == len(plan.stage_layers) - 1, c.dtype, c.microbatch_size,
                  c.microbatches, c.seed, c.checkpointing, c.checkpoint_every, plan.device)


@dataclass(frozen=True)
class _Stage:
    """What a stage's bytes depend on: a sweep's jobs that share it build and trace it once."""
    model: Any = field(compare=False)  # ModelConfig (unhashable); `model_key` stands for it
    a: int
    b: int
    first: bool
    last: bool
    dtype: str
    microbatch_size: int
    microbatches: int
    seed: int
    checkpointing: bool
    checkpoint_every: int
    device: str
    model_key: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_key", repr(self.model))


@functools.lru_cache(maxsize=1024)
def _stage_activations(st: _Stage) -> StageActivations:
    model = get_model(st.model)
    kept = _trace(model, st.a, st.b, st.first, st.last, st, st.checkpointing, st.device)
    recompute = 0
    if st.checkpointing:  # the largest segment's saved bytes, materialised while its backward runs
        size = st.checkpoint_every or (st.b - st.a)
        recompute = max(_trace(model, lo, min(st.b, lo + size), st.first and lo == st.a, False, st, False, st.device)
                        for lo in range(st.a, st.b, size))
    return StageActivations(kept, recompute)


REAL_TRACE_MAX_PARAMS = 64 * 2**20  # parameters a stage may have to be traced with real tensors on CPU


def _trace(model, a: int, b: int, first: bool, last: bool, c, checkpointing: bool, device: str) -> int:
    """Bytes one microbatch through layers [a, b) holds for its backward, counted as the
    runtime's meter counts them. Traced with real tensors where the run is on CPU and the stage
    is small (kernels then save exactly what the run's save: CPU attention saves other tensors
    than the math a fake trace picks), else under FakeTensorMode (no memory at any size)."""
    precision, B = Precision(c.dtype), c.microbatch_size
    with torch.device("meta"):
        numel = sum(p.numel() for p in model.build_layers(a, b, 0).parameters())
    fake = device != "cpu" or numel > REAL_TRACE_MAX_PARAMS
    default = torch.get_default_dtype()
    with compat.fake_tensors() if fake else contextlib.nullcontext():
        torch.set_default_dtype(precision.dtype)  # built in the dtype: .to() cannot convert fake parameters
        try:
            layers = model.build_layers(a, b, c.seed)
        finally:
            torch.set_default_dtype(default)
        params = {compat.storage_id(p) for p in layers.parameters()}
        held: dict[int, int] = {}

        def count(_key, t: torch.Tensor) -> None:
            if isinstance(t, torch.Tensor) and t.numel() and compat.storage_id(t) not in params:
                held[compat.storage_id(t)] = t.untyped_storage().nbytes()

        shape, in_dtype = model.input_shape(a, B)
        x = (torch.zeros(shape, dtype=in_dtype) if not in_dtype.is_floating_point
             else torch.zeros(shape, dtype=precision.dtype, requires_grad=not first))
        stage = CheckpointedStage(layers, c.checkpoint_every, count, lambda key, fn: fn) if checkpointing else layers
        _, targets = model.batch(c.seed, 0, B)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (count(None, t), t)[1], lambda t: t):
            y = stage(x, key=None) if checkpointing else stage(x)
            if last:
                y = model.loss(y.float(), targets) / c.microbatches
        if not first:
            count(None, x)
        count(None, y)
    return sum(held.values())


def _param_counts(plan) -> dict[int, list[int]]:
    """Stage -> the numel of each of its parameter tensors (built on the meta device)."""
    return {s: list(_numels(_stage(plan, s))) for s in range(len(plan.stage_layers))}


@functools.lru_cache(maxsize=1024)
def _numels(st: _Stage) -> tuple[int, ...]:
    with torch.device("meta"):
        return tuple(p.numel() for p in get_model(st.model).build_layers(st.a, st.b, 0).parameters())


def zero_shares(numels: list[int], dp: int) -> list[list[int]]:
    """torch's ZeroRedundancyOptimizer partition: largest first, each to the least loaded."""
    shares: list[list[int]] = [[] for _ in range(dp)]
    load = [0] * dp
    for n in sorted(numels, reverse=True):
        r = load.index(min(load))
        shares[r].append(n)
        load[r] += n
    return shares


def _optimizer_bytes(numels: list[int], all_numels: list[int], c, precision: Precision) -> int:
    """State of the parameters `numels` (this replica's ZeRO shard, or all), masters of all."""
    state = 4  # the optimizer steps fp32 (the masters in low precision, the parameters in fp32)
    o = c.optimizer
    if o.name == "adamw":
        per = 2 * state * sum(numels) + 4 * len(numels)  # two moments and a step counter per tensor
    else:
        per = state * sum(numels) if o.momentum > 0 else 0
    return per + (4 * sum(all_numels) if precision.master_weights else 0)


def theory_per_rank(plan) -> list[RankBytes]:
    """One RankBytes per global rank (replica * pp + pipeline rank)."""
    c = plan.config
    precision = Precision(c.dtype)
    numels = _param_counts(plan)
    out = []
    for g in range(plan.world):
        prank, replica = g % c.pp, g // c.pp
        mine = [s for s, r in plan.stage_rank.items() if r == prank]
        tensors = [n for s in mine for n in numels[s]]
        params = precision.bytes * sum(tensors)
        # ZeRO partitions each stage's DDP module's parameters across its replicas, the stages
        # of a rank together in one optimizer
        shard = zero_shares(tensors, c.dp)[replica] if c.zero else tensors
        optimizer = _optimizer_bytes(shard, tensors, c, precision)
        acts = {s: stage_activations(plan, s) for s in mine}
        held_peak, live_peak = _replay(plan.schedule[prank], acts, {s: precision.bytes * sum(numels[s]) for s in mine})
        out.append(RankBytes(params, params, optimizer, held_peak, params + optimizer + live_peak))
    return out


def _replay(actions, acts: dict[int, StageActivations], grads: dict[int, int]) -> tuple[int, int]:
    """(largest activations held, largest activations + gradients + recompute live) over the
    rank's actions in order. A (stage, microbatch) is held from its F to its B, or to its W
    for a split backward (what the deferred weight gradient keeps); a stage's gradients are
    live from its first backward on."""
    held = live_grads = held_peak = live_peak = 0
    grad_on: set[int] = set()
    for a in actions:
        s = a.stage
        if a.kind is Kind.F:
            held += acts[s].kept
        else:
            if a.kind in (Kind.B, Kind.I):
                live_peak = max(live_peak, held + live_grads + acts[s].recompute)
                if s not in grad_on:
                    grad_on.add(s)
                    live_grads += grads[s]
            if a.kind in (Kind.B, Kind.W):
                held -= acts[s].kept
        held_peak = max(held_peak, held)
        live_peak = max(live_peak, held + live_grads)
    return held_peak, live_peak
