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
- tensor parallelism (tp > 1): each stage's TP collectives per microbatch and direction
  (`tp_stage_collectives`: Megatron's, per layer kind), over the link the TP group spans
  (`tp_link`: comm.* without a cluster; a cluster's intra-node link when tp <= its GPUs per
  node, else its inter-node one), added to the stage's F, B and I (W has none; a recompute's
  forward has its forward's). The compute itself is the modeled one: a TP rank's (cost.*, or a
  profile derived at the run's tp, harness/planning/op_costs.py's split GEMMs);
- data parallelism (dp > 1): each stage's gradients (in dtype) ring all-reduced inside its last
  backward, over comm.* or the links its replicas span (plus the measured skew on cluster=here);
  with dp_sync=after_flush (Megatron-LM's finalize_model_grads) after the rank's last action
  instead, before its optimizer step, so no stage's gradient waits for it;
- with a cluster: the optimizer step per rank (memory-bound: parameters x bytes read and
  written / memory bandwidth) and, with ZeRO-1, the all-gather of the updated shards; the
  executor's measured overheads (per emulated action, posting a send, taking a receive, per step).
"""

from __future__ import annotations

import functools
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
          message_bytes: int, tp_s: tuple[tuple[float, float], ...] = ()) -> CostModel:
    """The CostModel of a plan: `modeled` (per-stage F, B at B, what compute=emulated holds),
    `owner` ([stage] pipeline rank), each stage's parameters (a TP rank's share) and one
    message's bytes (a TP rank's); `tp_s`: [stage] (forward, backward) TP collective seconds
    per microbatch (`tp_stage_collectives`; () at tp=1)."""
    S, world, cl = len(owner), c.pp * c.dp * c.tp, c.cluster
    real = c.compute != "emulated"
    fwd, bwd = list(modeled.fwd_s), list(modeled.bwd_s)
    if real and cl is not None and cl.overhead.real_fwd_scale:  # a real run's actions against the profile's
        kf, kb = links.overhead(cl, "real_fwd_scale", world), links.overhead(cl, "real_bwd_scale", world)
        fwd, bwd = [kf * f for f in fwd], [kb * b for b in bwd]
    tp_f, tp_b = ([f for f, _ in tp_s], [b for _, b in tp_s]) if tp_s else ([0.0] * S, [0.0] * S)
    fwd = [f + t for f, t in zip(fwd, tp_f)]  # the collectives block the stage's compute (not overlapped)
    rec = fwd if (real and c.checkpointing) else [0.0] * S  # a recompute runs the forward's collectives again
    w = c.cost.weight_grad_share
    pb = DTYPE_BYTES[c.dtype]
    grads = [pb * p for p in stage_params]
    priced = CostModel(fwd_s=tuple(fwd), bwd_s=tuple(b + t + r for b, t, r in zip(bwd, tp_b, rec)),
                       input_grad_s=tuple((1 - w) * b + t + r for b, t, r in zip(bwd, tp_b, rec)),
                       weight_grad_s=tuple(w * b for b in bwd))
    if cl is None:
        link = LinkConfig(latency_s=c.comm.latency_s, bandwidth_Bps=c.comm.bandwidth_Bps)
        sync = tuple(links.ring_allreduce_s(c.dp, g, link) for g in grads) if c.dp > 1 else ()
        after = [0.0] * c.pp
        if c.dp_sync == "after_flush":  # Megatron-LM's: after the rank's last action, before its optimizer
            for s, t in enumerate(sync):
                after[owner[s]] += t
            sync = ()
        return replace(priced, p2p_latency_s=link.latency_s, p2p_bandwidth_Bps=link.bandwidth_Bps,
                       message_bytes=(message_bytes,) * S, sync_s=sync,
                       optimizer_s=tuple(after) if any(after) else ())
    gpus = [links.replicas(c.placement, r, c.pp, c.dp, c.tp) for r in range(c.pp)]
    fwd_hop, bwd_hop = [0.0] * S, [0.0] * S
    for s in range(S - 1):
        r, q = owner[s], owner[s + 1]
        if r != q:
            same = not links.crosses(cl, c.placement, r, q, c.pp, c.dp, c.tp)
            fwd_hop[s] = bwd_hop[s + 1] = links.p2p_s(cl, message_bytes, same, world)
    skew = links.overhead(cl, "allreduce_s", world)
    sync = tuple(links.allreduce_s(cl, grads[s], gpus[owner[s]]) + skew for s in range(S)) if c.dp > 1 else ()
    touched, bandwidth = optimizer_bytes_touched(c), memory_bandwidth(cl)
    opt = [0.0] * c.pp
    for s in range(S):
        r = owner[s]
        opt[r] += stage_params[s] * touched / bandwidth
        if sync and c.dp_sync == "after_flush":  # Megatron-LM's finalize_model_grads: after the rank's schedule
            opt[r] += sync[s]
        if c.zero and c.dp > 1:
            opt[r] += links.allgather_s(cl, grads[s], gpus[r])
    if c.dp_sync == "after_flush":
        sync = ()
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


def tp_link(c: Config) -> LinkConfig:
    """The link a TP group's collectives run on: comm.* without a cluster; with one, its
    all-reduce (else point-to-point) figures inside a node when the group fits in one (tp <=
    gpus_per_node: the launchers keep a TP group on consecutive GPUs), else between nodes."""
    cl = c.cluster
    if cl is None:
        return LinkConfig(latency_s=c.comm.latency_s, bandwidth_Bps=c.comm.bandwidth_Bps)
    if c.tp <= cl.gpus_per_node:
        return cl.allreduce_intra or cl.intra
    return cl.allreduce_inter or cl.inter


def collective_s(op: str, n: int, nbytes: float, link: LinkConfig) -> float:
    """One ring collective over n members of the whole tensor's `nbytes`: all_reduce 2 (n-1)
    steps, all_gather and reduce_scatter (n-1) steps, each step a latency and 1/n of the bytes."""
    if n <= 1:
        return 0.0
    steps = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}[op] * (n - 1)
    return steps * (link.latency_s + nbytes / n / link.bandwidth_Bps)


def tp_collectives_s(tp: int, hidden: int, seq: int, microbatch_size: int, dtype_bytes: int, link: LinkConfig,
                     sequence_parallel: bool = False) -> float:
    """Megatron's TP collectives of one decoder block in one direction (forward, or backward)
    on one microbatch, over the link the TP group spans (`tp_link`): 2 ring all-reduces of the
    activation (B x seq x hidden, in dtype: after the attention's and the MLP's row-parallel
    linears forward, before their column-parallel ones backward), or with sequence parallelism
    (Korthikanti et al. 2022) 2 all-gathers + 2 reduce-scatters of it, the same bytes over the
    link in twice the steps. Not overlapped with compute."""
    return block_collectives_s(tp, microbatch_size * seq * hidden * dtype_bytes, link, sequence_parallel)


def block_collectives_s(tp: int, act_bytes: float, link: LinkConfig, sequence_parallel: bool) -> float:
    if not sequence_parallel:
        return 2 * collective_s("all_reduce", tp, act_bytes, link)
    return 2 * (collective_s("all_gather", tp, act_bytes, link) + collective_s("reduce_scatter", tp, act_bytes, link))


def layer_collectives_s(kind: str, position: int, stage_len: int, tp: int, act_bytes: float, logits_bytes: float,
                        link: LinkConfig, sequence_parallel: bool) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's TP collectives on one microbatch, as the
    models' tp_plan places them (harness/model/gpt.py, mlp.py; a Megatron f / g pair: an
    all-reduce forward is the identity backward, and the reverse):
    - block: the attention's and the MLP's, `block_collectives_s` each way;
    - embed (vocabulary-parallel): its all-reduce (reduce-scatter under sequence parallelism)
      forward; nothing backward (an all-gather under sequence parallelism);
    - head (vocabulary-parallel, its logits all-gathered for the loss): the logits' all-gather
      forward (and the input's all-gather under sequence parallelism); the input gradient's
      all-reduce (reduce-scatter) backward;
    - linear (model=mlp, column / row pairs from the stage's first layer): a row-parallel layer
      all-reduces forward, a column-parallel one backward; a stage's trailing column-parallel
      layer all-gathers its output forward and all-reduces backward;
    - other kinds: none known (0)."""
    ar, ag, rs = (functools.partial(collective_s, op, tp, link=link)
                  for op in ("all_reduce", "all_gather", "reduce_scatter"))
    sp = sequence_parallel
    if kind == "block":
        each = block_collectives_s(tp, act_bytes, link, sp)
        return each, each
    if kind == "embed":
        return (rs(act_bytes), ag(act_bytes)) if sp else (ar(act_bytes), 0.0)
    if kind == "head":
        return (ag(logits_bytes) + (ag(act_bytes) if sp else 0.0), rs(act_bytes) if sp else ar(act_bytes))
    if kind == "linear":
        if position % 2:
            return ar(act_bytes), 0.0
        return (ag(act_bytes) if position + 1 == stage_len else 0.0), ar(act_bytes)
    return 0.0, 0.0


def tp_stage_collectives(c: Config, kinds: tuple[str, ...], bounds: list[tuple[int, int]], act_bytes: float,
                         logits_bytes: float) -> tuple[tuple[float, float], ...]:
    """[stage] (forward, backward) TP collective seconds per microbatch: its layers'
    `layer_collectives_s` on `tp_link(c)`; () at tp=1. `act_bytes`: the whole activation of
    one microbatch (B x seq x hidden) in dtype; `logits_bytes`: the whole logits'."""
    if c.tp <= 1:
        return ()
    link = tp_link(c)
    out = []
    for a, b in bounds:
        per = [layer_collectives_s(kinds[i], i - a, b - a, c.tp, act_bytes, logits_bytes, link, c.sequence_parallel)
               for i in range(a, b)]
        out.append((sum(f for f, _ in per), sum(x for _, x in per)))
    return tuple(out)


def plan_tp_collectives(c: Config, model: object, bounds: list[tuple[int, int]]) -> tuple[tuple[float, float], ...]:
    """`tp_stage_collectives` of a built model (harness/model/built.py's BuiltModel): its
    layer kinds, its activation (activation_numel) and its logits (B x seq x cfg.vocab) in dtype."""
    if c.tp <= 1:
        return ()
    pb, b = DTYPE_BYTES[c.dtype], c.microbatch_size
    cfg = getattr(model.model, "cfg", None)
    seq, vocab = getattr(cfg, "seq", None), getattr(cfg, "vocab", None)
    logits = b * seq * vocab * pb if seq and vocab else 0
    return tp_stage_collectives(c, model.kinds, bounds, pb * model.activation_numel(b), logits)


def message_bytes_of(c: Config, model: object) -> int:
    """One inter-stage message of one TP rank: the activation in dtype, its sequence shard
    (1/tp) under sequence parallelism (harness/parallel/tensor.py's activation_shape)."""
    whole = DTYPE_BYTES[c.dtype] * model.activation_numel(c.microbatch_size)
    return whole // c.tp if c.sequence_parallel and c.tp > 1 else whole
