"""executor=sim: the plan's step simulated on its priced cost model (harness/simulate/pricing.py:
cost.* or a profile, comm.* or cluster=); no process, no clock. Every step is the same, so the
trace holds one measured step standing for all of them (Execution.step_repeats), and one
pipeline stands for every replica."""

from __future__ import annotations

from harness.measure.execution import Execution
from harness.planning.plan import Plan


def run_sim(plan: Plan, pids: list[int]) -> Execution:
    c = plan.config
    return Execution(plan.modeled_step(step=c.warmup_steps), c.pp, [], None, [], step_repeats=c.steps)
