"""make bench's verdict (benchmarks/judge.py): goals judged on the run's own figures, medians
compared with the baseline only when it was saved on this machine; and plain pytest runs no
benchmark unless asked (tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from benchmarks import judge
from tests.conftest import BENCH_DIR, bench_asked


def bench(name: str, median: float, **extra) -> dict:
    return {"name": name, "stats": {"median": median}, "extra_info": extra}


def run(*benchmarks: dict, fingerprint: dict | None = None) -> dict:
    return {"machine_info": {"fingerprint": fingerprint} if fingerprint else {}, "benchmarks": list(benchmarks)}


def test_medians_are_compared_only_with_a_baseline_of_this_machine():
    here = judge.fingerprint()
    assert set(here) == {"cpu_model", "cores", "host_sha256", "torch"} and here["cores"] >= 1
    now = run(bench("test_x", 1.3), bench("test_y", 1.0), fingerprint=here)
    same = run(bench("test_x", 1.0), bench("test_y", 1.0), fingerprint=dict(here))
    lines, failures = judge.compare(now, same)
    assert lines[0] == "baseline from this machine: medians compared"
    assert failures == ["test_x: median +30.0% against the baseline"]
    other = run(bench("test_x", 0.1), fingerprint={**here, "cpu_model": "another CPU"})
    assert judge.compare(now, other) == (["baseline from another machine: not compared (cpu_model differ)"], [])
    assert judge.compare(now, run(bench("test_x", 0.1))) == (
        ["baseline from another machine: not compared (the baseline has no fingerprint)"], [])


def test_goals_fail_when_not_met_unless_still_open():
    met = run(bench("test_generate_p32_m256", 1.0, seconds=1.5),
              bench("test_executor_overhead_vs_simulator", 1.0, native_measured_over_simulated=1.02,
                    pytorch_measured_over_simulated=1.1, native_over_floor=1.01),
              bench("test_nccl_safe_transport_against_eager", 1.0, safe_over_eager=1.2))
    lines, failures = judge.judge_goals(met)
    assert failures == []
    assert "  test_generate_p32_m256 seconds < 2: 1.5 met" in lines
    assert "  test_executor_overhead_vs_simulator native_measured_over_simulated <= 1.03: 1.02 met" in lines
    assert "  test_executor_overhead_vs_simulator native_over_floor <= 1.02: 1.01 met" in lines
    assert "  test_nccl_safe_transport_against_eager safe_over_eager <= 1: 1.2 not met (open)" in lines
    assert not any("pytorch_measured_over_simulated" in line for line in lines)  # torch's engine: not judged
    # a figure that moves with the platform: a miss is set beside the platform's own figure, and
    # fails only without it (the runtime's share has its own goal)
    noisy = bench("test_executor_overhead_vs_simulator", 1.0, native_measured_over_simulated=1.04,
                  floor_over_simulated=1.031, native_over_floor=1.009)
    lines, failures = judge.judge_goals(run(noisy))
    assert failures == []
    assert ("  test_executor_overhead_vs_simulator native_measured_over_simulated <= 1.03: 1.04 not met, "
            "the platform alone: floor_over_simulated 1.031") in lines
    del noisy["extra_info"]["floor_over_simulated"]
    assert judge.judge_goals(run(noisy))[1] == [
        "test_executor_overhead_vs_simulator native_measured_over_simulated <= 1.03: 1.04, no floor_over_simulated"]
    slow = run(bench("test_generate_p32_m256", 1.0, seconds=2.5), bench("test_sweep_marginal_job_wall_time[sim]", 1.0))
    _, failures = judge.judge_goals(slow)
    assert failures == ["test_generate_p32_m256 seconds < 2: 2.5",
                        "test_sweep_marginal_job_wall_time[sim] marginal_job_s < 0.1: no figure"]


def test_the_command_exits_1_on_a_failure_and_0_without(tmp_path, capsys):
    here = judge.fingerprint()
    (tmp_path / "base.json").write_text(json.dumps(run(bench("test_generate_p32_m256", 1.0), fingerprint=here)))
    (tmp_path / "ok.json").write_text(json.dumps(run(bench("test_generate_p32_m256", 1.1, seconds=1.0), fingerprint=here)))
    (tmp_path / "bad.json").write_text(json.dumps(run(bench("test_generate_p32_m256", 2.0, seconds=1.0), fingerprint=here)))
    assert judge.main([str(tmp_path / "ok.json"), "--baseline", str(tmp_path / "base.json")]) == 0
    assert judge.main([str(tmp_path / "bad.json"), "--baseline", str(tmp_path / "base.json")]) == 1
    assert "median +100.0% against the baseline" in capsys.readouterr().out
    assert judge.main([str(tmp_path / "missing.json")]) == 2


def test_plain_pytest_runs_no_benchmark_unless_asked(monkeypatch):
    def config(markexpr: str = "", enable: bool = False, args: tuple = ("tests",)) -> SimpleNamespace:
        return SimpleNamespace(option=SimpleNamespace(markexpr=markexpr), args=list(args),
                               getoption=lambda name, default=None: enable if name == "benchmark_enable" else default)

    monkeypatch.delenv("HARNESS_BENCH", raising=False)
    assert not bench_asked(config()) and not bench_asked(config("not slow"))
    assert bench_asked(config("bench")) and bench_asked(config(enable=True))
    assert bench_asked(config(args=(str(BENCH_DIR / "test_bench_cli.py") + "::test_cli_decides_before_torch",)))
    assert not bench_asked(config(args=(str(Path(__file__)),)))
    monkeypatch.setenv("HARNESS_BENCH", "1")
    assert bench_asked(config())


def test_a_stated_figure_outside_its_range_fails_and_the_readme_states_each():
    inside = run(bench("test_generate_p32_m256", 1.0, seconds=1.8))
    outside = run(bench("test_generate_p32_m256", 1.0, seconds=3.0))
    assert judge.judge_stated(inside)[1] == []
    assert judge.judge_stated(outside)[1] == [
        "test_generate_p32_m256 seconds stated 1.5 +-60%: 3 (+100%): the README's figure no longer holds"]
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    prose = readme + (Path(__file__).parents[1] / "benchmarks" / "README.md").read_text()
    for st in judge.STATED:
        assert st.row() in readme, st
        assert prose.count(st.text) >= 2, st  # the table's row and the sentence that states it
