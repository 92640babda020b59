"""compute=emulated's hold: never short of its modeled cost, and woken without Linux's default
50 us timer slack; its lead: the math starts after it on a CPU, never where it would lengthen the
action (harness/runtime/emulate.py)."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import pytest
import torch

from harness.runtime.emulate import LEAD_NS, LEAD_SHARE, Emulator
from harness.schedules.ir import Action, Kind
from harness.simulate.cost import CostModel

_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


def test_a_hold_never_ends_before_its_deadline():
    emulator = Emulator(CostModel.uniform(1, fwd_s=1e-3), torch.device("cpu"))
    for seconds in (0.0, 1e-5, 2e-4, 1e-3):
        start = time.perf_counter_ns()
        emulator.hold_s(start, seconds)
        assert time.perf_counter_ns() - start >= seconds * 1e9


def test_the_math_starts_after_the_lead_on_a_cpu():
    """A 5 ms F leads 1 ms (LEAD_NS); a 1 ms one 0.2 ms (LEAD_SHARE of it): a sleep never ends early."""
    for fwd_s, lead_ns in ((5e-3, LEAD_NS), (1e-3, LEAD_SHARE * 1e6)):
        emulator = Emulator(CostModel.uniform(2, fwd_s=fwd_s), torch.device("cpu"))
        start = time.perf_counter_ns()
        emulator.lead(start, Action(1, Kind.F, 0))
        assert time.perf_counter_ns() - start >= lead_ns


def test_no_lead_on_a_gpu_for_real_compute_or_where_the_math_filled_the_action(monkeypatch):
    """On a GPU the kernels run on the device; for compute=real nothing is modeled; where the
    action is short, or a (stage, kind)'s last math filled its modeled time (a first step's), a
    lead would lengthen the action: no sleep. Its next quick math brings the lead back; other stages and kinds lead."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)

    def leads(emulator: Emulator, a: Action) -> bool:
        before = len(slept)
        emulator.lead(time.perf_counter_ns(), a)
        return len(slept) > before

    f0 = Action(0, Kind.F, 0)
    assert not leads(Emulator(CostModel.uniform(2, fwd_s=5e-3), torch.device("cuda")), f0)
    assert not leads(Emulator(None, torch.device("cpu")), f0)
    assert not leads(Emulator(CostModel.uniform(2, fwd_s=4e-4), torch.device("cpu")), f0)  # 80 us: too short
    assert leads(Emulator(CostModel.uniform(2, fwd_s=5e-4), torch.device("cpu")), f0)  # 100 us
    emulator = Emulator(CostModel.uniform(2, fwd_s=5e-3), torch.device("cpu"))
    emulator.hold(time.perf_counter_ns() - 10**9, f0)  # began a second ago: its math outlasted 5 ms
    assert not leads(emulator, Action(0, Kind.F, 1))
    assert leads(emulator, Action(1, Kind.F, 0)) and leads(emulator, Action(0, Kind.B, 0))
    emulator.math_ns[(0, Kind.F)] = 100_000  # 0.1 ms, as here after the first step
    assert leads(emulator, Action(0, Kind.F, 2))


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
