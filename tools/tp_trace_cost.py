"""`python -m tools.tp_trace_cost [--hidden 64 256 1024] [--blocks 2] [--iters 30]`: what tracing
the TP collectives costs (harness/parallel/tp_trace.py, a TorchDispatchMode: one Python call
per dispatched op).

Two local gloo ranks split model=gpt's blocks at tp=2 (seq 64, 4 sequences, 4 heads) and time
one forward + backward, traced and untraced in alternation (the order flipped every
iteration), the ranks in step (a barrier before each). Prints the median of each, and the
median of the paired ratios (robust to a busy machine's drift).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, port: int, hidden: int, blocks: int, iters: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import DeviceMesh

    from harness.config import Config, set_keys
    from harness.parallel.tensor import parallelize_stage
    from harness.parallel.tp_trace import TPCommTrace
    from harness.planning.plan import make_plan
    from harness.runtime.tracer import Tracer, clock_for

    c = set_keys(Config(), tp=2, pp=1, **{"model.name": "gpt", "model.layers": blocks, "model.hidden": hidden,
                                          "model.heads": 4, "model.seq": 64, "model.vocab": 256})
    plan = make_plan(c)
    stage = plan.model.build_stage(1, 1 + blocks, 0, torch.float32)  # the blocks, not the embedding or head
    parallelize_stage(stage, plan.model.model, DeviceMesh("cpu", [0, 1]), False, 1)
    tracer = Tracer(clock_for(torch.device("cpu")))
    trace = TPCommTrace(tracer)
    trace.watch(stage, 1)
    x = torch.randn(4, 64, hidden)

    def one(traced: bool) -> float:
        t0 = time.perf_counter()
        with trace.action("0F0", "F", 0, 0) if traced else nullcontext():
            y = stage(x.clone().requires_grad_(True))
        with trace.action("0B0", "B", 0, 0) if traced else nullcontext():
            y.sum().backward()
        return time.perf_counter() - t0

    for _ in range(5):
        one(True), one(False)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(iters):
        for traced in (True, False) if i % 2 else (False, True):
            dist.barrier()
            times[traced].append(one(traced))
    slices = len(tracer.take()) // (iters + 5)
    if rank == 0:
        out.put((statistics.median(times[True]), statistics.median(times[False]),
                 statistics.median(a / b for a, b in zip(times[True], times[False])), slices))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--port", type=int, default=29611)
    a = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    for hidden in a.hidden:
        q = ctx.Queue()
        ranks = [ctx.Process(target=_rank, args=(r, a.port, hidden, a.blocks, a.iters, q)) for r in range(2)]
        for r in ranks:
            r.start()
        traced, plain, ratio, slices = q.get()
        for r in ranks:
            r.join()
        print(f"hidden={hidden} blocks={a.blocks}: F+B traced {traced * 1e3:.2f} ms, untraced {plain * 1e3:.2f} ms, "
              f"paired median {ratio - 1:+.1%} ({slices} TP slices per F+B)")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
