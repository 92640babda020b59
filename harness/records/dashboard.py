"""Dashboard as code: the README's "Panels worth making" for a W&B project, built with
wandb-workspaces, from the names log_wandb writes (summary: result.json's metric names joined
by "/"; config: the resolved config, nested keys dotted; history: per step against `step`,
wandb_log.history_rows: line plots of step time, bubble, throughput, TFLOP/s, peak activation
memory and loss).

    python -m harness.records.dashboard --project P [--entity E] [--group SWEEP] [--pp 2 4] [--json] [--save]

Two things are built: a workspace (a saved view of the project: every panel, runs grouped by
schedule.name then pp) and a report (the same panels, and bubble against M once per pp, each
over that pp's runs grouped by schedule). The default is a dry run: it prints the panels (with
--json, the workspace's and the report's JSON as they would be sent) and sends nothing;
--save sends both, after the same quick checks as an online job (API key, host reachable)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

SCHEDULE, PP = "schedule.name", "pp"
WORKSPACE_GROUPBY = (SCHEDULE, PP)  # colour (group) by schedule, split by depth: bubble against M per N
DEFAULT_PP = (2, 4)  # the default study's depths (conf/experiment/study.yaml)
NO_ENTITY = "<your default entity>"  # a dry run without --entity: resolved by --save


@dataclass(frozen=True)
class Axis:
    """A key of a run: section "config" (dotted, `schedule.name`), "summary" (`bubble/measured`)
    or "history" (`per_step/time_s`: logged per step, against `step`)."""

    section: str
    name: str

    def __str__(self) -> str:
        return f"{self.section}:{self.name}"


def C(name: str) -> Axis:
    return Axis("config", name)


def S(name: str) -> Axis:
    return Axis("summary", name)


def H(name: str) -> Axis:
    return Axis("history", name)


M, B, DP = C("microbatches"), C("microbatch_size"), C("dp")
BUBBLE, THEORY, SIMULATED = S("bubble/measured"), S("bubble/theory"), S("bubble/simulated")
THROUGHPUT, STEP_TIME = S("throughput_samples_s"), S("step_time_s")
TFLOPS, MFU = S("flops/tflops_per_device"), S("flops/mfu")
PEAK = S("memory/peak_activation_bytes_per_rank/max")
STAGE_MAX, IMBALANCE = S("stage_time_s/max"), S("measured_imbalance")
STEP = H("step")  # the history's x-axis (wandb_log.STEP): the training step, warm-up included


@dataclass(frozen=True)
class Panel:
    section: str
    title: str
    x: Axis
    y: Axis
    per_pp: bool = False  # the report draws it once per pp (the workspace: one panel, grouped by pp)
    groupby: str | None = SCHEDULE  # the report's grouping (colour) for it; None: a line per run

    @property
    def line(self) -> bool:
        """A line plot of a history key against the step (else a scatter plot of runs)."""
        return self.y.section == "history"


PANELS: tuple[Panel, ...] = (
    Panel("Bubble", "Bubble against microbatches (measured)", M, BUBBLE, per_pp=True),
    Panel("Bubble", "Bubble against microbatches (theory)", M, THEORY, per_pp=True),
    Panel("Bubble", "Bubble against microbatches (simulated)", M, SIMULATED, per_pp=True),
    Panel("Bubble", "Measured against theory", THEORY, BUBBLE),
    Panel("Throughput", "Throughput against microbatches", M, THROUGHPUT),
    Panel("Throughput", "Throughput against microbatch size", B, THROUGHPUT),
    Panel("Throughput", "Throughput against dp", DP, THROUGHPUT),
    Panel("Throughput", "TFLOP/s per device against microbatch size", B, TFLOPS),
    Panel("Throughput", "MFU against microbatch size (known devices)", B, MFU),
    Panel("Memory", "Peak activation memory per rank (max) against microbatches", M, PEAK),
    Panel("Memory", "Checkpointing: step time against peak activation memory", PEAK, STEP_TIME,
          groupby="checkpointing"),
    Panel("Stage balance", "Bubble against measured imbalance", IMBALANCE, BUBBLE, groupby="partition.name"),
    # per step, each run its own line (the workspace: its groups' lines)
    Panel("Per step", "Step time per step", STEP, H("per_step/time_s"), groupby=None),
    Panel("Per step", "Bubble per step (measured)", STEP, H("per_step/bubble"), groupby=None),
    Panel("Per step", "Throughput per step (samples/s)", STEP, H("per_step/throughput_samples_s"), groupby=None),
    Panel("Per step", "Throughput per step (tokens/s)", STEP, H("per_step/throughput_tokens_s"), groupby=None),
    Panel("Per step", "TFLOP/s per device per step", STEP, H("per_step/tflops_per_device"), groupby=None),
    Panel("Per step", "Peak activation memory per step (fullest rank)", STEP, H("per_step/peak_activation_bytes"),
          groupby=None),
    Panel("Per step", "Loss", STEP, H("loss"), groupby=None),
)
# the runs table's columns (the README's stage-balance table), pinned in both
TABLE_COLUMNS: tuple[Axis, ...] = (C("partition.name"), C(SCHEDULE), C(PP), M, STAGE_MAX, IMBALANCE, BUBBLE,
                                   THROUGHPUT, TFLOPS, MFU)


def summary_keys() -> set[str]:
    """Every summary key the dashboard reads (tests hold them to log_wandb's names)."""
    return {a.name for p in PANELS for a in (p.x, p.y) if a.section == "summary"} | {
        a.name for a in TABLE_COLUMNS if a.section == "summary"}


def history_keys() -> set[str]:
    """Every history key the dashboard plots, its x-axis included (tests hold them to log_wandb's)."""
    return {a.name for p in PANELS for a in (p.x, p.y) if a.section == "history"}


def config_keys() -> set[str]:
    return ({a.name for p in PANELS for a in (p.x, p.y) if a.section == "config"} | set(WORKSPACE_GROUPBY)
            | {p.groupby for p in PANELS if p.groupby} | {a.name for a in TABLE_COLUMNS if a.section == "config"})


def _plot(wr: Any, p: Panel, title: str):
    """The panel as wandb-workspaces draws it: a line plot of a history key against `step`, or
    a scatter plot of runs (config and summary keys)."""
    if p.line:
        return wr.LinePlot(title=title, x=p.x.name, y=[p.y.name])

    def axis(a: Axis):
        return wr.Config(a.name) if a.section == "config" else wr.SummaryMetric(a.name)

    return wr.ScatterPlot(title=title, x=axis(p.x), y=axis(p.y))


def _column(a: Axis) -> str:
    """A runs-table column as W&B names it: `config:<key>.value[.<rest>]`, `summary:<key>`."""
    if a.section == "config":
        head, _, rest = a.name.partition(".")
        return f"config:{head}.value{'.' + rest if rest else ''}"
    return f"summary:{a.name}"


def _filters(expr: Any, group: str | None, pp: int | None = None) -> list:
    out = [] if group is None else [expr.Metric("Group") == group]
    return out + ([] if pp is None else [expr.Config(PP) == pp])


def build_workspace(project: str, entity: str, group: str | None = None, name: str = "harness: pipeline parallelism"):
    """The workspace (a saved view of the project), built here and sent by nothing but --save."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = []
    for title in dict.fromkeys(p.section for p in PANELS):
        panels = [_plot(wr, p, p.title + (" (grouped by pp)" if p.per_pp else "")) for p in PANELS if p.section == title]
        sections.append(ws.Section(name=title, panels=panels, is_open=True))
    return ws.Workspace(
        entity=entity, project=project, name=name, sections=sections,
        runset_settings=ws.RunsetSettings(groupby=[ws.Config(k) for k in WORKSPACE_GROUPBY],
                                          filters=_filters(ws, group),
                                          pinned_columns=[_column(a) for a in TABLE_COLUMNS]))


def build_report(project: str, entity: str, group: str | None = None, pp: tuple[int, ...] = DEFAULT_PP,
                 title: str = "harness: pipeline bubbles, memory, throughput", bind: bool = False):
    """The report: bubble against M once per pp, then the other panels, each grid over the
    project's runs (or one sweep's: group) grouped as its panels want. bind: the run sets name
    entity/project, which wandb-workspaces turns into the project's id through the API when the
    report is serialized (so only --save binds; unbound, they are the report's project's runs)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    def grid(panels: list[Panel], groupby: str | None, n: int | None = None, **runset: Any):
        where = {"entity": entity, "project": project} if bind else {}
        rs = wr.Runset(**where, name=f"pp={n}" if n else "runs", filters=_filters(expr, group, n),
                       groupby=[f"config.{groupby}"] if groupby else [], **runset)
        return wr.PanelGrid(runsets=[rs], panels=[_plot(wr, p, p.title + (f", pp={n}" if n else "")) for p in panels])

    blocks: list = [wr.P("Built by `python -m harness.records.dashboard` from the names harness's log_wandb writes: "
                         "summary = result.json's metric names joined by '/', config = the resolved config.")]
    per_pp = [p for p in PANELS if p.per_pp]
    for n in pp:
        blocks += [wr.H2(f"Bubble against microbatches, pp={n}"), grid(per_pp, SCHEDULE, n)]
    rest = [p for p in PANELS if not p.per_pp]
    for groupby in dict.fromkeys(p.groupby for p in rest):
        panels = [p for p in rest if p.groupby == groupby]
        blocks += [wr.H2(", ".join(dict.fromkeys(p.section for p in panels)) + f" ({_grouping(groupby)})"),
                   grid(panels, groupby, pinned_columns=[_column(a) for a in TABLE_COLUMNS])]
    return wr.Report(project=project, entity=entity, title=title, blocks=blocks)


def _grouping(groupby: str | None) -> str:
    return f"grouped by {groupby}" if groupby else "a line per run"


def panel_lines(pp: tuple[int, ...] = DEFAULT_PP) -> list[str]:
    """The dry run's listing: one line per panel as the report draws it."""
    lines = []
    for p in PANELS:
        where = [f"pp={n}" for n in pp] if p.per_pp else ["all runs"]
        for w in where:
            lines.append(f"{p.section}: {p.title} [{w}, {_grouping(p.groupby)}]: x={p.x} y={p.y}")
    return lines


def _json(model: Any) -> Any:
    return json.loads(model.model_dump_json(by_alias=True, exclude_none=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.records.dashboard", description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", required=True, help="the W&B project (the jobs' wandb.project: harness unless set)")
    ap.add_argument("--entity", help="the W&B entity (team or user); default: your default entity")
    ap.add_argument("--group", help="only this sweep's runs (the run group: the sweep directory's name)")
    ap.add_argument("--pp", type=int, nargs="+", default=list(DEFAULT_PP),
                    help=f"the depths to draw bubble against M for (default: {' '.join(map(str, DEFAULT_PP))})")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="build and print, send nothing (the default)")
    mode.add_argument("--save", action="store_true", help="send the workspace and the report to W&B")
    ap.add_argument("--json", action="store_true", help="print the workspace's and the report's JSON")
    a = ap.parse_args(argv)
    pp = tuple(a.pp)

    try:
        import wandb_workspaces  # noqa: F401
    except ImportError as e:
        print(f"harness: error: dashboard: needs wandb-workspaces, pinned in requirements.txt ({e})", file=sys.stderr)
        return 1
    entity = a.entity
    if a.save:
        from harness.records.wandb_log import online_problem

        if why := online_problem():
            print(f"harness: error: dashboard not saved: {why}", file=sys.stderr)
            return 1
    try:
        if a.save and entity is None:
            import wandb

            entity = wandb.Api(timeout=10).default_entity
        entity = entity or NO_ENTITY
        workspace = build_workspace(a.project, entity, a.group)
        report = build_report(a.project, entity, a.group, pp, bind=a.save)
        if a.json:
            print(json.dumps({"workspace": _json(workspace._to_model()), "report": _json(report._to_model())},
                             indent=1))
        else:
            print(f"{'saving' if a.save else 'dry run (--save sends it)'}: {entity}/{a.project}"
                  f"{f', group {a.group}' if a.group else ''}")
            print(f'workspace "{workspace.name}": runs grouped by {", ".join(WORKSPACE_GROUPBY)}; '
                  f'report "{report.title}"')
            print("\n".join(f"  {line}" for line in panel_lines(pp)))
            print(f"  runs table: {', '.join(map(str, TABLE_COLUMNS))}")
        if a.save:
            workspace.save()
            report.save()
            print(f"harness: saved workspace {workspace.url}\nharness: saved report {report.url}")
    except Exception as e:  # noqa: BLE001 - one line, as the harness says everything
        print(f"harness: error: dashboard: {type(e).__name__}: {e}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
