"""The TP collectives inside a stage's forward and backward, each traced as its own slice
(category "tp"), nested in the compute action that issued it.

DTensor issues them inside the layers: the row-parallel outputs' all-reduces (or, under
sequence parallelism, the all-gathers before the column-parallel linears and the
reduce-scatters after the row-parallel ones), and their mirror images in the backward. They
reach the dispatcher as torch's functional collectives (`torch.ops._c10d_functional.*`, what
DTensor's redistribute calls), which is what torch's own CommDebugMode counts; `TPCommTrace`
is a TorchDispatchMode like it that also times them: a slice runs from the collective's
launch to the end of a `wait_tensor` the mode calls right after it (functional collectives
are asynchronous; DTensor's output waits when an op first reads it, which is the next op here,
so waiting at once moves the wait by nothing that matters on CPU; on CUDA a wait only orders
the streams). Every op is called as it came, so the numerics are those of the untraced run.

Naming: `tp <action> L<layer> <collective>` ("tp 1F0 L3 all_reduce"), kind `tp_<F|B|I|W>` (the
action's kind: the direction), the action's stage and microbatch. The layer is the global
layer index whose forward or backward is running: a forward pre-hook per layer names it in
the forward (and in a checkpointed recompute), a hook on each layer's output gradient names it
when the backward reaches that layer.

A slice sits inside its action's compute event: harness/measure/metrics.py takes each action's
compute time as its span less the TP slices nested in it (harness/measure/trace.py). For
compute=emulated the runners hold an action for its modeled compute plus `comm_ns`, the host
time its collectives took (an emulated action computes, then communicates for real; on CUDA
a collective's host time is its launch, so there the hold covers it).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from harness.measure.trace import TP

_funcol = torch.ops._c10d_functional
# the functional collectives DTensor's redistribute issues, by their trace name
COLLECTIVES: dict[Any, str] = {
    _funcol.all_reduce: "all_reduce",
    _funcol.all_reduce_coalesced: "all_reduce",
    _funcol.all_gather_into_tensor: "all_gather",
    _funcol.all_gather_into_tensor_coalesced: "all_gather",
    _funcol.reduce_scatter_tensor: "reduce_scatter",
    _funcol.reduce_scatter_tensor_coalesced: "reduce_scatter",
    _funcol.all_to_all_single: "all_to_all",
    _funcol.broadcast: "broadcast",
}
_WAIT = _funcol.wait_tensor.default
_DESUGARED = (DTensor, AsyncCollectiveTensor)


class TPCommTrace(TorchDispatchMode):
    """Active only inside `action(...)`: each functional collective launched there becomes a
    tracer event. `watch(layers, first)` names the layers of a stage."""

    def __init__(self, tracer: Any):
        super().__init__()
        self.tracer = tracer
        self.action_name, self.kind, self.stage, self.microbatch = "", "", -1, -1
        self.layer = -1  # the global layer whose forward or backward is running
        self.comm_ns = 0  # host ns of the running (or last) action's collectives, launch to wait

    # -- where we are ------------------------------------------------------------------------
    def watch(self, layers: nn.Sequential, first: int) -> None:
        """Names layer first + j while its forward or backward runs (j: its place in `layers`)."""
        for j, layer in enumerate(layers):
            layer.register_forward_pre_hook(self._enter_forward(first + j))
            layer.register_forward_hook(self._arm_backward(first + j))

    def _enter_forward(self, i: int):
        def hook(module: nn.Module, args: tuple) -> None:
            self.layer = i
        return hook

    def _arm_backward(self, i: int):
        def on_grad(grad: torch.Tensor) -> None:  # the layer's output gradient is in: its backward starts
            self.layer = i

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.requires_grad and torch.is_grad_enabled():
                output.register_hook(on_grad)
        return hook

    @contextmanager
    def action(self, name: str, kind: str, stage: int, microbatch: int) -> Iterator[None]:
        """Traces the collectives of one compute action (F, B, I, W) while it runs."""
        self.action_name, self.kind, self.stage, self.microbatch = name, kind, stage, microbatch
        self.comm_ns = 0
        with self:
            yield

    # -- the mode ----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(t in _DESUGARED for t in types):
            # DTensor or a collective's pending output first: it desugars into plain-tensor ops,
            # collectives and waits, dispatched again with this mode still active (CommDebugMode's way)
            return NotImplemented
        packet = func._overloadpacket
        name = COLLECTIVES.get(packet)
        if name is None:
            return func(*args, **kwargs)
        t0, h0 = self.tracer.mark(), time.perf_counter_ns()
        out = func(*args, **kwargs)
        # waited here, at once: the slice ends when the collective does. The consumer's own wait
        # (the output's first reader) finds it done. A consumer may wait where this mode does not
        # see it (inside the AsyncCollectiveTensor's dispatch), so a later wait cannot close it
        for t in out if isinstance(out, (list, tuple)) else (out,):
            _WAIT(t)
        self.tracer.record(f"tp {self.action_name} L{self.layer} {name}", TP, f"tp_{self.kind}", self.stage,
                           self.microbatch, t0)
        self.comm_ns += time.perf_counter_ns() - h0
        return out
