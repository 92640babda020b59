"""A schedule from outside the package, in one file: every forward, then every backward in
reverse microbatch order (the last microbatch's gradient first, as a stack would). No closed
form and no torch class: theory is the simulator's labelled ideal, executor=pytorch runs it
through torch's CSV loader.
Registered by the test that uses it (tests/test_schedule_registry.py), unregistered after."""

from __future__ import annotations

from harness.schedules.ir import Action, Kind, Schedule
from harness.schedules.registry import ScheduleSpec


def reverse_gpipe(n: int, m: int, v: int) -> Schedule:
    return {r: [Action(r, Kind.F, i) for i in range(m)] + [Action(r, Kind.B, i) for i in reversed(range(m))]
            for r in range(n)}


TOY = ScheduleSpec("reverse_gpipe", "every forward, then the backwards last microbatch first (a test's schedule)",
                   reverse_gpipe)
