"""`python -m tools.llama3` (`make llama3`): Llama 3 405B's pre-training rows reproduced by the
simulator, the Hopper twin of tools/sc21.py (A100).

"The Llama 3 Herd of Models" (Meta, arXiv:2407.21783), Table 4: Llama 3 405B pre-training in
BF16 on H100 80GB (700 W), sequence 8192, 16M tokens a batch. Its two rows without context
parallelism (the third, CP16 at sequence 131,072, is left out: context parallelism is not
modelled) are run as

    python -m harness executor=sim cluster=dgx_h100 cluster.nodes=<GPUs/8> model=hf model.arch=llama
        model.layers=126 model.hidden=16384 model.heads=128 model.kv_heads=8 model.ffn=53248
        model.vocab=128256 model.seq=8192 dtype=bf16 optimizer=adamw tp=8 sequence_parallel=true
        pp=16 dp=<GPUs/128> microbatch_size=1 microbatches=<batch per DP> checkpointing=false
        schedule=interleaved_1f1b virtual_stages=<v> partition=explicit zero=1 ...
        profile=<the derived profile of one TP rank>

and its step converted to TFLOP/s per GPU with the paper's MFU count (model FLOPs: 6 x
parameters x tokens + causal attention's whole s^2 term, 12 l s d a token; nothing
recomputed), printed beside the published figure.

The model: 126 layers, d 16,384, FFN 53,248, 128 heads, 8 KV heads, vocabulary 128,256 (the
paper's Table 3). What the paper does not fix, and is assumed here (one choice for both rows):
- microbatch 1 (one 8,192-token sequence): M = the table's batch per DP (32, 16);
- the interleaved schedule (section 3.3.2) with v = 8 chunks per rank of one layer slot each:
  126 blocks + embedding + head = 128 = 16 x 8 slots, the first chunk of the first rank holding
  only the embedding and the last chunk of the last rank only the head (the paper's "one
  Transformer layer fewer" on the first and last stages);
- no activation recompute (as we read section 3.3.2 on the 8K-sequence stage; the search corpus
  held no copy of the paper's text to check the wording against);
- tensor parallelism as Megatron-LM's with sequence parallelism (norms and adds on sequence
  shards, all-gather / reduce-scatter), the TP group inside one node (NVLink);
- FSDP (section 3.3.1: model, optimizer and gradients sharded, no reshard after the forward):
  priced as ZeRO-1 (zero=1: the optimizer state sharded, the gradients all-reduced and the
  parameters all-gathered once a step) with the gradient all-reduce after the pipeline flush
  (dp_sync=after_flush: each chunk's last backward comes at the flush in an interleaved
  schedule);
- attention: FlashAttention-2's rates on H100 (the FA3 paper's own FA2 bars,
  devices.FA2_ON_HOPPER): the 405B was pre-trained before FlashAttention-3 was released
  (July 2024); the kernel Meta ran is not named.

What is priced, and from where (nothing per row): the compute model fitted on the measured H200
GPT-2 profile (tools/sc21.compute_model) with the H100's rates (devices.py), one block,
embedding and head per TP rank; links from the dgx_h100 preset (NVLink 4 at 450 GB/s a
direction, one 400 Gb/s NIC per GPU: Meta's RoCE fabric is 400 Gb/s per GPU too).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tools.sc21 import compute_model as fitted_compute_model
from tools.sc21 import TOLERANCE, verdict  # the issue's goal, as SC21's

if TYPE_CHECKING:
    from harness.planning.compute_model import ComputeModel

DEVICE = "NVIDIA H100 80GB HBM3"
GPUS_PER_NODE, TP, PP, V, SEQ = 8, 8, 16, 8, 8192
MODEL = dict(name="hf", arch="llama", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256,
             seq=SEQ)  # Llama 3 405B (arXiv:2407.21783, Table 3)


@dataclass(frozen=True)
class Row:
    """One row of Llama 3's Table 4 as printed (BF16, H100 80GB at 700 W)."""
    gpus: int
    batch_per_dp: int
    published_tflops: float  # per GPU
    published_mfu: float

    @property
    def name(self) -> str:
        return f"{self.gpus}"

    @property
    def dp(self) -> int:
        return self.gpus // (TP * PP)


ROWS = (Row(8192, 32, 430.0, 0.43), Row(16384, 16, 400.0, 0.41))


def paper_flops(r: Row, params: int) -> float:
    """Model FLOPs a step as the MFU convention counts them: 6 N a token + 12 l s d a token
    (causal attention's whole s^2 term), N every parameter; nothing recomputed."""
    tokens = r.dp * r.batch_per_dp * SEQ
    return tokens * (6 * params + 12 * MODEL["layers"] * SEQ * MODEL["hidden"])


def compute_model(attention: str = "fa2", sustained: float | None = None, memory_share: float | None = None
                  ) -> ComputeModel:
    """The H200 GPT-2 fit with the H100's rates; attention at FlashAttention-2's rates on
    Hopper ("fa2", the assumption above) or FlashAttention-3's ("fa3", devices.py's H100 entry).
    `sustained` (the GEMM share) and `memory_share` replace devices.py's: the ablations."""
    from harness.planning.devices import FA2_ON_HOPPER, lookup

    cm = fitted_compute_model(DEVICE, sustained)
    device = lookup(DEVICE)
    if attention == "fa2":
        device = replace(device, attention=FA2_ON_HOPPER)
    if memory_share is not None:
        device = replace(device, memory_share=memory_share)
    return cm.on_device(device, sustained)


def profile_of(cm: ComputeModel) -> dict:
    """The one-block profile (embedding, one block, head) of one TP rank at tp=8 with sequence
    parallelism, microbatch 1, DERIVED by `cm` per operation."""
    from harness.advise.derive import derive_layers
    from harness.config import DTYPE_BYTES, model_config
    from harness.model import get_model
    from harness.planning.compute_model import Dims

    cfg = model_config(**MODEL)
    m = get_model(cfg)
    dims = Dims(seq=SEQ, d_model=cfg.hidden, vocab=cfg.vocab, dtype_bytes=DTYPE_BYTES["bf16"], heads=cfg.heads,
                kv_heads=cfg.kv_heads, ffn=cfg.ffn, gated=True, tp=TP, sequence_parallel=True)
    layers, _ = derive_layers(cm, m, dims, (1,))
    return {"device": f"{cm.device.name} (DERIVED, not measured)", "dtype": "torch.bfloat16", "derived": True,
            "model": {"config": {k: v for k, v in MODEL.items() if k != "name"}, "num_layers": m.num_layers,
                      "vocab": cfg.vocab, "seq": SEQ, "d_model": cfg.hidden, "heads": cfg.heads,
                      "blocks": cfg.layers, "tp": TP, "sequence_parallel": True},
            "derivation": {"method": "tools/llama3.py: tools/sc21.compute_model with the rates of "
                           f"{cm.device.name}, per TP rank at tp={TP} with sequence parallelism",
                           "compute_model": cm.to_json()},
            "layers": layers}


def stages(v: int = V) -> list[int]:
    """Layers per chunk: 128 slots (126 blocks, the embedding, the head) evenly over pp x v
    chunks; at v = 8 one slot each (the first is the embedding alone, the last the head alone)."""
    slots = MODEL["layers"] + 2
    assert slots % (PP * v) == 0, "Llama 3's layout: 126 blocks + embedding + head in equal chunks"
    return [slots // (PP * v)] * (PP * v)


def overrides(r: Row, profile: str, v: int = V, **extra: str) -> list[str]:
    """The row as harness keys: the published degrees and batch, the assumptions above."""
    keys = {"executor": "sim", "cluster": "dgx_h100", "cluster.nodes": str(r.gpus // GPUS_PER_NODE),
            **{f"model.{k}" if k != "name" else "model": str(x) for k, x in MODEL.items()},
            "dtype": "bf16", "optimizer": "adamw", "compute": "real", "tp": str(TP), "sequence_parallel": "true",
            "pp": str(PP), "dp": str(r.dp), "microbatch_size": "1", "microbatches": str(r.batch_per_dp),
            "checkpointing": "false", "zero": "1", "dp_sync": "after_flush", "schedule": "interleaved_1f1b",
            "virtual_stages": str(v), "partition": "explicit",
            "partition.layers_per_stage": f"[{','.join(map(str, stages(v)))}]", "profile": profile} | extra
    return [f"{k}={v}" for k, v in keys.items()]


@dataclass(frozen=True)
class Reproduced:
    row: Row
    step_s: float
    tflops: float  # per GPU, the MFU count over the simulated step
    harness_mfu: float  # the harness's own MFU (flops.py, Megatron/PaLM convention)
    parts: dict  # per rank on average: compute, TP collectives, bubble and hops, dp sync + optimizer (seconds)
    command: str
    peak_gib: float | None = None  # the memory theory's fullest GPU (reproduce(..., memory=True))

    @property
    def ratio(self) -> float:
        return self.tflops / self.row.published_tflops


def reproduce(r: Row, cm: ComputeModel, workdir: Path, v: int = V, memory: bool = False,
              **extra: str) -> Reproduced:
    """The row's plan as python -m harness makes it, its simulated step and what it is made of
    (`v` and `extra`, keys that replace the row's: the ablations). `memory`: also the memory
    theory's fullest GPU (a trace of the 405B's layers on fake tensors: ~20 s on 2 cores; the
    simulator prices time and does not refuse a plan that does not fit)."""
    from harness.frontend.compose import compose_config
    from harness.planning.flops import flops_of
    from harness.planning.plan import make_plan
    from harness.simulate.pricing import plan_tp_collectives

    path = workdir / "llama3_405b_tp8_sp.json"
    path.write_text(json.dumps(profile_of(cm)))
    keys = overrides(r, str(path), v, **extra)
    plan = make_plan(compose_config([*keys, "wandb.mode=disabled"]))
    cost = plan.sim_cost()
    step = plan.modeled_step_s()
    m, n = plan.config.microbatches, len(plan.stage_layers)
    per_rank = n // plan.config.pp
    tp_s = plan_tp_collectives(plan.config, plan.model, list(plan.stage_layers))
    recompute = 2 if plan.config.checkpointing else 1
    tp_total = m * per_rank * (sum(f for f, _ in tp_s) * recompute + sum(b for _, b in tp_s)) / n
    busy = m * per_rank * (sum(cost.fwd_s) + sum(cost.bwd_s)) / n
    after = max(cost.optimizer_s or (0.0,))
    parts = {"compute": busy - tp_total, "tp_collectives": tp_total,
             "pipeline_bubble_and_hops": step - busy - after, "dp_sync_and_optimizer": after}
    fl = flops_of(plan, step)
    peak = max(x.peak for x in plan.theory_per_rank()) / 2 ** 30 if memory else None
    return Reproduced(r, step, paper_flops(r, plan.model.total_params) / step / r.gpus / 1e12, fl.mfu or 0.0, parts,
                      "python -m harness " + " ".join(f"'{k}'" if "[" in k else k for k in keys), peak)


def table(results: list[Reproduced]) -> str:
    from harness.planning.devices import lookup

    peak = lookup(DEVICE).peak_bf16
    lines = ["| GPUs | TP x PP x DP | batch per DP (M), v | simulated step | predicted TFLOP/s/GPU (MFU) | published "
             "| ratio | TP comm | bubble + hops | dp sync + optimizer | memory theory, fullest GPU |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in results:
        r, p = x.row, x.parts
        lines.append(f"| {r.gpus:,} | {TP} x {PP} x {r.dp} | {r.batch_per_dp}, {V} | {x.step_s:.2f} s | "
                     f"{x.tflops:.0f} ({x.tflops * 1e12 / peak:.1%}) | {r.published_tflops:.0f} "
                     f"({r.published_mfu:.0%}) | {x.ratio:.2f} | {p['tp_collectives'] / x.step_s:.1%} | "
                     f"{p['pipeline_bubble_and_hops'] / x.step_s:.1%} | {p['dp_sync_and_optimizer'] / x.step_s:.1%} | "
                     + (f"{x.peak_gib:.0f} GiB |" if x.peak_gib is not None else "- |"))
    return "\n".join(lines)


def ablations(base: float | None) -> list[tuple[str, dict, int, dict]]:
    """(what changes, compute_model's arguments, v, harness keys): one part of the price moved at a
    time, from the GEMM share `base` (None: devices.py's)."""
    return [("as priced", {"sustained": base}, V, {}),
            ("attention at FlashAttention-3's rates", {"attention": "fa3", "sustained": base}, V, {}),
            ("memory-bound work at 40% of HBM bandwidth (was 80%)", {"sustained": base, "memory_share": 0.4}, V, {}),
            ("NVLink at 225 GB/s a direction (was 450)", {"sustained": base}, V,
             {"cluster.intra.bandwidth_Bps": "225e9"}),
            ("NIC at 25 GB/s (was 50)", {"sustained": base}, V, {"cluster.inter.bandwidth_Bps": "25e9"}),
            ("dp_sync=in_backward (was after_flush)", {"sustained": base}, V, {"dp_sync": "in_backward"}),
            ("v = 4 chunks per rank (was 8)", {"sustained": base}, 4, {}),
            ("full recompute (checkpointing=true; was none)", {"sustained": base}, V, {"checkpointing": "true"}),
            ("GEMMs at 60% of peak", {"sustained": 0.60}, V, {}),
            ("GEMMs at 75% of peak (FlashAttention-3's kernel)", {"sustained": 0.75}, V, {})]


def ablation_table(base: float | None, workdir: Path) -> str:
    lines = ["| what changes | " + " | ".join(f"{r.gpus:,} GPUs: TFLOP/s (ratio)" for r in ROWS) + " |",
             "| --- |" + " --- |" * len(ROWS)]
    for label, cm_args, v, keys in ablations(base):
        cm = compute_model(**cm_args)
        xs = [reproduce(r, cm, workdir, v, **keys) for r in ROWS]
        lines.append(f"| {label} | " + " | ".join(f"{x.tflops:.0f} ({x.ratio:.2f})" for x in xs) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.llama3", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commands", metavar="DIR", type=Path, default=None,
                    help="write the derived profile into DIR and print each row's python -m harness command")
    ap.add_argument("--sustained", type=float, default=None,
                    help="the GEMM share of peak for the H200 fit and the H100 (default devices.py's, calibrated "
                         "on the 8,192-GPU row; 0.75: FlashAttention-3's kernel, the price before the calibration)")
    ap.add_argument("--ablate", action="store_true", help="also move one part of the price at a time: a table")
    args = ap.parse_args(argv)
    if args.sustained is not None and not 0 < args.sustained <= 1:
        print(f"tools.llama3: --sustained {args.sustained}: a share of the peak (allowed: 0 < x <= 1)", file=sys.stderr)
        return 2
    cm = compute_model(sustained=args.sustained)
    with tempfile.TemporaryDirectory() as tmp:
        where = args.commands if args.commands is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        results = [reproduce(r, cm, where, memory=True) for r in ROWS]
        print(table(results))
        if args.ablate:
            print("\n" + ablation_table(args.sustained, where))
    if args.commands is not None:
        for x in results:
            print(f"\n{x.row.gpus} GPUs: {x.command}")
    print(verdict([(f"{x.row.name} GPUs", x.ratio) for x in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
