"""The native runner's bookkeeping between actions, in one process (pp=1 needs no process
group): what it counts incrementally equals what a full count gives, after every action."""

from __future__ import annotations

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
