"""Native against PyTorch's pipeline engine: step time per schedule and M, where a sweep ran
the same config through executor=native and executor=pytorch."""

from __future__ import annotations

from statistics import fmean

from harness.config import RUN_SECTIONS
from harness.report.doc import Block, Heading, Table, Text
from harness.report.runs import Run, config_key, ok, run_id

NOT_PLAN = ("executor", *RUN_SECTIONS)  # what two runs of one plan may differ in: the executor, run control


def peer_section(runs: list[Run]) -> list[Block]:
    blocks: list[Block] = [Heading("Native against torch.distributed.pipelining"),
                           Text("The same plan through both executors: step time (median over measured steps), "
                                "native / pytorch (below 1: the native executor is faster), and the measured bubble "
                                "of each.")]
    by_plan: dict[tuple, dict[str, list[Run]]] = {}
    for r in ok(runs):
        if r.cfg.executor in ("native", "pytorch"):
            by_plan.setdefault(config_key(r, NOT_PLAN), {}).setdefault(r.cfg.executor, []).append(r)
    pairs = [(d["native"], d["pytorch"]) for d in by_plan.values() if "native" in d and "pytorch" in d]
    if not pairs:  # nothing to compare: no section (a sweep `executor=native,pytorch` makes one)
        return []
    rows = []
    for native, peer in sorted(pairs, key=lambda p: (p[0][0].cfg.schedule.name, p[0][0].cfg.microbatches)):
        c = native[0].cfg
        n_s, p_s = (fmean(r.metrics.step_time_s for r in rs) for rs in (native, peer))
        rows.append([c.schedule.name, c.pp, c.microbatches, c.compute, n_s * 1e3, p_s * 1e3,
                     n_s / p_s, fmean(r.metrics.bubble.measured for r in native),
                     fmean(r.metrics.bubble.measured for r in peer),
                     ", ".join(run_id(r) for r in native + peer)])
    return blocks + [Table(["schedule", "pp", "M", "compute", "native step ms", "pytorch step ms", "native / pytorch",
                            "native bubble", "pytorch bubble", "runs"], rows)]
