"""`python -m harness.advise.derive --out data/llama70b_h200_derived_block_profile.json`: a
one-block profile (embedding, ONE decoder block, LM head) of a 70B-class Llama in bf16 on an
NVIDIA H200, DERIVED, not measured: no GPU ran it. It is the FALLBACK: a one-block measurement
(`python -m harness.profile ... device=cuda --blocks 1`, what `make gpu-check` runs) replaces it.

Each time is the compute model's (harness/planning/compute_model.py) fitted on the measured GPT-2 small
H200 bf16 profile (data/gpt2_h200_profile.json), per layer kind and direction, priced per
operation (harness/planning/op_costs.py): seconds = max(floor, the layer's GEMMs on a roofline
by their m, n, k + causal attention at FlashAttention-3's published rates + memory-bound work
(norms, SwiGLU, rotary, residual adds, the loss) at a share of the bandwidth + bytes x a fitted
residual per byte), with the H200's rates from harness/planning/devices.py and the 70B layer's
shape (tp=1; `--tp N --sequence-parallel`: one TP rank's, written as
data/llama70b_h200_derived_block_profile_tpN.json for harness.advise --tp-profiles). The head's
loss over fp32 logits keeps GPT-2's measured residual per byte; what was a launch floor for GPT-2 stays one. The JSON's "derivation" holds the fit, its source, the
leave-one-out error on that source, the efficiency each layer kind is priced at and the
seconds per operation class (`operations`); every layer is marked "measured": false,
"derived": true.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from harness.planning.compute_model import DIRECTIONS, GATED, ComputeModel, Dims, fit, leave_one_out
from harness.config import DTYPE_BYTES, model_config
from harness.parallel.checks import tp_problem
from harness.planning.devices import lookup
from harness.runtime.precision import DTYPES
from harness.records.atomic import write_text
from harness.records.safe_io import read_bytes

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "data" / "gpt2_h200_profile.json"
LLAMA_70B = dict(name="hf", arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256,
                 seq=4096)  # Llama-2/3-70B's shape (Touvron et al. 2023, Table 1; Meta's Llama 3 70B config)
SIZES = (1, 2, 4, 8)
DTYPE = "bf16"


def _profile_json(path: Path, flag: str) -> dict:
    """A profile JSON: a regular file within safe_io's profile cap only (a FIFO or /dev/zero is
    refused unread); FileNotFoundError where there is none."""
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    return json.loads(read_bytes(path, flag, "profile"))


def derive_layers(cm: ComputeModel, m, dims: Dims, sizes: tuple[int, ...]) -> tuple[list[dict], dict]:
    """A one-block profile's layers (the embedding, one block, the head of model `m`), each
    microbatch size's forward and backward seconds derived by `cm` per operation on `dims` (with
    each operation class's seconds, `by_class`); and the priced work per (kind, size), for what a
    caller reports beside them."""
    last = m.num_layers - 1
    with torch.device("meta"):
        params = {i: sum(p.numel() for p in m.build_layer(i).parameters()) for i in (0, 1, last)}
    layers, work = [], {}
    for idx, (i, kind) in enumerate(((0, "embed"), (1, "block"), (last, "head"))):
        by = {}
        for b in sizes:
            flops = float(m.fwd_flops(i, b))
            ws = work[kind, b] = {d: cm.work(kind, d, b, flops, dims) for d in DIRECTIONS}
            by[str(b)] = {"fwd_s": cm.seconds(kind, "fwd", ws["fwd"]), "bwd_s": cm.seconds(kind, "bwd", ws["bwd"]),
                          "fwd_flops": flops, "by_class": {d: dict(ws[d].by_class) for d in DIRECTIONS}}
        layers.append({"index": idx, "kind": kind, "params": params[i], "measured": False, "derived": True,
                       "by_microbatch": by})
    return layers, work


def derive(source: Path = SOURCE, sizes: tuple[int, ...] = SIZES, model: dict | None = None,
           sustained: float | None = None, tp: int = 1, sequence_parallel: bool = False) -> dict:
    """The profile of one TP rank at `tp` (with or without sequence parallelism): its GEMMs split
    as Megatron splits them, attention over its heads, its memory-bound work on its shard
    (op_costs.py); `params` and `fwd_flops` stay the whole layer's, as a profile measured at
    tp=1 records them (the plan takes a TP rank's share, the FLOP counts are the model's). The
    profile says its tp in model.tp and model.sequence_parallel (what harness.advise
    --tp-profiles reads)."""
    from harness.model import get_model

    measured = _profile_json(source, "--source")
    device = lookup(measured["device"])
    if device is None:
        raise ValueError(f"{source}: device {measured['device']!r} is not in harness/planning/devices.py")
    nbytes = DTYPE_BYTES[DTYPE]
    shown = str(source.relative_to(ROOT)) if source.is_relative_to(ROOT) else str(source)
    cm = fit(measured, device, DTYPE, nbytes, shown, sustained=sustained)
    cfg = model_config(**(model or LLAMA_70B))
    m = get_model(cfg)
    L = m.num_layers
    dims = Dims(seq=cfg.seq, d_model=cfg.hidden, vocab=cfg.vocab, dtype_bytes=nbytes, heads=cfg.heads,
                kv_heads=getattr(cfg, "kv_heads", None), ffn=getattr(cfg, "ffn", None),
                gated=getattr(cfg, "arch", None) in GATED, tp=tp, sequence_parallel=sequence_parallel)
    layers, work = derive_layers(cm, m, dims, sizes)
    efficiency, operations = {}, {}
    for (kind, b), ws in work.items():
        efficiency.setdefault(kind, {})[str(b)] = {  # a TP rank's FLOPs over its seconds
            d: cm.efficiency(kind, d, replace(ws[d], flops=ws[d].flops / tp)) for d in DIRECTIONS}
        operations.setdefault(kind, {})[str(b)] = {
            d: dict(ws[d].by_class) | {"floor_s": cm.fits[kind, d].floor_s,
                                       "residual_s": ws[d].bytes * cm.fits[kind, d].s_per_byte}
            for d in DIRECTIONS}
    return {
        "device": f"{device.name} (DERIVED, not measured: no GPU ran this profile)",
        "torch": None,
        "dtype": str(DTYPES[DTYPE]),
        "derived": True,
        "model": {"config": {k: v for k, v in vars(cfg).items() if k in LLAMA_70B}, "num_layers": L,
                  "vocab": cfg.vocab, "seq": cfg.seq, "d_model": cfg.hidden, "heads": cfg.heads, "blocks": cfg.layers,
                  "tp": tp, "sequence_parallel": sequence_parallel},
        "derivation": {
            "source": shown,
            "compute_model": cm.to_json(),
            "leave_one_out": leave_one_out(measured, device, DTYPE, nbytes),
            "efficiency": efficiency,
            "operations": operations,
            "priced_per_operation": cm.rates.describe(cfg.seq) if cm.rates is not None else None,
            "method": ("each layer kind's forward and backward seconds from harness/planning/compute_model.py fitted on the "
                       f"measured {shown} ({measured['device']}, {measured['dtype']}), priced per operation "
                       "(harness/planning/op_costs.py): max(floor, GEMMs on a roofline at "
                       f"{device.sustained if sustained is None else sustained:.0%} of the dense peak + causal "
                       "attention at FlashAttention's published rates + memory-bound work at a share of the "
                       "bandwidth + bytes x a fitted residual per byte), on the 70B layer's shape, per TP rank at "
                       f"tp={tp}" + (" with sequence parallelism" if sequence_parallel else "")),
            "replace_with": ("python -m harness.profile model=hf model.arch=llama model.layers=80 model.hidden=8192 "
                             "model.heads=64 model.kv_heads=8 model.ffn=28672 model.vocab=128256 model.seq=4096 "
                             "device=cuda dtype=bf16 --blocks 1 --microbatch-sizes 1 2 4 "
                             "--out data/llama70b_h200_block_profile.json"),
            "one_block": "embedding, one decoder block, head: python -m harness.advise expands it by kind to the "
                         f"model's {L} layers",
        },
        "layers": layers,
    }


def compare(derived: dict, measured: dict) -> list[str]:
    """Derived over measured seconds, per layer kind, direction and common microbatch size: how
    far the compute model was from a one-block measurement of the same model."""
    def first(profile: dict) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for layer in profile["layers"]:
            out.setdefault(layer["kind"], layer["by_microbatch"])
        return out

    d, m = first(derived), first(measured)
    lines = []
    for kind in [k for k in d if k in m]:
        for size in sorted(d[kind].keys() & m[kind].keys(), key=int):
            ratios = [f"{x} {d[kind][size][f'{x}_s'] / m[kind][size][f'{x}_s']:.2f}x" for x in DIRECTIONS
                      if m[kind][size][f"{x}_s"] > 0]
            lines.append(f"{kind} B={size}: derived / measured " + ", ".join(ratios))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.advise.derive", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "llama70b_h200_derived_block_profile.json")
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--sustained", type=float, default=None,
                    help="share of the dense peak large GEMMs sustain (default: harness/planning/devices.py's, sourced)")
    ap.add_argument("--tp", type=int, default=1, help="the TP degree whose rank the profile times (default 1)")
    ap.add_argument("--sequence-parallel", action="store_true", help="with --tp > 1: norms and adds on sequence shards")
    ap.add_argument("--compare", type=Path, default=None, metavar="MEASURED",
                    help="print the derived times over a measured one-block profile's (python -m harness.profile "
                         "... --blocks 1) instead of writing")
    args = ap.parse_args(argv)
    if args.sustained is not None and not 0 < args.sustained <= 1:
        print(f"harness.advise.derive: --sustained {args.sustained}: a share of the peak (allowed: 0 < x <= 1)",
              file=sys.stderr)
        return 2
    if problem := tp_problem(model_config(**LLAMA_70B), args.tp, args.sequence_parallel):
        print(f"harness.advise.derive: {problem}", file=sys.stderr)
        return 2
    where = "--source"
    try:
        prof = derive(args.source, sustained=args.sustained, tp=args.tp, sequence_parallel=args.sequence_parallel)
        if args.compare is not None:
            where = "--compare"
            print("\n".join(compare(prof, _profile_json(args.compare, "--compare"))))
            return 0
        where = "--out"
        write_text(args.out, json.dumps(prof, indent=1) + "\n")
    except (OSError, ValueError, KeyError, TypeError) as e:
        value = {"--source": args.source, "--compare": args.compare, "--out": args.out}[where]
        allowed = "a writable file" if where == "--out" else "a profile JSON as python -m harness.profile writes"
        print(f"harness.advise.derive: {where} {value}: {type(e).__name__}: {e} (allowed: {allowed})", file=sys.stderr)
        return 2
    d = prof["derivation"]
    blk, eff = prof["layers"][1]["by_microbatch"]["1"], d["efficiency"]
    shares = "; ".join(f"{k} F {v['1']['fwd']:.0%} B {v['1']['bwd']:.0%}" for k, v in eff.items())
    loo = d["leave_one_out"]
    at = f", tp={args.tp}" if args.tp > 1 else ""
    print(f"harness.advise.derive: a 70B block at B=1{at}: F {blk['fwd_s'] * 1e3:.1f} ms, B {blk['bwd_s'] * 1e3:.1f} ms "
          f"(DERIVED); share of peak at B=1: {shares}; leave-one-out on {d['source']}: worst "
          f"{loo['worst_whole_model']:.1%} (whole model); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
