"""executor=pytorch: the same plan through torch.distributed.pipelining, as a peer of the
native executor (harness/runtime/worker.py): same stages and weights (each stage built as
the native one), same data, same SGD, same placement, and the same payload for the parent.

What the trace holds, measured by wrapping this rank's PipelineStage methods and torch's two
P2P helpers (nothing is inferred from the schedule):
- compute: F (forward_one_chunk; on the last stage up to the end of its loss, as natively),
  B / I (backward_one_chunk, full or input-only), W (backward_weight_one_chunk), R (a
  checkpointed segment's recompute, inside its B/I), optim (outside the window);
- wait: "recv <action>", time blocked on the receive that action consumes: in its wait(),
  or, where Schedule1F1B fuses a send with the receive into one coalesced call that
  returns only once both are done (gloo), from that call on; "send wait" for sends;
- comm: "send <action>", time to post the send of what that action produced.
Not measured: activation memory (torch's step() splits the batch into views of one
storage, which the storage-counting meter would count whole for every microbatch).
Torch's zero-bubble schedules skip stage 0's I (nothing to send back) and run its whole
backward in W: the trace shows 0I<mb> near zero and 0W<mb> as a full B, as it happened.
compute=emulated holds each timed action until its modeled cost, as natively. Every step
checks that torch ran exactly plan.schedule's order on this rank (theory and simulation
describe that order), and torch's stage placement is checked against the plan's.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from multiprocessing.queues import Queue
from typing import Any, Callable, Iterator

import torch
import torch._dynamo  # noqa: F401 - the first optimizer imports it (~1.5 s); the forkserver pays once
import torch.distributed as dist
import torch.distributed.pipelining.schedules as torch_schedules
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
    _PipelineSchedule,
    _PipelineScheduleRuntime,
)

from harness.model import get_model
from harness.model.checkpoint import CheckpointedStage
from harness.plan import Plan
from harness.runtime.clock import CudaClock, HostClock
from harness.runtime.faults import maybe_inject, parse_fault
from harness.runtime.worker import join_world, worker_main
from harness.schedules.ir import Action, Kind
from harness.trace import COMM, COMPUTE, PIPELINE_KINDS, WAIT

# harness schedule -> torch class. zb_h1 is torch's ZB1P with one stage per rank, which is
# ZB-H1 (harness/schedules/builders.py builds the same order); csv goes through
# _PipelineScheduleRuntime._load_csv.
TORCH_SCHEDULES: dict[str, type[_PipelineSchedule]] = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zb_h1": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}
_UNRESOLVED = "?"  # backward kind (B or I) of a P2P label, known once the step has run


class Timeline:
    """This rank's events, step by step; `run` times one compute action."""

    def __init__(self, plan: Plan, clock: HostClock | CudaClock, device: torch.device):
        self.plan, self.clock, self.device = plan, clock, device
        self.last_stage = len(plan.stage_layers) - 1
        self.step = 0
        self.events: list[list] = []  # [step, name, cat, kind, stage, mb, start token, end token]
        self.current: tuple[int, int] | None = None  # (stage, mb) of the running action
        self.open_forward: tuple[list, int] | None = None  # last stage's F until its loss ran
        # id(works) -> (works kept alive so the id stays theirs, receiving action, fused post's start)
        self.waiting: dict[int, tuple[list[dist.Work], tuple[int, str, int], Any]] = {}

    def record(self, name: str, cat: str, kind: str, stage: int, mb: int, t0: Any) -> list:
        self.events.append([self.step, name, cat, kind, stage, mb, t0, self.clock.mark()])
        return self.events[-1]

    def _emulate(self, start_ns: int, stage: int, kind: Kind, mb: int) -> None:
        """compute=emulated: hold the action until its modeled cost has elapsed (as natively:
        real math first, then sleep, never spin: spinning steals a peer rank's core)."""
        if self.plan.config.compute != "emulated":
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        deadline = start_ns + int(self.plan.emulated_cost.compute(Action(stage, kind, mb)) * 1e9)
        while (left := deadline - time.perf_counter_ns()) > 0:
            time.sleep(left / 1e9)

    def run(self, kind: Kind, stage: int, mb: int, fn: Callable, *args, **kwargs) -> Any:
        h0, t0 = time.perf_counter_ns(), self.clock.mark()
        self.current = (stage, mb)
        try:
            out = fn(*args, **kwargs)
        finally:
            self.current = None
        loss_follows = kind is Kind.F and stage == self.last_stage
        if not loss_follows:
            self._emulate(h0, stage, kind, mb)
        event = self.record(f"{stage}{kind.value}{mb}", COMPUTE, kind.value, stage, mb, t0)
        if loss_follows:
            self.open_forward = (event, h0)
        return out

    def loss_done(self) -> None:
        """The loss belongs to the last stage's F (the native executor computes it inside F):
        torch calls loss_fn right after forward_one_chunk, so the F event extends to here.
        Its first step's metadata inference calls loss_fn outside any F: nothing to extend."""
        if self.open_forward is None:
            return
        event, h0 = self.open_forward
        self.open_forward = None
        self._emulate(h0, event[4], Kind.F, event[5])
        event[7] = self.clock.mark()

    def timed_recompute(self, fn: Callable) -> Callable:
        """A checkpointed segment's recompute, traced as R inside its B/I (as natively)."""

        def run(*args):
            if self.current is None:  # torch's metadata inference (first step), not an action
                return fn(*args)
            t0, (stage, mb) = self.clock.mark(), self.current
            try:
                return fn(*args)
            finally:
                self.record(f"{stage}R{mb}", COMPUTE, "R", stage, mb, t0)

        return run

    # -- P2P: torch's module-level helpers, wrapped -----------------------------------
    def post(self, batch_p2p: Callable, ops: list[dist.P2POp], desc: str | None = None) -> list[dist.Work]:
        t0 = self.clock.mark()
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
            self.record(f"send {stage}{kind}{mb}", COMM, "send", stage, mb, t0)
        return works

    def wait(self, wait_p2p: Callable, works: list[dist.Work]) -> None:
        if not works:
            return
        t0 = self.clock.mark()
        wait_p2p(works)
        _, label, posted = self.waiting.pop(id(works), (None, None, None))
        if label is None:
            self.record("send wait", WAIT, "send", -1, -1, t0)
        else:
            stage, kind, mb = label
            self.record(f"recv {stage}{kind}{mb}", WAIT, "recv", stage, mb, t0 if posted is None else posted)

    def take_step(self) -> list[tuple]:
        """This step's events with ns timestamps, each backward P2P label resolved to the
        kind (B or I) its action actually had; clears the buffer."""
        backward = {(e[4], e[5]): e[3] for e in self.events if e[2] == COMPUTE and e[3] in ("B", "I")}
        out = [(e[0], e[1].replace(_UNRESOLVED, backward[(e[4], e[5])]) if _UNRESOLVED in e[1] else e[1], *e[2:6],
                self.clock.resolve(e[6]), self.clock.resolve(e[7])) for e in self.events]
        self.events.clear()
        return out


def _label(ops: list[dist.P2POp], stage: int, kind: str, mb: int) -> list[dist.P2POp]:
    """Tags each op with the action at this end: the one that consumes what is received,
    or the one that produced what is sent."""
    for op in ops:
        op.harness_label = (stage, kind, mb)
    return ops


def _instrument(stage: PipelineStage, timeline: Timeline) -> None:
    """Times this stage's compute and labels its P2P ops, through instance attributes that
    shadow PipelineStage's methods (the schedules call them on the instance)."""
    s = stage.stage_index
    forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
    fwd_recv, bwd_recv, fwd_send, bwd_send = (stage.get_fwd_recv_ops, stage.get_bwd_recv_ops,
                                              stage.get_fwd_send_ops, stage.get_bwd_send_ops)

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


@contextmanager
def _p2p_traced(timeline: Timeline) -> Iterator[None]:
    """Within: torch's schedules post and wait every P2P batch through the timeline (they
    all call these two module functions; only this rank's process runs them meanwhile)."""
    post, wait = torch_schedules._batch_p2p, torch_schedules._wait_batch_p2p
    torch_schedules._batch_p2p = lambda ops, desc=None: timeline.post(post, ops, desc)
    torch_schedules._wait_batch_p2p = lambda works: timeline.wait(wait, works)
    try:
        yield
    finally:
        torch_schedules._batch_p2p, torch_schedules._wait_batch_p2p = post, wait


def _build_stages(rank: int, plan: Plan, device: torch.device, timeline: Timeline) -> dict[int, nn.Module]:
    """This rank's stage modules, built exactly as the native executor builds them (layer i
    from seed (seed, i)), without its WeightGradStore: torch splits I and W itself."""
    c = plan.config
    model = get_model(c.model)
    modules: dict[int, nn.Module] = {}
    for s, r in sorted(plan.stage_rank.items()):
        if r == rank:
            layers = model.build_layers(*plan.stage_layers[s], seed=c.seed).to(device)
            modules[s] = (CheckpointedStage(layers, c.checkpoint_every, lambda t: None, timeline.timed_recompute)
                          if c.checkpointing else layers)
    return modules


def _schedule(plan: Plan, stages: list[PipelineStage], loss_fn: Callable) -> _PipelineSchedule:
    """torch's schedule for the plan; refuses, in one line, one whose placement differs."""
    c = plan.config
    if c.schedule.name == "csv":
        schedule = _PipelineScheduleRuntime(stages, c.microbatches, loss_fn=loss_fn, scale_grads=True)
        schedule._load_csv(c.schedule.csv_path, format="compute_only")
    else:
        cls = TORCH_SCHEDULES[c.schedule.name]
        schedule = cls(stages[0] if issubclass(cls, PipelineScheduleSingle) else stages, c.microbatches,
                       loss_fn=loss_fn, scale_grads=True)
    placed = stages[0].stage_index_to_group_rank  # what torch's P2P uses: loop, V or the CSV's
    if dict(placed) != plan.stage_rank:
        raise ValueError(f"schedule={c.schedule.name}: torch places stages {dict(placed)}, the plan "
                         f"{plan.stage_rank}; not the same plan")
    return schedule


def _check_order(plan: Plan, rank: int, events: list[tuple], cls: str) -> None:
    """The metrics (theory, simulation) describe plan.schedule: refuse a run whose order is not it."""
    got = [e[1] for e in events if e[2] == COMPUTE and e[3] in PIPELINE_KINDS]
    want = [str(a) for a in plan.schedule[rank]]
    if got != want:
        i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        raise RuntimeError(f"torch's {cls} ran {got[i] if i < len(got) else 'nothing'} where schedule="
                           f"{plan.config.schedule.name} has {want[i] if i < len(want) else 'nothing'} "
                           f"(rank {rank}, action {i}): not the same plan")


def _gradients(plan: Plan, modules: dict[int, nn.Module]) -> dict[str, Any]:
    """Accumulated gradients by global name "<layer>.<param>", as StageRunner.gradients; numpy,
    since torch's queue pickling shares tensors by file descriptor, which dies with us."""
    out = {}
    for s, module in modules.items():
        first = plan.stage_layers[s][0]
        layers = module.layers if isinstance(module, CheckpointedStage) else module
        for name, p in layers.named_parameters():
            index, rest = name.split(".", 1)
            out[f"{first + int(index)}.{rest}"] = p.grad.detach().cpu().clone().numpy()
    return out


def _loss_fn(plan: Plan, timeline: Timeline) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    model = get_model(plan.config.model)

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # the microbatch's mean loss, unscaled: torch's scale_grads=True divides the
        # accumulated gradients by M once, as the native 1/M on every microbatch loss does
        loss = model.loss(output, target)
        timeline.loss_done()
        return loss

    return loss_fn


def _steps(rank: int, plan: Plan, schedule: _PipelineSchedule, modules: dict[int, nn.Module],
           optimizer: torch.optim.Optimizer, timeline: Timeline, device: torch.device) -> tuple[list, list, Any]:
    """Every step: (losses or Nones, events, the last step's gradients if asked)."""
    c = plan.config
    model, first, last = get_model(c.model), 0 in modules, len(plan.stage_layers) - 1 in modules
    fault = parse_fault(c.fault)
    losses, events, grads = [], [], None
    total = c.warmup_steps + c.steps
    for step in range(total):
        gc.collect()
        maybe_inject(fault, rank, step)
        x, y = model.batch(c.seed, step, c.microbatches * c.microbatch_size)
        mb_losses: list[torch.Tensor] = []
        timeline.step = step
        dist.barrier()  # every rank starts the step together; not inside the window
        timeline.clock.start_step()
        # torch splits the batch into M microbatches along dim 0, as the native x.split(B)
        schedule.step(*([x.to(device)] if first else []), target=y.to(device) if last else None,
                      losses=mb_losses if last else None)
        if c.verify_grads and step == total - 1:
            grads = _gradients(plan, modules)  # before the optimizer, as natively
        t0 = timeline.clock.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timeline.record("optim", COMPUTE, "optim", -1, -1, t0)
        timeline.clock.finish_step()
        step_events = timeline.take_step()
        _check_order(plan, rank, step_events, type(schedule).__name__)
        events += step_events
        # the native step loss: the sum over microbatches, in order, of loss / M
        losses.append(float(sum(loss.detach() / c.microbatches for loss in mb_losses)) if last else None)
    return losses, events, grads


def run_peer_rank(rank: int, plan: Plan, init_method: str) -> dict:
    """Joins the world as `rank`, runs every step through torch's schedule; returns the same
    payload as the native run_rank. The caller owns the process group's teardown."""
    c = plan.config  # dp > 1 and fault=noaccum are refused by config.validate, before any rank
    device = join_world(rank, plan, init_method)
    timeline = Timeline(plan, CudaClock(device) if device.type == "cuda" else HostClock(), device)
    modules = _build_stages(rank, plan, device, timeline)
    stages = [PipelineStage(m, s, len(plan.stage_layers), device) for s, m in modules.items()]
    for stage in stages:
        _instrument(stage, timeline)
    schedule = _schedule(plan, stages, _loss_fn(plan, timeline))
    optimizer = torch.optim.SGD([p for m in modules.values() for p in m.parameters()], lr=c.lr)
    gc.disable()  # a collection pause inside a step is jitter; collect between steps instead
    # ...and only over what the run made: the heap forked from the forkserver (torch,
    # imported once) is frozen out of collections, which cut a 4-rank job's
    # between-step gc.collect() from ~0.5 s to ~1 ms per step on 2 cores
    gc.freeze()
    try:
        with _p2p_traced(timeline):
            losses, events, grads = _steps(rank, plan, schedule, modules, optimizer, timeline, device)
    finally:
        gc.unfreeze()
        gc.enable()
    payload = {"events": events, "losses": losses if losses[0] is not None else None, "memory": [],
               "peak_activation_bytes": 0, "activation_bytes_per_microbatch": 0.0,  # not measured
               "grads": grads}
    if device.type == "cuda":
        payload["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    return payload


def peer_worker_main(rank: int, port: int, plan: Plan, results: Queue) -> None:
    """Entry point of a forked rank, as worker_main's, running torch's engine."""
    worker_main(rank, port, plan, results, run_peer_rank)
