"""Runs one rank's action list for one step, with real P2P of activations and gradients.

P2P semantics (the simulator and the validator assume the same): sends are posted with
isend and never block; a receive is posted right before the action that needs it and
blocks until the tensor is there. When the neighbouring stage lives on the same rank (V
placement), the tensor is handed over locally. Each stage is its own autograd graph: a
stage's input is a fresh leaf, its .grad is what goes back.

Gradients accumulate in .grad over the microbatches (each microbatch loss is scaled by
1/M, so the sum is the full-batch mean loss's gradient); the optimizer steps once per step.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from harness.model import get_model
from harness.model.checkpoint import CheckpointedStage
from harness.model.split_linear import WeightGradStore, attach_store
from harness.plan import Plan
from harness.runtime.clock import CudaClock, HostClock
from harness.runtime.groups import Layout
from harness.runtime.memory import MemoryMeter
from harness.schedules.ir import Action, Kind
from harness.trace import COMM, COMPUTE, WAIT

# Event as it travels back from a worker: (step, name, cat, kind, stage, mb, start_ns, end_ns)
RawEvent = tuple[int, str, str, str, int, int, int, int]


def _tag(stage: int, grad: bool, mb: int, stages: int) -> int:
    """Unique message tag per (sending stage, direction, microbatch); gloo matches on it."""
    return (mb * 2 + int(grad)) * stages + stage


@dataclass
class StepState:
    inputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # kept for backward
    outputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # output or loss
    local: dict[tuple[int, str, int], torch.Tensor] = field(default_factory=dict)  # same-rank hand-offs
    sends: list[tuple[dist.Work, torch.Tensor]] = field(default_factory=list)
    loss: torch.Tensor | None = None


class StageRunner:
    """One global rank: pipeline rank `layout.pipeline_rank(rank)` of replica
    `layout.replica(rank)`. With dp > 1 every stage is wrapped in DistributedDataParallel over
    `dp_group`; gradients sync only in the last backward of each stage in the step."""

    def __init__(self, rank: int, plan: Plan, device: torch.device, layout: Layout | None = None,
                 dp_group: dist.ProcessGroup | None = None):
        c = plan.config
        self.rank, self.plan, self.device = rank, plan, device
        self.layout = layout or Layout(c.pp, 1)
        self.prank, self.replica = self.layout.pipeline_rank(rank), self.layout.replica(rank)
        self.model = get_model(c.model)
        self.actions: list[Action] = plan.schedule[self.prank]
        self.num_stages = len(plan.stage_layers)
        self.store = WeightGradStore()
        self.modules: dict[int, nn.Module] = {}
        for s, r in plan.stage_rank.items():
            if r == self.prank:
                layers = self.model.build_layers(*plan.stage_layers[s], seed=c.seed).to(device)
                attach_store(layers, self.store)
                self.modules[s] = layers
        self.layers = dict(self.modules)  # stage -> its layers, under any wrapper
        params = [p for m in self.modules.values() for p in m.parameters()]
        self.optimizer = torch.optim.SGD(params, lr=c.lr)
        self.meter = MemoryMeter(params)
        if c.checkpointing:
            self.modules = {s: CheckpointedStage(m, c.checkpoint_every, self._keep_current, self._timed_recompute)
                            for s, m in self.modules.items()}
        self.clock = CudaClock(device) if device.type == "cuda" else HostClock()
        # the index of each stage's last backward in the action list: where DDP syncs
        self.last_backward = {a.stage: i for i, a in enumerate(self.actions) if a.kind in (Kind.B, Kind.I)}
        self.sync_launch = None  # clock token of the last gradient bucket's all-reduce launch
        self.modeled: tuple[int, float] | None = None  # (start ns, modeled s) of the running backward
        if c.dp > 1:
            self.modules = {s: self._ddp(m, dp_group) for s, m in self.modules.items()}
        self.act_shape = self.model.activation_shape(c.microbatch_size)
        self.events: list[tuple] = []  # (step, name, cat, kind, stage, mb, start token, end token)
        self._current: tuple[int, int, int] | None = None  # (step, stage, mb) of the running action
        self.drop_grads = False  # test-only fault (fault=noaccum@...): breaks accumulation
        self.microbatch_bytes: list[int] = []  # bytes held for backward by each F, at its end

    def _ddp(self, module: nn.Module, group: dist.ProcessGroup) -> DistributedDataParallel:
        ddp = DistributedDataParallel(module, process_group=group, forward_sync_buffers=False,
                                      device_ids=[self.device.index] if self.device.type == "cuda" else None)

        def timed_allreduce(state, bucket):  # DDP's default all-reduce, its launch time noted
            if self.modeled is not None:  # compute=emulated: the backward's modeled cost first
                self._emulate(*self.modeled)
            self.sync_launch = self.clock.mark()
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(group, timed_allreduce)
        return ddp

    @contextmanager
    def _sync_if(self, last: bool, module: nn.Module, output: torch.Tensor) -> Iterator[None]:
        """DDP: accumulate locally (no_sync) except in the stage's last backward of the step,
        which all-reduces. Forwards always run under no_sync, so only that backward is armed
        (the same reach into the reducer as torch.distributed.pipelining's stage)."""
        if not isinstance(module, DistributedDataParallel):
            yield
        elif last:
            module.reducer.prepare_for_backward(list(_find_tensors(output)))
            yield
        else:
            with module.no_sync():
                yield

    # -- timing -------------------------------------------------------------------------
    def _emulate(self, start_ns: int, seconds: float) -> None:
        """compute=emulated: hold the action until its modeled cost has elapsed since
        `start_ns` (host ns). The real math ran first, so tensors and losses stay real."""
        if self.plan.config.compute != "emulated":
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        deadline = start_ns + int(seconds * 1e9)
        # no spinning: with more ranks than cores a spinning rank steals the core a peer
        # needs; the ~0.1 ms oversleep lands inside the action, not in the bubble
        while (left := deadline - time.perf_counter_ns()) > 0:
            time.sleep(left / 1e9)

    def _record(self, step: int, name: str, cat: str, kind: str, stage: int, mb: int, t0, t1) -> None:
        self.events.append((step, name, cat, kind, stage, mb, t0, t1))

    def _keep_current(self, t: torch.Tensor) -> None:
        if self._current is not None:
            self.meter.keep(self._current[1:], t)

    def _timed_recompute(self, fn: Callable) -> Callable:
        """Checkpointing's recompute, traced as its own event (kind R, inside the B/I)."""

        def run(*args):
            t0 = self.clock.mark()
            try:
                return fn(*args)
            finally:  # non-reentrant checkpoint ends a recompute early by raising
                if self._current is not None:
                    step, s, mb = self._current
                    self._record(step, f"{s}R{mb}", COMPUTE, "R", s, mb, t0, self.clock.mark())

        return run

    # -- P2P ----------------------------------------------------------------------------
    def _peer(self, stage: int) -> int:
        """Global rank of the rank that holds `stage` in this replica's pipeline."""
        return self.layout.global_rank(self.replica, self.plan.stage_rank[stage])

    def _receive(self, step: int, st: StepState, a: Action, from_stage: int, grad: bool) -> torch.Tensor:
        if self.plan.stage_rank[from_stage] == self.prank:
            return st.local.pop((from_stage, "grad" if grad else "act", a.microbatch))
        buf = torch.empty(self.act_shape, device=self.device)
        t0 = self.clock.mark()
        dist.irecv(buf, src=self._peer(from_stage),
                   tag=_tag(from_stage, grad, a.microbatch, self.num_stages)).wait()
        self._record(step, f"recv {a}", WAIT, "recv", a.stage, a.microbatch, t0, self.clock.mark())
        return buf

    def _pass_on(self, step: int, st: StepState, a: Action, tensor: torch.Tensor, to_stage: int, grad: bool) -> None:
        tensor = tensor.detach()
        if self.plan.stage_rank[to_stage] == self.prank:
            st.local[(a.stage, "grad" if grad else "act", a.microbatch)] = tensor
            return
        t0 = self.clock.mark()
        tensor = tensor.contiguous()
        work = dist.isend(tensor, dst=self._peer(to_stage),
                          tag=_tag(a.stage, grad, a.microbatch, self.num_stages))
        st.sends.append((work, tensor))  # the tensor must outlive the send
        self._record(step, f"send {a}", COMM, "send", a.stage, a.microbatch, t0, self.clock.mark())

    # -- actions ------------------------------------------------------------------------
    def _forward(self, step: int, st: StepState, a: Action, batch: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        s, mb = a.stage, a.microbatch
        last = s == self.num_stages - 1
        if s == 0:
            x = batch[mb][0]
        else:
            x = self._receive(step, st, a, s - 1, grad=False).requires_grad_(True)
        h0, t0 = time.perf_counter_ns(), self.clock.mark()
        self._current = (step, s, mb)
        module = self.modules[s]
        no_sync = module.no_sync() if isinstance(module, DistributedDataParallel) else nullcontext()
        with self.meter.saving((s, mb)), no_sync:
            y = module(x)
            if last:
                y = self.model.loss(y, batch[mb][1]) / self.plan.config.microbatches
                st.loss = y.detach() if st.loss is None else st.loss + y.detach()
        self._current = None
        self._emulate(h0, self.plan.emulated_cost.compute(a))
        self._record(step, str(a), COMPUTE, "F", s, mb, t0, self.clock.mark())
        self.meter.keep((s, mb), x if s > 0 else None)
        self.meter.keep((s, mb), y)
        self.microbatch_bytes.append(self.meter.bytes_of((s, mb)))
        st.inputs[(s, mb)], st.outputs[(s, mb)] = x, y
        if not last:
            self._pass_on(step, st, a, y, s + 1, grad=False)

    def _backward(self, step: int, st: StepState, a: Action, index: int) -> None:
        """B, or I (input gradient now, weight gradient deferred to the W). With dp > 1 the
        stage's last backward of the step also all-reduces its gradients: that tail, from
        the last bucket's launch to the end, is traced as dp_sync, not as compute."""
        s, mb = a.stage, a.microbatch
        last = s == self.num_stages - 1
        grad = None if last else self._receive(step, st, a, s + 1, grad=True)
        h0, t0 = time.perf_counter_ns(), self.clock.mark()
        self._current = (step, s, mb)
        self.store.deferring = (s, mb) if a.kind is Kind.I else None
        if self.drop_grads:  # test-only fault: forget the microbatches accumulated so far
            self.optimizer.zero_grad(set_to_none=True)
        output = st.outputs.pop((s, mb))
        self.sync_launch, self.modeled = None, (h0, self.plan.emulated_cost.compute(a))
        with self._sync_if(index == self.last_backward[s], self.modules[s], output):
            torch.autograd.backward(output, grad_tensors=grad)
        self.modeled = None
        self.store.deferring = None
        self._current = None
        self._emulate(h0, self.plan.emulated_cost.compute(a))
        t1 = self.clock.mark()
        if self.sync_launch is not None:
            self._record(step, str(a), COMPUTE, a.kind.value, s, mb, t0, self.sync_launch)
            self._record(step, f"dp_sync {s}", COMM, "dp_sync", s, -1, self.sync_launch, t1)
        else:
            self._record(step, str(a), COMPUTE, a.kind.value, s, mb, t0, t1)
        x = st.inputs.pop((s, mb))
        self.meter.release((s, mb))
        for held in self.store.holding((s, mb)):  # what the deferred W still needs
            self.meter.keep((s, mb), held)
        if s > 0:
            self._pass_on(step, st, a, x.grad, s - 1, grad=True)

    def _weight(self, step: int, a: Action) -> None:
        h0, t0 = time.perf_counter_ns(), self.clock.mark()
        self.store.run((a.stage, a.microbatch))
        self._emulate(h0, self.plan.emulated_cost.compute(a))
        self._record(step, str(a), COMPUTE, "W", a.stage, a.microbatch, t0, self.clock.mark())
        self.meter.release((a.stage, a.microbatch))

    def run_step(self, step: int, keep_grads: bool = False) -> tuple[float | None, dict[str, torch.Tensor] | None]:
        """Runs every action of this rank for one step, then the optimizer. Returns the
        step's loss on the rank that holds the last stage (else None) and, if asked, the
        accumulated gradients by global parameter name ("<layer>.<param>")."""
        c = self.plan.config
        per_replica = c.microbatches * c.microbatch_size
        x, y = self.model.batch(c.seed, step, c.dp * per_replica)  # the global batch
        shard = slice(self.replica * per_replica, (self.replica + 1) * per_replica)
        # one tensor per microbatch, as a loader would give: a view would share (and the
        # memory meter would count) the whole batch's storage
        batch = [(xi.clone().to(self.device), yi.clone().to(self.device))
                 for xi, yi in zip(x[shard].split(c.microbatch_size), y[shard].split(c.microbatch_size))]
        st = StepState()
        self.meter.reset_peak()
        self.microbatch_bytes.clear()
        self.clock.start_step()
        for i, a in enumerate(self.actions):
            if a.kind is Kind.F:
                self._forward(step, st, a, batch)
            elif a.kind is Kind.W:
                self._weight(step, a)
            else:
                self._backward(step, st, a, i)
        t0 = self.clock.mark()
        for work, _ in st.sends:
            work.wait()
        self._record(step, "send wait", WAIT, "send", -1, -1, t0, self.clock.mark())
        grads = self.gradients() if keep_grads else None
        t0 = self.clock.mark()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._record(step, "optim", COMPUTE, "optim", -1, -1, t0, self.clock.mark())
        self.clock.finish_step()
        return (None if st.loss is None else float(st.loss)), grads

    def gradients(self) -> dict[str, torch.Tensor]:
        out = {}
        for s, layers in self.layers.items():
            first = self.plan.stage_layers[s][0]
            for name, p in layers.named_parameters():
                index, rest = name.split(".", 1)
                out[f"{first + int(index)}.{rest}"] = p.grad.detach().cpu().clone()
        return out

    def take_events(self) -> list[RawEvent]:
        """Events so far with tokens resolved to ns; clears the buffer. Call after run_step
        (CudaClock resolves against the step's anchor)."""
        out = [(*e[:6], self.clock.resolve(e[6]), self.clock.resolve(e[7])) for e in self.events]
        self.events.clear()
        return out
