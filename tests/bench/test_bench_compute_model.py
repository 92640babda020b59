"""Benchmark: the compute model's fit and its leave-one-out error on the measured H200 GPT-2
profile (data/gpt2_h200_profile.json): each measured microbatch size predicted by a fit on the
others, the whole model's forward and backward (goal: within 10%; the profile's identical
blocks themselves spread 19%). `make bench` times the leave-one-out (three fits) and prints
the errors; extra_info holds them, so the stored baseline keeps the figures beside the time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.planning.compute_model import leave_one_out
from harness.planning.devices import lookup

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]


def test_leave_one_out_on_the_h200_profile(benchmark, capsys):
    profile = json.loads((ROOT / "data" / "gpt2_h200_profile.json").read_text())
    loo = benchmark(leave_one_out, profile, lookup(profile["device"]), "bf16", 2)
    errors = {f"{d} B={b}": e for d, by in loo["whole_model"].items() for b, e in by.items()}
    benchmark.extra_info.update(worst=loo["worst_whole_model"], **errors)
    with capsys.disabled():
        print("\ncompute model, leave-one-out on data/gpt2_h200_profile.json (whole model): "
              + ", ".join(f"{k} {v:+.1%}" for k, v in errors.items()))
    assert loo["worst_whole_model"] < 0.12
