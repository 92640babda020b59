"""`python -m harness.profile [key=value ...] [--out FILE] [--blocks K] [--estimate KIND ...]`:
measure each layer's forward and backward time (warm-up, then the median of repeats) and the
bytes autograd saves for its backward, for any registered model (model=mlp|gpt|hf|custom),
in any precision (dtype=fp32|bf16|fp16), on CPU or a GPU (device=cuda); write a profile JSON
in the format of data/gpt2_h200_profile.json and print how the params and profile
partitions compare.

Keys are the main app's (model=..., model.layers=..., dtype=..., device=..., seed=...);
microbatch_size is replaced by --microbatch-sizes. Examples:
  python -m harness.profile model=gpt2_small device=cuda dtype=bf16 --out gpt2.json
  python -m harness.profile model=hf model.arch=llama model.layers=80 model.hidden=8192 \\
      model.heads=64 model.kv_heads=8 model.ffn=28672 model.vocab=128256 model.seq=4096 \\
      device=cuda dtype=bf16 --blocks 1 --microbatch-sizes 1 2 4 --out llama70b.json

What is measured: each layer is built alone (seeded as a rank builds it), cast to `dtype`
(the runtime's pure low precision, harness/runtime/precision.py), and run on one microbatch: layer
0 on the model's own batch inputs (floating point cast to `dtype`, token ids as they are),
the others on random activations in `dtype` that require grad, as a stage's received input
does; the last layer's forward includes the loss (fp32, on the model's own targets) and its
backward starts from it, as the last stage's does; every other backward starts from a random
output gradient. CPU: time.perf_counter, one thread (as each worker runs). CUDA: CUDA events
around the forward and the backward, after a synchronize, read after another (never run
here: correct by construction, unproven on hardware).

Parameter counts (meta device) and FLOPs (the model's fwd_flops) come from the model, never
from the measurement, for every layer.

--blocks K (expanding one measured block to the whole model): layers are grouped by what
makes their cost (kind, parameters, FLOPs at every measured size): the transformer blocks
are one group, mlp's layers one group, the embedding and the head groups of one. Of each
group only the first K layers are run; every other layer is written with the times of one
of them (round robin) and marked "measured": false, "copied_from": <that layer's index>. So
an 80-block Llama-70B is measured as the embedding, ONE block and the head, and written as
82 layers that the partitioners and compute=emulated read like any profile.

--estimate KIND ... (layers too big to run, e.g. --estimate head): those layers are not
run; their times are a measured layer's (the first of the largest group with FLOPs at
every size: a block) scaled by the ratio of their FLOPs to its, per microbatch size, marked
"measured": false, "estimated_from": <that layer's index>; their activation bytes are
traced on fake tensors (no memory). An embedding has no FLOPs, so an estimate gives it 0 s
(its real cost is memory-bound): measure it; it fits wherever the head does. By default
every layer, embedding and head included, is measured.

Schema: data/gpt2_h200_profile.json's keys at every level, plus (extra keys, which
load_profile ignores) "warmup", "repeats", "measurement" (how it was measured, which layers
were run, copied, estimated), "model"."num_layers" and "model"."config" (the whole model
config), per layer "measured", "copied_from", "estimated_from", per microbatch size
"activation_bytes". harness/model/profile_data.py reads it.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # python -m harness.profile: --help or a bad flag answered before torch is imported
    from harness.frontend.profile_args import refuse_bad_flags

    refuse_bad_flags(sys.argv[1:], __doc__)

import dataclasses
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from harness.runtime import compat
from harness.frontend.compose import compose_config
from harness.config import DTYPE_NAMES, Config, ConfigError, check_values
from harness.model import Model
from harness.model.built import BuiltModel
from harness.model.partition import min_max
from harness.frontend.profile_args import MAX_REPEATS, check_args, parser  # noqa: F401 - MAX_REPEATS: also here
from harness.records.atomic import write_text
from harness.runtime.precision import Precision


class ProfileArgsError(ValueError):
    """A profiler option that cannot run; str() is one line."""


# -- timing ---------------------------------------------------------------------------------
class Clock:
    """Marks around the forward and the backward. CPU: perf_counter. CUDA: events recorded on
    the current stream (what the GPU did between the marks, launch gaps included), read after a
    synchronize."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    @property
    def name(self) -> str:
        return "cuda events (after torch.cuda.synchronize)" if self.cuda else "time.perf_counter"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Between two marks; on CUDA call after sync()."""
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


# -- one layer -----------------------------------------------------------------------------
def _inputs(model: Model, i: int, b: int, precision: Precision, device: torch.device, seed: int,
            last: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Layer i's input for a microbatch of b, and the loss's targets if it is the last layer."""
    if i == 0:
        x, _ = model.batch(seed, 0, b)
        x = precision.cast(x).to(device)
    else:
        shape, dtype = model.input_shape(i, b)
        if dtype.is_floating_point:
            x = torch.randn(shape, device=device, dtype=precision.dtype).requires_grad_(True)
        else:
            high = max(2, int(getattr(getattr(model, "cfg", None), "vocab", 2) or 2))
            x = torch.randint(0, high, shape, device=device, dtype=dtype)
    target = model.batch(seed, 0, b)[1].to(device) if last else None
    return x, target


def _forward(model: Model, layer: torch.nn.Module, x: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """The layer, and for the last one the loss in fp32 (harness/runtime/precision.py) on the model's targets."""
    out = layer(x)
    return out if target is None else model.loss(out.float(), target)


def _saved_bytes(run: Callable[[], torch.Tensor], layer: torch.nn.Module) -> int:
    """Bytes autograd saves for backward in one forward, each storage once, parameters
    excluded (real or fake tensors alike: storages by identity, as the runtime's meter)."""
    params = {compat.storage_id(p) for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.Tensor) and t.numel() and compat.storage_id(t) not in params:
            seen[compat.storage_id(t)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def build_layer(model: Model, i: int, seed: int, precision: Precision, device: torch.device,
                fake: bool = False) -> torch.nn.Module:
    """Layer i as a rank builds it (its own seed), created on `device` and cast to `dtype`.
    `fake` (inside FakeTensorMode): Module.to cannot swap fake parameters (weak references),
    so each floating parameter and buffer is replaced by its cast instead, as .to() would."""
    with torch.device(device):
        layer = model.build_layers(i, i + 1, seed=seed)[0]
    if not fake:
        return layer.to(device=device, dtype=precision.dtype)
    for module in layer.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_floating_point():
                module._parameters[name] = torch.nn.Parameter(p.detach().to(precision.dtype), p.requires_grad)
        for name, buf in module._buffers.items():
            if buf is not None and buf.is_floating_point():
                module._buffers[name] = buf.to(precision.dtype)
    return layer


def measure_layer(model: Model, i: int, sizes: list[int], precision: Precision, device: torch.device, seed: int,
                  warmup: int, repeats: int) -> dict[str, dict]:
    """{"<B>": {"fwd_s", "bwd_s", "activation_bytes"}} of layer i: medians over `repeats` after `warmup`."""
    clock = Clock(device)
    last = i == model.num_layers - 1
    layer = build_layer(model, i, seed, precision, device)
    out: dict[str, dict] = {}
    for b in sizes:
        x, target = _inputs(model, i, b, precision, device, seed, last)
        grad = None
        fwd, bwd = [], []
        for r in range(warmup + repeats):
            clock.sync()
            t0 = clock.mark()
            y = _forward(model, layer, x, target)
            t1 = clock.mark()
            if grad is None and target is None:
                grad = torch.randn_like(y)
            t2 = clock.mark()
            y.backward(None if target is not None else grad)
            t3 = clock.mark()
            clock.sync()
            if r >= warmup:
                fwd.append(clock.seconds(t0, t1))
                bwd.append(clock.seconds(t2, t3))
            del y
            layer.zero_grad(set_to_none=True)
            x.grad = None
        saved = _saved_bytes(lambda: _forward(model, layer, x, target), layer)
        out[str(b)] = {"fwd_s": statistics.median(fwd), "bwd_s": statistics.median(bwd), "activation_bytes": saved}
        del x, target, grad
    del layer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def fake_activation_bytes(model: Model, i: int, sizes: list[int], precision: Precision, seed: int,
                          device: torch.device) -> dict[str, int]:
    """Layer i's saved bytes per size, traced on fake tensors of `device` (nothing allocated;
    the device's kernels decide what attention saves): for layers estimated rather than run."""
    last = i == model.num_layers - 1
    with compat.fake_tensors():
        layer = build_layer(model, i, seed, precision, device, fake=True)
        out = {}
        for b in sizes:
            x, target = _inputs(model, i, b, precision, device, seed, last)
            out[str(b)] = _saved_bytes(lambda: _forward(model, layer, x, target), layer)
    return out


# -- which layers run ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Source:
    """How layer i gets its times: run ("measured"), copied from a run layer, or estimated
    from one by FLOPs."""

    how: str  # measured | copied | estimated
    source: int | None = None


def plan_layers(model: Model, params: list[int], sizes: list[int], blocks: int | None,
                estimate: list[str]) -> list[Source]:
    """Per layer, measured / copied_from / estimated_from (module docstring): groups of
    identical layers (kind, parameters, FLOPs at every size) run their first `blocks` (all
    when None); layers of a kind in `estimate` are scaled from a measured layer's times."""
    n = model.num_layers
    kinds = [model.kind(i) for i in range(n)]
    unknown = [k for k in estimate if k not in kinds]
    if unknown:
        raise ProfileArgsError(f"--estimate {' '.join(unknown)}: no such layer kind in this model "
                               f"(allowed: {', '.join(dict.fromkeys(kinds))})")
    groups: dict[tuple, list[int]] = {}
    for i in range(n):
        if kinds[i] not in estimate:
            key = (kinds[i], params[i], tuple(float(model.fwd_flops(i, b)) for b in sizes))
            groups.setdefault(key, []).append(i)
    plan: list[Source | None] = [None] * n
    for members in groups.values():
        k = len(members) if blocks is None else min(blocks, len(members))
        for pos, i in enumerate(members):
            plan[i] = Source("measured") if pos < k else Source("copied", members[pos % k])
    if estimate:
        candidates = [members[0] for members in sorted(groups.values(), key=len, reverse=True)
                      if all(model.fwd_flops(members[0], b) > 0 for b in sizes)]
        if not candidates:
            raise ProfileArgsError(f"--estimate {' '.join(estimate)}: needs a measured layer with FLOPs at every "
                                   "size to scale from (this model has none left)")
        for i in range(n):
            if kinds[i] in estimate:
                plan[i] = Source("estimated", candidates[0])
    return plan  # type: ignore[return-value]


# -- the whole profile ---------------------------------------------------------------------
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**63


def check_fits(model: Model, params: list[int], plan: list[Source], precision: Precision,
               device: torch.device) -> None:
    """Refuse, in one line, a layer to run whose weights alone (fp32 as built, `dtype` cast,
    `dtype` gradients) exceed the device's memory: a lower bound, activations come on top."""
    limit = _memory_bytes(device)
    run = [i for i, s in enumerate(plan) if s.how == "measured"]
    i = max(run, key=lambda j: params[j])
    need = params[i] * (4 + 2 * precision.bytes)
    if need > limit:
        raise ProfileArgsError(
            f"layer {i} ({model.kind(i)}): {params[i]:,} parameters need {need / 2**30:,.1f} GiB to build, cast and "
            f"hold gradients, more than this {device.type} device's {limit / 2**30:,.1f} GiB (run fewer layers: "
            f"--blocks 1, --estimate {model.kind(i)}; or a GPU: device=cuda)")


def profile(c: Config, sizes: list[int], device: torch.device, warmup: int, repeats: int,
            blocks: int | None = None, estimate: list[str] | None = None, built: BuiltModel | None = None) -> dict:
    """The profile of `c.model` in `c.dtype` on `device` (module docstring for the schema)."""
    built = built or BuiltModel(c.model)
    model = built.model
    precision = Precision(c.dtype)
    params = built.layer_params
    plan = plan_layers(model, params, sizes, blocks, list(estimate or []))
    check_fits(model, params, plan, precision, device)
    measured: dict[int, dict[str, dict]] = {}
    layers = []
    for i, src in enumerate(plan):
        if src.how == "measured":
            measured[i] = measure_layer(model, i, sizes, precision, device, c.seed, warmup, repeats)
    for i, src in enumerate(plan):
        by_mb = {}
        fake = fake_activation_bytes(model, i, sizes, precision, c.seed, device) if src.how == "estimated" else None
        for b in sizes:
            flops = float(model.fwd_flops(i, b))
            if src.how == "estimated":
                ref = measured[src.source][str(b)]  # type: ignore[index]
                ratio = flops / float(model.fwd_flops(src.source, b))  # type: ignore[arg-type]
                t = {"fwd_s": ref["fwd_s"] * ratio, "bwd_s": ref["bwd_s"] * ratio,
                     "activation_bytes": fake[str(b)]}  # type: ignore[index]
            else:
                t = measured[i if src.how == "measured" else src.source][str(b)]  # type: ignore[index]
            by_mb[str(b)] = {"fwd_s": t["fwd_s"], "bwd_s": t["bwd_s"], "fwd_flops": flops,
                             "activation_bytes": t["activation_bytes"]}
        layers.append({"index": i, "kind": model.kind(i), "params": params[i], "by_microbatch": by_mb,
                       "measured": src.how == "measured",
                       "copied_from": src.source if src.how == "copied" else None,
                       "estimated_from": src.source if src.how == "estimated" else None})
        note = {"measured": "", "copied": f"  (copied from layer {src.source})",
                "estimated": f"  (estimated from layer {src.source} by FLOPs)"}[src.how]
        print(f"  layer {i:3d} {model.kind(i):6s} " + "  ".join(
            f"B={b}: fwd {v['fwd_s'] * 1e3:8.3f} ms bwd {v['bwd_s'] * 1e3:8.3f} ms" for b, v in by_mb.items())
            + note, flush=True)
    m = c.model
    return {
        "device": _device_name(device), "torch": torch.__version__, "dtype": str(precision.dtype),
        # GPT-2's keys, as ../shared/data's profile has them; null where the model kind has none (mlp)
        "model": {"vocab": getattr(m, "vocab", None), "seq": getattr(m, "seq", None), "d_model": m.hidden,
                  "heads": getattr(m, "heads", None), "blocks": m.layers, "num_layers": model.num_layers,
                  "config": dataclasses.asdict(m)},
        "warmup": warmup, "repeats": repeats,
        "measurement": {
            "device_type": device.type, "cpu": _cpu_name(),
            "threads": torch.get_num_threads() if device.type == "cpu" else None,
            "timing": Clock(device).name, "statistic": "median", "seed": c.seed, "microbatch_sizes": sizes,
            "precision": f"dtype={c.dtype}: layers and float inputs in {precision.dtype}, loss in fp32",
            "blocks": blocks, "estimate": list(estimate or []),
            "estimate_method": "a measured layer's times x (this layer's fwd_flops / its fwd_flops), per size",
            "measured_layers": [i for i, s in enumerate(plan) if s.how == "measured"],
            "copied_layers": [i for i, s in enumerate(plan) if s.how == "copied"],
            "estimated_layers": [i for i, s in enumerate(plan) if s.how == "estimated"],
        },
        "layers": layers,
    }


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
        ratio = f"{tq / tp:.2f}x" if tp > 0 else "n/a"
        lines.append(f"N={n} B={microbatch_size}: params partition {lp} slowest stage {tp * 1e3:.3f} ms; "
                     f"profile partition {lq} slowest stage {tq * 1e3:.3f} ms ({ratio})")
    return lines


def _error(message: str) -> int:
    print(f"harness.profile: error: {message}", file=sys.stderr)
    return 2


def check_activations(model: Model, sizes: list[int], precision: Precision, device: torch.device) -> None:
    """Refuse, in one line, a microbatch size whose input and output of a layer alone (the
    tensor between layers, in `dtype`, twice: a layer reads one and writes one) exceed the
    device's memory: a lower bound, what autograd saves comes on top. Before anything runs."""
    limit = _memory_bytes(device)
    b = max(sizes)
    shape = model.activation_shape(b)
    need = 2 * precision.bytes * math.prod(shape)
    if need > limit:
        raise ProfileArgsError(
            f"--microbatch-sizes {b}: a layer's input and output ({'x'.join(map(str, shape))}, {precision.dtype}) "
            f"need {need / 2**30:,.1f} GiB, more than this {device.type} device's {limit / 2**30:,.1f} GiB (allowed: "
            "smaller sizes)")


def make_parent(out: Path) -> str | None:
    """The --out file's folder, made now (after every other check); one line where it cannot be."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return (f"--out {out}: cannot create {out.parent} ({e.strerror or type(e).__name__}) (allowed: a path in a "
                "folder this user can write)")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        return f"--out {out}: {out.parent} is not writable (allowed: a path in a folder this user can write)"
    return None


def write_profile(out: Path, prof: dict) -> str | None:
    """prof written to `out` atomically (harness/records/atomic.py: a fresh temporary file beside
    it, then renamed; a link or a FIFO at `out` refused); one line where that fails, with no
    temporary file left behind."""
    try:
        write_text(out, json.dumps(prof, indent=1, default=str))
    except OSError as e:
        return f"--out {out}: cannot write it ({e.strerror or type(e).__name__})"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__).parse_args(argv)
    if why := check_args(args):
        return _error(why)
    try:
        c = compose_config(args.overrides)
        check_values(c)  # the schema's bounds (model.layers=1000000 among them), before a layer is built
    except ConfigError as e:
        return _error(str(e))
    if c.dtype not in DTYPE_NAMES:
        return _error(f"dtype={c.dtype}: unknown (allowed: {', '.join(DTYPE_NAMES)})")
    if c.device not in ("cpu", "cuda", "auto"):
        return _error(f"device={c.device}: unknown (allowed: cpu, cuda, auto)")
    if c.device == "cuda" and not torch.cuda.is_available():
        return _error("device=cuda: no CUDA device here (use device=cpu)")
    sizes = sorted(set(args.microbatch_sizes))
    device = torch.device("cuda", torch.cuda.current_device()) if c.device == "cuda" or (
        c.device == "auto" and torch.cuda.is_available()) else torch.device("cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in every worker: one rank per core
    try:
        built = BuiltModel(c.model)
        precision = Precision(c.dtype)
        # what profile() checks first, checked before anything is written: the layers to run, their sizes
        check_fits(built.model, built.layer_params, plan_layers(built.model, built.layer_params, sizes, args.blocks,
                                                                list(args.estimate)), precision, device)
        check_activations(built.model, sizes, precision, device)
        if why := make_parent(args.out):
            return _error(why)
        print(f"harness.profile: {c.model.name} ({built.num_layers} layers) in {c.dtype} on {_device_name(device)}",
              flush=True)
        prof = profile(c, sizes, device, args.warmup, args.repeats, args.blocks, args.estimate, built)
    except (ConfigError, ProfileArgsError) as e:
        return _error(str(e))
    finally:
        torch.set_num_threads(threads)
    bad = [(lay["index"], b, k) for lay in prof["layers"] for b, v in lay["by_microbatch"].items()
           for k in ("fwd_s", "bwd_s") if not (math.isfinite(v[k]) and v[k] >= 0)]
    if bad:  # never write what load_profile would refuse
        return _error(f"layer {bad[0][0]}, microbatch size {bad[0][1]}: {bad[0][2]} is not a finite time >= 0")
    if why := write_profile(args.out, prof):
        return _error(why)
    print(f"harness.profile: wrote {args.out}")
    for line in compare_partitions(prof, str(max(sizes)), args.compare):
        print(f"harness.profile: {line}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as e:
        print(f"harness.profile: error: {e}", file=sys.stderr)
        sys.exit(2)
