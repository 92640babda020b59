"""A toy executor in one file, for tests/test_executor_registry.py: the plan's actions with
plain autograd, full backwards only, over the eager transport; no memory meter, no
checkpointing, no data parallelism. Registered with one `register(...)` call; the shared
rank loop does everything else (steps, barrier, optimizer, faults, the report)."""

from __future__ import annotations

import torch

from harness.model import get_model
from harness.runtime.loop import RankContext, named_gradients
from harness.runtime.registry import Executor, register
from harness.runtime.transport import GroupTransport, Message, Routes
from harness.schedules.ir import Kind
from harness.measure.trace import COMPUTE


class ToyRunner:
    def __init__(self, ctx: RankContext):
        plan, c = ctx.plan, ctx.plan.config
        self.plan, self.rank, self.tracer, self.model = plan, ctx.rank, ctx.tracer, get_model(c.model)
        self.layers = {s: self.model.build_layers(*plan.stage_layers[s], seed=c.seed)
                       for s, r in plan.stage_rank.items() if r == ctx.rank}
        net = GroupTransport("eager", 0, c.pp, plan.stage_rank, {}, self.model.activation_shape(c.microbatch_size),
                             torch.float32, ctx.device, ctx.tracer)
        self.transport = Routes(plan.stage_rank, ctx.rank, net)

    def parameters(self) -> list[torch.Tensor]:
        return [p for m in self.layers.values() for p in m.parameters()]

    def gradients(self) -> dict[str, torch.Tensor]:
        return named_gradients(self.plan, self.layers)

    def step_memory(self) -> None:
        return None

    def run_step(self, step: int, drop_grads: bool) -> float | None:
        c, last = self.plan.config, len(self.plan.stage_layers) - 1
        x, y = self.model.batch(c.seed, step, c.microbatches * c.microbatch_size)
        xs, ys = x.split(c.microbatch_size), y.split(c.microbatch_size)
        held, loss = {}, None
        for a in self.plan.schedule[self.rank]:
            s, mb = a.stage, a.microbatch
            t0 = self.tracer.mark()
            if a.kind is Kind.F:
                inp = xs[mb] if s == 0 else self.transport.recv(Message(s - 1, s, "act", mb), a).requires_grad_()
                t0 = self.tracer.mark()
                out = self.layers[s](inp)
                if s == last:
                    out = self.model.loss(out, ys[mb]) / c.microbatches
                    loss = out.detach() if loss is None else loss + out.detach()
                self.tracer.record(str(a), COMPUTE, "F", s, mb, t0)
                held[(s, mb)] = inp, out
                if s < last:
                    self.transport.send(Message(s, s + 1, "act", mb), out, a)
            else:
                grad = None if s == last else self.transport.recv(Message(s + 1, s, "grad", mb), a)
                t0 = self.tracer.mark()
                inp, out = held.pop((s, mb))
                torch.autograd.backward(out, grad_tensors=grad)
                self.tracer.record(str(a), COMPUTE, "B", s, mb, t0)
                if s > 0:
                    self.transport.send(Message(s, s - 1, "grad", mb), inp.grad, a)
        self.transport.drain()
        return None if loss is None else float(loss)


TOY = register(Executor("toy", "a test's one-file executor", runner="tests.toy_executor:ToyRunner",
                        split_backward=False))
