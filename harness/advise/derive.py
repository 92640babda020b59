"""`python -m harness.advise.derive --out data/llama70b_h200_derived_block_profile.json`: a
one-block profile (embedding, ONE decoder block, LM head) of a 70B-class Llama in bf16 on an
NVIDIA H200, DERIVED, not measured: no GPU ran it.

How each time is derived from data/gpt2_h200_profile.json (GPT-2 small, measured on an H200 in
bf16) and the 70B layer's analytic FLOPs (harness.model.hf.HFModel.fwd_flops, the same
formula the profiler writes):
- decoder block: GPT-2's blocks' achieved rate at its largest measured microbatch (B=8, 8192
  tokens, the closest to a 70B microbatch's 4096+), median over its 12 blocks, forward FLOPs /
  forward seconds and 2 x forward FLOPs / backward seconds, applied to the 70B block's FLOPs at
  each B. A 70B block's matmuls (8192 x 28672) are larger than GPT-2's (768 x 3072) and usually
  run nearer the tensor cores' peak, so these times are conservative (slower than likely);
- LM head: its matmul at the block rate, plus the loss (fp32 log-softmax over the vocabulary,
  memory-bound) at GPT-2's head's measured seconds per logit beyond its own matmul;
- embedding: memory-bound: the forward scaled by output bytes (B x T x d), the backward by the
  table's bytes (vocab x d, the gradient it writes) from GPT-2's embedding at B=8.
Times are linear in B (no fixed part: a 70B layer at B >= 1 is compute-bound). Parameter counts
are the model's own (meta device). The JSON says all of this in its "derivation" and marks every
layer "measured": false, "derived": true.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from harness.config import model_config

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "data" / "gpt2_h200_profile.json"
LLAMA_70B = dict(name="hf", arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256,
                 seq=4096)  # Llama-2/3-70B's shape (Touvron et al. 2023, Table 1; Meta's Llama 3 70B config)
SIZES = (1, 2, 4, 8)


def derive(source: Path = SOURCE, sizes: tuple[int, ...] = SIZES, model: dict | None = None) -> dict:
    from harness.model import get_model

    gpt2 = json.loads(source.read_text())
    cfg = model_config(**(model or LLAMA_70B))
    m = get_model(cfg)
    L = m.num_layers
    ref_b = str(max(int(b) for b in gpt2["layers"][1]["by_microbatch"]))
    blocks = [lay["by_microbatch"][ref_b] for lay in gpt2["layers"] if lay["kind"] == "block"]
    rate_f = statistics.median(x["fwd_flops"] / x["fwd_s"] for x in blocks)
    rate_b = statistics.median(2 * x["fwd_flops"] / x["bwd_s"] for x in blocks)
    g = gpt2["model"]
    head = gpt2["layers"][-1]["by_microbatch"][ref_b]
    logits_ref = int(ref_b) * g["seq"] * g["vocab"]
    loss_f = max(0.0, head["fwd_s"] - head["fwd_flops"] / rate_f) / logits_ref  # s per logit
    loss_b = max(0.0, head["bwd_s"] - 2 * head["fwd_flops"] / rate_b) / logits_ref
    emb = gpt2["layers"][0]["by_microbatch"][ref_b]
    out_ref = int(ref_b) * g["seq"] * g["d_model"]
    table_ref = g["vocab"] * g["d_model"]
    with torch.device("meta"):
        params = {i: sum(p.numel() for p in m.build_layer(i).parameters()) for i in (0, 1, L - 1)}
    layers = []
    for idx, (i, kind) in enumerate(((0, "embed"), (1, "block"), (L - 1, "head"))):
        by = {}
        for b in sizes:
            flops = m.fwd_flops(i, b)
            if kind == "block":
                f, bw = flops / rate_f, 2 * flops / rate_b
            elif kind == "head":
                logits = b * cfg.seq * cfg.vocab
                f, bw = flops / rate_f + logits * loss_f, 2 * flops / rate_b + logits * loss_b
            else:
                f = emb["fwd_s"] * b * cfg.seq * cfg.hidden / out_ref
                bw = emb["bwd_s"] * cfg.vocab * cfg.hidden / table_ref
            by[str(b)] = {"fwd_s": f, "bwd_s": bw, "fwd_flops": float(flops)}
        layers.append({"index": idx, "kind": kind, "params": params[i], "measured": False, "derived": True,
                       "by_microbatch": by})
    return {
        "device": "NVIDIA H200 (DERIVED, not measured: no GPU ran this profile)",
        "torch": None,
        "dtype": "torch.bfloat16",
        "derived": True,
        "model": {"config": {k: v for k, v in vars(cfg).items() if k in LLAMA_70B}, "num_layers": L,
                  "vocab": cfg.vocab, "seq": cfg.seq, "d_model": cfg.hidden, "heads": cfg.heads, "blocks": cfg.layers},
        "derivation": {
            "source": str(source.relative_to(ROOT)) if source.is_relative_to(ROOT) else str(source),
            "reference_microbatch_size": int(ref_b),
            "block_forward_flops_per_s": rate_f,
            "block_backward_flops_per_s": rate_b,
            "head_loss_forward_s_per_logit": loss_f,
            "head_loss_backward_s_per_logit": loss_b,
            "method": ("block: GPT-2 small's measured H200 bf16 blocks' median achieved FLOP rate at B=8 (forward "
                       "FLOPs / forward s; 2 x forward FLOPs / backward s) applied to the 70B block's analytic FLOPs "
                       "(HFModel.fwd_flops); head: its matmul at that rate plus the loss at GPT-2's head's measured "
                       "seconds per logit beyond its matmul; embedding: GPT-2's scaled by output bytes (forward) and "
                       "table bytes (backward). Linear in B. Conservative: a 70B block's larger matmuls usually run "
                       "nearer peak than GPT-2's."),
            "one_block": "embedding, one decoder block, head: python -m harness.advise expands it by kind to the "
                         f"model's {L} layers",
        },
        "layers": layers,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.advise.derive", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "llama70b_h200_derived_block_profile.json")
    ap.add_argument("--source", type=Path, default=SOURCE)
    args = ap.parse_args(argv)
    prof = derive(args.source)
    args.out.write_text(json.dumps(prof, indent=1) + "\n")
    d = prof["derivation"]
    blk = prof["layers"][1]["by_microbatch"]["1"]
    print(f"harness.advise.derive: block rate {d['block_forward_flops_per_s'] / 1e12:.0f} TFLOP/s forward, "
          f"{d['block_backward_flops_per_s'] / 1e12:.0f} backward; a 70B block at B=1: F {blk['fwd_s'] * 1e3:.1f} ms, "
          f"B {blk['bwd_s'] * 1e3:.1f} ms (DERIVED); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
