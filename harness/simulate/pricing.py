"""What a plan costs, as the simulator's CostModel: the one pricing that executor=sim, a run's
modeled step and the planner (harness.advise) all use.

- compute: the modeled per-stage F and B at the run's microbatch size (the profile's times, or
  cost.*, x cost.time_scale: what compute=emulated holds each action for); a split backward
  I = (1 - w) B, W = w B (w = cost.weight_grad_share). Priced as a real run (compute=real): the
  cluster's measured real-compute scales (cluster=here) and, with checkpointing, the stage's
  forward again inside each backward (the recompute; under compute=emulated the replay holds B
  to its modeled cost whatever runs inside);
- messages: the activation (B x the model's activation shape, in dtype) over the link between
  the two ranks it joins: `comm.*` without a cluster; with one, the link between their GPUs
  (intra- or inter-node, the slowest replica's), per direction (harness/simulate/links.py);
- data parallelism (dp > 1): each stage's gradients (in dtype) ring all-reduced inside its last
  backward, over comm.* or the links its replicas span (plus the measured skew on cluster=here);
- with a cluster: the optimizer step per rank (memory-bound: parameters x bytes read and
  written / memory bandwidth) and, with ZeRO-1, the all-gather of the updated shards; the
  executor's measured overheads (per emulated action, posting a send, taking a receive, per step).
"""

from __future__ import annotations

from dataclasses import replace

from harness.config import DTYPE_BYTES, Config, LinkConfig
from harness.planning.devices import memory_bandwidth
from harness.simulate import links
from harness.simulate.cost import CostModel


def optimizer_bytes_touched(c: Config) -> int:
    """Bytes the optimizer step reads and writes per parameter: the gradient, the fp32 copy it
    steps (master or parameter) read and written, AdamW's two moments read and written (SGD's
    momentum buffer), and in low precision the parameter written back."""
    pb = DTYPE_BYTES[c.dtype]
    if c.optimizer.name == "adamw":
        state = 16
    else:
        state = 8 if getattr(c.optimizer, "momentum", 0.0) > 0 else 0
    return pb + 8 + state + (pb if c.dtype != "fp32" else 0)  # low precision: fp32 masters


def price(c: Config, modeled: CostModel, owner: tuple[int, ...], stage_params: list[int],
          message_bytes: int) -> CostModel:
    """The CostModel of a plan: `modeled` (per-stage F, B at B, what compute=emulated holds),
    `owner` ([stage] pipeline rank), each stage's parameters and one message's bytes."""
    S, world, cl = len(owner), c.pp * c.dp, c.cluster
    real = c.compute != "emulated"
    fwd, bwd = list(modeled.fwd_s), list(modeled.bwd_s)
    if real and cl is not None and cl.overhead.real_fwd_scale:  # a real run's actions against the profile's
        kf, kb = links.overhead(cl, "real_fwd_scale", world), links.overhead(cl, "real_bwd_scale", world)
        fwd, bwd = [kf * f for f in fwd], [kb * b for b in bwd]
    rec = fwd if (real and c.checkpointing) else [0.0] * S
    w = c.cost.weight_grad_share
    pb = DTYPE_BYTES[c.dtype]
    grads = [pb * p for p in stage_params]
    priced = CostModel(fwd_s=tuple(fwd), bwd_s=tuple(b + r for b, r in zip(bwd, rec)),
                       input_grad_s=tuple((1 - w) * b + r for b, r in zip(bwd, rec)),
                       weight_grad_s=tuple(w * b for b in bwd))
    if cl is None:
        link = LinkConfig(latency_s=c.comm.latency_s, bandwidth_Bps=c.comm.bandwidth_Bps)
        sync = tuple(links.ring_allreduce_s(c.dp, g, link) for g in grads) if c.dp > 1 else ()
        return replace(priced, p2p_latency_s=link.latency_s, p2p_bandwidth_Bps=link.bandwidth_Bps,
                       message_bytes=(message_bytes,) * S, sync_s=sync)
    gpus = [links.replicas(c.placement, r, c.pp, c.dp) for r in range(c.pp)]
    fwd_hop, bwd_hop = [0.0] * S, [0.0] * S
    for s in range(S - 1):
        r, q = owner[s], owner[s + 1]
        if r != q:
            same = not links.crosses(cl, c.placement, r, q, c.pp, c.dp)
            fwd_hop[s] = bwd_hop[s + 1] = links.p2p_s(cl, message_bytes, same, world)
    skew = links.overhead(cl, "allreduce_s", world)
    sync = tuple(links.allreduce_s(cl, grads[s], gpus[owner[s]]) + skew for s in range(S)) if c.dp > 1 else ()
    touched, bandwidth = optimizer_bytes_touched(c), memory_bandwidth(cl)
    opt = [0.0] * c.pp
    for s in range(S):
        r = owner[s]
        opt[r] += stage_params[s] * touched / bandwidth
        if c.zero and c.dp > 1:
            opt[r] += links.allgather_s(cl, grads[s], gpus[r])
    return replace(priced, message_bytes=(message_bytes,) * S, fwd_hop_s=tuple(fwd_hop), bwd_hop_s=tuple(bwd_hop),
                   sync_s=sync, action_overhead_s=0.0 if real else links.overhead(cl, "action_s", world),
                   send_s=links.overhead(cl, "send_s", world), recv_s=links.overhead(cl, "recv_s", world),
                   optimizer_s=tuple(opt), step_overhead_s=links.overhead(cl, "step_s", world))


def dp_sync_theory_s(cost: CostModel, owner: tuple[int, ...], pp: int) -> float | None:
    """The longest per-rank total of gradient syncs a step waits for (what a run's measured
    dp_sync_s is held against); None without data parallelism."""
    if not cost.sync_s:
        return None
    per_rank = [0.0] * pp
    for s, t in enumerate(cost.sync_s):
        per_rank[owner[s]] += t
    return max(per_rank)


def tp_collectives_s(tp: int, hidden: int, seq: int, microbatch_size: int, dtype_bytes: int, link: LinkConfig,
                     sequence_parallel: bool = False) -> float:
    """Megatron's TP collectives of one decoder block in one direction (forward, or backward)
    on one microbatch, over the link the TP group spans (within a node: the cluster's intra):
    2 ring all-reduces of the activation (B x seq x hidden, in dtype: after the attention's and
    the MLP's row-parallel linears forward, before their column-parallel ones backward), or with
    sequence parallelism (Korthikanti et al. 2022) 2 all-gathers + 2 reduce-scatters of it, the
    same bytes over the link in twice the steps. Not overlapped with compute. A pure function:
    wiring it into the plan's costs waits on the `tp` config key (issue 36)."""
    if tp <= 1:
        return 0.0
    nbytes = microbatch_size * seq * hidden * dtype_bytes
    if not sequence_parallel:
        return 2 * links.ring_allreduce_s(tp, nbytes, link)
    half = (tp - 1) * link.latency_s + (tp - 1) / tp * nbytes / link.bandwidth_Bps  # an all-gather or a reduce-scatter
    return 4 * half
