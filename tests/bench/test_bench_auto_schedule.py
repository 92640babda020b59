"""Benchmark: the zero-bubble generator (harness/schedules/auto.py) at p=32, m=256 on GPT-like
equal stages, memory limit 2.0: the knob grid's greedy candidates, the handcrafted seeds within
the limit, each timed by the simulator. Goal: under 2 seconds on one core. extra_info: seconds
(as the generator measures itself), candidates, bubble."""

from __future__ import annotations

import pytest

from harness.schedules.auto import generate
from harness.simulate import engine
from harness.simulate.cost import CostModel

pytestmark = pytest.mark.bench


def test_generate_p32_m256(benchmark):
    timed = not benchmark.disabled
    n, m = (32, 256) if timed else (8, 32)
    cost = CostModel((1.0,) * n, (1.5,) * n, (1.0,) * n, (0.5,) * n, fwd_hop_s=(0.03,) * n, bwd_hop_s=(0.03,) * n)
    g = benchmark.pedantic(generate, args=(n, m, cost, 2.0), rounds=3 if timed else 1, iterations=1)
    bubble = engine.bubble(engine.compile_schedule(g.schedule), cost)
    benchmark.extra_info.update(seconds=g.seconds, candidates=g.candidates, bubble=bubble)
    assert g.candidates >= 2 and bubble < 0.2
