"""The schedule seam: a schedule is one registry entry, whatever it is made from (its counts,
the run's priced costs, a file); every list of schedules (validation, theory, the simulator, the
executors, the report, the planner, the exports) reads the registry and asks the entry."""

from __future__ import annotations

import json

import pytest

from harness.planning import theory
from harness.config import ConfigError
from harness.job import run_job
from harness.planning.plan import make_plan
from harness.measure.reference import reference_losses
from harness.report.build import build_report
from harness.report.load import load_sweep
from harness.schedules.registry import (COSTS, COUNTS, FILE, SCHEDULES, ScheduleInputs, build, built_in, register,
                                       searchable, unregister)
from tests.toy_schedule import COSTED, TOY, greedy_warmup


@pytest.fixture
def toy():
    register(TOY)
    yield TOY.name
    unregister(TOY.name)


@pytest.fixture
def costed():
    register(COSTED)
    yield COSTED.name
    unregister(COSTED.name)


def test_every_list_of_schedules_is_the_registry():
    from harness.advise.__main__ import parser
    from harness.advise.search import searchable
    from harness.report.figures import schedule_order

    assert list(SCHEDULES)[:7] == ["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zbv", "dualpipev"]
    assert parser().parse_args([]).schedules == list(searchable()) == [*built_in(), "zb_auto"]
    assert {SCHEDULES[n].needs for n in built_in()} == {COUNTS} and SCHEDULES["zb_auto"].needs == COSTS
    assert SCHEDULES["csv"].needs == FILE and not SCHEDULES["csv"].searchable
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


def test_what_an_entry_needs_is_declared_and_checked():
    """An entry made from its counts has a builder and no more; any other declares `make`; the
    section's keys are its dataclass, registered as the schedule group's option while it is."""
    from harness.config import OPTIONS, ScheduleConfig

    for bad in (dict(build=None), dict(build=None, needs=COSTS), dict(build=lambda n, m, v: {}, needs=COSTS,
                                                                       make=lambda x: {}), dict(needs="magic")):
        with pytest.raises(ValueError, match="schedule toy"):
            type(TOY)("toy", "", **{"build": TOY.build, **bad})
    assert OPTIONS["schedule"]["zb_auto"] is SCHEDULES["zb_auto"].config and "reverse_gpipe" not in OPTIONS["schedule"]
    assert issubclass(OPTIONS["schedule"]["csv"], ScheduleConfig)
    with pytest.raises(ValueError, match="schedule=greedy_warmup: made from the run's priced costs, and none"):
        COSTED.make(ScheduleInputs(config_of(COSTED.name)))


def config_of(name: str, **keys):
    from harness.config import Config, set_keys

    return set_keys(Config(), **{"schedule.name": name, "pp": 2, "microbatches": 4, **keys})


HERE = ["cluster=here", "+scenario=h200_emulated", "cost.time_scale=2"]


@pytest.mark.sweep  # through the planner's and the exporter's command lines, and the report
def test_a_schedule_made_from_costs_registered_from_outside_runs_through_everything(costed, tmp_path, config,
                                                                                   monkeypatch, capsys):
    """tests/toy_schedule.py's COSTED, one entry (needs=COSTS, make): validated and planned from the
    plan's own priced costs (its order changes with them), simulated (executor=sim: theory the
    labelled simulated ideal, its note in the record), drawn by the report, searched by the
    planner beside 1f1b (each point made from its own costs; every printed command validates and
    reproduces its prediction to 1e-6, tests/test_advise.py's check), and exported from its run and
    from its advice point (torchtitan: its actions as torch's CSV; Megatron: refused as it is, 1F1B
    on its stages with --nearest, said)."""
    from harness.advise.__main__ import main as advise_main
    from harness.export.__main__ import main as export_main
    from harness.export.point import load
    from harness.frontend.compose import compose_config
    from harness.schedules.csv_io import from_csv
    from tests.test_advise import ROOT, _harness_args, _reproduces

    c = config(pp=2, microbatches=4, executor="sim", **{"schedule.name": costed})
    plan = make_plan(c)
    assert plan.schedule == greedy_warmup(ScheduleInputs(c, priced=plan.sim_cost))  # the plan's own priced costs
    assert any(n.startswith(f"schedule={costed}: warm-up forwards per rank") for n in plan.notes)
    orders = {bof: make_plan(config(pp=4, microbatches=8, executor="sim", **{"schedule.name": costed,
                                                                             "cost.bwd_over_fwd": bof})).schedule
              for bof in (2.0, 0.5)}
    assert orders[2.0] != orders[0.5]  # made from the costs, not the counts
    with pytest.raises(ConfigError, match=r"^pp=4: 4 stages, more than the model's 3 layers"):
        make_plan(config(pp=4, microbatches=4, executor="sim", **{"schedule.name": costed, "model.layers": 3}))

    sim = run_job(c, tmp_path / "0_sim", "t", "s")
    assert sim.status == "ok", sim.error
    assert sim.metrics.bubble.theory_source == theory.SIMULATED_IDEAL
    assert any(n.startswith(f"schedule={costed}:") for n in sim.plan.notes)
    index = build_report(load_sweep(tmp_path), tmp_path / "report").read_text()
    assert costed in index

    out = tmp_path / "advice"
    monkeypatch.chdir(ROOT)
    assert advise_main([*HERE, "--global-batch", "8", "--gpus", "2", "--pp", "2", "--microbatch-sizes", "1", "2",
                        "--schedules", "1f1b", costed, "--checkpointing", "off", "--zero", "0", "--workers", "1",
                        "--out", str(out)]) == 0
    doc = json.loads((out / "advice.json").read_text())
    made = [x for x in doc["points"] if x["overrides"]["schedule"] == costed]
    assert len(made) == 2 and all(x["rank"] is not None for x in made)
    assert _reproduces(out, ["cluster=here"], cuda=False) == 4 * 2  # 1f1b's and its: each run, and predicted
    assert f"schedule.name={costed} " in made[0]["commands"]["predicted"]  # no yaml of its own: the base's keys
    assert f"schedule={costed}: 2 points, each with its own order made in planning" in (out / "advice.md").read_text()

    for source in (str(tmp_path / "0_sim"), f"{out / 'advice.json'}#{made[0]['rank']}"):
        script = tmp_path / "titan.sh"
        assert export_main(["--to", "torchtitan", source, "--out", str(script), "--nearest"]) == 0
        assert f"schedule={costed} has no torch class" in script.read_text().replace("\n#   ", " ")
        assert from_csv((tmp_path / "titan.schedule.csv").read_text()) == load(source).actions()
    point = f"{out / 'advice.json'}#{made[0]['rank']}"  # a GPT (the run's mlp has no decoder for Megatron)
    capsys.readouterr()
    assert export_main(["--to", "megatron", point]) == 2  # asked of the entry (needs=COSTS), not its name
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"schedule={costed}: an order made from the point's costs" in err, err
    assert export_main(["--to", "megatron", point, "--nearest", "--out", str(tmp_path / "megatron.sh")]) == 0
    assert "below, 1F1B on the same stages" in (tmp_path / "megatron.sh").read_text().replace("\n#   ", " ")
    # the advice point's actions: its plan made again as its printed command plans it
    predicted = compose_config(_harness_args(made[0]["commands"]["predicted"]))
    assert load(f"{out / 'advice.json'}#{made[0]['rank']}").actions() == make_plan(predicted).schedule


@pytest.mark.dist
def test_a_schedule_made_from_costs_runs_natively(costed, tmp_path, config):
    """The same entry on two gloo ranks (executor=native): the plan's order runs, its losses one
    process's; executor=pytorch runs it through torch's CSV loader (no torch class)."""
    c = config(pp=2, microbatches=4, **{"schedule.name": costed, "cost.bwd_over_fwd": 0.5})
    native = run_job(c, tmp_path / "0_native", "t", "n")
    assert native.status == "ok", native.error
    assert native.plan.schedule == {str(r): " ".join(map(str, a)) for r, a in make_plan(c).schedule.items()}
    assert native.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    peer = run_job(config(pp=2, microbatches=4, executor="pytorch", **{"schedule.name": costed}), tmp_path / "1_p",
                   "t", "p")
    assert peer.status == "ok", peer.error
    assert peer.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
