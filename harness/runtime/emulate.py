"""compute=emulated: an action is held until its modeled cost has elapsed since it began.

The real math runs inside the action, so tensors, losses and memory stay real; only the time
an action takes is set. Shared by every real executor, so emulated runs mean the same everywhere.

On a CPU the math waits a short lead after the action begins (`Emulator.lead`). Ranks share
the host's cores, and an action begins when its input arrives: the moment the rank that sent
it, and in a steady state its neighbours, begin theirs. With the math (~0.1 ms here) run at
once, the ranks of a hand-off all want a core then, and a woken one waits for it: on 2 cores at
pp=4, M=16, the platform's floor (benchmarks/floor.py) measured 1.026 x the simulated step
with the math first and 1.013 with a 1 ms lead, median of 6 runs each, lower in 6 of 6 pairs.
Where the math sits in the window changes nothing else: the window is modeled either way.
"""

from __future__ import annotations

import ctypes
import sys
import time

import torch

from harness.schedules.ir import Action, Kind
from harness.simulate.cost import CostModel


_PR_SET_TIMERSLACK = 29
SPIN_NS = 50_000  # the last 50 us of a hold are spun: a sleep's wake-up lands 30-100 us late here
LEAD_NS = 1_000_000  # the math's lead: past a hand-off's wake-ups (0.2-0.5 ms here)
LEAD_SHARE = 0.2  # ... and at most this share of the action's modeled time, and what its last math left
MIN_LEAD_NS = 100_000  # a shorter sleep is mostly its own wake-up's latency: no lead


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
        self.math_ns: dict[tuple[int, Kind], int] = {}  # (stage, kind): its last action's math
        self.led_ns = 0  # the running action's lead
        if cost is not None:
            tight_sleeps()

    def seconds(self, a: Action) -> float:
        return self.cost.compute(a) if self.cost is not None else 0.0

    def lead(self, start_ns: int, a: Action) -> None:
        """Before the action's real math, on a CPU: sleeps until `start_ns` + its lead, the
        least of LEAD_NS, LEAD_SHARE x its modeled time and what the last math of its stage and
        kind left of that time, less the hold's spun tail (the module's docstring says why).
        None on a GPU, whose kernels run on the device, and none under MIN_LEAD_NS: where the
        math filled the modeled time (a first step's), or the action is short, a lead would
        lengthen it."""
        self.led_ns = 0
        if self.cost is None or self.device.type != "cpu":
            return
        modeled = int(self.seconds(a) * 1e9)
        lead = min(LEAD_NS, int(LEAD_SHARE * modeled),
                   modeled - self.math_ns.get((a.stage, a.kind), 0) - SPIN_NS)
        if lead >= MIN_LEAD_NS:
            self.led_ns = lead
            if (left := start_ns + lead - time.perf_counter_ns()) > 0:
                time.sleep(left / 1e9)

    def hold(self, start_ns: int, a: Action) -> None:
        if self.cost is not None:
            self.math_ns[(a.stage, a.kind)] = time.perf_counter_ns() - start_ns - self.led_ns
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
