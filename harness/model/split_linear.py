"""Linear layers whose weight gradient can be deferred: the zero-bubble split of a
backward into I (input gradient, needed by the previous stage now) and W (weight
gradient, any time before the optimizer). Qi et al. 2024, arXiv 2401.10241, sec. 2;
Megatron-LM's WeightGradStore does the same.

With no store attached, or a store not deferring, the backward is a plain Linear's. Within
`defer(None)` (a microbatch whose backward is a full B) the layer records nn.Linear's own
graph: the deferrable one is a Python autograd Function, whose forward and backward cost
~5 us a layer each way in Python, for nothing to defer.
Other parameters (none in mlp) get their gradients in I, as in Megatron.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Hashable

import torch
import torch.nn.functional as F
from torch import nn


class WeightGradStore:
    """Deferred weight-gradient work, queued under the key of the backward that made it."""

    def __init__(self) -> None:
        self.deferring: Hashable | None = None  # key while an I runs (set by defer); None: dW at once
        self.whole = False  # within defer(None): SplitLinear runs as nn.Linear (see defer)
        # key -> [(work, tensors it holds until it runs)]
        self.pending: dict[Hashable, list[tuple[Callable[[], None], tuple[torch.Tensor, ...]]]] = defaultdict(list)

    def defer(self, key: Hashable | None) -> _Deferring:
        """Within: weight gradients are queued under `key` (an I), or computed at once (None).
        Hold it around a microbatch's forward too: under None its SplitLinear layers record
        nn.Linear's own graph (nothing to defer, no Python in its backward), under a key the
        deferrable one. A checkpointed recompute runs inside the backward's defer and must
        record what its forward recorded: so the forward's and the backward's key agree.
        Outside any defer, the deferrable graph (deferred or not by its backward's defer)."""
        return _Deferring(self, key)

    def run(self, key: Hashable) -> None:
        """W: every weight gradient deferred under `key`, accumulated into .grad."""
        for work, _ in self.pending.pop(key, []):
            work()

    def holding(self, key: Hashable) -> list[torch.Tensor]:
        """Tensors the deferred work of `key` keeps alive (its activations and gradients)."""
        return [t for _, held in self.pending.get(key, []) for t in held]


class _Deferring:
    """WeightGradStore.defer's context: a class, not a generator, as it is entered inside
    every timed F and B (~0.2 us where a generator costs ~0.8)."""

    __slots__ = ("store", "key")

    def __init__(self, store: WeightGradStore, key: Hashable | None):
        self.store, self.key = store, key

    def __enter__(self) -> None:
        self.store.deferring, self.store.whole = self.key, self.key is None

    def __exit__(self, *exc: object) -> None:
        self.store.deferring, self.store.whole = None, False


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    param.grad = grad if param.grad is None else param.grad + grad


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, store):  # x [..., in], weight [out, in]
        ctx.save_for_backward(x)
        # the parameters themselves, not saved copies: W sets .grad on them
        ctx.weight, ctx.bias, ctx.store = weight, bias, store
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):  # g [..., out]
        (x,) = ctx.saved_tensors
        weight, bias = ctx.weight, ctx.bias
        grad_x = g @ weight if ctx.needs_input_grad[0] else None

        def weight_grad() -> tuple[torch.Tensor, torch.Tensor | None]:
            g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
            return g2.t() @ x2, (g2.sum(0) if bias is not None else None)

        key = ctx.store.deferring
        if key is None:
            gw, gb = weight_grad()
            return grad_x, gw, gb, None

        def work() -> None:
            gw, gb = weight_grad()
            _accumulate(weight, gw)
            if gb is not None:
                _accumulate(bias, gb)

        ctx.store.pending[key].append((work, (x, g)))
        return grad_x, None, None, None


class SplitLinear(nn.Linear):
    """nn.Linear (same init, same math) whose weight gradient a WeightGradStore can defer."""

    store: WeightGradStore | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.store is None or self.store.whole:
            return F.linear(x, self.weight, self.bias)
        return _LinearFn.apply(x, self.weight, self.bias, self.store)


def attach_store(module: nn.Module, store: WeightGradStore) -> None:
    for m in module.modules():
        if isinstance(m, SplitLinear):
            m.store = store


def _as_split_linear(m: nn.Module) -> SplitLinear | None:
    """A SplitLinear computing what `m` computes with `m`'s parameters, for an nn.Linear or a
    Hugging Face Conv1D (GPT-2's y = x W + b, W [in, out]: transposed once, here); else None."""
    if isinstance(m, SplitLinear):
        return None
    if isinstance(m, nn.Linear):
        new = SplitLinear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
        new.weight = m.weight  # the same Parameter objects: nothing copied
        if m.bias is not None:
            new.bias = m.bias
        return new
    weight = getattr(m, "weight", None)
    if type(m).__name__ == "Conv1D" and hasattr(m, "nf") and isinstance(weight, nn.Parameter) and weight.dim() == 2:
        nx, nf = weight.shape
        new = SplitLinear(nx, nf, bias=m.bias is not None, device="meta")
        new.weight = nn.Parameter(weight.detach().t().contiguous(), requires_grad=weight.requires_grad)
        if m.bias is not None:
            new.bias = m.bias
        return new
    return None


def to_split_linear(module: nn.Module) -> int:
    """Replaces, in place, every nn.Linear (and Hugging Face Conv1D) inside `module` by a
    SplitLinear of the same weights and math, so zero-bubble schedules can defer its weight
    gradient to W. Returns how many were replaced. Call it on a layer you build (a custom
    model's too) before its parameters are handed to an optimizer."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            new = _as_split_linear(child)
            if new is not None:
                setattr(parent, name, new)
                count += 1
    return count
