"""compute=emulated's hold: never short of its modeled cost, and woken without Linux's default
50 us timer slack (harness/runtime/emulate.py)."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import pytest
import torch

from harness.runtime.emulate import Emulator
from harness.simulate.cost import CostModel

_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


def test_a_hold_never_ends_before_its_deadline():
    emulator = Emulator(CostModel.uniform(1, fwd_s=1e-3), torch.device("cpu"))
    for seconds in (0.0, 1e-5, 2e-4, 1e-3):
        start = time.perf_counter_ns()
        emulator.hold_s(start, seconds)
        assert time.perf_counter_ns() - start >= seconds * 1e9


def test_real_compute_holds_nothing(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    Emulator(None, torch.device("cpu")).hold_s(time.perf_counter_ns(), 1.0)
    assert slept == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_an_emulating_thread_sleeps_with_a_1_ns_timer_slack():
    """The slack is per thread: an Emulator sets it on the thread that makes it (the rank's
    main thread, which holds), and compute=real leaves the default alone."""
    slack: dict[str, int] = {}

    def make(name: str, cost: CostModel | None) -> None:
        libc = ctypes.CDLL(None)
        libc.prctl(_PR_SET_TIMERSLACK, 50_000, 0, 0, 0)  # Linux's default (a thread inherits its creator's)
        Emulator(cost, torch.device("cpu"))
        slack[name] = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)

    for name, cost in (("emulated", CostModel.uniform(1)), ("real", None)):
        t = threading.Thread(target=make, args=(name, cost))
        t.start()
        t.join()
    assert slack["emulated"] == 1
    assert slack["real"] == 50_000
