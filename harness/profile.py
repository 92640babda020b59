"""`python -m harness.profile [key=value ...] [--out FILE]`: measure each layer's forward
and backward wall-clock time (warm-up, then the median of repeats), parameter count,
activation bytes saved for backward and analytic FLOPs; write a profile JSON (the format
of data/gpt2_h200_profile.json) and print how the profile and params partitions compare.

Keys are the main app's (model=gpt, model.layers=..., device=cuda, microbatch_size is
replaced by --microbatch-sizes). Example, GPT-2 small on a GPU:
  python -m harness.profile model=gpt2_small device=cuda --microbatch-sizes 1 4 8 --out gpt2_profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from harness.config import Config, ConfigError, register, to_config
from harness.model import get_model
from harness.model.partition import min_max
from harness.plan import layer_params


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _saved_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd saves for backward in one forward, each storage once, params excluded."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(seen.values())


def time_layer(layer: torch.nn.Module, shape: tuple[int, ...], dtype: torch.dtype, high: int,
               device: torch.device, warmup: int, repeats: int) -> dict:
    def make_input() -> torch.Tensor:
        if dtype == torch.int64:
            return torch.randint(0, high, shape, device=device)
        return torch.randn(shape, device=device, requires_grad=True)

    fwd, bwd = [], []
    for i in range(warmup + repeats):
        x = make_input()
        _sync(device)
        t0 = time.perf_counter()
        out = layer(x)
        _sync(device)
        t1 = time.perf_counter()
        grad = torch.randn_like(out)
        _sync(device)
        t2 = time.perf_counter()
        out.backward(grad)
        _sync(device)
        t3 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t3 - t2)
        layer.zero_grad(set_to_none=True)
    return {"fwd_s": statistics.median(fwd), "bwd_s": statistics.median(bwd),
            "activation_bytes": _saved_bytes(layer, make_input())}


def profile(c: Config, sizes: list[int], device: torch.device, warmup: int, repeats: int) -> dict:
    model = get_model(c.model)
    params = layer_params(model)
    layers = []
    for i in range(model.num_layers):
        layer = model.build_layers(i, i + 1, seed=c.seed)[0].to(device)
        by_mb = {}
        for b in sizes:
            shape, dtype = model.input_shape(i, b)
            t = time_layer(layer, shape, dtype, getattr(c.model, "vocab", 1), device, warmup, repeats)
            by_mb[str(b)] = {**t, "fwd_flops": model.fwd_flops(i, b)}
        layers.append({"index": i, "kind": model.kind(i), "params": params[i], "by_microbatch": by_mb})
        print(f"  layer {i:3d} {model.kind(i):6s} " + "  ".join(
            f"B={b}: fwd {v['fwd_s'] * 1e3:8.3f} ms bwd {v['bwd_s'] * 1e3:8.3f} ms" for b, v in by_mb.items()),
            flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__, "dtype": "torch.float32",
            "model": {k: getattr(c.model, k) for k in ("name", "layers", "hidden", "heads", "seq", "vocab")},
            "warmup": warmup, "repeats": repeats, "layers": layers}


def compare_partitions(prof: dict, microbatch_size: str, depths: list[int]) -> list[str]:
    """For each N: the slowest stage's profiled time under the params and profile partitions."""
    layers = prof["layers"]
    time_of = [lay["by_microbatch"][microbatch_size]["fwd_s"] + lay["by_microbatch"][microbatch_size]["bwd_s"]
               for lay in layers]
    lines = []
    for n in depths:
        if n > len(layers):
            continue
        slowest = {}
        for method, costs in (("params", [float(lay["params"]) for lay in layers]), ("profile", time_of)):
            bounds = min_max(costs, n)
            slowest[method] = (max(sum(time_of[a:b]) for a, b in bounds), [b - a for a, b in bounds])
        (tp, lp), (tq, lq) = slowest["params"], slowest["profile"]
        lines.append(f"N={n} B={microbatch_size}: params partition {lp} slowest stage {tp * 1e3:.3f} ms; "
                     f"profile partition {lq} slowest stage {tq * 1e3:.3f} ms ({tq / tp:.2f}x)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="config keys, as for python -m harness")
    ap.add_argument("--out", type=Path, default=Path("profile.json"))
    ap.add_argument("--microbatch-sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--compare", type=int, nargs="*", default=[2, 4, 8], help="pipeline depths to compare")
    args = ap.parse_args(argv)
    register()
    torch.set_num_threads(1)  # as in every worker: one rank per core
    try:
        with initialize_config_module(config_module="harness.conf", version_base="1.3"):
            c = to_config(compose(config_name="config", overrides=args.overrides))
    except Exception as e:  # noqa: BLE001 - a bad key or value: one line, as python -m harness says it
        from harness.cli import hydra_problem

        print(f"harness.profile: error: {hydra_problem(e, args.overrides)}", file=sys.stderr)
        return 2
    if c.device == "cuda" and not torch.cuda.is_available():
        print("harness.profile: error: device=cuda: no CUDA device here (use device=cpu)", file=sys.stderr)
        return 2
    device = torch.device("cuda" if c.device == "cuda" or (c.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    if any(b < 1 for b in args.microbatch_sizes) or args.repeats < 1 or args.warmup < 0:
        print("harness.profile: error: --microbatch-sizes and --repeats must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    print(f"harness.profile: {c.model.name} ({get_model(c.model).num_layers} layers) on {device}", flush=True)
    prof = profile(c, args.microbatch_sizes, device, args.warmup, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(prof, indent=1))
    print(f"harness.profile: wrote {args.out}")
    for line in compare_partitions(prof, str(max(args.microbatch_sizes)), args.compare):
        print(f"harness.profile: {line}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as e:
        print(f"harness.profile: error: {e}", file=sys.stderr)
        sys.exit(2)
