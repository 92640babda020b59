"""The platform's floor for an emulated job: the step time this host gives a runtime that
costs nothing between actions, for the benchmarks to set beside the harness's own.

The job's plan (its action lists, its modeled costs, its model's stages) is run by one process
a rank with nothing but torch: the same real math (autograd), the emulator's lead and hold
(harness/runtime/emulate.py), every receive posted at the step's start and each message sent
with isend on the groups the native runner uses (gloo, one direction of each rank pair a
group, a yield after each send), then the optimizer. No tracer, meter, routes or records. A
step is timed as the harness times it: first action start to last optimizer end, any rank.

On this 2-core VM the floor itself lies above the simulation: four ranks on two cores, ~0.1 ms
gloo sends, wake-ups that land late. measured / floor is the runtime's own cost; floor /
simulated is the platform's. 1F1B-like plans only (F and B; stages on any ranks).
"""

from __future__ import annotations

import os
import socket
import time
from multiprocessing.queues import Queue

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.config import Config
from harness.planning.plan import make_plan
from harness.runtime.emulate import Emulator
from harness.runtime.optimizer import Optimizer
from harness.runtime.precision import Precision
from harness.runtime.transport import DOWNWARD, downward, message_groups
from harness.schedules import p2p
from harness.schedules.ir import Action, Kind


def step_times_s(c: Config) -> list[float]:
    """The floor's measured steps (after c.warmup_steps) of the emulated job `c` (pp ranks, dp=1)."""
    if c.compute != "emulated" or c.dp != 1 or c.tp != 1:
        raise ValueError("the floor runs an emulated job at dp=1, tp=1")
    ctx = mp.get_context("forkserver")  # the harness's warm forkserver: no torch import per rank
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spans = ctx.Queue()
    ranks = [ctx.Process(target=_rank, args=(c, r, port, spans), daemon=True) for r in range(c.pp)]
    for p in ranks:
        p.start()
    got = dict(spans.get(timeout=c.run.timeout_s) for _ in ranks)
    for p in ranks:
        p.join()
    return [(max(got[r][s][1] for r in got) - min(got[r][s][0] for r in got)) / 1e9
            for s in range(c.warmup_steps, c.warmup_steps + c.steps)]


def _rank(c: Config, rank: int, port: int, spans: Queue) -> None:
    torch.set_num_threads(1)
    plan, cpu = make_plan(c), torch.device("cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=c.pp)
    owner, last, model = plan.stage_rank, len(plan.stage_layers) - 1, plan.model.model
    # the native runner's groups for eager on gloo: the world's, and the downward one
    down = message_groups("eager", "gloo", plan.schedule, c.pp, 1, rank, cpu).get(DOWNWARD)
    stages = {s: plan.model.build_stage(*plan.stage_layers[s], c.seed, torch.float32, cpu)
              for s, r in owner.items() if r == rank}
    optimizer = Optimizer([p for m in stages.values() for p in m.parameters()], c.lr, c.optimizer,
                          Precision(c.dtype))
    emulator = Emulator(plan.emulated_cost, cpu)
    shape = tuple(model.activation_shape(c.microbatch_size))

    def message(a: Action, into: bool) -> p2p.Message | None:
        """The message `a` takes in (into) or sends on, or None (the native runner's)."""
        if a.kind not in (Kind.F, Kind.B):
            raise ValueError(f"the floor runs F and B only, not {a.kind.value}")
        return p2p.action_message(a, into, last + 1)

    def route(msg: p2p.Message) -> dict:
        return {"group": down if downward(owner, msg) else None,
                "tag": p2p.tag(msg.from_stage, msg.to_stage, msg.microbatch, last + 1)}

    out: list[tuple[int, int]] = []
    for step in range(c.warmup_steps + c.steps):
        x, y = model.batch(c.seed, step, c.microbatches * c.microbatch_size)
        xs, ys = x.split(c.microbatch_size), y.split(c.microbatch_size)
        posted, local, held, sends = {}, {}, {}, []
        for a in plan.schedule[rank]:
            m = message(a, into=True)
            if m is not None and owner[m.from_stage] != rank:
                buf = torch.empty(shape)
                posted[m] = dist.irecv(buf, owner[m.from_stage], **route(m)), buf
        dist.barrier()
        t0 = time.perf_counter_ns()
        for a in plan.schedule[rank]:
            m = message(a, into=True)
            if m is None:
                got = xs[a.microbatch] if a.kind is Kind.F else None
            elif m in posted:
                work, got = posted.pop(m)
                work.wait()
            else:
                got = local.pop(m)
            h0 = time.perf_counter_ns()
            emulator.lead(h0, a)
            if a.kind is Kind.F:
                got = got.requires_grad_(a.stage > 0)
                sent = stages[a.stage](got)
                if a.stage == last:
                    sent = model.loss(sent, ys[a.microbatch]) / c.microbatches
                held[(a.stage, a.microbatch)] = got, sent
            else:
                x_in, y_out = held.pop((a.stage, a.microbatch))
                torch.autograd.backward(y_out, grad_tensors=got)
                sent = x_in.grad
            emulator.hold(h0, a)
            m = message(a, into=False)
            if m is None:
                continue
            if owner[m.to_stage] == rank:
                local[m] = sent.detach()
                continue
            sends.append(dist.isend(sent.detach(), owner[m.to_stage], **route(m)))
            os.sched_yield()
        for work in sends:
            work.wait()
        optimizer.step()
        optimizer.zero_grad()
        out.append((t0, time.perf_counter_ns()))
    spans.put((rank, out))
    dist.destroy_process_group()
