"""Intervals and comparisons (harness/measure/intervals.py): the order-statistic interval of the
median and its exact coverage (checked by drawing), the permutation test's exactness and the
counts below which it can never tell two runs apart, and the report's table built on them
(harness/report/noise.py): identical configs on 3 steps never called different, a real
difference on 5 steps told apart, each interval with its method and n, busy hosts marked."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from math import comb

import pytest

from harness.measure.intervals import (BOOTSTRAP, ORDER_STATISTICS, SIMULATED, compare, describe, interval, median_coverage,
                                       median_interval, overlap, tag)
from harness.records.result import HostLoad, Intervals
from harness.report.doc import Table
from harness.report.noise import noise_section
from tests.test_report import fake


def test_the_bootstrap_holds_the_median_is_reproducible_and_narrows_with_samples():
    rng = random.Random(1)
    few, many = [rng.gauss(10, 1) for _ in range(5)], [rng.gauss(10, 1) for _ in range(200)]
    lo, hi = interval(few)
    assert lo <= statistics.median(few) <= hi and interval(few) == (lo, hi)
    lo2, hi2 = interval(many)
    assert lo2 <= 10 <= hi2 and hi2 - lo2 < hi - lo
    assert interval([3.0]) == (3.0, 3.0) and interval([2.0, 2.0]) == (2.0, 2.0)
    assert overlap([1, 2], [1.5, 3]) and overlap([1, 2], [2, 3]) and not overlap([1, 2], [2.1, 3])


def test_the_median_interval_states_the_coverage_it_has():
    # few samples: the range, at what the range covers (1 - 2^(1-n)); 6 or more: at least 95%
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, 0.75)
    assert median_interval([5, 1, 4, 2, 3]) == (1.0, 5.0, 0.9375)
    assert median_interval([6, 1, 4, 2, 3, 5])[2] == pytest.approx(1 - 2 / 64)
    xs = list(range(30))
    lo, hi, cover = median_interval(xs)
    assert cover >= 0.95 and 0 < lo < 14.5 < hi < 29 and median_coverage(30, int(lo) + 2) < 0.95  # the narrowest
    assert median_interval([7.0]) == (7.0, 7.0, 0.0)
    assert describe(ORDER_STATISTICS, 0.9375, 5) == "93.8% interval, order statistics of the median, n=5 steps"
    assert describe(ORDER_STATISTICS, 0.0, 1).startswith("a single value")
    # the coverage is real: the range of 5 draws of a skewed distribution holds its median 93.75% of the time
    rng, median_exp = random.Random(3), 0.6931471805599453
    held = 0
    for _ in range(4000):
        lo, hi, _ = median_interval([rng.expovariate(1.0) for _ in range(5)])
        held += lo <= median_exp <= hi
    assert abs(held / 4000 - 0.9375) < 0.015


def test_three_steps_against_three_are_never_told_apart_and_five_can_be():
    # the smallest p 3 vs 3 can give is 2/20: not even a total separation is significant at 5%
    apart = compare([1.0, 1.01, 1.02], [5.0, 5.1, 5.2])
    assert apart.p == pytest.approx(0.1) and apart.smallest_p == pytest.approx(0.1) and not apart.distinguishable
    assert "no difference is significant at so few" in apart.phrase()
    rng = random.Random(7)
    for _ in range(300):  # an identical config twice, 3 steps each, with a slow step now and then
        a = [0.1 * (1 + rng.expovariate(20)) for _ in range(3)]
        b = [0.1 * (1 + rng.expovariate(20)) for _ in range(3)]
        assert not compare(a, b).distinguishable
    # 5 vs 5 wholly apart: the 2 most extreme of the 252 splits
    five = compare([1.0, 1.1, 1.2, 1.3, 1.4], [2.0, 2.1, 2.2, 2.3, 2.4])
    assert five.exact and five.p == pytest.approx(2 / comb(10, 5)) and five.distinguishable
    assert five.phrase() == "p=0.0079, n=5 vs 5 steps, permutation test"
    assert compare([1.0, 1.0], [1.0, 1.0]).p == 1.0
    # exchangeable samples are called different about 5% of the time at most (it is a 5% test)
    called = sum(compare([rng.gauss(0, 1) for _ in range(5)], [rng.gauss(0, 1) for _ in range(5)]).distinguishable
                 for _ in range(400))
    assert called <= 0.05 * 400 + 3 * (0.05 * 0.95 * 400) ** 0.5
    # past EXACT_SPLITS the splits are sampled, seeded: reproducible, and still finds a clear shift
    big_a, big_b = [rng.gauss(0, 1) for _ in range(12)], [rng.gauss(3, 1) for _ in range(12)]
    sampled = compare(big_a, big_b)
    assert not sampled.exact and sampled.distinguishable and sampled == compare(big_a, big_b)


def _run(i: int, schedule: str, steps: list[float], busy: bool | None = None):
    r = fake(i, schedule={"name": schedule})
    lo, hi, cover = median_interval(steps)
    r.result.metrics = replace(r.metrics, step_times_s=steps, step_time_s=statistics.median(steps),
                               intervals=Intervals(cover, ORDER_STATISTICS, len(steps), [lo, hi], [0.2, 0.2], [1, 2]))
    if busy is not None:
        r.result.env.host_load = HostLoad("/proc", "rule", 1.0, 2, [1.0] * 3, [2.0] * 3, 0.5,
                                          1.8 if busy else 0.05, 1.8 if busy else 0.05, busy)
    return r


def _rows(runs) -> dict[str, list]:
    table = next(b for b in noise_section(runs) if isinstance(b, Table))
    return {row[1]: row for row in table.rows}


def test_the_table_says_not_distinguishable_at_3_steps_and_tells_5_apart():
    # the same config under two schedule names, 3 steps each, one a hair faster: not told apart
    rows = _rows([_run(0, "gpipe", [0.100, 0.104, 0.101]), _run(1, "1f1b", [0.099, 0.103, 0.1005], busy=True)])
    assert rows["1f1b"][6] == "fastest"
    assert rows["gpipe"][6].startswith("not distinguishable from 1f1b (n=3 vs 3 steps")
    assert "(75.0% interval, order statistics of the median, n=3 steps)" in rows["gpipe"][3]
    assert rows["1f1b"][7] == "busy: 1.8 other cores" and rows["gpipe"][7] == "n/a"
    # 5 steps each, wholly apart: slower, with its p
    rows = _rows([_run(0, "gpipe", [0.120, 0.121, 0.122, 0.123, 0.124], busy=False),
                  _run(1, "1f1b", [0.100, 0.101, 0.102, 0.103, 0.104], busy=False)])
    assert rows["gpipe"][6] == "slower than 1f1b (p=0.0079, n=5 vs 5 steps, permutation test)"
    assert "93.8% interval" in rows["gpipe"][3] and rows["gpipe"][7] == "quiet"
    # repeats: over their median steps, and 2 vs 2 can never tell
    rows = _rows([_run(0, "gpipe", [0.2] * 3), _run(1, "gpipe", [0.21] * 3), _run(2, "1f1b", [0.1] * 3),
                  _run(3, "1f1b", [0.11] * 3)])
    assert "n=2 repeats" in rows["gpipe"][3] and rows["gpipe"][6].startswith("not distinguishable from 1f1b (n=2 vs 2 repeats")


@pytest.mark.dist
@pytest.mark.slow
def test_a_real_pair_of_identical_emulated_runs_on_3_steps_is_not_told_apart(tmp_path, config):
    from harness.job import run_job

    runs = []
    for name in ("a", "b"):
        c = config(pp=2, microbatches=4, steps=3, compute="emulated", **{"cost.fwd_ms_per_layer": 2.0})
        result = run_job(c, tmp_path / name, "test", name)
        assert result.status == "ok", result.error
        runs.append(result.metrics)
    test = compare(runs[0].step_times_s, runs[1].step_times_s)
    assert not test.distinguishable and test.n_a == test.n_b == 3, test
    assert runs[0].intervals.method == ORDER_STATISTICS and runs[0].intervals.level == 0.75


def test_the_short_tags_say_nominal_and_simulated():
    assert tag(ORDER_STATISTICS, 0.9375, 5) == "93.8%, n=5"
    assert tag(BOOTSTRAP, 0.95, 3) == "nominal 95.0%, n=3" and "under-covers" in describe(BOOTSTRAP, 0.95, 3)
    assert tag(SIMULATED, 1.0, 5) == "simulated" and describe(SIMULATED, 1.0, 5).endswith("a point, n=5 steps")



def test_a_setting_names_its_tensor_parallel_degree():
    plain = _rows([_run(0, "gpipe", [0.1] * 3), _run(1, "1f1b", [0.1] * 3)])
    assert " tp=" not in plain["gpipe"][0]
    runs = [_run(0, "gpipe", [0.1] * 3), _run(1, "1f1b", [0.1] * 3)]
    for r in runs:
        r.result.config.update(tp=2, sequence_parallel=True)
    assert _rows(runs)["gpipe"][0].startswith(f"pp={runs[0].cfg.pp} tp=2 sp dp=")
