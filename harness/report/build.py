"""reports/<sweep>/: index.md and a self-contained index.html saying the same, runs.csv, and
every figure as PNG + SVG. The report is a list of sections, each from one small function."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from harness.records.atomic import write_text
from harness.report import partition
from harness.report.attribution import bubble_attribution
from harness.report.peer import peer_section
from harness.report.bubble import bubble_vs_microbatches, measured_vs_theory
from harness.report.doc import Block, Heading, Image, Items, Text, markdown
from harness.report.figures import Figure, provenance
from harness.report.gallery import gallery
from harness.report.html import page
from harness.report.load import Sweep
from harness.report.noise import noise_section
from harness.report.memory import checkpointing_tradeoff, memory_breakdown, memory_per_rank, memory_vs_throughput
from harness.report.runs import Run, ok
from harness.report.tables import summary, write_csv
from harness.report.compute import compute_rate
from harness.report.tensor import tensor_parallel
from harness.report.throughput import dp_scaling, throughput
from harness.report.zero_bubble import zero_bubble_study


def figure_section(fig: Figure) -> list[Block]:
    blocks: list[Block] = [Heading(fig.title), Text(fig.caption)] + ([Items(fig.notes)] if fig.notes else [])
    if fig.path:
        blocks += [Image(fig.path.name, fig.title),
                   Text(f"Made from: {fig.held}. SVG: `{fig.path.with_suffix('.svg').name}`.")]
    return blocks + ([Items([f"Not drawn: {m}" for m in fig.missing])] if fig.missing else [])


def safely(make: Callable[[list[Run], Path], Figure], runs: list[Run], out: Path) -> Figure:
    """A figure that fails says so in the report and on stderr; the rest of the report stands."""
    try:
        return make(runs, out)
    except Exception as e:  # noqa: BLE001 - records from another version of the harness, or a bug here
        print(f"harness.report: warning: {make.__name__}: {type(e).__name__}: {e}", file=sys.stderr)
        return Figure(make.__name__.replace("_", " ").capitalize(), "", [],
                      missing=[f"failed: {type(e).__name__}: {e}"])


def guarded(make: Callable[..., list[Block]], *args: object) -> list[Block]:
    """A section (not a figure) that fails says so in its place and on stderr, like `safely`."""
    try:
        return make(*args)
    except Exception as e:  # noqa: BLE001 - see safely
        print(f"harness.report: warning: {make.__name__}: {type(e).__name__}: {e}", file=sys.stderr)
        return [Heading(make.__name__.replace("_", " ").capitalize()),
                Items([f"Not drawn: failed: {type(e).__name__}: {e}"])]


def shown_path(path: Path) -> str:
    """The sweep as a committed report may name it: relative to the working directory where it
    lies below it, else by its name alone (never the absolute path of the machine that made it)."""
    rel = os.path.relpath(path.resolve(), Path.cwd().resolve())
    return path.resolve().name if rel.startswith("..") or os.path.isabs(rel) else Path(rel).as_posix()


def header(sweep: Sweep) -> list[Block]:
    good = ok(sweep.runs)
    return [Heading(f"Sweep `{sweep.name}`", 1), Text(f"Source: `{shown_path(sweep.path)}`"),
            Text(f"How the runs were made: {provenance(sweep.runs)}"),
            Text(f"{len(good)} ok, {len(sweep.runs) - len(good)} not ok, {len(sweep.corrupt)} corrupt or partial "
                 "records. Every record, one row each: `runs.csv` beside this page.")]


def problems(sweep: Sweep) -> list[Block]:
    """Failed and interrupted runs with their error, and records that could not be read."""
    blocks: list[Block] = []
    if bad := [r for r in sweep.runs if r.status != "ok"]:
        blocks += [Heading("Not ok"), Items([f"`{r.dir}`: {r.status}: {r.error}" for r in bad])]
    if sweep.corrupt:
        blocks += [Heading("Corrupt or partial records (skipped)"),
                   Items([f"`{f}`: {why}" for f, why in sweep.corrupt])]
    if sweep.superseded:  # one record per point: its newest (harness/report/load.py superseded)
        blocks += [Heading("Superseded records (not reported)"),
                   Items([f"`{old}`: superseded by `{new}`, a newer record of the same point" for old, new in
                          sweep.superseded])]
    return blocks


def partition_section(runs: list[Run], out: Path) -> list[Block]:
    return figure_section(safely(partition.partition_figure, runs, out)) + partition.tables(runs)


def gallery_section(sweep: Sweep, out: Path) -> list[Block]:
    blocks: list[Block] = [Heading("Schedule gallery"),
                           Text("Per schedule, its run with the most microbatches up to 16: the simulator on the "
                                "run's modeled costs, and the run's measured timeline (its last measured step).")]
    entries = gallery(sweep.runs, sweep.path, out / "gallery")
    if not entries:
        return blocks + [Items(["Not drawn: no run finished ok"])]
    for e in entries:
        blocks += [Heading(e.label, 3), Text(f"Made from: {provenance([e.run])}; run `{e.run.dir}`.")]
        blocks += [Image(p, f"{e.label} {what}") for p, what in ((e.simulated, "simulated"), (e.measured, "measured"))
                   if p]
        blocks += [Items(e.missing)] if e.missing else []
    return blocks


FIGURES = (bubble_vs_microbatches, measured_vs_theory, bubble_attribution, zero_bubble_study, memory_per_rank, memory_breakdown,
           memory_vs_throughput, throughput, compute_rate, checkpointing_tradeoff, dp_scaling, tensor_parallel)


def build_report(sweep: Sweep, out: Path) -> Path:
    """Writes the report into out; returns index.md (index.html beside it)."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(sweep, out / "runs.csv")
    blocks = header(sweep) + [Heading("Runs"), *summary(sweep.runs)] + problems(sweep) + guarded(noise_section,
                                                                                                  sweep.runs)
    for make in FIGURES:
        blocks += figure_section(safely(make, sweep.runs, out))
    blocks += guarded(partition_section, sweep.runs, out) + guarded(peer_section, sweep.runs) + guarded(
        gallery_section, sweep, out)
    write_text(out / "index.md", markdown(blocks))
    write_text(out / "index.html", page(blocks, f"Sweep {sweep.name}", out))
    return out / "index.md"
