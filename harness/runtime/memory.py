"""Activation memory meter: bytes held for a later backward, per rank, live over the step.

Counted: tensors autograd saves during a forward (saved_tensors_hooks) and tensors the
executor keeps (stage inputs and outputs, checkpoint segment inputs, what a deferred
weight gradient holds), each storage once, parameters excluded. A (stage, microbatch)'s
bytes are released when its backward (B, or W for split schedules) has run.
torch.cuda.max_memory_allocated is no help on CPU; this works on both.

Inside a timed action the meter only notes what it sees (`note`, with when), and counts it
once the action's event has closed (`count_noted`): the counting is the meter's
bookkeeping (~1 us a tensor), not the action's compute; between events it is runtime
overhead, as the meter's other bookkeeping already is.
"""

from __future__ import annotations

import time
from typing import Hashable

import torch

from harness.parallel.tensor import local
from harness.runtime.loop import storage_bytes


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


class MemoryMeter:
    def __init__(self, params: list[torch.Tensor]):
        self.param_storages = {local(p).untyped_storage().data_ptr() for p in params}  # tp > 1: the shards
        self.param_ids = {id(p) for p in params}  # autograd saves a layer's weight itself: no storage to look up
        self.held: dict[Hashable, dict[int, int]] = {}  # key -> {storage ptr: bytes}
        self.live = 0
        self.peak = 0
        self.grads = 0  # gradient bytes live now (set by the runner after each backward)
        self.peak_with_grads = 0  # the largest live + grads
        self.samples: list[tuple[int, int]] = []  # (perf_counter_ns, live bytes)
        self.noted: list[tuple[Hashable, torch.Tensor | None, int]] = []  # (key, tensor, ns): to count

    def note(self, key: Hashable, t: torch.Tensor | None) -> None:
        """`keep(key, t)`, as of now, deferred to the next `count_noted`: cheap enough for
        inside a timed action."""
        self.noted.append((key, t, time.perf_counter_ns()))

    def count_noted(self) -> None:
        """Every noted tensor kept, in the order noted, each sample at its noting time."""
        keep = self.keep  # bound once: an F notes every tensor autograd saved (tens a layer)
        for key, t, at in self.noted:
            keep(key, t, at)
        self.noted.clear()

    def keep(self, key: Hashable, t: torch.Tensor | None, at: int | None = None) -> None:
        """Count `t`'s storage under `key` (once), live from `at` (ns; default now)."""
        if type(t) is not torch.Tensor:  # a plain tensor (nearly every one) needs no unwrapping
            if not isinstance(t, torch.Tensor) or id(t) in self.param_ids:
                return
            t = local(t)  # tp > 1: what autograd saved of a DTensor is its local shard
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        held = self.held.get(key)
        if held is None:
            held = self.held[key] = {}
        if ptr in held or ptr in self.param_storages:
            return
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        held[ptr] = nbytes
        live = self.live = self.live + nbytes
        if live > self.peak:
            self.peak = live
        if live + self.grads > self.peak_with_grads:
            self.peak_with_grads = live + self.grads
        self.samples.append((time.perf_counter_ns() if at is None else at, live))

    def release(self, key: Hashable) -> None:
        self.live -= sum(self.held.pop(key, {}).values())
        self.samples.append((time.perf_counter_ns(), self.live))

    def transient(self, nbytes: int) -> None:
        """`nbytes` live for a moment on top of what is held and the gradients (a checkpointed
        backward's recompute, which the meter cannot see: it runs inside torch.utils.checkpoint)."""
        self.peak_with_grads = max(self.peak_with_grads, self.live + self.grads + nbytes)

    def set_grads(self, nbytes: int) -> None:
        self.grads = nbytes
        self.peak_with_grads = max(self.peak_with_grads, self.live + self.grads)

    def bytes_of(self, key: Hashable) -> int:
        return sum(self.held.get(key, {}).values())

    def saving(self, key: Hashable) -> torch.autograd.graph.saved_tensors_hooks:
        """A context within which every tensor autograd saves is noted under `key`
        (count_noted counts them). torch's own context, not wrapped in a generator: it is
        entered inside the timed F."""
        noted, clock = self.noted.append, time.perf_counter_ns  # bound once: pack runs per saved tensor

        def pack(t: torch.Tensor) -> torch.Tensor:
            noted((key, t, clock()))
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, _unpack)

    def reset_peak(self) -> None:
        self.peak = self.live
        self.peak_with_grads = self.live + self.grads
        self.samples.clear()


class GradientBytes:
    """The bytes of a rank's gradients (each storage once), kept per stage, so that after an
    action only its own stage's gradients are looked at, and summed again only when one of
    them is a new tensor (a first backward, a W's `p.grad = p.grad + g`): autograd adds into
    an existing .grad in place. Stages never share a gradient's storage (each is its own
    module, never tied across stages). Holds the gradients it summed: `clear` at the end of
    the step, before the optimizer frees them."""

    def __init__(self, params: dict[int, list[torch.Tensor]]):
        self.params = params  # stage -> its parameters
        self.summed: dict[int, tuple[list[torch.Tensor | None], int]] = {}  # stage -> (its grads, their bytes)
        self.total = 0

    def after(self, stage: int) -> int:
        """Every stage's gradient bytes, once `stage`'s may have changed."""
        grads = [p.grad for p in self.params[stage]]
        before = self.summed.get(stage)
        if before is not None and all(g is h for g, h in zip(grads, before[0])):
            return self.total
        nbytes = storage_bytes(grads)
        self.total += nbytes - (before[1] if before is not None else 0)
        self.summed[stage] = (grads, nbytes)
        return self.total

    def clear(self) -> None:
        self.summed.clear()
        self.total = 0
