"""Numbers that tell the truth: theory in the run's costs, costs that scale with the work,
contention said, the measured bubble attributed, spread recorded, simulated said."""

from __future__ import annotations

import json
import math

import pytest

from harness.config import ConfigError
from harness.job import run_job
from harness.planning.plan import make_plan
from tests.jitter import bubble_allowance, oversleep, stretch

EMULATED = {"compute": "emulated", "cost.fwd_ms_per_layer": 10.0, "model.layers": 4}


def test_emulated_costs_scale_with_the_microbatch(config):
    """fwd(B) = fwd_ms_per_layer x (fixed + (1 - fixed) x B / at_microbatch_size), per layer."""
    base = dict(pp=2, microbatches=4, **{"model.layers": 4, "cost.fwd_ms_per_layer": 10.0,
                                         "cost.fixed_fraction": 0.2, "cost.at_microbatch_size": 4})
    per_stage = {b: make_plan(config(microbatch_size=b, **base)).emulated_cost.fwd_s[0] for b in (2, 4, 8)}
    assert per_stage[4] == pytest.approx(2 * 0.010)  # two layers a stage, at the reference size
    assert per_stage[8] == pytest.approx(2 * 0.010 * (0.2 + 0.8 * 2))
    assert per_stage[2] == pytest.approx(2 * 0.010 * (0.2 + 0.8 * 0.5))
    split = make_plan(config(**base, **{"schedule.name": "zb_h1", "cost.weight_grad_share": 0.3})).emulated_cost
    assert split.weight_grad_s[0] == pytest.approx(0.3 * split.bwd_s[0])
    assert split.input_grad_s[0] == pytest.approx(0.7 * split.bwd_s[0])


def test_a_profile_is_interpolated_between_its_sizes_and_extrapolation_is_noted(config):
    scenario = {"profile": "data/gpt2_h200_profile.json", "model.name": "gpt", "model.layers": 12,
                "model.hidden": 32, "model.heads": 2, "compute": "emulated", "pp": 4}
    at = {b: make_plan(config(microbatch_size=b, **scenario)) for b in (1, 2, 4, 16)}
    f = {b: sum(p.emulated_cost.fwd_s) for b, p in at.items()}
    assert f[1] < f[2] < f[4] and f[2] == pytest.approx(f[1] + (f[4] - f[1]) / 3)  # linear between 1 and 4
    assert not at[2].notes and "extrapolated" in at[16].notes[0]


@pytest.mark.dist
def test_emulated_throughput_grows_with_b_as_the_cost_model_says(tmp_path, config):
    """Within 5% on a quiet machine; on a busy one each job's step stretches by what its own
    actions' oversleep says (tests/jitter.py), the short-action B=2 job the most, so the ratio
    may move by that much."""
    got, share = {}, {}
    for b in (2, 8):
        c = config(pp=2, microbatches=4, microbatch_size=b, steps=3, **EMULATED)
        result = run_job(c, tmp_path / str(b), "test", f"b{b}")
        assert result.status == "ok", result.error
        got[b] = (result.metrics.throughput_samples_s, c.microbatches * b / result.metrics.model_step_s)
        share[b] = oversleep(c, result.metrics)
    measured, modeled = got[8][0] / got[2][0], got[8][1] / got[2][1]
    assert modeled == pytest.approx(4 / 3, rel=0.01)  # 4x the samples in (0.2 + 0.8 x 2) / (0.2 + 0.8 x 0.5) = 3x the time
    lo, hi = modeled * 0.95 / stretch(share[8]), modeled * 1.05 * stretch(share[2])
    assert lo <= measured <= hi, (measured, modeled, share, lo, hi)


@pytest.mark.dist
def test_the_dp_study_at_a_fixed_global_batch_matches_its_reference(tmp_path, config):
    """dp 1 -> 2 at global batch 32: B halves, so does most of each op's work; the measured
    throughput follows the cost model's prediction for each point (the dp figure's line)."""
    ratios, floors = [], []
    for dp in (1, 2):
        c = config(pp=2, microbatches=4, dp=dp, global_batch=32, steps=3, **EMULATED)
        m = run_job(c, tmp_path / str(dp), "test", f"dp{dp}").metrics
        ratios.append(m.throughput_samples_s / (32 / m.model_step_s))
        floors.append(0.8 / stretch(oversleep(c, m)))  # 0.8 on a quiet machine (tests/jitter.py)
    # measured can only lose to the model: hops, jitter
    assert all(f < r <= 1.02 for r, f in zip(ratios, floors)), (ratios, floors)


@pytest.mark.dist
@pytest.mark.parametrize("schedule", ["1f1b", "zb_h1"])
def test_attribution_sums_to_the_measured_bubble(tmp_path, config, schedule):
    c = config(pp=4, microbatches=8, steps=2, **{"schedule.name": schedule, "cost.bwd_over_fwd": 3.0}, **EMULATED)
    result = run_job(c, tmp_path, "test", "why")
    b = result.metrics.bubble
    a = b.attribution
    assert a.schedule + a.imbalance + a.communication + a.overhead == pytest.approx(b.measured, abs=1e-9)
    assert min(a.schedule, a.imbalance, a.communication, a.overhead) >= 0, a  # emulated equal stages
    assert a.schedule == b.theory and b.theory_source == "closed form"
    assert b.theory_costs["bwd_over_fwd"] == pytest.approx(3.0)
    assert "= schedule" in result.headline() and "oversubscribed" not in result.headline()
    assert len(b.measured_step_iqr) == 2 and b.measured_step_iqr[0] <= b.measured_step_iqr[1]
    assert result.metrics.step_time_iqr_s[0] <= result.metrics.step_time_s <= result.metrics.step_time_iqr_s[1]


@pytest.mark.dist
def test_imbalance_dominates_the_h200_params_partition_replay(tmp_path, config):
    c = config(pp=4, microbatches=8, steps=2, microbatch_size=1, compute="emulated", profile="data/gpt2_h200_profile.json",
               **{"model.name": "gpt", "model.layers": 12, "model.hidden": 32, "model.heads": 2, "model.seq": 16,
                  "model.vocab": 64, "partition.name": "params", "cost.time_scale": 3.0})
    m = run_job(c, tmp_path, "test", "params").metrics
    a = m.bubble.attribution
    assert a.imbalance > a.communication and a.imbalance > 0.1, a
    # the overhead is the machine's: late wake-ups on a busy one add to it what they add to the
    # bubble (tests/jitter.py; seen 0.18 against an imbalance of 0.17 with 8 jobs on 2 cores)
    busy = bubble_allowance(0.0, m.bubble.theory, oversleep(c, m))
    assert a.imbalance > a.overhead - busy, (a, f"busy machine's part {busy:.3f}")


@pytest.mark.dist
def test_real_compute_with_more_ranks_than_cores_is_flagged(tmp_path, config, monkeypatch):
    import harness.planning.plan

    monkeypatch.setattr(harness.planning.plan, "host_cores", lambda: 2)  # this machine's count, on any machine
    real = run_job(config(pp=4, microbatches=4, steps=1), tmp_path / "real", "test", "real")
    assert real.env.oversubscribed and (real.env.ranks_on_host, real.env.cores) == (4, 2)
    assert "oversubscribed: 4 busy ranks on 2 cores" in real.headline()
    emulated = run_job(config(pp=4, microbatches=4, steps=1, compute="emulated", **{"cost.fwd_ms_per_layer": 1.0}),
                       tmp_path / "emulated", "test", "emulated")
    assert emulated.env.oversubscribed is False
    assert json.loads((tmp_path / "real" / "result.json").read_text())["env"]["oversubscribed"] is True


def test_compute_auto_emulates_when_ranks_would_outnumber_cores(config, monkeypatch):
    import harness.planning.plan

    monkeypatch.setattr(harness.planning.plan, "host_cores", lambda: 2)
    crowded = make_plan(config(compute="auto", pp=4))
    assert crowded.config.compute == "emulated" and "4 ranks would share 2 cores" in crowded.notes[0]
    assert make_plan(config(compute="auto", pp=2)).config.compute == "real"
    assert make_plan(config(compute="auto", pp=4, executor="sim")).notes == ()


def test_simulated_numbers_say_so(config, tmp_path):
    result = run_job(config(executor="sim", pp=4, microbatches=8), tmp_path, "test", "sim")
    line = result.headline()
    assert "(simulated: executor=sim)" in line and "measured" not in line
    assert result.env.oversubscribed is False and result.config["compute"] == "real"  # as asked; no process ran


@pytest.mark.parametrize("overrides,expected", [
    ({"schedule.name": "1f1b", "pp": 4, "microbatches": 2},
     "schedule=1f1b pp=4 microbatches=2: executor=pytorch (Schedule1F1B) refuses it: Number of microbatches (2) must"),
    ({"schedule.name": "zb_h1", "pp": 2, "microbatches": 9},
     "executor=pytorch (ScheduleInterleavedZeroBubble) refuses it: Zero bubble requires the number of microbatches"),
])
def test_the_peer_executors_constraints_come_from_torch_before_any_worker(config, overrides, expected):
    with pytest.raises(ConfigError) as err:
        make_plan(config(executor="pytorch", **overrides))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_theory_of_a_csv_schedule_is_its_built_in(config, tmp_path):
    from harness.measure.metrics import bubble_theory
    from harness.schedules.registry import build
    from harness.schedules.csv_io import write_csv

    write_csv(tmp_path / "zbv.csv", build("zbv", 4, 8))
    plan = make_plan(config(pp=4, microbatches=8, compute="emulated", **{"schedule.name": "csv",
                                                                         "schedule.csv_path": str(tmp_path / "zbv.csv")}))
    got, _ = bubble_theory(plan, {})
    want, _ = bubble_theory(make_plan(config(pp=4, microbatches=8, compute="emulated", **{"schedule.name": "zbv"})), {})
    assert got.value == want.value and not math.isnan(got.value)
