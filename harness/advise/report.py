"""What a search writes: advice.json (every point), advice.md and advice.html (one page, two
renderings, page.py: the answer, why its bubble is what it is, what came close, the
assumptions, the commands), advice.png (throughput against peak memory per GPU, with the
Pareto front: figure.py)."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from harness.config import OVERHEAD_TABLES
from harness.frontend.compose import schedule_key
from harness.planning.devices import memory_bandwidth
from harness.records.atomic import write_json_atomic, write_text
from harness.report.doc import Block, markdown
from harness.report.html import page as html_page
from harness.schedules.registry import COSTS, SCHEDULES
from harness.simulate.links import summary

from .bubble import Explained, explain
from .figure import Frame, figure
from .page import blocks, model_title
from .compute import compute_summary
from .problem import shown
from .search import GIB, Prediction, Problem, Ranking, limit_text


def assumptions(p: Problem, r: Ranking | None = None) -> list[str]:
    cl, c = p.cluster, p.config
    profiled = c.profile is not None
    out = [
        f"cluster {cl.name}: {cl.description or summary(cl)}; source: {cl.source or 'not stated'}",
        f"memory per GPU: {cl.memory_per_gpu_gib:g} GiB - {cl.memory_reserve_gib:g} GiB reserved = "
        f"{cl.usable_bytes / GIB:.1f} GiB for the model",
        f"point to point: latency + bytes / bandwidth of the link between the two GPUs (intra-node "
        f"{cl.intra.bandwidth_Bps / 1e9:g} GB/s + {cl.intra.latency_s * 1e6:g} us, inter-node "
        f"{cl.inter.bandwidth_Bps / 1e9:g} GB/s + {cl.inter.latency_s * 1e6:g} us, per GPU and direction)"
        + (f"; latency replaced by the executor's measured hop ({cl.overhead.hop_s} s by ranks on the host)"
           if cl.overhead.hop_s else ""),
        "data-parallel gradient sync: ring all-reduce per stage, 2(n-1) latency + 2(n-1)/n x bytes / bandwidth "
        "over the slowest link the replicas span, inside the stage's last backward (after its last W where the "
        "schedule splits the backward), not overlapped with compute",
        "ZeRO-1: optimizer moments sharded (memory); after the step an all-gather of the updated shards (time)",
        f"optimizer step: memory-bound, parameters x bytes read and written / {memory_bandwidth(cl) / 1e12:g} TB/s",
        "compute: the profile's per-layer forward and backward seconds at B (linear between measured sizes), "
        f"x cost.time_scale={c.cost.time_scale:g}; split backward I = (1 - w) B, W = w B, "
        f"w = cost.weight_grad_share={c.cost.weight_grad_share:g}"
        if profiled else
        f"compute: cost.* ({c.cost.fwd_ms_per_layer:g} ms per layer at B={c.cost.at_microbatch_size}, "
        f"{c.cost.fixed_fraction:g} fixed; backward x{c.cost.bwd_over_fwd:g})",
        "checkpointing: the stage's forward runs again inside its backward"
        + (" (not under compute=emulated: the replay holds B to its modeled cost)" if c.compute == "emulated" else ""),
        "stages: partition=profile (min-max of F + B per layer at B)" if profiled
        else f"stages: partition={c.partition.name}",
        f"memory: harness/planning/memory_theory.py (params, grads in {c.dtype}; optimizer {c.optimizer.name}"
        + (" with fp32 masters" if c.dtype != "fp32" else "")
        + "; activations traced per layer"
        + (" on fake tensors (kernels as the CPU's math picks them, not measured on the device)"
           if cl.device != "cpu" else "") + ")",
        "only points the harness can run: each is a harness config, kept only if the harness's own validation "
        "(harness/planning/checks.py) accepts it; its prediction is python -m harness executor=sim on it (the plan, "
        "harness/simulate/pricing.py, the simulator, harness/planning/memory_theory.py)",
        "placement (the harness's `placement=` key): pp_inner puts a pipeline on consecutive GPUs (its "
        "messages inside a node, data-parallel all-reduces across nodes), dp_inner a stage's replicas "
        "(all-reduces inside a node, pipeline messages across)",
    ]
    o = cl.overhead
    if any(getattr(o, k) for k in OVERHEAD_TABLES):
        out.append(f"executor overhead (measured by tools/calibrate.py, by ranks on the host): seconds per emulated action "
                   f"{o.action_s}, posting a send {o.send_s}, a receive already arrived {o.recv_s}, the rest of a hop "
                   f"{o.hop_s}, a gradient sync beyond the ring model {o.allreduce_s}, per step {o.step_s}; real "
                   f"compute's F and B over the profile's x{o.real_fwd_scale}, x{o.real_bwd_scale}")
    else:
        out.append("executor overhead: none modeled (not measured on this cluster)")
    made = _made(r) if r is not None else {}
    planned = sorted({note for x in r.predictions for note in x.notes
                      if not any(note.startswith(f"schedule={name}:") for name in made)}) if r is not None else []
    if c.profile:  # as the commands name it: from where they run
        planned = [note.replace(c.profile, shown(c.profile)) for note in planned]
    return out + list(p.notes) + planned + [made_assumption(r, name, xs) for name, xs in made.items()]


def _made(r: Ranking) -> dict[str, list[Prediction]]:
    """The points of each schedule made per point from its costs (its entry's needs), by name."""
    out: dict[str, list[Prediction]] = {}
    for x in r.predictions:
        if SCHEDULES[x.point.schedule].needs == COSTS:
            out.setdefault(x.point.schedule, []).append(x)
    return out


def made_assumption(r: Ranking, name: str, xs: list[Prediction]) -> str:
    """One line for a made schedule's points (each plan's own note, `schedule=<name>: ...`, says how its order
    was made)."""
    entry, prefix = SCHEDULES[name], f"schedule={name}:"
    best = min(xs, key=lambda x: x.rank or math.inf)
    note = next((n for n in best.notes if n.startswith(prefix)), "")
    left = sum(n for why, n in r.dropped.items() if why.startswith(f"{name}:"))
    limits = (f", at {entry.limit_key} 1 and the largest the memory theory lets fit, or as --memory-limits gave them"
              if entry.limit_key else "")
    return (f"{prefix} {len(xs)} points, each with its own order made in planning for its priced costs "
            f"({entry.summary}){limits}; {left} more left out (their reasons below); its best, "
            f"{best.point.label()}: {note.removeprefix(prefix).strip()}")


def _value(v: object) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def run_overrides(p: Problem, x: Prediction) -> list[str]:
    """The harness keys that run this point: the problem's (the user's model, dtype, optimizer,
    cost.*, the profile's model, profile and partition, the compute mode), the global batch and
    the point's keys."""
    o = x.point.overrides()
    profile = p.profile_at(x.point.tp, x.point.sequence_parallel)  # a TP rank's at tp > 1 (--tp-profiles)
    keys = [f"profile={shown(profile)}" if k.startswith("profile=") and profile else k for k in p.overrides]
    keys.append(schedule_key(o["schedule"]))
    if x.point.memory_limit is not None:
        keys.append(f"schedule.{SCHEDULES[x.point.schedule].limit_key}={limit_text(x.point.memory_limit)}")
    keys += [f"pp={o['pp']}", f"tp={o['tp']}", f"dp={o['dp']}", f"microbatches={o['microbatches']}",
             f"global_batch={p.global_batch}"]
    if SCHEDULES[x.point.schedule].reads_virtual_stages:
        keys.append(f"virtual_stages={o['virtual_stages']}")
    keys += [f"checkpointing={_value(o['checkpointing'])}", f"zero={o['zero']}"]
    if o["placement"] != "pp_inner":
        keys.append(f"placement={o['placement']}")
    if o["tp"] > 1:
        keys.append(f"sequence_parallel={_value(o['sequence_parallel'])}")
    return keys


def commands(p: Problem, x: Prediction) -> dict[str, str]:
    """How to run the point for real: on this machine (python -m harness), or at scale
    (torchrun per node, or the SLURM launcher); and how to reproduce its prediction (the same
    keys with executor=sim on the cluster it was priced on)."""
    keys = run_overrides(p, x)
    cl = p.cluster
    world = x.point.pp * x.point.tp * x.point.dp
    q = " ".join(shlex.quote(k) for k in keys)
    out: dict[str, str] = {}
    if cl.device == "cpu":
        out["here"] = f"python -m harness {q}"
    else:
        nodes = math.ceil(world / cl.gpus_per_node)
        per_node = min(world, cl.gpus_per_node)
        out["torchrun"] = (f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
                           f"--rdzv-endpoint $HEAD:29500 -m harness device=cuda {q}")
        out["slurm"] = (f"python -m harness -m hydra/launcher=slurm hydra.launcher.gpus_per_node={cl.gpus_per_node} "
                        f"device=cuda {q}")
    out["predicted"] = "python -m harness executor=sim " + " ".join(shlex.quote(k) for k in p.cluster_keys) \
        + (" device=cuda " if cl.device == "cuda" else " ") + q
    return out


def to_json(p: Problem, r: Ranking, top: int) -> dict:
    pts = []
    for x in r.predictions:
        d = x.as_dict(p.tokens_per_sample)
        d["overrides"] = {**d["overrides"], "global_batch": p.global_batch}
        if x.rank is not None and x.rank <= top:
            d["commands"] = commands(p, x)
        pts.append(d)
    cl = p.cluster
    return {
        "cluster": {"name": cl.name, "nodes": cl.nodes, "gpus_per_node": cl.gpus_per_node,
                    "usable_bytes_per_gpu": cl.usable_bytes, "source": cl.source},
        "model": {"name": p.config.model.name, "title": model_title(p.config.model, p.model), "layers": p.num_layers,
                  "dtype": p.config.dtype, "optimizer": p.config.optimizer.name,
                  "profile": shown(p.config.profile) if p.config.profile else None},
        "global_batch": p.global_batch,
        "search": {"points": len(r.predictions), "fit": len(r.fitting), "seconds": r.seconds,
                   "points_per_s": len(r.predictions) / r.seconds if r.seconds else None,
                   "left_out": r.dropped, "left_out_examples": r.examples},
        "assumptions": assumptions(p, r),
        "overrides": p.overrides,
        "points": pts,
    }


def page_blocks(p: Problem, r: Ranking, top: int, doc: dict, figure: str | None = None,
                frame: Frame | None = None, explained: Explained | None = None) -> list[Block]:
    """The advice page's blocks (page.py), with this module's commands and assumptions."""
    return blocks(p, r, top, doc, figure, frame, explained, lambda x: commands(p, x), assumptions(p, r))


def write(p: Problem, r: Ranking, out: Path, top: int) -> dict[str, Path]:
    """advice.json, advice.png, and the page made once as blocks: advice.md and advice.html."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "advice.json", "md": out / "advice.md", "html": out / "advice.html",
             "png": out / "advice.png"}
    doc = to_json(p, r, top)
    explained = explain(p, r.fitting[0])
    doc["recommended_bubble"] = explained.as_dict()
    doc["compute"] = compute_summary(p, r.fitting[0])
    # strict JSON (no Infinity or NaN: jq and JavaScript refuse them), each replaced value listed in the file
    write_json_atomic(paths["json"], doc)
    title = model_title(p.config.model, p.model)
    frame = figure(p, r, paths["png"], title)
    parts = page_blocks(p, r, top, doc, paths["png"].name, frame, explained)
    write_text(paths["md"], markdown(parts))
    write_text(paths["html"], html_page(parts, f"Advice: {title} on {p.cluster.name}", out))
    return paths
