"""executor=pytorch: the same plan through torch.distributed.pipelining, as a peer of the
native runner: same stages and weights (each stage built as the native one), same data,
same optimizer (the rank loop's), same placement.

What the trace holds, measured by wrapping this rank's PipelineStage methods and torch's two
P2P helpers (nothing is inferred from the schedule):
- compute: F (forward_one_chunk; on the last stage up to the end of its loss, as natively),
  B / I (backward_one_chunk, full or input-only), W (backward_weight_one_chunk), R (a
  checkpointed segment's recompute, inside its B/I);
- wait: "recv <action>", time blocked on the receive that action consumes: in its wait(),
  or, where Schedule1F1B fuses a send with the receive into one coalesced call that
  returns only once both are done (gloo), from that call on; "send wait" for sends;
- comm: "send <action>", time to post the send of what that action produced.
Not measured (None in the record): activation memory (torch's step() splits the batch into
views of one storage, which the storage-counting meter would count whole for every
microbatch). Torch's zero-bubble schedules skip stage 0's I (nothing to send back) and run
its whole backward in W: the trace shows 0I<mb> near zero and 0W<mb> as a full B, as it
happened. compute=emulated holds each timed action until its modeled cost, as natively.
Every step checks that torch ran exactly plan.schedule's order on this rank (theory and
simulation describe that order), and torch's stage placement is checked against the plan's.
tp > 1: each stage is TP-parallelized by the model's plan before torch's PipelineStage wraps it
(torchtitan's order); each tp rank's stages form their own pipeline (a process group of the
same tp rank of every stage, which torch's P2P addresses); the TP gradient sync follows torch's
step (tp_sync), as natively.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Hashable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from harness.runtime import compat
from harness.model.checkpoint import CheckpointedStage
from harness.planning.plan import Plan
from harness.runtime.precision import Precision
from harness.runtime.emulate import Emulator
from harness.parallel.tensor import parallelize_stage, sync_gradients
from harness.runtime.groups import Layout
from harness.runtime.loop import RankContext, named_gradients
from harness.runtime.tracer import Tracer
from harness.records.scratch import Scratch
from harness.schedules.csv_io import write_csv
from harness.schedules.ir import Action, Kind, Schedule
from harness.schedules.registry import SCHEDULES, spec
from harness.measure.trace import COMM, COMPUTE, PIPELINE_KINDS, WAIT


@contextmanager
def as_csv(schedule: Schedule) -> Iterator[str]:
    """`schedule` in torch's compute_only CSV, in a file that lives while the caller reads it."""
    with Scratch(prefix="harness-csv-") as d:  # removed by identity, never by name
        path = os.path.join(d.path, "schedule.csv")
        write_csv(path, schedule)
        yield path


def torch_class_name(name: str) -> str | None:
    """The registry's torch class for `name`, None if it has none or is not registered in this
    process (a schedule registered by the caller after the workers started: the plan carries
    its actions)."""
    return SCHEDULES[name].torch_class if name in SCHEDULES else None


def torch_class(name: str) -> type:
    """The torch.distributed.pipelining class of a registered schedule (ScheduleSpec.torch_class;
    zb_h1 is torch's ZB1P with one stage per rank, which is ZB-H1); KeyError if it has none
    (csv, and a schedule torch has no class for, go through torch's own CSV loader,
    compat.csv_schedule)."""
    cls = spec(name).torch_class
    if cls is None:
        raise KeyError(f"schedule={name}: no torch class")
    return getattr(torch_schedules, cls)


_UNRESOLVED = "?"  # backward kind (B or I) of a P2P label, known once the step has run


class Timeline:
    """Times this rank's torch-driven actions and P2P into the rank's Tracer."""

    def __init__(self, plan: Plan, tracer: Tracer, emulator: Emulator):
        self.tracer, self.emulator = tracer, emulator
        self.last_stage = len(plan.stage_layers) - 1
        self.current: tuple[int, int] | None = None  # (stage, mb) of the running action
        self.open_forward: tuple[list, int, Action] | None = None  # last stage's F until its loss ran
        # id(works) -> (works kept alive so the id stays theirs, receiving action, fused post's start)
        self.waiting: dict[int, tuple[list[dist.Work], tuple[int, str, int], Any]] = {}
        self.tp_trace: Any = None  # tp > 1: a TPCommTrace (harness/parallel/tp_trace.py), the actions' TP collectives

    def _traced(self, a: Action) -> Any:
        return nullcontext() if self.tp_trace is None else self.tp_trace.action(str(a), a.kind.value, a.stage,
                                                                                a.microbatch)

    def _comm_ns(self) -> int:
        """The last action's TP collectives (host ns): compute=emulated holds its compute after them."""
        return 0 if self.tp_trace is None else self.tp_trace.comm_ns

    def run(self, kind: Kind, stage: int, mb: int, fn: Callable, *args, **kwargs) -> Any:
        a = Action(stage, kind, mb)
        h0, t0 = time.perf_counter_ns(), self.tracer.mark()
        self.emulator.lead(h0, a)
        self.current = (stage, mb)
        try:
            with self._traced(a):
                out = fn(*args, **kwargs)
        finally:
            self.current = None
        loss_follows = kind is Kind.F and stage == self.last_stage
        if not loss_follows:
            self.emulator.hold(h0 + self._comm_ns(), a)
        event = self.tracer.record(str(a), COMPUTE, kind.value, stage, mb, t0)
        if loss_follows:
            self.open_forward = (event, h0, a)
        return out

    def loss_done(self) -> None:
        """The loss belongs to the last stage's F (the native runner computes it inside F):
        torch calls loss_fn right after forward_one_chunk, so the F event extends to here.
        Its first step's metadata inference calls loss_fn outside any F: nothing to extend."""
        if self.open_forward is None:
            return
        event, h0, a = self.open_forward
        self.open_forward = None
        self.emulator.hold(h0 + self._comm_ns(), a)
        event[7] = self.tracer.mark()

    def timed_recompute(self, key: Hashable, fn: Callable) -> Callable:
        """A checkpointed segment's recompute, traced as R inside its B/I (as natively)."""

        def run(*args):
            if self.current is None:  # torch's metadata inference (first step), not an action
                return fn(*args)
            t0, (stage, mb) = self.tracer.mark(), self.current
            try:
                return fn(*args)
            finally:
                self.tracer.record(f"{stage}R{mb}", COMPUTE, "R", stage, mb, t0)

        return run

    # -- P2P: torch's module-level helpers, wrapped (compat.traced_pipelining_p2p) -------
    def post(self, batch_p2p: Callable, ops: list[dist.P2POp], desc: str | None = None) -> list[dist.Work]:
        t0 = self.tracer.mark()
        works = batch_p2p(ops, desc)
        sends = [op.harness_label for op in ops if op.op is dist.isend]
        recvs = [op.harness_label for op in ops if op.op is dist.irecv]
        if recvs:  # one tensor per stage boundary: at most one receive per posted batch
            # A batch that also sends (Schedule1F1B fuses a send with the next receive) is
            # one coalesced call that returns only once the exchange is done (gloo): the
            # time blocked in it is the receive's. A receive alone posts at once (the
            # runtime schedules post it early) and blocks in its wait.
            self.waiting[id(works)] = (works, recvs[0], t0 if sends else None)
        elif sends:
            stage, kind, mb = sends[0]
            self.tracer.record(f"send {stage}{kind}{mb}", COMM, "send", stage, mb, t0)
        return works

    def wait(self, wait_p2p: Callable, works: list[dist.Work]) -> None:
        if not works:
            return
        t0 = self.tracer.mark()
        wait_p2p(works)
        _, label, posted = self.waiting.pop(id(works), (None, None, None))
        if label is None:
            self.tracer.record("send wait", WAIT, "send", -1, -1, t0)
        else:
            stage, kind, mb = label
            self.tracer.record(f"recv {stage}{kind}{mb}", WAIT, "recv", stage, mb, t0 if posted is None else posted)

    def resolve_labels(self) -> None:
        """Each backward P2P label of the running step gets the kind (B or I) its action had."""
        pending = self.tracer.pending
        backward = {(e[4], e[5]): e[3] for e in pending if e[2] == COMPUTE and e[3] in ("B", "I")}
        for e in pending:
            if _UNRESOLVED in e[1]:
                e[1] = e[1].replace(_UNRESOLVED, backward[(e[4], e[5])])


def _label(ops: list[dist.P2POp], stage: int, kind: str, mb: int) -> list[dist.P2POp]:
    """Tags each op with the action at this end: the one that consumes what is received,
    or the one that produced what is sent."""
    for op in ops:
        op.harness_label = (stage, kind, mb)
    return ops


def _instrument(stage: PipelineStage, timeline: Timeline) -> None:
    """Times this stage's compute and labels its P2P ops, through instance attributes that
    shadow PipelineStage's methods (compat.STAGE_COMPUTE, compat.STAGE_P2P)."""
    s = stage.stage_index
    forward, backward, weight = (getattr(stage, name) for name in compat.STAGE_COMPUTE)
    fwd_recv, bwd_recv, fwd_send, bwd_send = (getattr(stage, name) for name in compat.STAGE_P2P)

    def backward_one_chunk(mb: int, loss=None, full_backward: bool = True, last_backward: bool = False):
        return timeline.run(Kind.B if full_backward else Kind.I, s, mb, backward, mb, loss=loss,
                            full_backward=full_backward, last_backward=last_backward)

    stage.forward_one_chunk = lambda mb, *a, **k: timeline.run(Kind.F, s, mb, forward, mb, *a, **k)
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = lambda mb, *a, **k: timeline.run(Kind.W, s, mb, weight, mb, *a, **k)
    stage.get_fwd_recv_ops = lambda mb: _label(fwd_recv(mb), s, "F", mb)
    stage.get_bwd_recv_ops = lambda mb: _label(bwd_recv(mb), s, _UNRESOLVED, mb)
    stage.get_fwd_send_ops = lambda mb: _label(fwd_send(mb), s, "F", mb)
    stage.get_bwd_send_ops = lambda mb: _label(bwd_send(mb), s, _UNRESOLVED, mb)


def pipeline_group(layout: Layout, rank: int) -> dist.ProcessGroup | None:
    """tp > 1: the pipeline of `rank`'s tp rank (the same tp rank of every stage), its group
    ranks the pipeline ranks torch's stages address; every rank creates every such group, in
    one order (new_group is collective). tp=1: None, the world (executor=pytorch runs dp=1)."""
    if layout.tp == 1:
        return None
    mine = None
    for t in range(layout.tp):
        g = dist.new_group([layout.global_rank(0, p, t) for p in range(layout.pp)])
        if layout.tp_rank(rank) == t:
            mine = g
    return mine


class PeerRunner:
    def __init__(self, ctx: RankContext):
        plan, c, device = ctx.plan, ctx.plan.config, ctx.device
        # self.rank: the pipeline rank (tp > 1: this rank's TP group shares it, every member runs its stages)
        self.plan, self.device, self.rank, self.tracer = plan, device, ctx.layout.pipeline_rank(ctx.rank), ctx.tracer
        self.model = plan.model.model
        self.timeline = Timeline(plan, ctx.tracer, Emulator(plan.emulated_cost if c.compute == "emulated" else None,
                                                            device))
        # built exactly as natively (layer i from seed (seed, i)), without the WeightGradStore:
        # torch splits I and W itself
        self.precision = Precision(c.dtype)
        self.layers: dict[int, nn.Module] = {
            s: plan.model.build_stage(*plan.stage_layers[s], c.seed, self.precision.dtype, device)
            for s, r in sorted(plan.stage_rank.items()) if r == self.rank}
        if c.tp > 1:  # imported here: at tp=1 the rank loop imports none of torch's distributed tensor API
            from harness.parallel.tp_trace import TPCommTrace

            self.timeline.tp_trace = TPCommTrace(ctx.tracer)
        for s, m in self.layers.items():  # tp > 1: the model's TP plan, as natively (torchtitan's order: TP, then PP)
            parallelize_stage(m, self.model, ctx.tp_mesh, c.sequence_parallel, plan.stage_layers[s][0])
            if self.timeline.tp_trace is not None:
                self.timeline.tp_trace.watch(m, plan.stage_layers[s][0])
        modules = {s: CheckpointedStage(m, c.checkpoint_every, lambda key, t: None, self.timeline.timed_recompute)
                   if c.checkpointing else m for s, m in self.layers.items()}
        group = pipeline_group(ctx.layout, ctx.rank)  # tp > 1: this tp rank's pipeline; tp=1: the world
        stages = [PipelineStage(m, s, len(plan.stage_layers), device, group=group) for s, m in modules.items()]
        for stage in stages:
            _instrument(stage, self.timeline)
        self.schedule = self._schedule(stages)
        self.first, self.last = 0 in modules, len(plan.stage_layers) - 1 in modules

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # the microbatch's mean loss in fp32 (times fp16's loss scale), not divided by M: torch's
        # scale_grads=True divides the accumulated gradients by M once, as the native 1/M on
        # every microbatch loss does
        loss = self.model.loss(output.float(), target) * self.precision.loss_scale
        self.timeline.loss_done()
        return loss

    def _schedule(self, stages: list[PipelineStage]) -> Any:
        """torch's schedule for the plan; refuses, in one line, one whose placement differs."""
        c = self.plan.config
        if not torch_class_name(c.schedule.name):  # csv, zb_h2, zb_auto...: the plan's actions, by torch's CSV loader
            with as_csv(self.plan.schedule) as path:
                schedule = compat.csv_schedule(stages, c.microbatches, self._loss, path)
        else:
            cls = torch_class(c.schedule.name)
            schedule = cls(stages[0] if compat.is_single_stage_schedule(cls) else stages, c.microbatches,
                           loss_fn=self._loss, scale_grads=True)
        placed = compat.stage_placement(stages[0])
        if placed != self.plan.stage_rank:
            raise ValueError(f"schedule={c.schedule.name}: torch places stages {placed}, the plan "
                             f"{self.plan.stage_rank}; not the same plan")
        return schedule

    def parameters(self) -> list[torch.Tensor]:
        return [p for m in self.layers.values() for p in m.parameters()]

    def gradients(self) -> dict[str, torch.Tensor]:
        return named_gradients(self.plan, self.layers)

    def step_memory(self) -> None:
        return None  # not measured: see the module docstring

    def run_step(self, step: int, drop_grads: bool = False) -> float | None:
        c = self.plan.config
        x, y = self.model.batch(c.seed, step, c.microbatches * c.microbatch_size)
        losses: list[torch.Tensor] = []
        with compat.traced_pipelining_p2p(self.timeline.post, self.timeline.wait):
            # torch splits the batch into M microbatches along dim 0, as the native x.split(B)
            self.schedule.step(*([self.precision.cast(x).to(self.device)] if self.first else []),
                               target=y.to(self.device) if self.last else None,
                               losses=losses if self.last else None)
        self.timeline.resolve_labels()
        self._check_order()
        if c.tp > 1:  # the step's gradients are in: each to its parameter's placement (natively: tp_sync)
            for s, m in self.layers.items():
                t0 = self.tracer.mark()
                sync_gradients(m)
                self.tracer.record(f"tp_sync {s}", COMM, "tp_sync", s, -1, t0)
        # the native step loss: the sum over microbatches, in order, of loss / M
        scale = c.microbatches * self.precision.loss_scale
        return float(sum(loss.detach() / scale for loss in losses)) if self.last else None

    def _check_order(self) -> None:
        """The metrics (theory, simulation) describe plan.schedule: refuse a run whose order is not it."""
        got = [e[1] for e in self.tracer.pending if e[2] == COMPUTE and e[3] in PIPELINE_KINDS]
        want = [str(a) for a in self.plan.schedule[self.rank]]
        if got != want:
            i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            raise RuntimeError(f"torch's {type(self.schedule).__name__} ran {got[i] if i < len(got) else 'nothing'} "
                               f"where schedule={self.plan.config.schedule.name} has "
                               f"{want[i] if i < len(want) else 'nothing'} (rank {self.rank}, action {i}): "
                               "not the same plan")
