"""`python -m tools.sc21` (`make sc21`): SC21 Megatron-LM's Table 1 reproduced by the simulator.

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC21, arXiv:2104.04473), Table 1: GPT models on DGX A100 80GB nodes, vocabulary
51,200, sequence 2048, mixed precision, full activation recomputation, microbatch 1, TP=8 and PP
between nodes. Every pipeline-parallel row (the shapes, degrees, GPUs, batch and TFLOP/s per GPU
as the paper prints them) is run as

    python -m harness executor=sim cluster=dgx_a100_80gb cluster.nodes=<GPUs/8> model=gpt
        model.layers=<l> model.hidden=<h> model.heads=<a> model.seq=2048 model.vocab=51200 dtype=bf16
        optimizer=adamw tp=8 pp=<p> dp=<GPUs/(8p)> microbatch_size=1 microbatches=<batch/dp>
        checkpointing=true schedule=interleaved_1f1b virtual_stages=<v> partition=explicit ...
        profile=<the row's derived one-block profile>

and its step converted to TFLOP/s per GPU with the paper's own count (its equation 3, recompute
included: 96 B s l h^2 (1 + s/6h + V/16lh) per step), printed beside the published figure.

What is priced, and from where (nothing per row):
- compute: one block, the embedding and the head per TP rank (tp=8: GEMM m, n, k split as
  Megatron splits them), priced per operation by harness/planning/compute_model.py fitted on the
  measured H200 GPT-2 profile (data/gpt2_h200_profile.json: its launch floors and residual per
  byte) with the A100's rates (harness/planning/devices.py: GEMM roof at FlashAttention-2's 73%
  of 312 TFLOP/s, FlashAttention-2's attention rates, memory-bound work at 80% of 2,039 GB/s).
  That fit is the one calibration, and it is the H200's, not one made for this table;
- TP collectives, pipeline hops, the data-parallel gradient all-reduce and the optimizer step:
  harness/simulate/pricing.py on the dgx_a100_80gb preset's links (NVLink 3 inside a node, one
  HDR 200 Gb/s NIC per GPU between nodes);
- the schedule: Megatron's interleaved 1F1B with `V_RULE`'s chunks per rank (the paper does not
  print them); the embedding on the first stage and the head on the last (partition=explicit),
  as Megatron places them;
- Megatron-LM's software of 2021: attention unfused (op_costs.unfused_attention: SC21 predates
  FlashAttention), the data-parallel all-reduce after the pipeline flush (dp_sync=after_flush:
  its finalize_model_grads), full recompute priced as a real run's (compute=real).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.planning.compute_model import ComputeModel

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "data" / "gpt2_h200_profile.json"
VOCAB, SEQ, TP, GPUS_PER_NODE = 51_200, 2048, 8, 8
DEVICE = "NVIDIA A100-SXM4-80GB"
TOLERANCE = 0.15  # the goal: every row within 15% of the published TFLOP/s


@dataclass(frozen=True)
class Row:
    """One row of SC21 Table 1 as printed (arXiv:2104.04473v5, Table 1)."""
    name: str
    layers: int
    hidden: int
    heads: int
    pp: int
    gpus: int
    batch: int
    published_tflops: float  # per GPU, the paper's count (its equation 3: recompute included)

    @property
    def dp(self) -> int:
        return self.gpus // (TP * self.pp)

    @property
    def microbatches(self) -> int:
        return self.batch // self.dp

    @property
    def virtual_stages(self) -> int:
        return V_RULE(self.layers // self.pp)


def chunks_of_two_or_more_blocks(blocks_per_rank: int) -> int:
    """Chunks per pipeline rank: the most that keep every chunk at 2 blocks or more and divide the
    rank's blocks evenly (Megatron's --num-layers-per-virtual-pipeline-stage must divide them);
    1 where the rank holds fewer than 4 blocks. One rule for every row."""
    return max((v for v in range(1, blocks_per_rank // 2 + 1) if blocks_per_rank % v == 0
                and blocks_per_rank // v >= 2), default=1)


V_RULE = chunks_of_two_or_more_blocks

ROWS = (
    Row("39.1B", 48, 8192, 64, 2, 512, 1536, 138.0),
    Row("76.1B", 60, 10240, 80, 4, 1024, 1792, 140.0),
    Row("145.6B", 80, 12288, 96, 8, 1536, 2304, 148.0),
    Row("310.1B", 96, 16384, 128, 16, 1920, 2160, 155.0),
    Row("529.6B", 105, 20480, 128, 35, 2520, 2520, 163.0),
    Row("1008B", 128, 25600, 160, 64, 3072, 3072, 163.0),
)


def paper_flops(r: Row) -> float:
    """FLOPs per step as the paper counts them (equation 3, recompute's forward included)."""
    b, s, l, h = r.batch, SEQ, r.layers, r.hidden  # noqa: E741
    return 96 * b * s * l * h ** 2 * (1 + s / (6 * h) + VOCAB / (16 * l * h))


def compute_model(device: str = DEVICE, sustained: float | None = None) -> ComputeModel:
    """The one calibration: the compute model fitted on the measured H200 GPT-2 profile, its
    rates moved to `device` (compute_model.ComputeModel.on_device; tools/llama3.py: the H100).
    `sustained`: one GEMM share for both instead of devices.py's (tools/llama3.py --sustained)."""
    from harness.config import DTYPE_BYTES
    from harness.planning.compute_model import fit
    from harness.planning.devices import lookup

    measured = json.loads(SOURCE.read_text())
    h200 = fit(measured, lookup(measured["device"]), "bf16", DTYPE_BYTES["bf16"], str(SOURCE.relative_to(ROOT)),
               sustained=sustained)
    return h200.on_device(lookup(device), sustained)


def profile_of(r: Row, cm: ComputeModel) -> dict:
    """A one-block profile (embedding, one block, head) of the row's GPT at tp=8, microbatch 1,
    DERIVED by `cm` per operation: what python -m harness expands by kind to the row's layers."""
    from harness.advise.derive import derive_layers
    from harness.config import DTYPE_BYTES, model_config
    from harness.model import get_model
    from harness.planning.compute_model import Dims

    cfg = model_config(name="gpt", layers=r.layers, hidden=r.hidden, heads=r.heads, seq=SEQ, vocab=VOCAB)
    m = get_model(cfg)
    dims = Dims(seq=SEQ, d_model=r.hidden, vocab=VOCAB, dtype_bytes=DTYPE_BYTES["bf16"], heads=r.heads, tp=TP,
                flash_attention=False)  # SC21 predates FlashAttention: Megatron's unfused attention
    layers, _ = derive_layers(cm, m, dims, (1,))
    return {"device": f"{cm.device.name} (DERIVED, not measured)", "dtype": "torch.bfloat16", "derived": True,
            "model": {"num_layers": m.num_layers, "vocab": VOCAB, "seq": SEQ, "d_model": r.hidden,
                      "heads": r.heads, "blocks": r.layers, "tp": TP},
            "derivation": {"method": "tools/sc21.py: compute_model fitted on " + str(SOURCE.relative_to(ROOT))
                           + f", rates of {cm.device.name}, per TP rank at tp={TP}",
                           "compute_model": cm.to_json()},
            "layers": layers}


def overrides(r: Row, profile: str) -> list[str]:
    """The row as harness keys: the published configuration, nothing fitted."""
    v = r.virtual_stages
    per_chunk = r.layers // (r.pp * v)
    stages = [per_chunk] * (r.pp * v)
    stages[0] += 1  # the embedding with the first chunk, the head with the last (Megatron's placement)
    stages[-1] += 1
    return ["executor=sim", "cluster=dgx_a100_80gb", f"cluster.nodes={r.gpus // GPUS_PER_NODE}", "model=gpt",
            f"model.layers={r.layers}", f"model.hidden={r.hidden}", f"model.heads={r.heads}", f"model.seq={SEQ}",
            f"model.vocab={VOCAB}", "dtype=bf16", "optimizer=adamw", "compute=real", f"tp={TP}", f"pp={r.pp}", f"dp={r.dp}",
            "microbatch_size=1", f"microbatches={r.microbatches}", "checkpointing=true", "dp_sync=after_flush",
            "schedule=interleaved_1f1b", f"virtual_stages={v}", "partition=explicit",
            f"partition.layers_per_stage=[{','.join(map(str, stages))}]", f"profile={profile}"]


@dataclass(frozen=True)
class Reproduced:
    row: Row
    step_s: float
    tflops: float  # per GPU, the paper's count over the simulated step
    harness_hfu_tflops: float  # per GPU, the harness's own hardware count (metrics.flops)
    parts: dict  # what the step is made of, per rank on average: compute, TP collectives, the rest (seconds)
    command: str

    @property
    def ratio(self) -> float:
        return self.tflops / self.row.published_tflops


def reproduce(r: Row, cm: ComputeModel, workdir: Path) -> Reproduced:
    """The row's plan as python -m harness makes it (compose_config, make_plan), its simulated
    step and what that step is made of."""
    from harness.frontend.compose import compose_config
    from harness.planning.flops import flops_of
    from harness.planning.plan import make_plan
    from harness.simulate.pricing import plan_tp_collectives

    path = workdir / f"sc21_{r.name}.json"
    path.write_text(json.dumps(profile_of(r, cm)))
    keys = overrides(r, str(path))
    plan = make_plan(compose_config([*keys, "wandb.mode=disabled"]))
    cost = plan.sim_cost()
    step = plan.modeled_step_s()
    m, stages = r.microbatches, len(plan.stage_layers)
    tp_s = plan_tp_collectives(plan.config, plan.model, list(plan.stage_layers))
    per_rank = stages // r.pp
    tp_total = m * per_rank * (sum(f for f, _ in tp_s) * 2 + sum(b for _, b in tp_s)) / stages  # F, recompute, B
    busy = m * per_rank * (sum(cost.fwd_s) + sum(cost.bwd_s)) / stages
    after = max(cost.optimizer_s or (0.0,))  # dp_sync=after_flush: the rank's all-reduces, then its optimizer step
    parts = {"compute": busy - tp_total, "tp_collectives": tp_total,
             "pipeline_bubble_and_hops": step - busy - after, "dp_allreduce_and_optimizer": after}
    hfu = flops_of(plan, step).hardware_tflops_per_device
    return Reproduced(r, step, paper_flops(r) / step / r.gpus / 1e12, hfu, parts,
                      "python -m harness " + " ".join(f"'{k}'" if "[" in k else k for k in keys))


def table(results: list[Reproduced]) -> str:
    lines = ["| model | TP x PP x DP (GPUs) | batch, M, v | simulated step | predicted TFLOP/s/GPU | published | ratio "
             "| TP comm | bubble + hops | dp all-reduce + optimizer |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in results:
        r, p = x.row, x.parts
        lines.append(f"| {r.name} | {TP} x {r.pp} x {r.dp} ({r.gpus}) | {r.batch}, {r.microbatches}, "
                     f"{r.virtual_stages} | {x.step_s:.2f} s | {x.tflops:.1f} | {r.published_tflops:.0f} | "
                     f"{x.ratio:.2f} | {p['tp_collectives'] / x.step_s:.1%} | "
                     f"{p['pipeline_bubble_and_hops'] / x.step_s:.1%} | {p['dp_allreduce_and_optimizer'] / x.step_s:.1%} |")
    return "\n".join(lines)


def verdict(ratios: list[tuple[str, float]]) -> str:
    """The closing line: how many rows (name, predicted / published) are within TOLERANCE."""
    missed = [name for name, ratio in ratios if abs(ratio - 1) > TOLERANCE]
    return (f"\n{len(ratios) - len(missed)} of {len(ratios)} rows within {TOLERANCE:.0%} of the published TFLOP/s"
            + (f"; missed: {', '.join(missed)}" if missed else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.sc21", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", default=None, help="only these rows (e.g. 39.1B 1008B)")
    ap.add_argument("--commands", metavar="DIR", type=Path, default=None,
                    help="write each row's derived profile into DIR and print its python -m harness command")
    args = ap.parse_args(argv)
    rows = [r for r in ROWS if args.rows is None or r.name in args.rows]
    if not rows:
        print(f"tools.sc21: --rows {' '.join(args.rows)}: no such row (allowed: {', '.join(r.name for r in ROWS)})",
              file=sys.stderr)
        return 2
    cm = compute_model()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.commands if args.commands is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        results = [reproduce(r, cm, where) for r in rows]
    print(table(results))
    if args.commands is not None:
        for x in results:
            print(f"\n{x.row.name}: {x.command}")
    print(verdict([(x.row.name, x.ratio) for x in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
