"""compute=emulated: an action is held until its modeled cost has elapsed since it began.

The real math runs first, so tensors, losses and memory stay real; only the time an action
takes is set. Shared by every real executor, so emulated runs mean the same everywhere.
"""

from __future__ import annotations

import ctypes
import sys
import time

import torch

from harness.schedules.ir import Action
from harness.simulate.cost import CostModel


_PR_SET_TIMERSLACK = 29
SPIN_NS = 50_000  # the last 50 us of a hold are spun: a sleep's wake-up lands 30-100 us late here


def tight_sleeps() -> None:
    """Linux lets a sleeping thread wake up to its timer slack late (50 us by default), so an
    emulated 5 ms action ran 5.10 ms; a 1 ns slack for this thread leaves the wake-up's own
    latency, which the spun tail of `Emulator.hold_s` absorbs."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)


class Emulator:
    """`cost` None (compute=real): holding is a no-op."""

    def __init__(self, cost: CostModel | None, device: torch.device):
        self.cost, self.device = cost, device
        if cost is not None:
            tight_sleeps()

    def seconds(self, a: Action) -> float:
        return self.cost.compute(a) if self.cost is not None else 0.0

    def hold(self, start_ns: int, a: Action) -> None:
        self.hold_s(start_ns, self.seconds(a))

    def hold_s(self, start_ns: int, seconds: float) -> None:
        """Sleep until `start_ns` (host ns) + `seconds`, spinning only the last SPIN_NS: with
        more ranks than cores a spinning rank steals the core a peer needs, so the spin is
        bounded (1% of a 5 ms action); a late wake-up would land in the action's time."""
        if self.cost is None:
            return
        if self.device.type == "cuda":  # the action's kernels, not their launch, set its start
            torch.cuda.synchronize(self.device)
        deadline = start_ns + int(seconds * 1e9)
        while (left := deadline - time.perf_counter_ns()) > SPIN_NS:
            time.sleep((left - SPIN_NS) / 1e9)
        while time.perf_counter_ns() < deadline:
            pass
