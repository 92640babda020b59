"""The schedule seam: a schedule is its builder and one registry entry; every list of schedules
(validation, theory, the simulator, the executors, the report, the planner) reads the registry."""

from __future__ import annotations

import pytest

from harness.planning import theory
from harness.config import ConfigError
from harness.job import run_job
from harness.planning.plan import make_plan
from harness.measure.reference import reference_losses
from harness.report.build import build_report
from harness.report.load import load_sweep
from harness.schedules.registry import SCHEDULES, build, built_in, register, unregister
from tests.toy_schedule import TOY


@pytest.fixture
def toy():
    register(TOY)
    yield TOY.name
    unregister(TOY.name)


def test_every_list_of_schedules_is_the_registry():
    from harness.advise.__main__ import parser
    from harness.advise.search import searchable
    from harness.report.figures import schedule_order

    assert list(SCHEDULES)[:7] == ["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zbv", "dualpipev"]
    assert parser().parse_args([]).schedules == list(searchable()) == [*built_in(), "zb_auto"]
    assert schedule_order({"csv", "zbv", "gpipe"}) == ["gpipe", "zbv", "csv"]
    for name in built_in():
        spec = SCHEDULES[name]
        assert spec.idle and spec.theory_source and spec.inflight, name
        assert spec.torch_class or name == "zb_h2", name  # torch has no ZB-H2: its CSV loader runs it


@pytest.mark.dist
def test_a_schedule_registered_from_outside_runs_through_everything(toy, tmp_path, config):
    """Validated, simulated (executor=sim), run for real (executor=native, losses equal one
    process's), its theory the labelled simulated ideal (GPipe's closed form: the same fill and
    drain), drawn by the report; executor=pytorch runs it through torch's CSV loader."""
    c = config(pp=2, microbatches=4, **{"schedule.name": toy})
    assert make_plan(c).schedule == build(toy, 2, 4)
    sim = run_job(config(pp=2, microbatches=4, executor="sim", **{"schedule.name": toy}), tmp_path / "0_sim", "t", "s")
    native = run_job(c, tmp_path / "1_native", "t", "n")
    for r in (sim, native):
        assert r.status == "ok", r.error
        b = r.metrics.bubble
        assert b.theory_source == theory.SIMULATED_IDEAL
        assert b.theory == pytest.approx(theory.bubble("gpipe", 2, 4, 1, **b.theory_costs).value, abs=1e-12)
    assert native.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    index = build_report(load_sweep(tmp_path), tmp_path / "report").read_text()
    assert f"{toy}" in index and "gallery" in index.lower()
    # torch has no class for it: executor=pytorch runs its actions through torch's CSV loader
    peer = run_job(config(pp=2, microbatches=4, executor="pytorch", **{"schedule.name": toy}), tmp_path / "p", "t", "p")
    assert peer.status == "ok", peer.error
    assert peer.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
