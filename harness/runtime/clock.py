"""Timestamps for the trace, in ns of time.perf_counter_ns (CLOCK_MONOTONIC: one clock
for every process of a host).

On CUDA, kernels run asynchronously, so host timestamps would time the launch, not the
work: CudaClock records CUDA events and converts them to host ns after the step, through
an anchor event recorded right after a synchronize.
"""

from __future__ import annotations

import time

import torch


class HostClock:
    def start_step(self) -> None:
        pass

    def mark(self) -> int:
        return time.perf_counter_ns()

    def resolve(self, token: int) -> int:
        return token

    def finish_step(self) -> None:
        pass


class CudaClock:
    def __init__(self, device: torch.device):
        self.device = device
        self.anchor_ns = 0
        self.anchor: torch.cuda.Event | None = None

    def start_step(self) -> None:
        torch.cuda.synchronize(self.device)
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record()
        self.anchor_ns = time.perf_counter_ns()

    def mark(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def finish_step(self) -> None:
        torch.cuda.synchronize(self.device)

    def resolve(self, token: torch.cuda.Event) -> int:
        assert self.anchor is not None
        return self.anchor_ns + int(self.anchor.elapsed_time(token) * 1e6)  # elapsed_time is ms
