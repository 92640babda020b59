"""executor=sim: every step simulated on the modeled costs (cost.*, comm.*), back to back;
no process, no clock. Replicas are identical, so one pipeline stands for every replica."""

from __future__ import annotations

from dataclasses import replace

from harness.metrics import ring_allreduce_s
from harness.plan import Plan
from harness.runtime.launch import Execution
from harness.simulate.engine import simulate
from harness.trace import COMM, Event


def run_sim(plan: Plan) -> Execution:
    """With dp > 1 each stage's last backward is followed by its ring all-reduce (dp_sync),
    as the native executor traces it (no overlap)."""
    one = simulate(plan.schedule, plan.sim_cost())
    if plan.config.dp > 1:
        sync = ring_allreduce_s(plan)
        last = {}  # (rank, stage) -> its last backward event
        for e in one:
            if e.kind in "BI":
                last[(e.rank, e.stage)] = e
        for (rank, stage), e in last.items():
            one.append(Event(rank, 0, f"dp_sync {stage}", COMM, "dp_sync", stage, -1, e.end, e.end + sync))
    span = max(e.end for e in one)
    steps = plan.config.warmup_steps + plan.config.steps
    trace = [replace(e, step=s, start=e.start + s * span, end=e.end + s * span) for s in range(steps) for e in one]
    return Execution(trace, plan.config.pp, [], None, [])
