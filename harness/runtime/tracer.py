"""A rank's trace buffer: the timed events of the running step, on the rank's clock (its
offset to rank 0's is added where every rank's events meet: harness/measure/execution.py from_reports).

Every real executor records through one Tracer: the rank loop (barrier, optimizer), the
runner (compute actions) and the transport (receive waits, sends). Tokens are the clock's
(host ns, or CUDA events resolved after the step); `take` turns them into ns.
"""

from __future__ import annotations

from typing import Any

from harness.measure.execution import RawEvent
from harness.runtime.clock import CudaClock, HostClock


class Tracer:
    def __init__(self, clock: HostClock | CudaClock):
        self.clock = clock
        self.step = 0
        # [step, name, cat, kind, stage, mb, start token, end token]; lists, so a runner can
        # extend an event it opened (the peer's last-stage F until its loss has run)
        self.pending: list[list[Any]] = []

    def mark(self) -> Any:
        return self.clock.mark()

    def record(self, name: str, cat: str, kind: str, stage: int, mb: int, start: Any, end: Any = None) -> list[Any]:
        """One event of the running step, ending now unless `end` is given; returns it."""
        event = [self.step, name, cat, kind, stage, mb, start, self.clock.mark() if end is None else end]
        self.pending.append(event)
        return event

    def start_step(self, step: int) -> None:
        self.step = step
        self.clock.start_step()

    def finish_step(self) -> None:
        self.clock.finish_step()

    def take(self) -> list[RawEvent]:
        """The step's events with tokens resolved to ns; clears the buffer. After finish_step
        (a CudaClock resolves against the step's anchor)."""
        out = [(*e[:6], self.clock.resolve(e[6]), self.clock.resolve(e[7])) for e in self.pending]
        self.pending.clear()
        return out


def clock_for(device: Any, skew_ns: int = 0) -> HostClock | CudaClock:
    """The rank's clock; `skew_ns` (test-only: clock_skew_s) is added to every reading."""
    return CudaClock(device, skew_ns) if device.type == "cuda" else HostClock(skew_ns)
