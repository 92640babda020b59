"""executor=sim: every step simulated on the modeled costs (cost.*, comm.*), back to back;
no process, no clock. Replicas are identical, so one pipeline stands for every replica."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

from harness.metrics import modeled_step
from harness.plan import Plan
from harness.runtime.launch import Execution
from harness.trace import Event


def run_sim(plan: Plan) -> Execution:
    with no_gc():  # ~10^6 events and no reference cycle: the cyclic collector's passes only cost time
        one = modeled_step(plan)
        span = max(e.end for e in one)
        steps = plan.config.warmup_steps + plan.config.steps
        return Execution(repeat_steps(one, steps, span), plan.config.pp, [], None, [])


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (reference counting still frees
    everything): building a million small objects otherwise triggers collections that scan
    all of them, about half the time at pp=64, M=1024."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def repeat_steps(one: list[Event], steps: int, span: float) -> list[Event]:
    """`one` (a step numbered 0) and `steps - 1` copies of it, step s shifted by s x span.

    Each copy is made from the original's field dict (object.__new__, then the dict), not
    through the frozen dataclass's __init__ or dataclasses.replace: pp=64, M=1024 is 131,072
    events a step, and those cost ~4 us and ~7 us an event, this ~1.5 us."""
    out = list(one)
    new = object.__new__
    for s in range(1, steps):
        shift = s * span
        for e in one:
            fields = e.__dict__
            copy = new(Event)
            copy.__dict__.update(fields, step=s, start=fields["start"] + shift, end=fields["end"] + shift)
            out.append(copy)
    return out
