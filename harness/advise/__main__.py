"""`python -m harness.advise [key=value ...] cluster=<preset> --global-batch N [options]`:
search schedule x pp x tp x dp x M x v x checkpointing x ZeRO x placement for a model on a cluster
and write advice.json, advice.md, advice.html and advice.png (harness/advise/__init__.py says how).
A schedule made from each point's costs (schedule=zb_auto) is searched beside the built-ins; one
with a memory limit at limits 1 and the largest the memory budget allows (harness/advise/search.py);
--memory-limits fixes them.

Keys are python -m harness's (model=..., model.layers=..., dtype=..., optimizer=..., profile=...,
cost.time_scale=..., +scenario=...), `cluster=<preset>` and `cluster.<key>=<value>` among them
(harness/conf/cluster/). A profile with fewer layers than the model (embedding, one block,
head) is expanded by kind. Examples:

  python -m harness.advise cluster=h200_8nodes profile=data/llama70b_h200_derived_block_profile.json \\
      dtype=bf16 optimizer=adamw --global-batch 512
  python -m harness.advise cluster=h200_node profile=data/gpt2_h200_profile.json dtype=bf16 \\
      optimizer=adamw --global-batch 64
  python -m harness.advise cluster=here +scenario=h200_emulated --global-batch 16 --gpus 4

Bad input (no such cluster, a global batch nothing divides, a space empty after the
constraints, a cluster whose GPUs hold no point, a memory limit that is not a number > 0, a tp
the model or the node refuses) is
one line naming why, exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.frontend.args import OneLineParser
from harness.config import MAX_ACTIONS, MAX_GPUS, MAX_WORLD, PLACEMENTS
from harness.records.outputs import out_problem
from harness.schedules.registry import searchable

from .errors import MEMORY_LIMITS_ALLOWED, AdviseError

if TYPE_CHECKING:  # the search imports torch: its flags are refused before it is loaded (main)
    from .search import Prediction


def _bools(v: str) -> tuple[bool, ...]:
    return {"both": (False, True), "on": (True,), "off": (False,), "true": (True,), "false": (False,)}[v]


def _allowed(message: str) -> str:
    hint = "; keys are key=value, e.g. profile=FILE" if "unrecognized arguments: --" in message else ""
    return f"python -m harness.advise key=value ... cluster=<preset> --global-batch N [options]{hint}; --help lists them"


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m harness.advise", description=__doc__, allowed=_allowed,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="python -m harness keys, cluster=<preset> and cluster.<key>=<value>")
    ap.add_argument("--global-batch", type=int, default=None, help="samples per step over all replicas")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default runs/advise/<time>)")
    ap.add_argument("--top", type=int, default=5, help="how many points get run commands")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs a point uses (pp x tp x dp; default: the whole cluster)")
    ap.add_argument("--schedules", nargs="+", default=list(searchable()), choices=searchable())
    ap.add_argument("--pp", type=int, nargs="+", default=None)
    ap.add_argument("--dp", type=int, nargs="+", default=None, help="default: gpus / (pp x tp)")
    ap.add_argument("--tp", type=int, nargs="+", default=None,
                    help="tensor-parallel degrees (default: every one the model allows, up to a node's GPUs)")
    ap.add_argument("--tp-profiles", nargs="+", default=[], metavar="PROFILE",
                    help="with profile=: profiles of one TP rank at tp > 1 (python -m harness.advise.derive --tp N "
                         "--sequence-parallel); tp > 1 is searched where one is given")
    ap.add_argument("--tp-across-nodes", action="store_true", help="let a TP group span nodes (tp > GPUs per node)")
    ap.add_argument("--sequence-parallel", choices=("both", "on", "off"), default="on",
                    help="at tp > 1 (default on, as Megatron-LM and torchtitan run TP)")
    ap.add_argument("--microbatch-sizes", type=int, nargs="+", default=None,
                    help="default: every divisor of global_batch / dp up to --max-microbatch-size")
    ap.add_argument("--virtual-stages", type=int, nargs="+", default=[2, 4], help="interleaved_1f1b's chunks per rank")
    ap.add_argument("--checkpointing", choices=("both", "on", "off"), default="both")
    ap.add_argument("--zero", type=int, nargs="+", default=[0, 1], choices=(0, 1))
    ap.add_argument("--placements", nargs="+", default=list(PLACEMENTS), choices=PLACEMENTS)
    ap.add_argument("--max-microbatches", type=int, default=1024)
    ap.add_argument("--max-microbatch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=None, help="processes evaluating points (default: the cores)")
    ap.add_argument("--memory-limits", nargs="+", default=["budget"], metavar="LIMIT",
                    help="the memory limits of the schedules that take one (zb_auto's schedule.memory_limit), in "
                         "units of 1F1B's peak (pp microbatches per rank), "
                         "e.g. 1 2 or 1,2 (default budget: 1 and the largest the memory budget allows)")
    return ap


MAX_GLOBAL_BATCH = 2**20  # --global-batch: the search lists every divisor of global_batch / dp for B
MAX_WORKERS = 1024  # --workers: processes evaluating points


def check_args(args: argparse.Namespace) -> None:
    """Each option within what the search can use, before anything is composed or written;
    AdviseError (one line) naming the option, the value and what is allowed."""
    def whole(flag: str, values: list[int] | int | None, low: int, high: int, what: str) -> None:
        for v in ([] if values is None else values if isinstance(values, list) else [values]):
            if not low <= v <= high:
                raise AdviseError(f"{flag} {v}: {what} (allowed: integers {low:,}..{high:,})")

    whole("--global-batch", args.global_batch, 1, MAX_GLOBAL_BATCH, "samples per step over all replicas")
    whole("--pp", args.pp, 1, MAX_WORLD, "pipeline ranks")
    whole("--dp", args.dp, 1, MAX_WORLD, "data-parallel replicas")
    whole("--tp", args.tp, 1, MAX_WORLD, "tensor-parallel ranks inside each stage")
    whole("--gpus", args.gpus, 1, MAX_GPUS, "GPUs a point uses, pp x tp x dp")
    whole("--microbatch-sizes", args.microbatch_sizes, 1, MAX_GLOBAL_BATCH, "samples per microbatch")
    whole("--max-microbatch-size", args.max_microbatch_size, 1, MAX_GLOBAL_BATCH, "the largest B searched")
    whole("--max-microbatches", args.max_microbatches, 1, MAX_ACTIONS // 3, "the most microbatches searched")
    whole("--virtual-stages", args.virtual_stages, 1, MAX_ACTIONS // 3, "interleaved_1f1b's chunks per rank")
    whole("--top", args.top, 1, 10_000, "how many points get run commands")
    whole("--workers", args.workers, 1, MAX_WORKERS, "processes evaluating points")


def check_out(out: Path) -> None:
    """--out as a place for the outputs, checked before anything is composed, searched or
    written (nothing is made here: a refusal later must leave no empty directory); AdviseError
    (one line) for the harness's source tree, a path that is no directory, or a parent that
    cannot hold it."""
    if why := out_problem(out, f"--out {out}", "dir"):
        raise AdviseError(why)
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise AdviseError(f"--out {out}: exists and is not a directory (allowed: a directory, or a path where one "
                              "can be created)")
        return
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise AdviseError(f"--out {out}: cannot create it ({parent} is not a directory this user can write) "
                          "(allowed: a directory this user can write, or one that can be created)")


def make_out(out: Path) -> None:
    """The output directory, made once the search has an answer (a refused command writes
    nothing); AdviseError (one line) where it cannot be."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AdviseError(f"--out {out}: cannot create it ({e.strerror or type(e).__name__}) (allowed: a directory "
                          "this user can write, or one that can be created)") from None


def memory_limits(values: list[str]) -> tuple[float, ...] | None:
    """--memory-limits as the search takes them: None for `budget`, else numbers > 0 (given
    apart or comma-separated); AdviseError (one line) naming a bad one."""
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if items == ["budget"]:
        return None
    out: list[float] = []
    for v in items or ["(none)"]:
        try:
            x = float(v)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x > 0):
            raise AdviseError(f"--memory-limits {v}: {MEMORY_LIMITS_ALLOWED}")
        out.append(x)
    return tuple(out)


def _progress():
    shown = [0.0]

    def show(i: int, n: int) -> None:
        if i == n or i / n >= shown[0] + 0.25:
            shown[0] = i / n
            print(f"harness.advise: {i:,}/{n:,} points", flush=True)

    return show


def _utilization(x: Prediction) -> str:
    u = x.flops
    if u is None:
        return ""
    return f"{u.tflops_per_device:.4g} TFLOP/s per GPU" + (f" (MFU {u.mfu:.1%})" if u.mfu is not None else "") + ", "


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        check_args(args)
        out = args.out or Path("runs/advise") / time.strftime("%Y-%m-%d_%H-%M-%S")
        check_out(out)
        limits = memory_limits(args.memory_limits)
    except AdviseError as e:  # the flags: said before the search, and torch, are imported
        print(f"harness.advise: error: {e}", file=sys.stderr)
        return 2
    from .page import model_title
    from .problem import build_problem
    from .report import write
    from .search import Space, search

    try:
        problem = build_problem(args.overrides, args.global_batch, args.tp_profiles)
        if problem.global_batch > MAX_GLOBAL_BATCH:  # given as global_batch=N among the keys
            raise AdviseError(f"global_batch={problem.global_batch}: more than {MAX_GLOBAL_BATCH:,} (allowed: "
                              f"1..{MAX_GLOBAL_BATCH:,} samples per step; the search lists its divisors)")
        space = Space(schedules=tuple(args.schedules), pp=tuple(args.pp) if args.pp else None,
                      dp=tuple(args.dp) if args.dp else None, tp=tuple(args.tp) if args.tp else None,
                      tp_across_nodes=args.tp_across_nodes, sequence_parallel=_bools(args.sequence_parallel),
                      microbatch_sizes=tuple(args.microbatch_sizes) if args.microbatch_sizes else None,
                      virtual_stages=tuple(args.virtual_stages), checkpointing=_bools(args.checkpointing),
                      zero=tuple(args.zero), placements=tuple(args.placements), gpus=args.gpus,
                      max_microbatches=args.max_microbatches, max_microbatch_size=args.max_microbatch_size,
                      memory_limits=limits, auto_top=max(1, args.top))
        c = problem.config
        print(f"harness.advise: {model_title(c.model, problem.model)} ({problem.num_layers} layers, {c.dtype}, "
              f"{c.optimizer.name}) on {problem.cluster.name}, global batch {problem.global_batch}", flush=True)
        result = search(problem, space, _progress(), args.workers)
        make_out(out)
    except AdviseError as e:
        print(f"harness.advise: error: {e}", file=sys.stderr)
        return 2
    paths = write(problem, result, out, args.top)
    best = result.fitting[0]
    k = problem.tokens_per_sample or 1
    print(f"harness.advise: {len(result.predictions):,} points in {result.seconds:.1f} s "
          f"({len(result.predictions) / max(result.seconds, 1e-9):,.0f}/s), {len(result.fitting):,} fit; best: "
          f"{best.point.label()}: step {best.step_time_s:.4g} s, {best.throughput_samples_s * k:,.0f} "
          f"{'tokens' if problem.tokens_per_sample else 'samples'}/s, {_utilization(best)}"
          f"{best.memory.peak / 2**30:.1f} GiB per GPU")
    print(f"harness.advise: wrote {paths['md']}, {paths['html']}, {paths['json']}, {paths['png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
