"""compute=emulated: an action is held until its modeled cost has elapsed since it began.

The real math runs first, so tensors, losses and memory stay real; only the time an action
takes is set. Shared by every real executor, so emulated runs mean the same everywhere.
"""

from __future__ import annotations

import time

import torch

from harness.schedules.ir import Action
from harness.simulate.cost import CostModel


class Emulator:
    """`cost` None (compute=real): holding is a no-op."""

    def __init__(self, cost: CostModel | None, device: torch.device):
        self.cost, self.device = cost, device

    def seconds(self, a: Action) -> float:
        return self.cost.compute(a) if self.cost is not None else 0.0

    def hold(self, start_ns: int, a: Action) -> None:
        self.hold_s(start_ns, self.seconds(a))

    def hold_s(self, start_ns: int, seconds: float) -> None:
        """Sleep until `start_ns` (host ns) + `seconds`. No spinning: with more ranks than
        cores a spinning rank steals the core a peer needs; the ~0.1 ms oversleep lands
        inside the action, not in the bubble."""
        if self.cost is None:
            return
        if self.device.type == "cuda":  # the action's kernels, not their launch, set its start
            torch.cuda.synchronize(self.device)
        deadline = start_ns + int(seconds * 1e9)
        while (left := deadline - time.perf_counter_ns()) > 0:
            time.sleep(left / 1e9)
