"""A compute model that scales with the work: a layer's seconds from its FLOPs and the bytes it
moves, fitted per layer kind and direction on a measured profile, bounded by the device.

    seconds = max(floor, flops / (peak x sustained) + bytes x seconds_per_byte)

- `floor`: what a layer costs however small: the host launching its kernels (the GPU runs them
  asynchronously, so small work hides under the launches; GPT-2 small's blocks on an H200 sit
  on this floor at every measured microbatch size).
- flops at `sustained` x the device's dense peak (harness/planning/devices.py, sourced): the rate large
  GEMMs approach. Efficiency (flops / (seconds x peak)) therefore grows with the work toward
  `sustained` and never exceeds the peak. Where a profile measured a layer faster than that,
  the measured best rate is used instead (still at most the peak).
- bytes: one pass over the layer's dominant tensor (`layer_bytes`); `seconds_per_byte` is
  fitted (how many passes at what bandwidth) and never faster than one pass at the device's
  memory bandwidth. This is where a memory-bound layer's time goes: the fp32 loss over the
  logits, the embedding's table gradient.

A profile cannot separate what it never varied: the fit keeps the sustained rate unless the
data contradict it, and says so (`ComputeModel.notes`). Fitted on per-size medians over the
layers of a kind (a profile's identical blocks are repeats of one measurement).

Priced per operation (where the layers' transformer shape is known: Dims.heads): the work's
`flops x s_per_flop` is replaced by harness/planning/op_costs.py's sum over the layer's
operations (GEMMs on a roofline by their m, n, k after the TP split, attention at
FlashAttention's published rates, memory-bound work at a share of the bandwidth), and the fit
keeps only a floor and a residual per byte (>= 0: what the operation list leaves out, e.g. the
eager loss's extra passes over the logits):

    seconds = max(floor, sum over operations + bytes x residual_s_per_byte)
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from harness.planning.devices import Device
from harness.planning.op_costs import Rates, Shape, layer_ops

DIRECTIONS = ("fwd", "bwd")
DEFAULT_TOLERANCE = 0.1  # a form "fits" within this RMS relative error when a profile has no repeats to tell
LOSS_BYTES = 4  # the loss runs over fp32 logits (HFModel.loss, GPTModel.loss)


@dataclass(frozen=True)
class Dims:
    """What the bytes of a transformer's layers depend on; with `heads`, the shape its
    operations are priced on (op_costs.Shape)."""
    seq: int
    d_model: int
    vocab: int
    dtype_bytes: int
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    gated: bool = False
    tp: int = 1
    sequence_parallel: bool = False
    flash_attention: bool = True

    def shape(self) -> Shape | None:
        if not self.heads:
            return None
        return Shape(self.seq, self.d_model, self.heads, self.kv_heads or self.heads, self.ffn or 4 * self.d_model,
                     self.vocab, self.gated, self.dtype_bytes, self.tp, self.sequence_parallel, self.flash_attention)


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float
    priced_s: float | None = None  # the operations' seconds (op_costs.py); None: flops x s_per_flop
    by_class: tuple[tuple[str, float], ...] = ()  # (gemm | attention | memory, seconds)


def layer_bytes(kind: str, direction: str, b: int, dims: Dims) -> float:
    """One pass over the tensor that a layer of this kind reads or writes most: the activation
    (B x seq x d) for a block; the fp32 logits for the head (its loss); the output forward and
    the whole table's gradient backward for the embedding. 0 for kinds without dimensions."""
    act = b * dims.seq * dims.d_model * dims.dtype_bytes
    if kind == "head":
        return b * dims.seq * dims.vocab * LOSS_BYTES
    if kind == "embed":
        return act if direction == "fwd" else dims.vocab * dims.d_model * dims.dtype_bytes
    return float(act)


def work(kind: str, direction: str, b: int, fwd_flops: float, dims: Dims, rates: Rates | None = None) -> Work:
    """A layer's work on one microbatch of b: the backward does twice the forward's FLOPs. With
    `rates` and a known shape, its operations priced (op_costs.py)."""
    flops, nbytes = fwd_flops * (1 if direction == "fwd" else 2), layer_bytes(kind, direction, b, dims)
    shape = dims.shape()
    if rates is None or shape is None:
        return Work(flops, nbytes)
    by = rates.by_class(layer_ops(kind, shape, b, direction), dims.seq, direction)
    return Work(flops, nbytes, sum(by.values()), tuple(by.items()))


@dataclass(frozen=True)
class KindFit:
    kind: str
    direction: str
    floor_s: float
    s_per_flop: float
    s_per_byte: float  # priced per operation: the residual per byte the operations leave out
    sizes: tuple[int, ...]  # the microbatch sizes it was fitted on
    priced: bool = False  # per operation (op_costs.py) rather than flops x s_per_flop

    def base_s(self, w: Work) -> float:
        return w.priced_s if self.priced and w.priced_s is not None else w.flops * self.s_per_flop

    def seconds(self, w: Work) -> float:
        return max(self.floor_s, self.base_s(w) + w.bytes * self.s_per_byte)

    def efficiency(self, w: Work, peak: float) -> float:
        """Achieved FLOP/s over the peak at this work (0 for a layer without FLOPs)."""
        return w.flops / (self.seconds(w) * peak)


def _fit_one(kind: str, direction: str, points: list[tuple[int, Work, float]], device: Device,
             peak: float, sustained: float, tolerance: float) -> KindFit:
    """points: (B, work, measured seconds), one per microbatch size. The simplest form that
    fits within `tolerance` (RMS relative error) wins, in order: a floor alone (bytes at the
    device's bandwidth), bytes alone (no floor), both (the smallest sizes on the floor, the
    rest above it, the best split); otherwise the best of them. Two measured sizes fit any
    two-parameter form exactly: preferring the simplest is what keeps a third size predictable."""
    points = sorted(points)
    priced = all(w.priced_s is not None for _, w, _ in points)
    # priced per operation, the memory-bound work is among them: the residual may be 0
    min_per_byte = 0.0 if priced else 1 / device.memory_bandwidth_Bps
    s_per_flop = 1 / (peak * sustained)
    if not priced:
        # the best rate measured, its bytes at full bandwidth taken out
        fastest = min(((t - w.bytes * min_per_byte) / w.flops for _, w, t in points if w.flops > 0),
                      default=s_per_flop)
        s_per_flop = max(min(s_per_flop, fastest), 1 / peak)  # the data may only raise the rate, never above peak
    sizes = tuple(b for b, _, _ in points)
    proto = KindFit(kind, direction, 0.0, s_per_flop, 0.0, sizes, priced)

    def per_byte(above: list[tuple[int, Work, float]]) -> float:
        # least squares in relative error of t - base = bytes x s_per_byte
        num = sum((t - proto.base_s(w)) * w.bytes / t ** 2 for _, w, t in above)
        den = sum(w.bytes ** 2 / t ** 2 for _, w, t in above)
        return max(num / den if den else 0.0, min_per_byte)

    def rms(f: KindFit) -> float:
        return (sum(((f.seconds(w) - t) / t) ** 2 for _, w, t in points) / len(points)) ** 0.5

    def make(floor: float, s_per_byte: float) -> KindFit:
        return KindFit(kind, direction, floor, s_per_flop, s_per_byte, sizes, priced)

    floor_only = make(statistics.median(t for _, _, t in points), min_per_byte)
    bytes_only = make(0.0, per_byte(points))
    splits = [make(statistics.median(t for _, _, t in points[:k]), per_byte(points[k:])) for k in range(1, len(points))]
    both = min(splits, key=rms, default=floor_only)
    for f in (floor_only, bytes_only, both):
        if rms(f) <= tolerance:
            return f
    return min((floor_only, bytes_only, both), key=rms)


def spread(profile: dict) -> float | None:
    """How far a profile's identical layers (one kind, one size) differ: the median over such
    groups of their relative standard deviation; None with no group of 3 or more."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for layer in profile["layers"]:
        if layer.get("measured") is False:
            continue
        for size, m in layer["by_microbatch"].items():
            for d in DIRECTIONS:
                groups.setdefault((layer["kind"], d, size), []).append(float(m[f"{d}_s"]))
    rel = [statistics.stdev(ts) / statistics.fmean(ts) for ts in groups.values() if len(ts) >= 3 and min(ts) > 0]
    return statistics.median(rel) if rel else None


@dataclass
class ComputeModel:
    device: Device
    dtype: str
    source: str  # the measured profile it was fitted on
    fits: dict[tuple[str, str], KindFit]
    notes: list[str] = field(default_factory=list)
    rates: Rates | None = None  # priced per operation where a layer's shape is known
    seq: int = 0  # the source profile's sequence length (what `describe` quotes attention at)

    @property
    def peak(self) -> float:
        return self.device.peak_flops(self.dtype)

    def seconds(self, kind: str, direction: str, w: Work) -> float:
        if (kind, direction) not in self.fits:
            raise KeyError(f"layer kind {kind!r}: the profile {self.source} has none to fit (it has: "
                           f"{', '.join(sorted({k for k, _ in self.fits}))})")
        return self.fits[kind, direction].seconds(w)

    def efficiency(self, kind: str, direction: str, w: Work) -> float:
        return self.fits[kind, direction].efficiency(w, self.peak)

    def work(self, kind: str, direction: str, b: int, fwd_flops: float, dims: Dims) -> Work:
        """A layer's work priced with this model's rates (per operation where dims has a shape)."""
        return work(kind, direction, b, fwd_flops, dims, self.rates)

    def on_device(self, device: Device, sustained: float | None = None) -> "ComputeModel":
        """The same fit with another device's per-operation rates (devices.py's, sourced): its
        GEMM roof, FlashAttention rates and bandwidth; the fitted launch floors and residual per
        byte carried over as measured (a host's launches, the loss's extra passes). Only for a
        model priced per operation (the fit's rates are what moves)."""
        if self.rates is None:
            raise ValueError(f"{self.source}: not priced per operation, so it has no rates to move to {device.name}")
        share = sustained if sustained is not None else device.sustained
        if share is None:
            raise ValueError(f"{device.name}: no sustained share of peak in harness/planning/devices.py; give one")
        note = (f"rates moved from {self.device.name} to {device.name} (devices.py); floors and residual per byte "
                f"as fitted on {self.source}")
        return ComputeModel(device, self.dtype, self.source, self.fits, [*self.notes, note],
                            Rates(device, self.dtype, share), self.seq)

    def to_json(self) -> dict:
        priced = ({"priced_per_operation": self.rates.describe(self.seq),
                   "form_per_operation": "seconds = max(floor_s, sum over the layer's operations "
                                         "(harness/planning/op_costs.py) + bytes x s_per_byte)"}
                  if self.rates is not None else {})
        return priced | {
            "source": self.source, "device": self.device.name, "dtype": self.dtype,
            "peak_flops": self.peak, "sustained": self.device.sustained,
            "sustained_source": self.device.sustained_source, "memory_bandwidth_Bps": self.device.memory_bandwidth_Bps,
            "device_source": self.device.source,
            "form": "seconds = max(floor_s, flops x s_per_flop + bytes x s_per_byte)",
            "fits": [asdict(f) for f in self.fits.values()],
            "notes": self.notes,
        }


GATED = ("llama", "mistral", "qwen2")  # model=hf archs with a SwiGLU MLP and rotary embeddings


def profile_dims(profile: dict, dtype_bytes: int) -> Dims:
    """A profile's dimensions; its transformer shape where it records heads (a GPT-2 profile:
    ffn 4 d, as many KV heads as heads, no gating)."""
    m = profile["model"]
    cfg = m.get("config") or {}
    heads = m.get("heads") or cfg.get("heads")
    return Dims(seq=int(m["seq"]), d_model=int(m["d_model"]), vocab=int(m["vocab"]), dtype_bytes=dtype_bytes,
                heads=int(heads) if heads else None, kv_heads=cfg.get("kv_heads") or m.get("kv_heads"),
                ffn=cfg.get("ffn") or m.get("ffn"), gated=cfg.get("arch") in GATED)


def samples(profile: dict, dims: Dims, sizes: set[int] | None = None,
            rates: Rates | None = None) -> dict[tuple[str, str], list[tuple[int, Work, float]]]:
    """(kind, direction) -> (B, work, median seconds over the measured layers of that kind)."""
    by_kind: dict[tuple[str, str, int], list[tuple[Work, float]]] = {}
    for layer in profile["layers"]:
        if layer.get("measured") is False:
            continue  # copied or estimated: not a measurement
        for size, m in layer["by_microbatch"].items():
            b = int(size)
            if sizes is not None and b not in sizes:
                continue
            for d in DIRECTIONS:
                w = work(layer["kind"], d, b, float(m["fwd_flops"]), dims, rates)
                by_kind.setdefault((layer["kind"], d, b), []).append((w, float(m[f"{d}_s"])))
    out: dict[tuple[str, str], list[tuple[int, Work, float]]] = {}
    for (kind, d, b), xs in sorted(by_kind.items()):
        out.setdefault((kind, d), []).append((b, xs[0][0], statistics.median(t for _, t in xs)))
    return out


def fit(profile: dict, device: Device, dtype: str, dtype_bytes: int, source: str,
        sizes: set[int] | None = None, sustained: float | None = None, per_operation: bool = True) -> ComputeModel:
    """Fit every (kind, direction) of a measured profile, on the given microbatch sizes (all by
    default). `sustained` overrides the device table's share of peak. `per_operation`: price
    the layers' operations (op_costs.py) where the profile records their shape."""
    share = sustained if sustained is not None else device.sustained
    if share is None:
        raise ValueError(f"{device.name}: no sustained share of peak is published in harness/planning/devices.py; "
                         "give one (--sustained, 0 < x <= 1)")
    if not 0 < share <= 1:
        raise ValueError(f"sustained={share!r} (allowed: 0 < sustained <= 1)")
    peak = device.peak_flops(dtype)
    dims = profile_dims(profile, dtype_bytes)
    rates = Rates(device, dtype, share) if per_operation and dims.shape() is not None else None
    tolerance = spread(profile) or DEFAULT_TOLERANCE
    measured = samples(profile, dims, sizes, rates)
    fits = {key: _fit_one(*key, pts, device, peak, share, tolerance) for key, pts in measured.items()}
    notes = []
    for (kind, d), pts in measured.items():
        quick = [b for b, w, t in pts if w.priced_s is not None and t < w.priced_s]
        if quick:
            notes.append(f"{kind} {d}: measured faster than its operations are priced at B={quick} "
                         "(the per-operation rates are not lowered by a fit)")
    for f in fits.values():
        if not f.priced and f.s_per_flop < 1 / (peak * share) * (1 - 1e-9):
            notes.append(f"{f.kind} {f.direction}: measured faster than {share:.0%} of peak: priced at its "
                         f"measured best rate ({1 / (f.s_per_flop * peak):.0%} of peak)")
    blocks = fits.get(("block", "fwd"))
    if blocks is not None and blocks.floor_s > 0:
        notes.append(f"blocks sit on a {blocks.floor_s * 1e3:.2f} ms launch floor at B <= "
                     f"{max(blocks.sizes)} on this profile: it bounds their GEMM rate from below only, so large GEMMs "
                     f"are priced at {share:.0%} of peak ({device.sustained_source or 'given'})")
    return ComputeModel(device, dtype, source, fits, notes, rates, dims.seq)


def leave_one_out(profile: dict, device: Device, dtype: str, dtype_bytes: int) -> dict:
    """Each measured microbatch size predicted by a fit on the others: the relative error per
    (kind, direction), and for the whole model's forward and backward (the sum over its layers,
    each at its own kind's fit)."""
    dims = profile_dims(profile, dtype_bytes)
    all_sizes = sorted({int(s) for layer in profile["layers"] for s in layer["by_microbatch"]})
    per_kind: dict[str, dict[str, float]] = {}
    whole: dict[str, dict[str, float]] = {}
    for held in all_sizes:
        model = fit(profile, device, dtype, dtype_bytes, "loo", sizes=set(all_sizes) - {held})
        for (kind, d), pts in samples(profile, dims, rates=model.rates).items():
            for b, w, t in pts:
                if b == held:
                    per_kind.setdefault(f"{kind} {d}", {})[str(b)] = model.seconds(kind, d, w) / t - 1
        for d in DIRECTIONS:
            pred = meas = 0.0
            for layer in profile["layers"]:
                m = layer["by_microbatch"].get(str(held))
                if m is None:
                    continue
                pred += model.seconds(layer["kind"], d, model.work(layer["kind"], d, held, float(m["fwd_flops"]), dims))
                meas += float(m[f"{d}_s"])
            whole.setdefault(d, {})[str(held)] = pred / meas - 1
    worst = max(abs(e) for errs in whole.values() for e in errs.values())
    return {"sizes": all_sizes, "whole_model": whole, "per_kind": per_kind, "worst_whole_model": worst}
