"""The one memory model: every byte a pipeline rank holds, from the plan alone: parameters,
gradients, optimizer state, activations held for backward, and the transient peak. A run's
record holds it beside what its ranks measured; executor=sim and the planner (harness.advise)
price their points with it.

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
- activations: the bytes one (stage, microbatch) holds from its F to its backward (what
  autograd saves, its kept input and output, counted the way the runtime's meter counts them:
  each storage once, parameters excluded; with checkpointing, what the checkpoint keeps:
  segment inputs and the output) x the rank's in-flight counts, replayed from its actions
  (M for GPipe, N - rank for 1F1B); where the backward is split (zero-bubble schedules), a
  microbatch between its I and its W holds only what its deferred W keeps (each split
  linear's input and output gradient, traced by running the layer's F and I);
- peak: parameters + optimizer state + the largest sum, over the rank's actions in order, of
  activations held and gradients live (they appear at the stage's first backward; split, its
  split linears' at its first W), plus with checkpointing the stage's largest segment's
  recompute during each of its backwards (B or I).

A stage's activations are composed from its layers (LayerMemory): each distinct layer (its
kind, structure and sizes, first or last) is traced once per microbatch size, running one
microbatch through it (real tensors for a small layer on CPU, FakeTensorMode otherwise:
shapes, dtypes and storages, no memory); a stage holds the sum of its layers' bytes less each
inner boundary once (the tensor between two layers is one storage, which the meter counts
once), measured on the pair. So 10k planner points do not trace 10k stages; `trace_stage`, the
primitive, traces a whole stage too (tests/test_advise.py checks the composition against it).
At tp > 1 the same, where each of a stage's layers is split in it as it is alone and beside
either neighbour (fake_tp.split_key: gpt's and hf's plans are per layer kind): the layer's key
adds its split, and its traces are TP rank 0's of the layer split alone (tests/test_tp_memory.py
checks the composition against the whole split stage's trace); a stage whose layers' splits
depend on it (model=mlp's column/row pairs) is traced whole.
The replay is symbolic, once per rank's action list: the states it passes through, each priced
in its bytes.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from harness.runtime import compat
from harness.config import DTYPE_BYTES, Config
from harness.model.built import BuiltModel
from harness.model.checkpoint import CheckpointedStage
from harness.parallel.tensor import activation_shape, local
from harness.planning.fake_tp import split_key, split_stage, stage_input_shape, stage_tensors
from harness.runtime.precision import DTYPES
from harness.schedules.ir import Action, Kind


@dataclass(frozen=True)
class RankBytes:
    params: int
    grads: int
    optimizer: int
    activations: int  # the largest held at once
    peak: int

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "peak": self.peak}


@dataclass(frozen=True)
class StageActivations:
    kept: int  # bytes one (stage, microbatch) holds from its F to its backward (to its I when split)
    recompute: int  # checkpointing: the largest segment's saved bytes, live during its backward
    deferred: int = 0  # split backward: what its deferred W keeps from its I to its W
    # split backward: the gradient bytes only its W writes (its split linears' weights and biases;
    # the I writes the other parameters'): absent until the stage's first W
    deferred_grads: int = 0


# -- tracing ----------------------------------------------------------------------------------------
REAL_TRACE_MAX_PARAMS = 64 * 2**20  # parameters a stage may have to be traced with real tensors on CPU
REAL_TRACE_MAX_INPUT = 16 * 2**20  # and elements of its input (executor=sim, which allocates nothing, may plan any B)


def trace_stage(model: BuiltModel, a: int, b: int, first: bool, last: bool, dtype: str, microbatch_size: int,
                checkpointing: bool, every: int, device: str, tp: int = 1, sequence_parallel: bool = False
                ) -> StageActivations:
    """What layers [a, b) hold for one microbatch's backward, as a stage: the primitive the
    composition is built from (cached: a sweep's jobs and the planner's points share it).
    tp > 1: as TP rank 0 of the stage split by the model's tp_plan (harness/planning/fake_tp.py)."""
    return _trace_stage(_Key(model, a, b, first, last, dtype, microbatch_size, checkpointing, every, device, tp,
                             sequence_parallel, a, b))


@dataclass(frozen=True)
class _Key:
    model: BuiltModel  # compared by its config: `model_key`
    a: int
    b: int
    first: bool
    last: bool
    dtype: str
    microbatch_size: int
    checkpointing: bool
    every: int
    device: str
    tp: int = 1
    sequence_parallel: bool = False
    sa: int = 0  # tp > 1: the stage [sa, se) whose TP plan splits layers [a, b)
    se: int = 0

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self._tuple() == other._tuple()

    def _tuple(self) -> tuple:
        return (repr(self.model.config),) + tuple(getattr(self, f) for f in
                                                  ("a", "b", "first", "last", "dtype", "microbatch_size",
                                                   "checkpointing", "every", "device", "tp",
                                                   "sequence_parallel", "sa", "se"))


@functools.lru_cache(maxsize=4096)
def _trace_stage(k: _Key) -> StageActivations:
    kept = _trace(k.model, k.a, k.b, k.first, k.last, k, k.checkpointing)
    recompute = 0
    if k.checkpointing:  # the largest segment's saved bytes, materialised while its backward runs
        size = k.every or (k.b - k.a)
        recompute = max(_trace(k.model, lo, min(k.b, lo + size), k.first and lo == k.a, False, k, False)
                        for lo in range(k.a, k.b, size))
    return StageActivations(kept, recompute)


def _fake(built: BuiltModel, a: int, b: int, shape: tuple, device: str) -> bool:
    """Whether layers [a, b) are traced with fake tensors: off CPU, or too large to allocate."""
    numel = sum(built.layer_params[a:b]) if built.numels is not None else REAL_TRACE_MAX_PARAMS + 1
    return device != "cpu" or numel > REAL_TRACE_MAX_PARAMS or math.prod(shape) > REAL_TRACE_MAX_INPUT


def _trace(built: BuiltModel, a: int, b: int, first: bool, last: bool, k: _Key, checkpointing: bool) -> int:
    """Bytes one microbatch through layers [a, b) holds for its backward, counted as the
    runtime's meter counts them. Traced with real tensors where the run is on CPU and the stage
    is small (kernels then save exactly what the run's save: CPU attention saves other tensors
    than the math a fake trace picks), else under FakeTensorMode (no memory at any size)."""
    model, B = built.model, k.microbatch_size
    dtype = DTYPES[k.dtype]
    shape, in_dtype = model.input_shape(a, B)
    fake = _fake(built, a, b, shape, k.device)
    default = torch.get_default_dtype()
    with compat.fake_tensors() if fake else contextlib.nullcontext():
        if k.tp > 1:  # the run's split stage, and the input it hands layer a
            layers, x = split_stage(built, a, b, k.sa, k.se, B, dtype, k.tp, k.sequence_parallel, first)
        else:
            torch.set_default_dtype(dtype)  # built in the dtype: .to() cannot convert fake parameters
            try:
                layers = model.build_layers(a, b, 0)
            finally:
                torch.set_default_dtype(default)
            x = (torch.zeros(shape, dtype=in_dtype) if not in_dtype.is_floating_point
                 else torch.zeros(shape, dtype=dtype, requires_grad=not first))
        params = {compat.storage_id(local(p)) for p in layers.parameters()}  # tp > 1: the rank's shards
        held: dict[int, int] = {}

        def count(_key: Any, t: torch.Tensor) -> None:
            t = local(t)  # tp > 1: as the runtime's meter counts a DTensor (its shard) or a collective's output
            if isinstance(t, torch.Tensor) and t.numel() and compat.storage_id(t) not in params:
                held[compat.storage_id(t)] = t.untyped_storage().nbytes()

        stage = CheckpointedStage(layers, k.every, count, lambda key, fn: fn) if checkpointing else layers
        # a copy, as the runtime's loader gives (at B=1 the model's contiguous() targets may be a view
        # of its [B, seq + 1] ids, whose storage the loss would save: 8 bytes more)
        targets = model.batch(0, 0, B)[1].clone()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (count(None, t), t)[1], lambda t: t):
            y = stage(x, key=None) if checkpointing else stage(x)
            if last:  # the runtime keeps loss / M, a scalar of its own (the loss is a view of its reduction's buffer)
                y = model.loss(y.float(), targets) / 1.0
        if not first:
            count(None, x)
        count(None, y)
    return sum(held.values())


def _trace_deferred(built: BuiltModel, i: int, dtype: str, b: int, device: str, tp: int = 1,
                    sequence_parallel: bool = False, stage: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """Bytes layer i's deferred weight gradient keeps from its I to its W, for one microbatch,
    and the bytes of the gradients its W writes (the parameters the I left without .grad):
    what the runtime's store holds (harness/model/split_linear.py: each split linear's input
    and output gradient, each storage once), traced by running the layer's F and I as the
    runtime does, with real tensors where _trace would use them, else fakes. tp > 1: layer i
    as `stage` splits it, TP rank 0's shards (a column-parallel linear keeps its whole input,
    gathered under sequence parallelism, a row-parallel one its shard and the whole gradient)."""
    from harness.model.split_linear import WeightGradStore, attach_store, to_split_linear

    model = built.model
    first, last = i == 0, i == built.num_layers - 1
    shape, in_dtype = model.input_shape(i, b)
    fake = _fake(built, i, i + 1, shape, device)
    default = torch.get_default_dtype()
    with compat.fake_tensors() if fake else contextlib.nullcontext():
        if tp > 1:  # split as the run splits it, before the store is attached (as the runtime does)
            layers, x = split_stage(built, i, i + 1, *stage, b, DTYPES[dtype], tp, sequence_parallel, first)
        else:
            torch.set_default_dtype(DTYPES[dtype])
            try:
                layers = model.build_layers(i, i + 1, 0)
            finally:
                torch.set_default_dtype(default)
            x = (torch.zeros(shape, dtype=in_dtype) if not in_dtype.is_floating_point
                 else torch.zeros(shape, dtype=DTYPES[dtype], requires_grad=not first))
        to_split_linear(layers)
        store = WeightGradStore()
        attach_store(layers, store)
        params = {compat.storage_id(local(p)) for p in layers.parameters()}
        with store.defer("mb"):
            y = layers(x)
            if last:
                y = model.loss(y.float(), model.batch(0, 0, b)[1])
            if not y.requires_grad:  # nothing here has a gradient (no parameters, no input gradient)
                return 0, 0
            torch.autograd.backward(y, grad_tensors=None if last else torch.ones_like(y))
        kept = [local(t) for t in store.holding("mb")]
        held = {compat.storage_id(t): t.untyped_storage().nbytes() for t in kept
                if isinstance(t, torch.Tensor) and t.numel() and compat.storage_id(t) not in params}
        # each .grad is its parameter's size (tp > 1: its local shard's), each storage once
        later = {compat.storage_id(local(p)): local(p).untyped_storage().nbytes() for p in layers.parameters()
                 if p.requires_grad and p.grad is None and p.numel()}
    return sum(held.values()), sum(later.values())


# -- a stage's bytes, composed per layer ------------------------------------------------------------
class LayerMemory:
    """The model's per-layer bytes in one dtype on one device: parameter tensors (BuiltModel's,
    on the meta device) and, per microbatch size, what each layer holds for its backward
    (traced once per distinct layer) and what neighbours share.

    tp > 1 (`at`): TP rank 0's bytes (harness/planning/fake_tp.py), composed per layer as at
    tp=1 where the stage splits each of its layers as the layer alone is split (`composable`),
    else traced whole as the run splits the stage (model=mlp pairs a stage's layers from its
    first): its activations, and its parameter tensors as the split stage's local shards."""

    def __init__(self, model: BuiltModel, dtype: str, device: str, tp: int = 1, sequence_parallel: bool = False):
        if model.numels is None:
            raise ValueError("the model's layers cannot be built on the meta device: no per-layer memory")
        self.model, self.dtype, self.device = model, dtype, device
        self.tp, self.sequence_parallel = tp, sequence_parallel
        self.L = model.num_layers
        self.itemsize = DTYPE_BYTES[dtype]
        self.numels = model.numels
        self.params = model.layer_params
        self._singletons = [(i, i + 1) for i in range(self.L)]
        self._layers: dict[tuple, StageActivations] = {}  # (signature, B, checkpointed) -> traced bytes
        self._pairs: dict[tuple, int] = {}  # (signature of i - 1, of i, B) -> shared bytes
        self._deferred: dict[tuple, tuple[int, int]] = {}  # (signature, B) -> (what its W keeps, grads it writes)
        self._tensors: dict[tuple, tuple[int, ...]] = {}  # tp > 1: signature -> its split tensors' elements
        self._splits: dict[tuple[int, int, int], Any] = {}  # tp > 1: (layer, stage) -> fake_tp.split_key
        self._composable: dict[tuple[int, int], bool] = {}  # tp > 1: stage -> composable

    def signature(self, i: int) -> tuple:
        """What a layer's bytes depend on: its kind, structure and sizes, whether it is the
        first (no input gradient) or the last (the loss), and at tp > 1 its split alone."""
        own = (self.model.kinds[i], self.model.structures[i], self.numels[i], i == 0, i == self.L - 1)
        return own if self.tp == 1 else own + (self._split(i, i, i + 1),)

    def _split(self, i: int, a: int, e: int) -> Any:
        """Layer i's split in stage [a, e) (tp > 1), by value."""
        key = (i, a, e)
        if key not in self._splits:
            self._splits[key] = split_key(self.model, i, self.tp, self.sequence_parallel, range(a, e))
        return self._splits[key]

    def composable(self, a: int, e: int) -> bool:
        """Whether stage [a, e)'s bytes compose from its layers' (always at tp=1): at tp > 1, each
        layer is split in the stage, and in each pair with a neighbour there (what `shared`
        traces), as it is alone; so each takes and gives what it does alone, and holds its bytes."""
        if self.tp == 1:
            return True
        if (a, e) not in self._composable:
            alone = [self._split(i, i, i + 1) for i in range(a, e)]
            self._composable[(a, e)] = (
                all(self._split(i, a, e) == alone[i - a] for i in range(a, e))
                and all(self._split(i - 1, i - 1, i + 1) == alone[i - 1 - a]
                        and self._split(i, i - 1, i + 1) == alone[i - a] for i in range(a + 1, e)))
        return self._composable[(a, e)]

    def at(self, tp: int, sequence_parallel: bool) -> LayerMemory:
        """This model's memory at TP degree `tp` (with or without sequence parallelism)."""
        if (tp, sequence_parallel) == (self.tp, self.sequence_parallel):
            return self
        return layer_memory(self.model, self.dtype, self.device, tp, sequence_parallel)

    def tensors(self, a: int, e: int) -> list[int]:
        """Elements of each parameter tensor stage [a, e) holds (tp > 1: TP rank 0's shards)."""
        if self.tp == 1:
            return [n for i in range(a, e) for n in self.numels[i]]
        if not self.composable(a, e):
            return list(stage_tensors(self.model, a, e, self.tp, self.sequence_parallel))
        out: list[int] = []
        for i in range(a, e):
            key = self.signature(i)
            if key not in self._tensors:
                self._tensors[key] = stage_tensors(self.model, i, i + 1, self.tp, self.sequence_parallel)
            out += self._tensors[key]
        return out

    def act_bytes(self, b: int) -> int:
        """One message between stages: the activation, in dtype (tp > 1: a TP rank's)."""
        return self.itemsize * math.prod(activation_shape(self.model.model, b, self.tp, self.sequence_parallel))

    def in_bytes(self, i: int, b: int) -> int:
        """What layer i takes at b (tp > 1: a TP rank's, its sequence shard under sequence parallelism)."""
        _, dtype = self.model.model.input_shape(i, b)
        shape = stage_input_shape(self.model, i, b, self.tp, self.sequence_parallel)
        item = self.itemsize if dtype.is_floating_point else torch.empty((), dtype=dtype).element_size()
        return item * math.prod(shape)

    def _trace(self, a: int, e: int, b: int, checkpointing: bool) -> StageActivations:
        return trace_stage(self.model, a, e, a == 0, e == self.L, self.dtype, b, checkpointing, 0, self.device,
                           self.tp, self.sequence_parallel)

    def layer(self, i: int, b: int, checkpointed: bool = False) -> StageActivations:
        """What layer i holds at b (kept, and recompute when checkpointed) as a stage of its own."""
        key = (self.signature(i), b, checkpointed)
        if key not in self._layers:
            self._layers[key] = self._trace(i, i + 1, b, checkpointed)
        return self._layers[key]

    def shared(self, i: int, b: int) -> int:
        """Bytes counted by both layer i - 1 and layer i alone, once in a stage holding both
        (the tensor between them, and whatever else they share): T(i-1) + T(i) - T(i-1, i).
        Only for a composable pair (the key holds each layer's split alone)."""
        key = (self.signature(i - 1), self.signature(i), b)
        if key not in self._pairs:
            both = self._trace(i - 1, i + 1, b, False).kept
            self._pairs[key] = self.layer(i - 1, b).kept + self.layer(i, b).kept - both
        return self._pairs[key]

    def warm(self, b: int, split: bool = False) -> None:
        """Every trace a composable stage at microbatch size b can need (so forked searchers
        inherit them), and with `split` what each layer's deferred W keeps."""
        for i in range(self.L):
            self.layer(i, b)
            self.layer(i, b, checkpointed=True)
            if i and self.composable(i - 1, i + 1):
                self.shared(i, b)
        if split and self.composable(0, self.L):
            self.deferred(0, self.L, b)

    def _held(self, a: int, e: int, b: int, recompute: bool = False) -> int:
        """Layers [a, e) at b without checkpointing: their bytes less each inner boundary once;
        with `recompute`, what their checkpointed recompute materialises (the same, counted as
        a checkpointed layer's recompute is)."""
        held = (self.layer(i, b, True).recompute if recompute else self.layer(i, b).kept for i in range(a, e))
        return sum(held) - sum(self.shared(i, b) for i in range(a + 1, e))

    def _deferred_layer(self, i: int, a: int, e: int, b: int) -> tuple[int, int]:
        """Layer i of stage [a, e) at b: what its deferred W keeps, and the gradient bytes it writes."""
        alike = self.composable(a, e)  # else split as its stage splits it
        key = (self.signature(i), b) if alike else (i, a, e, b)
        if key not in self._deferred:
            self._deferred[key] = _trace_deferred(self.model, i, self.dtype, b, self.device, self.tp,
                                                  self.sequence_parallel, (i, i + 1) if alike else (a, e))
        return self._deferred[key]

    def deferred(self, a: int, e: int, b: int) -> int:
        """What one microbatch's deferred W keeps for layers [a, e): the sum of the layers' (each
        holds its own split linears' inputs and output gradients; no storage is shared across a
        boundary), with or without checkpointing (an I recomputes what its W will need)."""
        return sum(self._deferred_layer(i, a, e, b)[0] for i in range(a, e))

    def deferred_grads(self, a: int, e: int, b: int) -> int:
        """The gradient bytes of layers [a, e) that only a W writes (its split linears')."""
        return sum(self._deferred_layer(i, a, e, b)[1] for i in range(a, e))

    def stage(self, a: int, e: int, b: int, checkpointing: bool, every: int = 0, split: bool = False
              ) -> StageActivations:
        """What one microbatch through layers [a, e) holds from its F to its backward, its
        recompute with checkpointing (segments of `every` layers; 0: the whole stage), and with
        a `split` backward what its deferred W keeps from the I on."""
        if split:
            whole = self.stage(a, e, b, checkpointing, every)
            return StageActivations(whole.kept, whole.recompute, self.deferred(a, e, b), self.deferred_grads(a, e, b))
        if not self.composable(a, e):  # traced whole: its layers' splits depend on the stage
            return trace_stage(self.model, a, e, a == 0, e == self.L, self.dtype, b, checkpointing, every,
                               self.device, self.tp, self.sequence_parallel)
        if not checkpointing:
            return StageActivations(self._held(a, e, b), 0)
        size = every or (e - a)
        starts = range(a, e, size)
        kept = sum(self.in_bytes(lo, b) for lo in starts)
        if e == self.L:  # the loss's held bytes and the loss itself, measured on the head alone
            kept += self.layer(self.L - 1, b, True).kept - self.in_bytes(self.L - 1, b)
        else:
            kept += self.act_bytes(b)
        recompute = max(self._held(lo, min(e, lo + size), b, recompute=True) for lo in starts)
        return StageActivations(kept, recompute)


@functools.lru_cache(maxsize=64)
def layer_memory(model: BuiltModel, dtype: str, device: str, tp: int = 1, sequence_parallel: bool = False
                 ) -> LayerMemory:
    """One LayerMemory per built model, dtype, tracing device and TP degree (its traces are kept)."""
    return LayerMemory(model, dtype, device, tp, sequence_parallel)


# -- the replay -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Replay:
    """A rank's actions replayed in counts: its stages, the held-count vectors it passes
    through, and the live states (held counts, live-gradient mask: bit j the gradients stage j's
    B or I writes, bit S + j those only its W writes; recompute stage or -1),
    each pruned to the states no other dominates (bytes per stage are never negative, so a
    dominated state is never the peak)."""
    stages: tuple[int, ...]
    helds: tuple[tuple[int, ...], ...]
    lives: tuple[tuple[tuple[int, ...], int, int], ...]
    split: bool  # some backward is split into I and W


def replay(actions: list[Action]) -> Replay:
    """A (stage, microbatch) is held whole from its F to its B or I, and from an I to its W
    in what the deferred weight gradient keeps (the held vector: whole counts per stage, then
    deferred counts per stage); a stage's gradients are live from its first B on, or split:
    from its first I those of the parameters outside its split linears, from its first W the
    split linears' (their .grad is first written by the W: torch holds nothing for them before);
    a checkpointed segment's recompute is live during a backward (B or I: the W recomputes nothing)."""
    stages = tuple(sorted({a.stage for a in actions}))
    pos = {s: j for j, s in enumerate(stages)}
    S = len(stages)
    held = [0] * (2 * S)
    mask = 0
    helds: set[tuple[int, ...]] = set()
    lives: set[tuple[tuple[int, ...], int, int]] = set()
    F, I, W = Kind.F, Kind.I, Kind.W  # noqa: E741
    for p, (stage, kind, _) in enumerate(actions):
        j = pos[stage]
        if kind is F:
            held[j] += 1
        elif kind is W:
            held[S + j] -= 1
            mask |= 1 << (S + j)
        else:
            lives.add((tuple(held), mask, j))
            mask |= (1 << j) if kind is I else (1 << j) | (1 << (S + j))
            held[j] -= 1
            if kind is I:
                held[S + j] += 1
        # a state an F follows is below the next one (more held, the same gradients): only the
        # others can be a peak
        if p + 1 == len(actions) or actions[p + 1].kind is not F:
            h = tuple(held)
            helds.add(h)
            lives.add((h, mask, -1))
    return Replay(stages, tuple(_maximal(helds)), tuple(_prune_live(lives)), any(a.kind is I for a in actions))


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


# -- the optimizer ----------------------------------------------------------------------------------
def zero_shares(numels: list[int], dp: int) -> list[list[int]]:
    """torch's ZeroRedundancyOptimizer partition: largest first, each to the least loaded."""
    shares: list[list[int]] = [[] for _ in range(dp)]
    load = [0] * dp
    for n in sorted(numels, reverse=True):
        r = load.index(min(load))
        shares[r].append(n)
        load[r] += n
    return shares


def optimizer_bytes(shard: list[int], tensors: list[int], c: Config) -> int:
    """State of the parameter tensors `shard` (this replica's ZeRO shard, or all of `tensors`),
    and the fp32 masters of all of them in low precision. The optimizer steps fp32: AdamW keeps
    two moments and a step counter per tensor, SGD a momentum buffer when momentum > 0."""
    if c.optimizer.name == "adamw":
        per = 8 * sum(shard) + 4 * len(shard)
    else:
        per = 4 * sum(shard) if getattr(c.optimizer, "momentum", 0.0) > 0 else 0
    return per + (4 * sum(tensors) if c.dtype != "fp32" else 0)


# -- a rank's bytes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """What a rank's bytes depend on beyond the model: the plan's stages and its ranks' replays."""
    stage_layers: tuple[tuple[int, int], ...]  # [stage] (first layer, end layer)
    replays: tuple[Replay, ...]  # [pipeline rank] its actions replayed (a plan's `replays`)


def rank_bytes(mem: LayerMemory, c: Config, layout: Layout, prank: int,
               acts: list[StageActivations]) -> list[RankBytes]:
    """[replica] the bytes of pipeline rank `prank` (replicas differ only in their ZeRO shard)."""
    r = layout.replays[prank]
    per_stage = {s: mem.tensors(*layout.stage_layers[s]) for s in r.stages}  # tp > 1: the local shards
    tensors = [n for s in r.stages for n in per_stage[s]]
    params = mem.itemsize * sum(tensors)
    grads = {s: mem.itemsize * sum(t) for s, t in per_stage.items()}  # this rank's stages only
    kept = [acts[s].kept for s in r.stages] + [acts[s].deferred for s in r.stages]
    held = max(sum(n * k for n, k in zip(h, kept)) for h in r.helds)
    # [mask bit] gradient bytes: what a stage's B or I writes, then what only its W writes
    parts = [grads[s] - acts[s].deferred_grads for s in r.stages] + [acts[s].deferred_grads for s in r.stages]
    live = 0
    for h, mask, rc in r.lives:
        x = sum(n * k for n, k in zip(h, kept)) + sum(g for j, g in enumerate(parts) if mask >> j & 1)
        if rc >= 0:
            x += acts[r.stages[rc]].recompute
        live = max(live, x)
    if not c.zero:  # a split parameter's gradient is its shard, as the parameter
        opt = optimizer_bytes(tensors, tensors, c)
        return [RankBytes(params, params, opt, held, params + opt + live)] * c.dp
    return [RankBytes(params, params, opt, held, params + opt + live)
            for opt in (optimizer_bytes(sh, tensors, c) for sh in zero_shares(tensors, c.dp))]


def stage_activations(mem: LayerMemory, c: Config, stage_layers: tuple[tuple[int, int], ...], split: bool = False
                      ) -> list[StageActivations]:
    """[stage] what one of its microbatches holds, at the config's microbatch size (and with a
    `split` backward, what its deferred W keeps)."""
    return [mem.stage(a, e, c.microbatch_size, c.checkpointing, c.checkpoint_every, split) for a, e in stage_layers]


def theory_per_rank(plan) -> list[RankBytes]:
    """One RankBytes per global rank (replica * pp + pipeline rank) of a Plan; tp > 1: TP rank 0's
    of each TP group (the rank a run's records measure)."""
    c = plan.config
    mem = plan.memory().at(c.tp, c.sequence_parallel)
    layout = Layout(plan.stage_layers, plan.replays)
    acts = stage_activations(mem, c, plan.stage_layers, any(r.split for r in plan.replays))
    per_rank = [rank_bytes(mem, c, layout, p, acts) for p in range(c.pp)]
    return [per_rank[g % c.pp][g // c.pp] for g in range(c.pp * c.dp)]


def fullest(mem: LayerMemory, c: Config, layout: Layout, tp: int | None = None,
            sequence_parallel: bool | None = None) -> tuple[RankBytes, int]:
    """The fullest GPU of a plan and its pipeline rank: theory_per_rank's largest peak, without
    listing every replica (the planner's question), at TP degree `tp` with or without
    `sequence_parallel` (default: c's), whatever TP degree `mem` was made for."""
    mem = mem.at(c.tp if tp is None else tp, c.sequence_parallel if sequence_parallel is None else sequence_parallel)
    acts = stage_activations(mem, c, layout.stage_layers, any(r.split for r in layout.replays))
    best, where = None, 0
    for p in range(c.pp):
        top = max(rank_bytes(mem, c, layout, p, acts), key=lambda x: x.peak)
        if best is None or top.peak > best.peak:
            best, where = top, p
    assert best is not None
    return best, where
