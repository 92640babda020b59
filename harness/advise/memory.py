"""Per-rank memory of a search point: harness/memory_theory.py's accounting, composed per layer
so that 10k points do not trace 10k stages.

memory_theory.theory_per_rank(plan) traces every stage of a Plan (FakeTensorMode for large
ones) and replays each rank's actions. Here:
- each layer is traced once per (its kind and size, first/last, B, dtype, checkpointing), by
  memory_theory.stage_activations itself on a one-layer stage, and a stage's bytes are composed
  from its layers: without checkpointing the sum of its layers' held bytes less each inner
  boundary once (the tensor between two layers is the first one's output and the next one's
  input, one storage, which the meter counts once); with checkpointing each segment's input
  plus the stage's output (or, on the last stage, what the loss holds), and as the recompute
  the largest segment's held bytes;
- the replay of a rank's actions is done once per (schedule, pp, M, v, rank) symbolically: it
  keeps the in-flight counts per stage, which gradients are live and which recompute runs, and
  a point's peak is then the largest of those few states priced in its bytes;
- parameters, gradients, optimizer state (SGD, AdamW; fp32 masters in low precision; ZeRO-1's
  shards, largest tensor first to the least-loaded replica, as torch's ZeroRedundancyOptimizer)
  exactly as memory_theory counts them.
tests/test_advise.py checks the composition equals theory_per_rank(make_plan(...)) byte for byte.
"""

from __future__ import annotations

import dataclasses
import math
import types
from functools import lru_cache

import torch

from harness.config import Config
from harness.memory_theory import stage_activations, zero_shares
from harness.model import get_model
from harness.precision import Precision
from harness.schedules.ir import Kind


@dataclasses.dataclass(frozen=True)
class RankPeak:
    params: int
    grads: int
    optimizer: int
    activations: int
    peak: int
    rank: int  # pipeline rank of the fullest GPU

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("params", "grads", "optimizer", "activations", "peak", "rank")}


class LayerMemory:
    """The model's per-layer bytes: parameter tensors (meta device) and, per microbatch size and
    checkpointing, what each layer holds for its backward (traced once per kind of layer)."""

    def __init__(self, c: Config, device: str):
        self.c, self.device = c, device
        self.model = get_model(c.model)
        self.L = self.model.num_layers
        self.bytes = Precision(c.dtype).bytes
        self.master = Precision(c.dtype).master_weights
        with torch.device("meta"):
            self.numels = [tuple(p.numel() for p in self.model.build_layer(i).parameters()) for i in range(self.L)]
        self.params = [sum(n) for n in self.numels]
        self._singletons = tuple((i, i + 1) for i in range(self.L))
        self._layers: dict[tuple, tuple[int, int, int]] = {}  # (signature, B) -> traced bytes
        self._pairs: dict[tuple, int] = {}  # (signature of i - 1, of i, B) -> shared bytes

    def signature(self, i: int) -> tuple:
        return (self.model.kind(i), self.numels[i], i == 0, i == self.L - 1)

    def act_bytes(self, b: int) -> int:
        return self.bytes * math.prod(self.model.activation_shape(b))

    def in_bytes(self, i: int, b: int) -> int:
        shape, dtype = self.model.input_shape(i, b)
        item = self.bytes if dtype.is_floating_point else torch.empty((), dtype=dtype).element_size()
        return item * math.prod(shape)

    def _trace_layer(self, i: int, b: int) -> tuple[int, int, int]:
        """(held without checkpointing, held checkpointed alone, its recompute) of layer i at b."""
        base = dataclasses.replace(self.c, microbatch_size=b, checkpointing=False, checkpoint_every=0)
        plan = types.SimpleNamespace(config=base, stage_layers=self._singletons, device=self.device)
        plain = stage_activations(plan, i).kept
        plan.config = dataclasses.replace(base, checkpointing=True)
        ck = stage_activations(plan, i)
        return plain, ck.kept, ck.recompute

    def layer(self, i: int, b: int) -> tuple[int, int, int]:
        key = (self.signature(i), b)
        if key not in self._layers:
            self._layers[key] = self._trace_layer(i, b)
        return self._layers[key]

    def _trace_pair(self, i: int, b: int) -> int:
        """Bytes layers i - 1 and i hold twice when traced alone but once together (the tensor
        between them, and whatever else they share): T(i-1) + T(i) - T(i-1, i)."""
        c = dataclasses.replace(self.c, microbatch_size=b, checkpointing=False, checkpoint_every=0)
        bounds = tuple((j, j + 1) for j in range(i - 1)) + ((i - 1, i + 1),) + tuple((j, j + 1) for j in range(i + 1, self.L))
        plan = types.SimpleNamespace(config=c, stage_layers=bounds, device=self.device)
        return self.layer(i - 1, b)[0] + self.layer(i, b)[0] - stage_activations(plan, i - 1).kept

    def shared(self, i: int, b: int) -> int:
        """Bytes counted by both layer i - 1 and layer i alone, once in a stage holding both."""
        key = (self.signature(i - 1), self.signature(i), b)
        if key not in self._pairs:
            self._pairs[key] = self._trace_pair(i, b)
        return self._pairs[key]

    def warm(self, b: int) -> None:
        """Every trace a stage at microbatch size b can need (so forked searchers inherit them)."""
        for i in range(self.L):
            self.layer(i, b)
            if i:
                self.shared(i, b)

    def _held(self, a: int, e: int, b: int, col: int) -> int:
        return sum(self.layer(i, b)[col] for i in range(a, e)) - sum(self.shared(i, b) for i in range(a + 1, e))

    def stage(self, a: int, e: int, b: int, checkpointing: bool, every: int = 0) -> tuple[int, int]:
        """(bytes one microbatch holds from its F to its backward, recompute bytes) of layers [a, e)."""
        boundary = self.act_bytes(b)
        if not checkpointing:
            return self._held(a, e, b, 0), 0
        size = every or (e - a)
        starts = range(a, e, size)
        kept = sum(self.in_bytes(lo, b) for lo in starts)
        if e == self.L:  # the loss's held bytes and the loss itself, measured on the head alone
            kept += self.layer(self.L - 1, b)[1] - self.in_bytes(self.L - 1, b)
        else:
            kept += boundary
        recompute = max(self._held(lo, min(e, lo + size), b, 2) for lo in starts)
        return kept, recompute


@lru_cache(maxsize=256)
def replay_all(name: str, pp: int, m: int, v: int) -> tuple:
    """replay_states of every rank of one schedule (built once)."""
    from .fastsim import built

    schedule = built(name, pp, m, v)
    return tuple(replay_states(schedule[r]) for r in range(pp))


def replay_states(acts: list) -> tuple[tuple[int, ...], tuple, tuple]:
    """A rank's actions replayed as memory_theory._replay does, in counts: (its stages, the
    held-count vectors it passes through, the live states (held counts, live-gradient mask,
    recompute stage or -1)), each pruned to the states no other state dominates (the prices,
    bytes per stage, are never negative, so a dominated state is never the peak)."""
    stages = tuple(sorted({a.stage for a in acts}))
    pos = {s: j for j, s in enumerate(stages)}
    held = [0] * len(stages)
    mask = 0
    helds: set[tuple[int, ...]] = set()
    lives: set[tuple[tuple[int, ...], int, int]] = set()
    for a in acts:
        j = pos[a.stage]
        if a.kind is Kind.F:
            held[j] += 1
        else:
            if a.kind in (Kind.B, Kind.I):
                lives.add((tuple(held), mask, j))
                mask |= 1 << j
            if a.kind in (Kind.B, Kind.W):
                held[j] -= 1
        h = tuple(held)
        helds.add(h)
        lives.add((h, mask, -1))
    return stages, tuple(_maximal(helds)), tuple(_prune_live(lives))


def _maximal(vectors) -> list[tuple[int, ...]]:
    """The vectors no other one dominates (component-wise <=)."""
    out: list[tuple[int, ...]] = []
    for x in sorted(set(vectors), key=sum, reverse=True):
        if not any(all(a <= b for a, b in zip(x, y)) for y in out):
            out.append(x)
    return out


def _prune_live(states: set) -> list:
    """Per (live-gradient mask, recompute stage): the maximal held vectors; then a state is also
    dominated by one with a superset mask and the same recompute (or none needed)."""
    groups: dict[tuple[int, int], list] = {}
    for h, mask, rc in states:
        groups.setdefault((mask, rc), []).append(h)
    out = [(h, mask, rc) for (mask, rc), hs in groups.items() for h in _maximal(hs)]
    kept = []
    for x in sorted(out, key=lambda t: (sum(t[0]), bin(t[1]).count("1"), t[2] >= 0), reverse=True):
        if not any(all(a <= b for a, b in zip(x[0], y[0])) and (x[1] & ~y[1]) == 0 and (x[2] < 0 or x[2] == y[2])
                   for y in kept):
            kept.append(x)
    return kept


def optimizer_bytes(shard: list[int], all_numels: list[int], c: Config) -> int:
    """memory_theory._optimizer_bytes: AdamW two fp32 moments and a step per tensor, SGD a
    momentum buffer when momentum > 0; fp32 masters of every parameter in low precision."""
    o = c.optimizer
    if o.name == "adamw":
        per = 8 * sum(shard) + 4 * len(shard)
    else:
        per = 4 * sum(shard) if o.momentum > 0 else 0
    return per + (4 * sum(all_numels) if Precision(c.dtype).master_weights else 0)


def peak_per_gpu(mem: LayerMemory, name: str, pp: int, m: int, v: int, dp: int, zero: int,
                 bounds: tuple[tuple[int, int], ...], b: int, checkpointing: bool, every: int = 0) -> RankPeak:
    """The fullest GPU of the point: parameters + optimizer + the largest live activations and
    gradients over its actions (memory_theory.theory_per_rank's peak), max over ranks and replicas."""
    acts = [mem.stage(a, e, b, checkpointing, every) for a, e in bounds]
    grads = [mem.bytes * sum(mem.params[a:e]) for a, e in bounds]
    best: RankPeak | None = None
    states = replay_all(name, pp, m, v)
    for r in range(pp):
        stages, helds, lives = states[r]
        tensors = [n for s in stages for i in range(*bounds[s]) for n in mem.numels[i]]
        params = mem.bytes * sum(tensors)
        if zero and dp > 1:
            opt = max(optimizer_bytes(sh, tensors, mem.c) for sh in zero_shares(tensors, dp))
        else:
            opt = optimizer_bytes(tensors, tensors, mem.c)
        kept = [acts[s][0] for s in stages]
        held = max(sum(n * k for n, k in zip(h, kept)) for h in helds)
        live = 0
        for h, mask, rc in lives:
            x = sum(n * k for n, k in zip(h, kept))
            x += sum(grads[s] for j, s in enumerate(stages) if mask >> j & 1)
            if rc >= 0:
                x += acts[stages[rc]][1]
            live = max(live, x)
        peak = params + opt + live
        if best is None or peak > best.peak:
            best = RankPeak(params, params, opt, held, peak, r)
    assert best is not None
    return best
