"""reports/<sweep>/: index.md (a table of every run, figures), runs.csv, figures."""

from __future__ import annotations

import csv
from pathlib import Path

from harness.report.gallery import gallery
from harness.report.figures import bubble_vs_microbatches, checkpointing_tradeoff, memory_per_rank, provenance
from harness.report.load import Sweep

COLUMNS = ["run", "status", "schedule", "pp", "microbatches", "microbatch_size", "compute", "device",
           "checkpointing", "step_time_s", "throughput_samples_s", "bubble_theory", "bubble_simulated",
           "bubble_measured", "peak_activation_bytes_max", "recompute_s", "final_loss", "error"]


def row(run: dict) -> dict:
    c, m = run["config"], run.get("metrics") or {}
    b = m.get("bubble", {})
    return {
        "run": run["_dir"], "status": run["status"], "schedule": c["schedule"]["name"], "pp": c["pp"],
        "microbatches": c["microbatches"], "microbatch_size": c["microbatch_size"], "compute": c["compute"],
        "device": (run.get("env") or {}).get("device", c["device"]),
        "step_time_s": m.get("step_time_s"), "throughput_samples_s": m.get("throughput_samples_s"),
        "bubble_theory": b.get("theory"), "bubble_simulated": b.get("simulated"),
        "bubble_measured": b.get("measured"), "final_loss": (m.get("losses") or [None])[-1],
        "checkpointing": c.get("checkpointing", False),
        "peak_activation_bytes_max": max((m.get("memory") or {}).get("peak_activation_bytes_per_stage") or [None],
                                         key=lambda v: v or 0),
        "recompute_s": m.get("recompute_s"),
        "error": run.get("error"),
    }


def _fmt(v: object) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|")


def build_report(sweep: Sweep, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted((row(r) for r in sweep.runs), key=lambda r: (r["schedule"], r["pp"], r["microbatches"]))
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    fig = bubble_vs_microbatches(sweep.runs, out / "bubble_vs_microbatches.png")
    ok = [r for r in rows if r["status"] == "ok"]
    lines = [f"# Sweep `{sweep.name}`", "",
             f"Source: `{sweep.path}`  ", f"{provenance(sweep.runs)}  ",
             f"{len(ok)} ok, {len(rows) - len(ok)} not ok, {len(sweep.corrupt)} corrupt records.", ""]
    if fig:
        lines += ["## Bubble against microbatches", "",
                  "Lines: closed form (N-1)/(M+N-1) for GPipe and 1F1B. Filled markers: measured (mean "
                  "idle fraction of the step window over ranks; bars span the measured steps). Hollow: the "
                  "simulator fed with each run's own measured op costs and hop latency.", "",
                  f"![bubble against microbatches]({fig.name})", ""]
    else:
        lines += ["No run finished ok: no figure.", ""]
    mem = memory_per_rank(sweep.runs, out / "memory_per_rank.png")
    lines += ["## Activation memory per rank", ""]
    lines += ([f"Measured peak bytes held for backward (saved tensors + kept inputs) per rank; black ticks: "
               f"the schedule's in-flight microbatches x measured bytes per microbatch.", "",
               f"![memory per rank]({mem.name})", ""] if mem else ["No run with memory measurements.", ""])
    ckpt = checkpointing_tradeoff(sweep.runs, out / "checkpointing.png")
    if ckpt:
        lines += ["## Checkpointing trade-off", "", f"![checkpointing]({ckpt.name})", ""]
    head = ["run", "status", "schedule", "pp", "M", "B", "compute", "step ms", "samples/s",
            "bubble theory", "simulated", "measured"]
    lines += ["## Runs", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        st = None if r["step_time_s"] is None else r["step_time_s"] * 1e3
        cells = [r["run"], r["status"], r["schedule"], r["pp"], r["microbatches"], r["microbatch_size"],
                 r["compute"], st, r["throughput_samples_s"], r["bubble_theory"], r["bubble_simulated"],
                 r["bubble_measured"]]
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "## Not ok", ""] + [f"- `{r['run']}`: {r['status']}: {r['error']}" for r in failed]
    if sweep.corrupt:
        lines += ["", "## Corrupt or partial records (skipped)", ""] + [f"- `{p}`" for p in sweep.corrupt]
    rows_g = gallery(sweep.runs, sweep.path, out / "gallery")
    if rows_g:
        lines += ["", "## Schedule gallery", "",
                  "Per schedule: the simulator on the run's modeled costs, and the real run's measured timeline "
                  "(its last measured step).", ""]
        for label, sim_png, real_png in rows_g:
            lines += [f"### {label}", ""]
            lines += [f"![{label} simulated]({sim_png})" if sim_png else "(no simulation)", ""]
            lines += [f"![{label} measured]({real_png})" if real_png else "(no measured Gantt)", ""]
    lines += ["", "Table of every run: [runs.csv](runs.csv)."]
    (out / "index.md").write_text("\n".join(lines) + "\n")
    return out / "index.md"
