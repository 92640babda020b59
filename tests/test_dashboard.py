"""harness.records.dashboard: the README's panels built offline (nothing sent, no API touched), on the
exact summary and history keys log_wandb writes and the config keys a run's config has."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import wandb

from harness.records import dashboard
from harness.job import run_job
from harness.records.result import read
from harness.records.wandb_log import PER_STEP_METRICS, STEP, history_rows, summary_metrics

ROOT = Path(__file__).resolve().parents[1]
README_KEYS = {"bubble/measured", "bubble/theory", "bubble/simulated", "memory/peak_activation_bytes_per_rank/max",
               "throughput_samples_s", "step_time_s", "stage_time_s/max", "measured_imbalance",
               "flops/tflops_per_device", "flops/mfu"}
HISTORY_KEYS = {"step", "loss", "per_step/time_s", "per_step/bubble", "per_step/throughput_samples_s",
                "per_step/throughput_tokens_s", "per_step/tflops_per_device", "per_step/peak_activation_bytes"}


@pytest.fixture
def offline(monkeypatch):
    """No connection and no wandb API: building must not need them."""

    def refuse(*args, **kwargs):
        raise AssertionError("the dashboard's dry run went to the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(wandb, "Api", refuse)


@pytest.mark.dist
def test_its_keys_are_the_ones_log_wandb_writes(config, tmp_path):
    """Held to a measured run's summary (executor=sim measures no memory)."""
    result = run_job(config(pp=2, microbatches=4), tmp_path, "g", "n").to_json()
    assert result["status"] == "ok", result["error"]
    summary = summary_metrics(result["metrics"])
    # a CPU run: TFLOP/s, and MFU null with the reason (no peak for a CPU)
    assert summary["flops/tflops_per_device"] > 0 and summary["flops/mfu"] is None
    assert "cpu" in summary["flops/note"] and "MFU n/a: cpu" in read(tmp_path / "result.json").headline()
    assert dashboard.summary_keys() == README_KEYS
    assert README_KEYS <= summary.keys()
    for key in dashboard.config_keys():  # dotted paths into the resolved config wandb gets
        value = result["config"]
        for part in key.split("."):
            value = value[part]
    assert dashboard.config_keys() >= {"schedule.name", "pp", "microbatches", "microbatch_size", "dp",
                                       "checkpointing", "partition.name"}
    # the history the per-step panels plot: what log_wandb logs for this run (its trace.json's
    # memory per step included; an mlp has no tokens)
    assert dashboard.history_keys() == HISTORY_KEYS and HISTORY_KEYS <= {STEP, "loss", *PER_STEP_METRICS}
    rows = history_rows(result, tmp_path)
    assert HISTORY_KEYS - {"per_step/throughput_tokens_s"} <= {k for r in rows for k in r}


def test_workspace_and_report_build_offline_with_every_panel(offline):
    ws = dashboard.build_workspace("proj", "team", group="2026-01-01_00-00-00")
    model = json.loads(ws._to_model().model_dump_json(by_alias=True, exclude_none=True))
    assert (model["entity"], model["project"]) == ("team", "proj")
    spec = model["spec"]["section"]
    panels = [(s["name"], p["config"]["chartTitle"], p["config"]["xAxis"], p["config"].get("yAxis"))
              for s in spec["panelBankConfig"]["sections"] for p in s["panels"]]
    assert len(panels) == len(dashboard.PANELS)
    axes = {(x, y) for _, _, x, y in panels}
    # the per-step section: history line plots against the step, one key each
    lines = {(p["viewType"], p["config"]["xAxis"], tuple(p["config"]["metrics"]))
             for s in spec["panelBankConfig"]["sections"] if s["name"] == "Per step" for p in s["panels"]}
    assert lines == {("Run History Line Plot", "step", (k,)) for k in HISTORY_KEYS - {"step"}}
    assert {("config:microbatches.value", "summary:bubble/measured"),
            ("config:microbatches.value", "summary:bubble/theory"),
            ("summary:bubble/theory", "summary:bubble/measured"),
            ("config:microbatches.value", "summary:throughput_samples_s"),
            ("config:microbatches.value", "summary:memory/peak_activation_bytes_per_rank/max"),
            ("summary:memory/peak_activation_bytes_per_rank/max", "summary:step_time_s")} <= axes
    (runset,) = spec["runSets"]
    assert runset["grouping"] == [{"section": "config", "name": "schedule.value.name"},
                                  {"section": "config", "name": "pp.value"}]
    assert {"summary:stage_time_s/max", "summary:measured_imbalance", "config:partition.value.name"} <= set(
        runset["runFeed"]["columnOrder"])
    assert "2026-01-01_00-00-00" in json.dumps(runset["filters"])

    report = dashboard.build_report("proj", "team", pp=(2, 4, 8))
    blocks = json.loads(report._to_model().model_dump_json(by_alias=True, exclude_none=True))["spec"]["blocks"]
    grids = [b["metadata"] for b in blocks if b["type"] == "panel-grid"]
    per_pp = [g for g in grids if g["runSets"][0]["name"].startswith("pp=")]
    assert [g["runSets"][0]["name"] for g in per_pp] == ["pp=2", "pp=4", "pp=8"]
    for g, n in zip(per_pp, (2, 4, 8)):
        (rs,) = g["runSets"]
        assert {"key": {"section": "config", "name": "pp"}, "op": "=", "value": n} in [
            {k: f[k] for k in ("key", "op", "value")} for f in rs["filters"]["filters"]]
        assert rs["grouping"] == [{"section": "config", "name": "schedule.value.name"}]
        ys = [p["config"]["yAxis"] for p in g["panelBankSectionConfig"]["panels"]]
        assert ys == ["summary:bubble/measured", "summary:bubble/theory", "summary:bubble/simulated"]
    others = {p["config"].get("yAxis") for g in grids if g not in per_pp for p in g["panelBankSectionConfig"]["panels"]}
    assert {"summary:throughput_samples_s", "summary:memory/peak_activation_bytes_per_rank/max",
            "summary:step_time_s", "summary:bubble/measured"} <= others
    groupings = [[x["name"] for x in g["runSets"][0]["grouping"]] for g in grids if g not in per_pp]
    assert groupings == [["schedule.value.name"], ["checkpointing.value"], ["partition.value.name"], []]
    per_step = grids[-1]["panelBankSectionConfig"]["panels"]  # a line per run, against the step
    assert {(p["viewType"], p["config"]["xAxis"], p["config"]["metrics"][0]) for p in per_step} == {
        ("Run History Line Plot", "step", k) for k in HISTORY_KEYS - {"step"}}


def test_dry_run_is_the_default_and_lists_the_panels(offline, capsys):
    assert dashboard.main(["--project", "proj", "--entity", "team"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dry run (--save sends it): team/proj\n")
    assert ("Bubble: Bubble against microbatches (measured) [pp=4, grouped by schedule.name]: "
            "x=config:microbatches y=summary:bubble/measured") in out
    assert ("Memory: Peak activation memory per rank (max) against microbatches [all runs, grouped by "
            "schedule.name]: x=config:microbatches y=summary:memory/peak_activation_bytes_per_rank/max") in out
    assert "x=config:microbatches y=summary:throughput_samples_s" in out
    assert ("Per step: Bubble per step (measured) [all runs, a line per run]: x=history:step "
            "y=history:per_step/bubble") in out
    assert len([line for line in out.splitlines() if line.startswith("  Bubble: Bubble against microbatches")]) == 6

    assert dashboard.main(["--project", "proj", "--json", "--pp", "2"]) == 0  # no entity: a placeholder
    both = json.loads(capsys.readouterr().out)
    assert both["workspace"]["entity"] == dashboard.NO_ENTITY and both["report"]["project"]["name"] == "proj"


@pytest.mark.subprocess
def test_save_without_an_api_key_fails_fast_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "XDG_"))}
    p = subprocess.run([sys.executable, "-m", "harness.records.dashboard", "--project", "proj", "--save"], cwd=tmp_path,
                       env={**env, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1
    assert p.stderr.startswith("harness: error: dashboard not saved: no API key for ") and p.stderr.count("\n") == 1
