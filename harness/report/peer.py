"""Native against PyTorch's pipeline engine: step time per schedule and M, where a sweep ran
the same config through executor=native and executor=pytorch."""

from __future__ import annotations

from statistics import fmean

from harness.config import RUN_SECTIONS
from harness.report.doc import Block, Heading, Table, Text
from harness.report.runs import ok, run_id


def _same_plan(r: dict) -> tuple:
    """Everything that makes two runs the same plan, except the executor."""
    c = {k: v for k, v in r["config"].items() if k not in ("executor", *RUN_SECTIONS)}
    return tuple(sorted((k, repr(v)) for k, v in c.items()))


def peer_section(runs: list[dict]) -> list[Block]:
    blocks: list[Block] = [Heading("Native against torch.distributed.pipelining"),
                           Text("The same plan through both executors: step time (median over measured steps), "
                                "native / pytorch (below 1: the native executor is faster), and the measured bubble "
                                "of each.")]
    by_plan: dict[tuple, dict[str, list[dict]]] = {}
    for r in ok(runs):
        if r["config"]["executor"] in ("native", "pytorch"):
            by_plan.setdefault(_same_plan(r), {}).setdefault(r["config"]["executor"], []).append(r)
    pairs = [(d["native"], d["pytorch"]) for d in by_plan.values() if "native" in d and "pytorch" in d]
    if not pairs:  # nothing to compare: no section (a sweep `executor=native,pytorch` makes one)
        return []
    rows = []
    for native, peer in sorted(pairs, key=lambda p: (p[0][0]["config"]["schedule"]["name"],
                                                     p[0][0]["config"]["microbatches"])):
        c = native[0]["config"]
        n_s, p_s = (fmean(r["metrics"]["step_time_s"] for r in rs) for rs in (native, peer))
        rows.append([c["schedule"]["name"], c["pp"], c["microbatches"], c["compute"], n_s * 1e3, p_s * 1e3,
                     n_s / p_s, fmean(r["metrics"]["bubble"]["measured"] for r in native),
                     fmean(r["metrics"]["bubble"]["measured"] for r in peer),
                     ", ".join(run_id(r) for r in native + peer)])
    return blocks + [Table(["schedule", "pp", "M", "compute", "native step ms", "pytorch step ms", "native / pytorch",
                            "native bubble", "pytorch bubble", "runs"], rows)]
