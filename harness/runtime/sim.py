"""executor=sim: every step simulated on the modeled costs (cost.*, comm.*), back to back;
no process, no clock. Replicas are identical, so one pipeline stands for every replica."""

from __future__ import annotations

from dataclasses import replace

from harness.metrics import modeled_step
from harness.plan import Plan
from harness.runtime.launch import Execution


def run_sim(plan: Plan) -> Execution:
    one = modeled_step(plan)
    span = max(e.end for e in one)
    steps = plan.config.warmup_steps + plan.config.steps
    trace = [replace(e, step=s, start=e.start + s * span, end=e.end + s * span) for s in range(steps) for e in one]
    return Execution(trace, plan.config.pp, [], None, [])
