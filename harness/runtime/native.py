"""executor=native: runs this rank's action list, one step at a time, with real P2P of
activations and gradients through the rank's Transport.

Each stage is its own autograd graph: a stage's input is a fresh leaf, its .grad is what
goes back. Gradients accumulate in .grad over the microbatches (each microbatch loss is
scaled by 1/M, so the sum is the full-batch mean loss's gradient); the rank loop steps the
optimizer. I runs the input gradient now and queues the weight gradient (SplitLinear's
WeightGradStore) for its W. Memory: the MemoryMeter counts what each (stage, microbatch)
holds for its backward, from its F until its B (or W).

tp > 1 (harness/parallel/tensor.py): each stage is split by the model's tp_plan over the
rank's TP group right after it is built; every TP rank of a replica runs the same actions on
the same batch and sends to the same TP rank of the next stage (sequence shards under
sequence_parallel). Each stage finishes explicitly (never DDP, which takes no DTensors): at
its last gradient-making action its gradients are brought to their parameters' placements
(tp_sync), then, with dp > 1, the local shards are all-reduced over the replicas (dp_sync).
Each action runs inside harness/parallel/tp_trace.py's TPCommTrace: the TP collectives DTensor
issues in it are traced as their own slices (category tp), nested in the action's event.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Hashable

import torch
from torch import nn

from harness.model.checkpoint import CheckpointedStage
from harness.model.split_linear import WeightGradStore, attach_store
from harness.parallel.tensor import activation_shape, parallelize_stage, sync_gradients
from harness.runtime.emulate import Emulator
from harness.runtime.grad_sync import GradSync
from harness.planning.memory_theory import stage_activations
from harness.runtime.precision import Precision
from harness.runtime.loop import RankContext, StepMemory, named_gradients
from harness.runtime.memory import GradientBytes, MemoryMeter
from harness.runtime.transport import GroupTransport, Routes, message_groups
from harness.schedules.p2p import action_message
from harness.schedules.ir import Action, Kind
from harness.measure.trace import COMM, COMPUTE


class NativeRunner:
    def __init__(self, ctx: RankContext):
        plan, c, device = ctx.plan, ctx.plan.config, ctx.device
        self.plan, self.device, self.tracer = plan, device, ctx.tracer
        self.prank, self.replica = ctx.layout.pipeline_rank(ctx.rank), ctx.layout.replica(ctx.rank)
        self.tp = c.tp  # tp > 1: every stage split over the rank's TP group (ctx.tp_mesh), same batch on each
        self.model = plan.model.model
        self.actions: list[Action] = plan.schedule[self.prank]
        self.last_stage = len(plan.stage_layers) - 1
        self.store = WeightGradStore()
        self.layers: dict[int, nn.Module] = {}  # stage -> its layers, under any wrapper
        self.precision = Precision(c.dtype)
        self.loss_scale = self.precision.loss_scale
        # tp > 1: the TP collectives inside each action traced as their own slices (category tp)
        self.tp_trace = None
        if c.tp > 1:  # imported here: at tp=1 the rank loop imports none of torch's distributed tensor API
            from harness.parallel.tp_trace import TPCommTrace

            self.tp_trace = TPCommTrace(self.tracer)
        for s, r in plan.stage_rank.items():
            if r == self.prank:
                self.layers[s] = plan.model.build_stage(*plan.stage_layers[s], c.seed, self.precision.dtype, device)
                # the model's TP plan, before the store, checkpointing, the sync and the meter see the layers
                parallelize_stage(self.layers[s], self.model, ctx.tp_mesh, c.sequence_parallel, plan.stage_layers[s][0])
                if self.tp_trace is not None:
                    self.tp_trace.watch(self.layers[s], plan.stage_layers[s][0])
                attach_store(self.layers[s], self.store)
        # fixed from here on (DDP, checkpointing and the meter wrap the layers, never replace a parameter)
        self.params = {s: list(m.parameters()) for s, m in self.layers.items()}
        self.meter = MemoryMeter(self.parameters())
        self.grad_bytes = GradientBytes(self.params)
        self.emulator = Emulator(plan.emulated_cost if c.compute == "emulated" else None, device)
        self.modules: dict[int, nn.Module] = dict(self.layers)
        if c.checkpointing:
            self.modules = {s: CheckpointedStage(m, c.checkpoint_every, self.meter.note, self._timed_recompute)
                            for s, m in self.modules.items()}
        # process groups: every rank creates every group, in one order (new_group is collective)
        dp_group = ctx.dp_group
        ping_on = device if plan.backend == "nccl" else torch.device("cpu")
        groups = message_groups(plan.p2p, plan.backend, plan.schedule, c.pp, c.dp, ctx.rank, ping_on, c.tp)
        net = GroupTransport(plan.p2p, self.replica, c.pp, plan.stage_rank, groups,
                             activation_shape(self.model, c.microbatch_size, c.tp, c.sequence_parallel),
                             self.precision.dtype, device, self.tracer, c.p2p_single_tag, plan.backend, c.tp,
                             ctx.layout.tp_rank(ctx.rank))
        self.transport = Routes(plan.stage_rank, self.prank, net)
        self.sync = GradSync(dp_group, device, self.emulator, self.tracer) if c.dp > 1 else None
        # stages with W: their weight gradients come after the backward, out of DDP's sight: they
        # all-reduce explicitly after their last gradient; the others are wrapped in DDP. tp > 1:
        # every stage finishes explicitly (its TP gradient sync, then the dp all-reduce of its
        # local shards: DDP does not take DTensor parameters)
        if c.tp > 1:
            self.explicit = set(self.layers)
        else:
            self.explicit = {a.stage for a in self.actions if a.kind is Kind.W} if self.sync else set()
        if self.sync:
            self.modules = {s: m if s in self.explicit else self.sync.wrap(m) for s, m in self.modules.items()}
        # (stage, mb) whose backward is an I: only their forwards record the deferrable graph
        self.deferred = {(a.stage, a.microbatch) for a in self.actions if a.kind is Kind.I}
        # the index of each stage's last gradient-making action (B, I or W) in the action list: where it syncs
        self.last_grad = {a.stage: i for i, a in enumerate(self.actions) if a.kind in (Kind.B, Kind.I, Kind.W)}
        # each action's incoming and outgoing message (None: none), made once, the same every step
        stages = self.last_stage + 1
        self.incoming = [action_message(a, True, stages) for a in self.actions]
        self.outgoing = [action_message(a, False, stages) for a in self.actions]
        self.microbatch_bytes: list[int] = []
        # checkpointing: [stage] its largest segment's recompute, which runs inside torch.utils.checkpoint
        # where the meter cannot see; accounted from the model's graph (harness/planning/memory_theory.py)
        # and counted during each of the stage's backwards (B or I), the only time it exists
        self.recompute: dict[int, int] = {}
        if c.checkpointing:  # tp > 1: the stage as split on TP rank 0 (a fake group's, no communication)
            acts = stage_activations(plan.memory().at(c.tp, c.sequence_parallel), c, plan.stage_layers)
            self.recompute = {s: acts[s].recompute for s in self.layers}

    def parameters(self) -> list[torch.Tensor]:
        return [p for ps in self.params.values() for p in ps]

    def gradients(self) -> dict[str, torch.Tensor]:
        return named_gradients(self.plan, self.layers)

    def step_memory(self) -> StepMemory:
        return StepMemory(list(self.meter.samples), self.meter.peak, list(self.microbatch_bytes),
                          self.meter.peak_with_grads)

    def _grads_now(self, s: int) -> None:
        """Tell the meter the gradient bytes now live, after an action of stage s (they appear
        with a stage's first backward)."""
        self.meter.set_grads(self.grad_bytes.after(s))

    def _timed_recompute(self, key: Hashable, fn):
        """Checkpointing's recompute, traced as its own event (kind R, inside the B/I)."""

        def run(*args):
            t0 = self.tracer.mark()
            try:
                return fn(*args)
            finally:  # non-reentrant checkpoint ends a recompute early by raising
                s, mb = key
                self.tracer.record(f"{s}R{mb}", COMPUTE, "R", s, mb, t0)

        return run

    def _traced(self, a: Action):
        """tp > 1: the action's TP collectives traced inside it; else nothing."""
        return nullcontext() if self.tp_trace is None else self.tp_trace.action(str(a), a.kind.value, a.stage,
                                                                                a.microbatch)

    def _tp_comm_ns(self) -> int:
        """Host ns the running action has spent in TP collectives so far (0 at tp=1)."""
        return self.tp_trace.comm_ns if self.tp_trace is not None else 0

    def _hold(self, h0: int, a: Action) -> None:
        """compute=emulated: the action held for its modeled compute after its TP collectives
        (their host time added: they communicate for real, beside the emulated compute)."""
        self.emulator.hold(h0 + self._tp_comm_ns(), a)

    def _call(self, s: int, x: torch.Tensor, key: tuple[int, int]) -> torch.Tensor:
        return self.modules[s](x, key=key) if self.plan.config.checkpointing else self.modules[s](x)

    # -- actions ------------------------------------------------------------------------
    def _forward(self, a: Action, index: int, batch: list[tuple[torch.Tensor, torch.Tensor]],
                 st: dict) -> torch.Tensor | None:
        s, mb, key = a.stage, a.microbatch, (a.stage, a.microbatch)
        last = s == self.last_stage
        x = batch[mb][0] if s == 0 else self.transport.recv(self.incoming[index], a).requires_grad_(True)
        h0, t0 = time.perf_counter_ns(), self.tracer.mark()
        self.emulator.lead(h0, a)
        loss = None
        with (self.meter.saving(key), self.store.defer(key if key in self.deferred else None),
              GradSync.forward_context(self.modules[s]), self._traced(a)):
            y = self._call(s, x, key)
            if last:  # in fp32, whatever the dtype; fp16 scales it for the backward (precision.py)
                loss = self.model.loss(y.float(), batch[mb][1]) / self.plan.config.microbatches
                y = loss * self.loss_scale if self.loss_scale != 1.0 else loss  # x 1.0: an op and a node for nothing
        self._hold(h0, a)
        self.tracer.record(str(a), COMPUTE, "F", s, mb, t0)
        if not last:  # sent before the bookkeeping below: the next stage waits for it, not for the meter
            self.transport.send(self.outgoing[index], y, a)
        self.meter.count_noted()  # what autograd saved during the F: counted outside its event
        self.meter.keep(key, x if s > 0 else None)
        self.meter.keep(key, y)
        self.microbatch_bytes.append(self.meter.bytes_of(key))
        st[key] = (x, y)
        return None if loss is None else loss.detach()

    def _backward(self, a: Action, index: int, st: dict, drop_grads: bool) -> None:
        """B, or I (input gradient now, weight gradient deferred to the W). With dp > 1 the
        stage's last backward of the step also all-reduces its gradients: that tail, from
        the last bucket's launch to the end, is traced as dp_sync, not as compute."""
        s, mb, key = a.stage, a.microbatch, (a.stage, a.microbatch)
        grad = None if s == self.last_stage else self.transport.recv(self.incoming[index], a)
        h0, t0 = time.perf_counter_ns(), self.tracer.mark()
        self.emulator.lead(h0, a)
        if drop_grads:  # test-only fault: forget the microbatches accumulated so far
            for p in self.parameters():
                p.grad = None
            self.grad_bytes.clear()
        x, output = st.pop(key)
        if s in self.recompute:  # what it recomputes lives beside all held so far (this microbatch's too)
            self.meter.transient(self.recompute[s])
        last = index == self.last_grad[s]
        syncing = (self.sync.backward(self.modules[s], output, last, h0, self.emulator.seconds(a), self._tp_comm_ns)
                   if self.sync and s not in self.explicit else nullcontext())
        with self.store.defer(key if a.kind is Kind.I else None), syncing, self._traced(a):
            torch.autograd.backward(output, grad_tensors=grad)
        self._hold(h0, a)
        launched = self.sync.launched if self.sync and s not in self.explicit else None
        self.tracer.record(str(a), COMPUTE, a.kind.value, s, mb, t0, launched)
        if launched is not None:
            self.tracer.record(f"dp_sync {s}", COMM, "dp_sync", s, -1, launched)
        if last and s in self.explicit:  # a B ends this stage's gradients: sync before sending on
            self._finish(s)
        if s > 0:  # sent before the bookkeeping below: the previous stage waits for it, not for the meter
            self.transport.send(self.outgoing[index], x.grad, a)
        self.meter.release(key)
        for held in self.store.holding(key):  # what the deferred W still needs
            self.meter.keep(key, held)
        self._grads_now(s)

    def _weight(self, a: Action, index: int) -> None:
        h0, t0 = time.perf_counter_ns(), self.tracer.mark()
        self.emulator.lead(h0, a)
        with self._traced(a):
            self.store.run((a.stage, a.microbatch))
        self._hold(h0, a)
        self.tracer.record(str(a), COMPUTE, "W", a.stage, a.microbatch, t0)
        self.meter.release((a.stage, a.microbatch))
        self._grads_now(a.stage)
        if index == self.last_grad[a.stage] and a.stage in self.explicit:
            self._finish(a.stage)

    def _finish(self, s: int) -> None:
        """Stage s's gradients are all in: tp > 1, each brought to its parameter's placement
        (the TP all-reduce of the replicated ones that hold parts: norms under sequence
        parallelism, replicated KV heads); dp > 1, the shards averaged over the replicas."""
        if self.tp > 1:
            t0 = self.tracer.mark()
            sync_gradients(self.layers[s])
            self.tracer.record(f"tp_sync {s}", COMM, "tp_sync", s, -1, t0)
        if self.sync is not None:
            self.sync.all_reduce(list(self.layers[s].parameters()))
            self.tracer.record(f"dp_sync {s}", COMM, "dp_sync", s, -1, self.sync.launched)

    def _batch(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This replica's shard of the step's global batch, one tensor per microbatch, as a
        loader would give (a view would share, and the meter count, the whole batch)."""
        c = self.plan.config
        per_replica = c.microbatches * c.microbatch_size
        x, y = self.model.batch(c.seed, step, c.dp * per_replica)
        shard = slice(self.replica * per_replica, (self.replica + 1) * per_replica)
        return [(self.precision.cast(xi.clone()).to(self.device), yi.clone().to(self.device))
                for xi, yi in zip(x[shard].split(c.microbatch_size), y[shard].split(c.microbatch_size))]

    def run_step(self, step: int, drop_grads: bool = False) -> float | None:
        batch = self._batch(step)
        st: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (stage, mb) -> (input, output)
        self.grad_bytes.clear()  # the optimizer cleared them
        self.meter.set_grads(0)
        self.meter.reset_peak()
        self.microbatch_bytes.clear()
        loss = None
        # every receive of the step posted now, in consumer order (gloo; a no-op on NCCL): a
        # receive posted mid-step takes gloo's pair lock beside transfers in flight, and on a
        # busy host waited ms for it, between events. torch's PipelineStage too holds a receive
        # buffer for every microbatch
        for msg in self.incoming:
            self.transport.post(msg)
        for i, a in enumerate(self.actions):
            if a.kind is Kind.F:
                part = self._forward(a, i, batch, st)
                if part is not None:
                    loss = part if loss is None else loss + part
            elif a.kind is Kind.W:
                self._weight(a, i)
            else:
                self._backward(a, i, st, drop_grads)
        self.transport.drain()
        self.grad_bytes.clear()  # holds the step's gradients: the optimizer frees them
        return None if loss is None else float(loss)

