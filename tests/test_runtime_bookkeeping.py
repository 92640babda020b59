"""The native runner's bookkeeping between actions, in one process (pp=1 needs no process
group): what it counts incrementally equals what a full count gives, after every action."""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.planning.plan import make_plan
from harness.runtime.groups import Layout
from harness.runtime.loop import RankContext, storage_bytes
from harness.runtime.native import NativeRunner
from harness.runtime.tracer import Tracer, clock_for


def test_gradient_bytes_equal_a_full_sum_after_every_action(config):
    """Per stage, summed again only when a .grad is a new tensor (a first backward, a W's
    out-of-place accumulation, the noaccum fault's reset): the same bytes as summing every
    parameter's gradient storage, at every action of every step. zbv at pp=1: two stages
    on the rank, I and W actions."""
    plan = make_plan(config(pp=1, microbatches=4, **{"schedule.name": "zbv"}))
    cpu = torch.device("cpu")
    runner = NativeRunner(RankContext(0, plan, cpu, Tracer(clock_for(cpu)), Layout(1, 1)))
    seen: list[tuple[int, int]] = []
    set_grads = runner.meter.set_grads

    def check(nbytes: int) -> None:
        seen.append((nbytes, storage_bytes(p.grad for p in runner.parameters())))
        set_grads(nbytes)

    runner.meter.set_grads = check
    for step in range(2):
        runner.run_step(step, drop_grads=step == 1)
        for p in runner.parameters():  # as the optimizer's zero_grad
            p.grad = None
    assert seen and all(got == want for got, want in seen), seen
    assert any(got > 0 for got, _ in seen)


def test_messages_are_sent_before_the_meters_bookkeeping(config):
    """An F's activation and a B's input gradient go to the transport straight after the
    action's event, before the meter counts or releases anything: the peer waits for the
    message, not for the bookkeeping. zbv at pp=1: two stages on the rank, so both stages'
    messages travel (handed over in memory) through the same Routes.send."""
    plan = make_plan(config(pp=1, microbatches=4, **{"schedule.name": "zbv"}))
    cpu = torch.device("cpu")
    runner = NativeRunner(RankContext(0, plan, cpu, Tracer(clock_for(cpu)), Layout(1, 1)))
    calls: list[str] = []

    def logged(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return fn(*args, **kwargs)
        return call

    runner.transport.send = logged("send", runner.transport.send)
    runner.meter.count_noted = logged("count", runner.meter.count_noted)
    runner.meter.release = logged("release", runner.meter.release)
    runner.tracer.record = logged("event", runner.tracer.record)
    runner.run_step(0)
    sends = [i for i, c in enumerate(calls) if c == "send"]
    assert sends
    # the call before each send is its action's event: never the meter's counting or releasing
    assert all(calls[i - 1] == "event" for i in sends), calls
