"""`python -m tools.advise_validate --out reports/advise_validation/`: hold the advisor's
predictions against measurement on this machine (cluster=here).

The grid is two searches the advisor itself makes on cluster=here, every point of which is then
run for real through harness.job.run_job:
- `emulated`: the H200 GPT-2 profile replayed on a tiny stand-in GPT (+scenario=h200_emulated,
  compute=emulated, cost.time_scale as calibrate.STAND_IN so the stand-in's real math stays
  inside every modeled cost), every schedule, pp 2 and 4, dp 1 and 2, M from the global batch.
  Each point is priced with what the executor adds per action (calibrate's job of its pp, dp
  and B: host_executor), the rest of cluster=here as calibrated;
- `real`: an mlp with real compute at pp <= 2 (this machine's cores). Each point is priced on
  its profile inside the executor at its B (pp=1, M=12: calibrate.inrun_profile) and, for 2
  ranks, how much slower an action runs when both ranks compute (1F1B pp=2, M=12:
  calibrate.real_scales); no grid point is either job.
The points run in rounds, every point once a round (`--repeats` rounds for the emulated ones,
`--real-repeats` for the real ones), so drift hits every point alike; a point whose runs
disagree runs again in later rounds (SETTLED_SE, MAX_RUNS). Its measured step is the median
over every measured step of every run. What the host moves (real compute on this shared 2-core
VM drifts by 10-30% over minutes; the executor's per-action cost with it) is measured in every
round, once for each kind of point in it, and each point is priced on the median over the
rounds: figures from the morning's calibration would measure the drift, not the prediction.
Written: the table (predicted, measured, error) and the rank agreement (Spearman over the
group, and over the predicted top 5), validation.md / validation.json / validation.png.
The search's top point is held against the grid's median point, both measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from harness.advise.search import AdviseError, Point, Problem, Space, predict, search
from harness.config import Config
from harness.records.atomic import write_atomic, write_text
from tools.calibrate import REAL_MLP, REAL_SIZES, STAND_IN, load_average

EMULATED_OVERRIDES = STAND_IN  # the H200 profile x cost.time_scale: the stand-in's real math stays inside each action
EMULATED_BATCH = 16
EMULATED_SPACE = Space(pp=(2, 4), dp=(1, 2), gpus=4, microbatch_sizes=(1, 2), virtual_stages=(2,),
                       checkpointing=(False,), zero=(0,), placements=("pp_inner",))
REAL_MODEL = ["model=mlp", *(f"{k}={v}" for k, v in REAL_MLP.items() if k != "model.name"), "compute=real",
              "partition=profile", "wandb.mode=disabled"]
REAL_B = REAL_SIZES
REAL_BATCH = 128
REAL_SPACE = Space(schedules=("gpipe", "1f1b"), pp=(1, 2), dp=(1,), gpus=2, microbatch_sizes=REAL_B,
                   checkpointing=(False,), zero=(0,), placements=("pp_inner",))
# Real compute here comes in bursts: two consecutive 3-6 s jobs of the same work differed by up
# to 10% in their mean action, with no bias either way. Many short interleaved windows average
# that out where a few long ones cannot; each real point runs in REAL_REPEATS rounds.
PROFILE_STEPS = 6  # the real group's profile job (pp=1, M=12)
SCALE_STEPS = 4  # the 2-rank slow-down job (pp=2, M=12)
REAL_STEPS = 12  # a real grid point
REAL_REPEATS = 10
# A point's measurement is settled when the robust standard error of its runs' medians is under
# this (emulated points' runs agree within ~1-2%, real ones within ~3% in a quiet minute); an
# unsettled one runs again, up to MAX_RUNS in all.
SETTLED_SE = {"emulated": 0.015, "real": 0.03}
MAX_RUNS = {"emulated": 10, "real": 16}
SMALL = [Point("1f1b", 2, 8, 1, 1, 2, False, 0, "pp_inner"), Point("gpipe", 4, 16, 1, 1, 1, False, 0, "pp_inner"),
         Point("zbv", 2, 16, 1, 1, 1, False, 0, "pp_inner")]


def spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation (average ranks for ties)."""
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=x.__getitem__)
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(a) < 2:
        return 1.0
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else 1.0


def robust_se(runs: list[float]) -> float:
    """The standard error of the median of `runs`, relative to it, from their median absolute
    deviation (x 1.4826: a normal's sd): one run slowed by a busy minute does not inflate it.
    Two runs have no third to outvote either: their half-difference is the deviation."""
    if len(runs) < 2:
        return 0.0
    m = statistics.median(runs)
    mad = statistics.median(abs(x - m) for x in runs)
    return 1.4826 * mad / len(runs) ** 0.5 / m


def _config(problem: Problem, pt: Point) -> Config:
    """The harness Config that runs `pt` for real (the point's config on the native executor;
    real compute, noisier, REAL_STEPS measured steps)."""
    c = pt.config(problem.config)
    return replace(c, executor="native", steps=REAL_STEPS if c.compute == "real" else 4, warmup_steps=1,
                   run=replace(c.run, timeout_s=300.0))


def host_profile(b: int, worlds: set[int], work: Path) -> tuple[Path, dict[int, dict]]:
    """The real group's mlp profiled inside the executor at microbatch size `b`
    (calibrate.inrun_profile: pp=1), and for each world of 2 ranks or more, how much slower an
    action runs with that many ranks on the cores than alone (calibrate.real_scales: 1F1B), both
    at M=12 (calibrate.PROFILE_MICROBATCHES): global batches of 96 and 192, no grid point's."""
    from tools.calibrate import PROFILE_MICROBATCHES, inrun_profile, real_scales

    path = inrun_profile(work.with_name(work.name + "_profile.json"), work.with_name(work.name + "_profile"),
                         (b,), lambda m: None, steps=PROFILE_STEPS)
    return path, {w: real_scales(path, w, PROFILE_MICROBATCHES, b, work.with_name(f"{work.name}_scales{w}"),
                                 SCALE_STEPS) for w in sorted(worlds)}


def executor_point(pt: Point) -> tuple:
    """The calibrate job (calibrate.EXECUTOR_POINTS, a global batch of 8 or 4: never a grid
    point) that measures what the executor adds to `pt`'s actions: the same pp, dp and B."""
    from tools.calibrate import EXECUTOR_POINTS

    return min(EXECUTOR_POINTS, key=lambda x: ((x[1], x[2]) != (pt.pp, pt.dp), x[4] != pt.microbatch_size,
                                               x[1] * x[2] != pt.pp * pt.dp))


def host_executor(job: tuple, work: Path) -> float:
    """What the native executor adds to each emulated action, measured by calibrate's `job`. On
    this VM it moved from 0.2 ms to 1.5-4 ms in a busy hour (the stand-in's real math outgrowing
    the modeled cost), so a figure from hours before would measure the host, not the prediction."""
    from tools.calibrate import executor_job

    return executor_job(*job, work)["action_excess_s"]


def priced_executor(problem: Problem, pt: Point, excess: list[float]) -> Config:
    """An emulated point's config with the executor's per-action cost measured in the rounds of
    the validation (the median of them) in its cluster."""
    c = pt.config(problem.config)
    o = problem.cluster.overhead
    o = replace(o, action_s={**o.action_s, str(pt.pp * pt.dp): statistics.median(excess)})
    return replace(c, cluster=replace(problem.cluster, overhead=o))


def priced_real(problem: Problem, pt: Point, paths: list[Path], scales: list[dict], work: Path) -> Config:
    """A real point's config priced on what was measured in the rounds of the validation: the
    median of the profiles at its B, its mean B at its own M (a step's first backward creates
    the gradients, the others add into them: calibrate.step_medians), and the median
    slow-down of its ranks (1 for one rank: the profile is that rank alone), as its measured
    step is the median of its runs' steps."""
    work.mkdir(parents=True, exist_ok=True)
    path = median_profile(paths, work / "mlp_inrun_profile.json", pt.microbatches)
    o = problem.cluster.overhead
    for key, name in (("fwd_scale", "real_fwd_scale"), ("bwd_scale", "real_bwd_scale")):
        table = {**getattr(o, name), "1": 1.0}
        for world in sorted({s["world"] for s in scales}):
            table[str(world)] = statistics.median(s[key] for s in scales if s["world"] == world)
        o = replace(o, **{name: table})
    return replace(pt.config(problem.config), profile=str(path.resolve()),
                   cluster=replace(problem.cluster, overhead=o))


def median_profile(paths: list[Path], out: Path, microbatches: int) -> Path:
    """One profile whose times at each microbatch size are the medians over `paths` measured at
    it, its B the mean over a step of `microbatches` (one first, the rest adding). The 2-rank
    slow-down (calibrate.real_scales) is against the profile job's own mean B, at its own M:
    it scales this one."""
    runs = [json.loads(p.read_text()) for p in paths]
    merged = json.loads(paths[0].read_text())
    for i, layer in enumerate(merged["layers"]):
        sizes = sorted({b for r in runs for b in r["layers"][i]["by_microbatch"]}, key=int)
        layer["by_microbatch"] = {}
        for b in sizes:
            at = [r["layers"][i]["by_microbatch"][b] for r in runs if b in r["layers"][i]["by_microbatch"]]
            t = {**at[0], **{k: statistics.median(x[k] for x in at)
                             for k in ("fwd_s", "bwd_s", "bwd_first_s", "bwd_rest_s")}}
            step_mean = (t["bwd_first_s"] + (microbatches - 1) * t["bwd_rest_s"]) / microbatches
            job_mean = (t["bwd_first_s"] + (t["microbatches"] - 1) * t["bwd_rest_s"]) / t["microbatches"]
            layer["by_microbatch"][b] = {**t, "bwd_s": t["bwd_s"] * step_mean / job_mean}
    merged["measurement"] += (f"; the median of {len(runs)} such profiles, measured in the rounds of a validation, "
                              f"its B the mean over a step of M={microbatches} (advise_validate.py)")
    write_text(out, json.dumps(merged, indent=1))
    return out


def run_point(group: str, problem, pt: Point, d: Path, rep: int, log) -> list[float]:
    from harness.job import run_job

    r = run_job(_config(problem, pt), d, "validate", pt.label())
    if r.status != "ok":
        raise AdviseError(f"validation run {group} {pt.label()}: {r.status}: {r.error}")
    log(f"tools.advise_validate: {group} {pt.label()} (repeat {rep}): step {r.metrics.step_time_s * 1e3:.1f} ms")
    return r.metrics.step_times_s


def tied_ranks(values: list[float], resolution: float) -> list[float]:
    """Ranks of `values` (1 = largest), neighbours closer than `resolution` (relative) being one
    group the measurement cannot order: within it the ranks follow the values' given order (the
    prediction's), so neither order counts against a prediction and no other order counts for it."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j]] - values[order[j + 1]] <= resolution * values[order[j]]:
            j += 1
        for k, index in enumerate(sorted(order[i:j + 1])):
            ranks[index] = float(i + k + 1)
        i = j + 1
    return ranks


def validate(cluster: list[str], out: Path, repeats: int = 2, groups: tuple[str, ...] = ("emulated", "real"),
             small: bool = False, log=print, work: Path | None = None, real_repeats: int = REAL_REPEATS) -> dict:
    """The table, figure and summary into `out`; the runs (records, traces) into `work`
    (default out/runs). `cluster`: the keys of the cluster the points are priced on (cluster=here).

    Each round runs every point due once (so drift over the minutes hits every point alike),
    after measuring what the host moves for each kind of point in it (an emulated point's
    per-action executor cost; a real point's profile and, at 2 ranks, its slow-down); a
    prediction uses the median over the rounds. The real grid is what the search ranks on a
    first profile (every point fits either way)."""
    work = out / "runs" if work is None else work
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    load0 = load_average()
    t0 = time.time()
    grids = _grids(cluster, groups, small, work)
    times = {"emulated": repeats, "real": real_repeats}
    runs = _Rounds(grids, work, log)
    for rep in range(max(times[g] for g in grids) if grids else 0):
        runs.round([(g, i, pt) for g, (_, pts) in grids.items() if rep < times[g] for i, pt in enumerate(pts)])
    # A point whose runs disagree (a busy minute on the host slowed one of them) runs again,
    # interleaved with the other such points, until its measurement settles or MAX_RUNS: decided
    # from the runs alone, never from the prediction.
    while unsettled := [(g, i, pt) for g, (_, pts) in grids.items() for i, pt in enumerate(pts)
                        if robust_se(runs.per_run[(g, pt)]) > SETTLED_SE[g]
                        and len(runs.per_run[(g, pt)]) < MAX_RUNS[g]]:
        for group, _, pt in unsettled:
            log(f"tools.advise_validate: {group} {pt.label()}: its runs disagree "
                f"(standard error {robust_se(runs.per_run[(group, pt)]):.1%}), one more")
        runs.round(unsettled)
    rows = _rows(grids, runs, work)
    priced_on = next(iter(grids.values()))[0].cluster
    result = {"cluster": priced_on.name, "cluster_source": priced_on.source, "repeats": {g: times[g] for g in grids},
              "small": small,
              "run_seconds": time.time() - t0, "load_average_before": load0, "load_average_after": load_average(),
              "summary": _summary(grids, rows), "points": rows}
    write_text(out / "validation.json", json.dumps(result, indent=1))
    figure(rows, out / "validation.png")
    write_text(out / "validation.md", markdown(result))
    return result


Grids = dict[str, tuple[object, list[Point]]]  # group -> (its problem, its points)


def _grids(cluster: list[str], groups: tuple[str, ...], small: bool, work: Path) -> Grids:
    """group -> (its problem, its points): the emulated grid (SMALL's three, or what the search
    fits), and the real one (what the search ranks on a first profile)."""
    from harness.advise.problem import build_problem

    grids: Grids = {}
    if "emulated" in groups:
        problem = build_problem([*EMULATED_OVERRIDES, *cluster], EMULATED_BATCH)
        pts = list(SMALL) if small else [x.point for x in search(problem, EMULATED_SPACE).fitting]
        grids["emulated"] = (problem, pts)
    if "real" in groups and not small:
        from tools.calibrate import inrun_profile

        first = inrun_profile(work / "grid_profile.json", work / "grid_profile", REAL_B, lambda m: None)
        problem = build_problem([*REAL_MODEL, f"profile={first}", *cluster], REAL_BATCH)
        grids["real"] = (problem, [x.point for x in search(problem, REAL_SPACE).fitting])
    return grids


class _Rounds:
    """The runs of validate's rounds and what they measured: each point's steps and per-run
    medians, and what the host moves (the real group's profiles and 2-rank slow-downs by B,
    the executor's per-action excess by calibrate's job), over every round."""

    def __init__(self, grids: Grids, work: Path, log):
        self.grids, self.work, self.log = grids, work, log
        self.steps: dict[tuple[str, Point], list[float]] = {}
        self.per_run: dict[tuple[str, Point], list[float]] = {}
        self.profiles: dict[int, list[Path]] = {}  # B -> the real group's profiles
        self.slowdowns: dict[int, list[dict]] = {}  # B -> its 2-rank slow-downs
        self.executor: dict[tuple, list[float]] = {}  # calibrate's job -> per-action excess
        self.rounds = 0

    def measure_host(self, group: str, pts: list[Point]) -> None:
        """What the host moves, measured once this round for each kind of point about to run:
        each point is priced on the median over every round. Pooled, not paired with a run: a
        profile taken seconds before a run tracked it no better than one from another round
        (README), and one per kind leaves the time to the runs themselves."""
        tag = f"host{self.rounds:02d}_{group}"
        if group == "real":
            for b in sorted({pt.microbatch_size for pt in pts}):
                worlds = {pt.pp * pt.dp for pt in pts if pt.microbatch_size == b} - {1}
                path, scales = host_profile(b, worlds, self.work / f"{tag}_b{b}")
                self.profiles.setdefault(b, []).append(path)
                self.slowdowns.setdefault(b, []).extend(scales.values())
        else:
            for job in dict.fromkeys(executor_point(pt) for pt in pts):
                self.executor.setdefault(job, []).append(
                    host_executor(job, self.work / f"{tag}_{'_'.join(map(str, job))}"))

    def round(self, todo: list[tuple[str, int, Point]]) -> None:
        """Every point of `todo` once, each group after measuring the host for it."""
        for group in self.grids:
            pts = [(i, pt) for g, i, pt in todo if g == group]
            if pts:
                self.measure_host(group, [pt for _, pt in pts])
                # each round starts one point further on: no point always runs right after the
                # host jobs or the same neighbour (a point's runs fell 10% slower than its
                # profile, pooled over the same ten rounds, while another's fell 4% faster)
                pts = pts[self.rounds % len(pts):] + pts[:self.rounds % len(pts)]
            for i, pt in pts:
                rep = len(self.per_run.get((group, pt), []))
                s = run_point(group, self.grids[group][0], pt, self.work / f"{group}_{i:02d}_r{rep}", rep, self.log)
                self.steps.setdefault((group, pt), []).extend(s)
                self.per_run.setdefault((group, pt), []).append(statistics.median(s))
        self.rounds += 1


def _rows(grids: Grids, runs: _Rounds, work: Path) -> list[dict]:
    """One row per point: predicted (priced on what the rounds measured of the host) against
    measured step time and throughput."""
    rows = []
    for group, (problem, pts) in grids.items():
        for i, pt in enumerate(pts):
            # priced on what the rounds measured of the host
            if group == "real":
                host = runs.profiles[pt.microbatch_size]
                priced = priced_real(problem, pt, host,
                                     runs.slowdowns[pt.microbatch_size] if pt.pp * pt.dp > 1 else [],
                                     work / f"real_{i:02d}")
            else:
                host = runs.executor[executor_point(pt)]
                priced = priced_executor(problem, pt, host)
            step, m = predict(priced, problem.model).step_time_s, statistics.median(runs.steps[(group, pt)])
            reps = runs.per_run[(group, pt)]
            se = robust_se(reps)
            rows.append({"group": group, "point": pt.label(), "overrides": asdict(pt), "predicted_step_s": step,
                         "measured_step_s": m, "error": step / m - 1, "repeat_spread": (max(reps) - min(reps)) / m,
                         "measured_se": se, "runs": len(reps), "host_measurements": len(host),
                         "predicted_throughput": problem.global_batch / step,
                         "measured_throughput": problem.global_batch / m})
    return rows


def _summary(grids: Grids, rows: list[dict]) -> dict:
    """Per group: the errors, the rank agreement of predicted and measured throughput (all, the
    top five, and the top five with ties within the measurement's resolution); ranks written
    into `rows`."""
    summary = {}
    for group in grids:
        g = [r for r in rows if r["group"] == group]
        for key in ("predicted", "measured"):
            for i, r in enumerate(sorted(g, key=lambda r: -r[f"{key}_throughput"])):
                r[f"{key}_rank"] = i + 1
        grid = sorted(g, key=lambda r: -r["predicted_throughput"])
        top, median = grid[:5], grid[len(grid) // 2]
        # the measurement's resolution: two standard errors of the difference of two points'
        # measurements (each point's from the spread of its runs' medians; the group's median)
        resolution = 2 * 2 ** 0.5 * statistics.median(r["measured_se"] for r in g)
        measured_top = [r["measured_throughput"] for r in top]
        summary[group] = {
            "points": len(g),
            "max_abs_error": max(abs(r["error"]) for r in g),
            "mean_abs_error": statistics.fmean(abs(r["error"]) for r in g),
            "within_10pct": sum(abs(r["error"]) <= 0.10 for r in g),
            "spearman_all": spearman([r["predicted_throughput"] for r in g], [r["measured_throughput"] for r in g]),
            "spearman_top5": spearman([r["predicted_throughput"] for r in top], measured_top),
            "resolution": resolution,
            "spearman_top5_ties": spearman([-float(i) for i in range(len(top))],
                                           [-x for x in tied_ranks(measured_top, resolution)]),
            "top5_predicted": [r["point"] for r in top],
            "top5_measured_order": [r["point"] for r in sorted(top, key=lambda r: -r["measured_throughput"])],
            "top_point": grid[0]["point"], "top_measured_throughput": grid[0]["measured_throughput"],
            "median_point": median["point"], "median_measured_throughput": median["measured_throughput"],
        }
    return summary


def figure(rows: list[dict], path: Path) -> None:
    """Left: predicted against measured step, the identity and its 10% band under the points;
    right: each point's error (predicted / measured - 1), so every point shows, emulated and
    real in their own columns (their times are made differently)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, err) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1, 1.2]})
    lo = min(min(r["measured_step_s"], r["predicted_step_s"]) for r in rows) * 1e3 * 0.8
    hi = max(max(r["measured_step_s"], r["predicted_step_s"]) for r in rows) * 1e3 * 1.2
    xs = [lo, hi]
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="0.9", label="within 10%", zorder=0)
    ax.plot(xs, xs, "-", color="0.4", lw=0.8, label="predicted = measured", zorder=1)
    groups = [(group, marker, [r for r in rows if r["group"] == group]) for group, marker in (("emulated", "o"),
                                                                                            ("real", "s"))]
    x0 = 0
    for group, marker, g in groups:
        if not g:
            continue
        pts = ax.scatter([r["measured_step_s"] * 1e3 for r in g], [r["predicted_step_s"] * 1e3 for r in g],
                         marker=marker, s=18, label=f"{group} ({len(g)})", alpha=0.85, zorder=3)
        errors = sorted(100 * (r["predicted_step_s"] / r["measured_step_s"] - 1) for r in g)
        err.scatter(range(x0, x0 + len(g)), errors, marker=marker, s=18, color=pts.get_facecolor()[0], zorder=3,
                    label=f"{group} ({len(g)}), sorted")
        x0 += len(g) + 2
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(xs)
    ax.set_ylim(xs)
    ax.set_xlabel("measured step (ms, median of the steps)")
    ax.set_ylabel("predicted step (ms, harness.advise)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    err.axhspan(-10, 10, color="0.9", zorder=0, label="within 10%")
    err.axhline(0, color="0.4", lw=0.8, zorder=1)
    err.set_xticks([])
    err.set_xlabel("points, each group sorted by its error")
    err.set_ylabel("predicted / measured - 1 (%)")
    err.legend(fontsize=8)
    err.grid(alpha=0.3, axis="y")
    fig.suptitle("predicted against measured, cluster=here (native executor)", fontsize=10)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format=Path(path).suffix.lstrip(".") or "png", dpi=120), binary=True)
    plt.close(fig)


def markdown(res: dict) -> str:
    lines = ["# Predicted against measured (cluster=here)", "",
             f"Regenerate: `make advise-validate` (`python -m tools.advise_validate`; cluster {res['cluster']}: "
             f"{res['cluster_source']}). "
             f"Runs per point, interleaved: {', '.join(f'{g} {n}' for g, n in res['repeats'].items())}, and up to "
             f"{', '.join(f'{g} {MAX_RUNS[g]}' for g in res['repeats'])} where a point's runs disagreed (a standard "
             f"error over {', '.join(f'{g} {SETTLED_SE[g]:.1%}' for g in res['repeats'])}); "
             "measured = median of every measured step; "
             f"runs took {res['run_seconds']:.0f} s; load average before {res['load_average_before']}, after "
             f"{res['load_average_after']}.", "", "![predicted against measured](validation.png)", ""]
    for group, s in res["summary"].items():
        lines += [f"## {group}: {s['points']} points", "",
                  f"- within 10%: {s['within_10pct']}/{s['points']}; largest error {s['max_abs_error']:.1%}, mean "
                  f"{s['mean_abs_error']:.1%}",
                  f"- rank correlation (Spearman) of throughput, all points: {s['spearman_all']:.3f}; the predicted top "
                  f"5: {s['spearman_top5']:.3f}, and {s['spearman_top5_ties']:.3f} with measured points closer than "
                  f"the measurement's resolution ({s['resolution']:.1%}: two standard errors of the difference of "
                  "two points' measurements, from the spread of their runs) "
                  "taken in the predicted order (the measurement cannot order them)",
                  f"- predicted top 5: {', '.join(s['top5_predicted'])}",
                  f"- measured order of those: {', '.join(s['top5_measured_order'])}",
                  f"- the search's top point ({s['top_point']}) measured {s['top_measured_throughput']:.1f} samples/s; "
                  f"the grid's median point ({s['median_point']}) {s['median_measured_throughput']:.1f}", "",
                  "| point | predicted step | measured step | error | runs | runs' spread | standard error | "
                  "predicted rank | measured rank |",
                  "|---|---|---|---|---|---|---|---|---|"]
        g = sorted((r for r in res["points"] if r["group"] == group), key=lambda r: r["predicted_rank"] or 0)
        lines += [f"| {r['point']} | {r['predicted_step_s'] * 1e3:.1f} ms | {r['measured_step_s'] * 1e3:.1f} ms | "
                  f"{r['error']:+.1%} | {r['runs']} | {r['repeat_spread']:.1%} | {r['measured_se']:.1%} | {r['predicted_rank']} | {r['measured_rank']} |" for r in g]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.advise_validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", default=["cluster=here"], help="cluster=<preset> (default here)")
    ap.add_argument("--out", type=Path, default=Path("reports/advise_validation"))
    ap.add_argument("--work", type=Path, default=Path("runs/advise_validation"),
                    help="where the runs' records go (git-ignored runs/; --out keeps only the tables and figure)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each emulated point")
    ap.add_argument("--real-repeats", type=int, default=REAL_REPEATS, help="runs of each real-compute point")
    ap.add_argument("--groups", nargs="+", default=["emulated", "real"], choices=("emulated", "real"))
    ap.add_argument("--small", action="store_true", help=f"only {len(SMALL)} emulated points")
    args = ap.parse_args(argv)
    try:
        res = validate(args.overrides, args.out, args.repeats, tuple(args.groups), args.small,
                       lambda m: print(m, flush=True), args.work, args.real_repeats)
    except AdviseError as e:
        print(f"tools.advise_validate: error: {e}", file=sys.stderr)
        return 2
    for group, s in res["summary"].items():
        print(f"tools.advise_validate: {group}: {s['within_10pct']}/{s['points']} within 10% (largest "
              f"{s['max_abs_error']:.1%}), Spearman {s['spearman_all']:.3f}, top 5 {s['spearman_top5']:.3f} "
              f"({s['spearman_top5_ties']:.3f} with ties within {s['resolution']:.1%})")
    print(f"tools.advise_validate: wrote {args.out / 'validation.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
