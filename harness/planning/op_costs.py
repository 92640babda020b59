"""A transformer layer's compute priced per operation, from the model's shape and a device's
sourced rates (harness/planning/devices.py), for one microbatch and one direction:

- GEMMs (the linears, after Megatron's TP split: column parallel divides n, row parallel k):
  seconds = max(2mnk / (sustained x peak x fill), bytes / bandwidth), a roofline (Williams et
  al. 2009) whose compute roof is the device's published sustained share of its dense peak and
  whose memory roof is one pass over A, B and C at the HBM bandwidth (arithmetic intensity as in
  NVIDIA's "Matrix Multiplication Background User's Guide"). `fill`: a GEMM with fewer 128 x 128
  output tiles than the device has SMs leaves SMs idle (the guide's wave quantization, its
  under-one-wave case; cuBLAS's split-K is not modelled). So efficiency rises with min(m, n, k)
  (through the memory roof) and with m x n (through the fill), and saturates at the sustained
  share: TP shrinks n or k and with them the rate.
- attention: FlashAttention's published rates for causal attention at head dim 128 by sequence
  length (devices.AttentionRates: FlashAttention-3 on Hopper, FlashAttention-2 on Ampere), on
  the FLOPs the kernel runs (the causal half: 2 B s^2 d forward, x 2.5 backward, the papers'
  convention: 5 matmuls against 2).
  Or (`Shape.flash_attention` False: Megatron-LM before FlashAttention, as the SC21 runs)
  unfused: QK^T and PV as batched GEMMs over the whole s^2 scores, softmax and attention
  dropout as memory-bound passes over them (`unfused_attention`).
- memory-bound work (norms, residual adds, the MLP's activation, rotary, the embedding, the
  loss over the logits): bytes moved at the device's `memory_share` of its HBM bandwidth; a
  backward moves twice its forward's bytes (it reads the saved input and the incoming gradient
  and writes a gradient). Norms and residual adds run on the whole sequence on every TP rank
  unless sequence parallelism shards them.

Each class's rate is marked derived where it is not a measurement on that device
(`OpClass.derived`); compute_model.py fits only what the measured profile identifies (a launch
floor per layer kind and a residual per byte), never these rates.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from harness.planning.devices import Device

CLASSES = ("gemm", "attention", "memory")
TILE = 128  # a cuBLAS output tile's side (the guide's example tiles are 128 or 256 wide)
FA_BWD_FLOPS = 2.5  # FlashAttention counts a backward as 2.5 forwards (5 matmuls against 2)


@dataclass(frozen=True)
class Shape:
    """What a decoder layer's operations depend on."""
    seq: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated: bool  # SwiGLU (3 MLP matrices, rotary) as Llama; else GELU (2 matrices) as GPT-2
    dtype_bytes: int = 2
    tp: int = 1
    sequence_parallel: bool = False
    flash_attention: bool = True  # False: attention as Megatron-LM ran it before FlashAttention (unfused_attention)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Op:
    name: str
    cls: str  # gemm | attention | memory
    flops: float  # what the kernel runs (attention: the causal half; FA's 2.5 x backward)
    bytes: float
    mnk: tuple[int, int, int] | None = None
    batch: int = 1  # a batched GEMM: this many m x n x k products (one per head)


def _gemm(name: str, m: int, n: int, k: int, direction: str, e: int) -> list[Op]:
    """A linear's forward y = x W (m x k by k x n), or its backward: the input gradient (m x n by
    n x k) and the weight gradient (k x m by m x n)."""
    shapes = [(m, n, k)] if direction == "fwd" else [(m, k, n), (k, n, m)]
    return [Op(f"{name}{'' if direction == 'fwd' else ('.dgrad', '.wgrad')[i]}", "gemm", 2.0 * a * b * c,
               float(e * (a * c + c * b + a * b)), (a, b, c)) for i, (a, b, c) in enumerate(shapes)]


def _batched(name: str, batch: int, m: int, n: int, k: int, direction: str, e: int) -> list[Op]:
    """A batched GEMM (one m x n x k product per head), forward or its two backward products."""
    return [Op(op.name, "gemm", batch * op.flops, batch * op.bytes, op.mnk, batch) for op in _gemm(name, m, n, k,
                                                                                                   direction, e)]


def unfused_attention(s: Shape, b: int, direction: str) -> list[Op]:
    """Attention as Megatron-LM ran it before FlashAttention (the SC21 paper's runs): per TP
    rank's heads, QK^T and PV as batched GEMMs over the WHOLE s x s scores (the causal mask
    applied to them, not skipped), a fused scale-mask-softmax reading and writing the scores,
    and dropout on the probabilities (read, write, and a one-byte mask); in the run's dtype."""
    t, e, hd = s.tp, s.dtype_bytes, s.head_dim
    heads = b * s.heads // t
    scores = heads * s.seq ** 2
    return (_batched("scores", heads, s.seq, s.seq, hd, direction, e)
            + _batched("context", heads, s.seq, hd, s.seq, direction, e)
            + [_mem("softmax", 2 * scores * e, direction),
               _mem("attention_dropout", scores * (2 * e + 1), direction)])


def _mem(name: str, fwd_bytes: float, direction: str) -> Op:
    return Op(name, "memory", 0.0, fwd_bytes * (1 if direction == "fwd" else 2))


def block_ops(s: Shape, b: int, direction: str) -> list[Op]:
    """A decoder block's operations on one microbatch of b sequences, per TP rank."""
    t, e, T, hd = s.tp, s.dtype_bytes, b * s.seq, s.head_dim
    sp = t if s.sequence_parallel else 1  # norms and residual adds on a sequence shard
    ops = (_gemm("qkv", T, (s.heads + 2 * s.kv_heads) * hd // t, s.hidden, direction, e)
           + _gemm("attn_out", T, s.hidden, s.heads * hd // t, direction, e)
           + _gemm("mlp_in", T, (2 if s.gated else 1) * s.ffn // t, s.hidden, direction, e)
           + _gemm("mlp_out", T, s.hidden, s.ffn // t, direction, e))
    if s.flash_attention:
        causal = 2.0 * b * s.seq ** 2 * hd * (s.heads // t)
        ops.append(Op("attention", "attention", causal * (1 if direction == "fwd" else FA_BWD_FLOPS),
                      float(e * T * (2 * s.heads + 2 * s.kv_heads) * hd // t)))
    else:
        ops += unfused_attention(s, b, direction)
    act = T * s.hidden * e
    ops += [_mem("norms", 2 * 2 * act / sp, direction),  # 2 norms: read, write
            _mem("residual_adds", 2 * 3 * act / sp, direction),  # 2 adds: read 2, write 1
            _mem("activation", (3 if s.gated else 2) * T * s.ffn * e / t, direction)]  # SwiGLU reads 2
    if s.gated:
        ops.append(_mem("rotary", 2 * T * (s.heads + s.kv_heads) * hd * e / t, direction))  # q, k: read, write
    return ops


LOSS_BYTES_PER_LOGIT = 2 + 3 * 4  # read the bf16 logits, write them fp32, log-softmax reads and writes fp32


def head_ops(s: Shape, b: int, direction: str) -> list[Op]:
    """The final norm, the vocabulary-parallel output GEMM and the loss over fp32 logits."""
    T, e = b * s.seq, s.dtype_bytes
    return ([_mem("final_norm", 2 * T * s.hidden * e, direction)]
            + _gemm("logits", T, s.vocab // s.tp, s.hidden, direction, e)
            + [_mem("cross_entropy", LOSS_BYTES_PER_LOGIT * T * s.vocab / s.tp, direction)])


def embed_ops(s: Shape, b: int, direction: str) -> list[Op]:
    """A lookup forward (read the rows, write the activation); backward the table's gradient
    (zeroed and scattered into: one write of the table) plus the incoming gradient read."""
    T, e = b * s.seq, s.dtype_bytes
    if direction == "fwd":
        return [Op("lookup", "memory", 0.0, 2.0 * T * s.hidden * e)]
    return [Op("table_grad", "memory", 0.0, float(s.vocab // s.tp * s.hidden * e + T * s.hidden * e))]


def layer_ops(kind: str, s: Shape, b: int, direction: str) -> list[Op]:
    if kind == "block":
        return block_ops(s, b, direction)
    if kind == "head":
        return head_ops(s, b, direction)
    if kind == "embed":
        return embed_ops(s, b, direction)
    raise KeyError(f"layer kind {kind!r}: no operations known (allowed: embed, block, head)")


def _interp(table: tuple[tuple[int, float], ...], x: float) -> float:
    """Linear in log2(x) between a table's points, flat beyond its ends."""
    xs = [p for p, _ in table]
    if x <= xs[0]:
        return table[0][1]
    if x >= xs[-1]:
        return table[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = table[i - 1], table[i]
    f = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
    return y0 + f * (y1 - y0)


@dataclass(frozen=True)
class Rates:
    """One device's prices per operation class (devices.py's sourced figures)."""
    device: Device
    dtype: str
    sustained: float  # share of the dense peak the GEMM roof is at

    @property
    def peak(self) -> float:
        return self.device.peak_flops(self.dtype)

    def gemm_s(self, m: int, n: int, k: int, nbytes: float, batch: int = 1) -> float:
        tiles = batch * math.ceil(m / TILE) * math.ceil(n / TILE)
        fill = min(1.0, tiles / self.device.sms) if self.device.sms else 1.0
        return max(2.0 * batch * m * n * k / (self.sustained * self.peak * fill),
                   nbytes / self.device.memory_bandwidth_Bps)

    def attention_flops_per_s(self, seq: int, direction: str) -> float:
        a = self.device.attention
        if a is None:  # nothing published here: the GEMM roof
            return self.sustained * self.peak
        return 1e12 * _interp(a.fwd_tflops if direction == "fwd" else a.bwd_tflops, seq)

    def memory_Bps(self) -> float:
        return self.device.memory_share * self.device.memory_bandwidth_Bps

    def op_s(self, op: Op, seq: int, direction: str) -> float:
        if op.cls == "gemm":
            return self.gemm_s(*op.mnk, op.bytes, op.batch)
        if op.cls == "attention":
            return op.flops / self.attention_flops_per_s(seq, direction)
        return op.bytes / self.memory_Bps()

    def by_class(self, ops: list[Op], seq: int, direction: str) -> dict[str, float]:
        """Seconds per operation class (every class, 0 where the layer has none)."""
        out = dict.fromkeys(CLASSES, 0.0)
        for op in ops:
            out[op.cls] += self.op_s(op, seq, direction)
        return out

    def describe(self, seq: int) -> dict[str, dict]:
        """What each class is priced at, its source, and whether it is derived (not measured on
        this device)."""
        d, a = self.device, self.device.attention
        att = ({"fwd_tflops": self.attention_flops_per_s(seq, "fwd") / 1e12,
                "bwd_tflops": self.attention_flops_per_s(seq, "bwd") / 1e12,
                "at_seq": seq, "source": a.source, "derived": a.derived} if a is not None else
               {"fwd_tflops": self.sustained * self.peak / 1e12, "bwd_tflops": self.sustained * self.peak / 1e12,
                "at_seq": seq, "source": "no FlashAttention rate listed for this device: the GEMM roof",
                "derived": True})
        return {
            "gemm": {"roof_share_of_peak": self.sustained, "peak_tflops": self.peak / 1e12, "sms": d.sms,
                     "form": "max(2mnk / (sustained x peak x min(1, 128x128 tiles / SMs)), "
                             "bytes(A, B, C) / HBM bandwidth)",
                     "source": d.sustained_source or "given", "derived": True},
            "attention": att,
            "memory": {"share_of_bandwidth": d.memory_share, "bandwidth_Bps": d.memory_bandwidth_Bps,
                       "source": d.memory_share_source, "derived": True},
        }
