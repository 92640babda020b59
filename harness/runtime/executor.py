"""Runs one rank's action list for one step, with real P2P of activations and gradients.

P2P semantics (the simulator and the validator assume the same): sends are posted with
isend and never block; a receive is posted right before the action that needs it and
blocks until the tensor is there. Gradients accumulate in .grad over the microbatches
(each microbatch loss is scaled by 1/M, so the sum is the full-batch mean loss's
gradient); the optimizer steps once per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from harness.model import get_model
from harness.plan import Plan
from harness.runtime.clock import CudaClock, HostClock
from harness.schedules.ir import Action, Kind
from harness.trace import COMM, COMPUTE, WAIT

# Event as it travels back from a worker: (step, name, cat, kind, stage, mb, start_ns, end_ns)
RawEvent = tuple[int, str, str, str, int, int, int, int]


def _tag(stage: int, grad: bool, mb: int, stages: int) -> int:
    """Unique message tag per (stage, direction, microbatch); gloo matches on it."""
    return (mb * 2 + int(grad)) * stages + stage


@dataclass
class StepState:
    inputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # kept for backward
    outputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # output or loss
    sends: list[tuple[dist.Work, torch.Tensor]] = field(default_factory=list)
    loss: torch.Tensor | None = None


class StageRunner:
    def __init__(self, rank: int, plan: Plan, device: torch.device):
        c = plan.config
        self.rank, self.plan, self.device = rank, plan, device
        self.model = get_model(c.model)
        self.actions: list[Action] = plan.schedule[rank]
        self.num_stages = len(plan.stage_layers)
        self.modules = {
            s: self.model.build_layers(*plan.stage_layers[s], seed=c.seed).to(device)
            for s, r in plan.stage_rank.items() if r == rank
        }
        params = [p for m in self.modules.values() for p in m.parameters()]
        self.optimizer = torch.optim.SGD(params, lr=c.lr)
        self.clock = CudaClock(device) if device.type == "cuda" else HostClock()
        self.act_shape = self.model.activation_shape(c.microbatch_size)
        self.events: list[tuple] = []  # (step, name, cat, kind, stage, mb, start token, end token)

    # -- timing -------------------------------------------------------------------------
    def _emulate(self, start_ns: int, seconds: float) -> None:
        """compute=emulated: hold the action until its modeled cost has elapsed since
        `start_ns` (host ns). The real math ran first, so tensors and losses stay real."""
        if self.plan.config.compute != "emulated":
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        deadline = start_ns + int(seconds * 1e9)
        # sleep oversleeps ~0.1 ms; sleep to 0.3 ms before the deadline, then spin
        while (left := deadline - time.perf_counter_ns()) > 300_000:
            time.sleep((left - 300_000) / 1e9)
        while time.perf_counter_ns() < deadline:
            pass

    def _record(self, step: int, name: str, cat: str, kind: str, stage: int, mb: int, t0, t1) -> None:
        self.events.append((step, name, cat, kind, stage, mb, t0, t1))

    # -- P2P ----------------------------------------------------------------------------
    def _recv(self, step: int, a: Action, from_stage: int, grad: bool) -> torch.Tensor:
        buf = torch.empty(self.act_shape, device=self.device)
        t0 = self.clock.mark()
        dist.irecv(buf, src=self.plan.stage_rank[from_stage], tag=_tag(from_stage, grad, a.microbatch,
                                                                        self.num_stages)).wait()
        self._record(step, f"recv {a}", WAIT, "recv", a.stage, a.microbatch, t0, self.clock.mark())
        return buf

    def _send(self, step: int, st: StepState, a: Action, tensor: torch.Tensor, to_stage: int, grad: bool) -> None:
        t0 = self.clock.mark()
        tensor = tensor.contiguous()
        work = dist.isend(tensor, dst=self.plan.stage_rank[to_stage],
                          tag=_tag(a.stage, grad, a.microbatch, self.num_stages))
        st.sends.append((work, tensor))  # the tensor must outlive the send
        self._record(step, f"send {a}", COMM, "send", a.stage, a.microbatch, t0, self.clock.mark())

    # -- actions ------------------------------------------------------------------------
    def _forward(self, step: int, st: StepState, a: Action, batch) -> None:
        s, mb, B = a.stage, a.microbatch, self.plan.config.microbatch_size
        first, last = s == 0, s == self.num_stages - 1
        if first:
            x = batch[0][mb * B:(mb + 1) * B]
        else:
            x = self._recv(step, a, s - 1, grad=False).requires_grad_(True)
        h0, t0 = time.perf_counter_ns(), self.clock.mark()
        y = self.modules[s](x)
        if last:
            y = self.model.loss(y, batch[1][mb * B:(mb + 1) * B]) / self.plan.config.microbatches
            st.loss = y.detach() if st.loss is None else st.loss + y.detach()
        self._emulate(h0, self.plan.emulated_cost.compute(a))
        self._record(step, str(a), COMPUTE, "F", s, mb, t0, self.clock.mark())
        st.inputs[(s, mb)], st.outputs[(s, mb)] = x, y
        if not last:
            self._send(step, st, a, y.detach(), s + 1, grad=False)

    def _backward(self, step: int, st: StepState, a: Action) -> None:
        s, mb = a.stage, a.microbatch
        last = s == self.num_stages - 1
        grad = None if last else self._recv(step, a, s + 1, grad=True)
        h0, t0 = time.perf_counter_ns(), self.clock.mark()
        torch.autograd.backward(st.outputs.pop((s, mb)), grad_tensors=grad)
        self._emulate(h0, self.plan.emulated_cost.compute(a))
        self._record(step, str(a), COMPUTE, "B", s, mb, t0, self.clock.mark())
        x = st.inputs.pop((s, mb))
        if s > 0:
            self._send(step, st, a, x.grad, s - 1, grad=True)

    def run_step(self, step: int) -> float | None:
        """Runs every action of this rank for one step, then the optimizer.
        Returns the step's loss on the rank that holds the last stage, else None."""
        c = self.plan.config
        batch = self.model.batch(c.seed, step, c.microbatches * c.microbatch_size)
        batch = (batch[0].to(self.device), batch[1].to(self.device))
        st = StepState()
        self.clock.start_step()
        for a in self.actions:
            if a.kind is Kind.F:
                self._forward(step, st, a, batch)
            elif a.kind is Kind.B:
                self._backward(step, st, a)
            else:
                raise NotImplementedError(f"{a}: I/W actions need the zero-bubble executor (not in this version)")
        t0 = self.clock.mark()
        for work, _ in st.sends:
            work.wait()
        self._record(step, "send wait", WAIT, "send", -1, -1, t0, self.clock.mark())
        t0 = self.clock.mark()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._record(step, "optim", COMPUTE, "optim", -1, -1, t0, self.clock.mark())
        self.clock.finish_step()
        return None if st.loss is None else float(st.loss)

    def take_events(self) -> list[RawEvent]:
        """Events so far with tokens resolved to ns; clears the buffer. Call after run_step
        (CudaClock resolves against the step's anchor)."""
        out = [(*e[:6], self.clock.resolve(e[6]), self.clock.resolve(e[7])) for e in self.events]
        self.events.clear()
        return out
