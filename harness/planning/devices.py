"""What an accelerator can do at most: dense peak FLOP/s per dtype and memory bandwidth, from
the vendors' datasheets, looked up by the name torch reports (torch.cuda.get_device_name).

MFU and HFU (harness/planning/flops.py) divide achieved FLOP/s by `peak_flops`; the compute model
(harness/planning/compute_model.py) prices GEMM-bound work at most at `sustained` x peak and
memory-bound work at most at `memory_bandwidth_Bps`. Peaks are DENSE (the datasheets' "with
sparsity" figures are twice these). fp32 is the CUDA cores' rate: PyTorch runs fp32 matmuls
without TF32 unless told to (torch.backends.cuda.matmul.allow_tf32 is False by default).

`sustained` is the largest share of the dense peak a published transformer kernel has
sustained on that architecture, with its source; on Hopper, the one calibration instead (a
published training run's share, stated below); None where nothing is published here (the
compute model then needs it given). No CPU is listed: on CPU a record reports TFLOP/s, and
MFU is n/a.

The per-operation prices (harness/planning/op_costs.py) add, where listed: `sms` (the SM count,
from NVIDIA's architecture whitepapers: a GEMM with fewer output tiles leaves SMs idle),
`attention` (FlashAttention's published causal rates by sequence length) and `memory_share`
(the share of the HBM bandwidth elementwise kernels are priced at: an assumption, said so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.config import DTYPE_NAMES, ClusterConfig, ConfigError

# THE ONE HOPPER CALIBRATION (issue 37 allows one per device, stated): a kernel alone sustains more
# (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608: 740 of 989 TFLOP/s BF16 on H100 SXM5,
# 75%), a training run's GEMMs less (clocks under the 700 W limit, SMs taken by NCCL's kernels).
# 0.57 is the share at which tools/llama3.py reproduces Llama 3 405B's 8,192-GPU row of Table 4
# (arXiv:2407.21783: 430 TFLOP/s per GPU); its 16,384-GPU row (400) is the check. H200 and GH200
# share the GH100 chip and clocks; Ampere is not calibrated (SC21 holds within 15% without).
_HOPPER_SHARE = 0.57
_HOPPER_SUSTAINED = ("CALIBRATED, not a kernel's figure: 57% of the dense peak reproduces Llama 3 405B's pre-training "
                     "on 8,192 H100s (arXiv:2407.21783 Table 4: 430 TFLOP/s per GPU; tools/llama3.py, checked on its "
                     "16,384-GPU row); a GEMM kernel alone sustains up to 75% (FlashAttention-3, arXiv:2407.08608: "
                     "740 of 989 TFLOP/s); H200 and GH200: the same GH100 chip and clocks")
_AMPERE_SUSTAINED = ("FlashAttention-2 (Dao, 2023, arXiv:2307.08691): up to 73% of the A100's theoretical "
                     "maximum FLOP/s")


@dataclass(frozen=True)
class AttentionRates:
    """Causal attention at head dim 128, TFLOP/s by sequence length, on the FLOPs the kernel
    runs (forward: the causal half of 4 B s^2 d; backward: 2.5 x that, FlashAttention's count)."""
    fwd_tflops: tuple[tuple[int, float], ...]
    bwd_tflops: tuple[tuple[int, float], ...]
    source: str
    derived: bool  # True where the table is not the paper's figure on this very device


_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608), H100 80GB SXM5, BF16/FP16, head dim 128:
# Figure 5's causal forward panel and Figure 6's backward panel (the paper shows no causal
# backward panel: its non-causal rates are used, a causal backward skips the masked blocks).
_FA3_FWD = tuple(zip(_SEQS, (292.0, 423.0, 521.0, 579.0, 602.0, 616.0)))
_FA3_BWD = tuple(zip(_SEQS, (316.0, 424.0, 501.0, 542.0, 559.0, 561.0)))
_HOPPER_ATTENTION = AttentionRates(_FA3_FWD, _FA3_BWD, "FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608), "
                                   "H100 SXM5, head dim 128: Fig. 5 causal forward, Fig. 6 backward", False)
_H200_ATTENTION = AttentionRates(_FA3_FWD, _FA3_BWD, _HOPPER_ATTENTION.source + "; H200: the same GH100 chip and "
                                 "clocks (attention is compute-bound: its larger bandwidth not credited)", True)
# FlashAttention-2 (Dao 2023, arXiv:2307.08691) on A100: "up to 73% of the theoretical maximum
# FLOP/s" forward and 63% backward (section 4.1): 228 and 197 TFLOP/s of 312. Its fall-off with
# shorter sequences is taken from FlashAttention-2's own bars in the FA3 paper's H100 figures
# (causal forward 191..335, backward 214..322 TFLOP/s over 512..16k), scaled to those maxima.
_FA2_FWD_SHAPE = (191.0, 260.0, 298.0, 319.0, 333.0, 335.0)
_FA2_BWD_SHAPE = (214.0, 260.0, 291.0, 310.0, 318.0, 322.0)
_AMPERE_ATTENTION = AttentionRates(
    tuple((s, 0.73 * 312 * r / _FA2_FWD_SHAPE[-1]) for s, r in zip(_SEQS, _FA2_FWD_SHAPE)),
    tuple((s, 0.63 * 312 * r / _FA2_BWD_SHAPE[-1]) for s, r in zip(_SEQS, _FA2_BWD_SHAPE)),
    "FlashAttention-2 (Dao 2023, arXiv:2307.08691) on A100: 73% of 312 TFLOP/s forward, 63% backward at "
    "long sequences; shorter sequences scaled by FA2's own fall-off in the FA3 paper's figures", True)
# FlashAttention-2 on H100 (the FA3 paper's own FA2 bars above): the kernel public before FA3's
# release (July 2024), for runs that predate it (tools/llama3.py: Llama 3 405B's pre-training).
FA2_ON_HOPPER = AttentionRates(tuple(zip(_SEQS, _FA2_FWD_SHAPE)), tuple(zip(_SEQS, _FA2_BWD_SHAPE)),
                               "FlashAttention-2 on H100 SXM5, head dim 128: its bars in FlashAttention-3 (Shah et "
                               "al. 2024, arXiv:2407.08608) Fig. 5 causal forward, Fig. 6 backward", False)
_MEMORY_SHARE = ("assumed: elementwise kernels (norms, activations, adds, the loss) priced at 80% of the "
                 "datasheet's HBM bandwidth; not measured per kernel on this device")


@dataclass(frozen=True)
class Device:
    name: str  # as the datasheet names it
    pattern: str  # regex matched (case-insensitive, anywhere) against torch's device name
    peak_bf16: float  # dense FLOP/s; fp16 is the same on every device listed
    peak_fp32: float  # dense FLOP/s on the CUDA cores (no TF32)
    memory_bandwidth_Bps: float
    source: str
    sustained: float | None = None  # share of peak_bf16 a published kernel sustained
    sustained_source: str | None = None
    sms: int | None = None  # streaming multiprocessors (NVIDIA's architecture whitepapers)
    attention: AttentionRates | None = None
    memory_share: float = 0.8
    memory_share_source: str = _MEMORY_SHARE

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for the harness's dtype (fp32 | bf16 | fp16)."""
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype={dtype!r} (allowed: {', '.join(DTYPE_NAMES)})")
        return self.peak_fp32 if dtype == "fp32" else self.peak_bf16


# Ordered: the first match wins (GH200 before H200; NVL and PCIe before the SXM default).
DEVICES: tuple[Device, ...] = (
    Device("NVIDIA GH200", r"gh200", 989e12, 67e12, 4.0e12,
           "NVIDIA GH200 datasheet: BF16 1,979 TFLOPS with sparsity, FP32 67 TFLOPS, 96 GB HBM3 at 4 TB/s",
           _HOPPER_SHARE, _HOPPER_SUSTAINED, 132, _H200_ATTENTION),
    Device("NVIDIA H200 NVL", r"h200 nvl", 835e12, 60e12, 4.8e12,
           "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): H200 NVL BF16 1,671 TFLOPS with sparsity, "
           "FP32 60 TFLOPS, 4.8 TB/s", _HOPPER_SHARE, _HOPPER_SUSTAINED, 132, _H200_ATTENTION),
    Device("NVIDIA H200 SXM", r"h200", 989e12, 67e12, 4.8e12,
           "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): H200 SXM BF16 1,979 TFLOPS with sparsity, "
           "FP32 67 TFLOPS, 4.8 TB/s", _HOPPER_SHARE, _HOPPER_SUSTAINED, 132, _H200_ATTENTION),
    Device("NVIDIA H100 NVL", r"h100 nvl", 835e12, 60e12, 3.9e12,
           "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): H100 NVL BF16 1,671 TFLOPS with sparsity, "
           "FP32 60 TFLOPS, 3.9 TB/s", _HOPPER_SHARE, _HOPPER_SUSTAINED, 132, _HOPPER_ATTENTION),
    Device("NVIDIA H100 PCIe", r"h100 pcie", 756e12, 51e12, 2.0e12,
           "NVIDIA H100 datasheet: H100 PCIe BF16 1,513 TFLOPS with sparsity, FP32 51 TFLOPS, 2 TB/s",
           _HOPPER_SHARE, _HOPPER_SUSTAINED, 114),
    Device("NVIDIA H100 SXM", r"h100", 989e12, 67e12, 3.35e12,
           "NVIDIA H100 datasheet: H100 SXM BF16 1,979 TFLOPS with sparsity, FP32 67 TFLOPS, 3.35 TB/s",
           _HOPPER_SHARE, _HOPPER_SUSTAINED, 132, _HOPPER_ATTENTION),
    Device("NVIDIA A100 40GB", r"a100.*40\s*gb", 312e12, 19.5e12, 1.555e12,
           "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): BF16 312 TFLOPS (624 with sparsity), "
           "FP32 19.5 TFLOPS, 40 GB HBM2 at 1,555 GB/s", 0.73, _AMPERE_SUSTAINED, 108, _AMPERE_ATTENTION),
    Device("NVIDIA A100 80GB", r"a100", 312e12, 19.5e12, 2.039e12,
           "NVIDIA A100 datasheet: BF16 312 TFLOPS (624 with sparsity), FP32 19.5 TFLOPS, 80 GB HBM2e SXM at "
           "2,039 GB/s (PCIe 1,935 GB/s)", 0.73, _AMPERE_SUSTAINED, 108, _AMPERE_ATTENTION),
    Device("NVIDIA B200", r"b200", 2.25e15, 75e12, 8.0e12,
           "NVIDIA HGX B200 datasheet (nvidia.com/en-us/data-center/hgx): per GPU FP16/BF16 4.5 PFLOPS with "
           "sparsity, FP32 75 TFLOPS, 8 TB/s"),
    Device("NVIDIA L40S", r"l40s", 362e12, 91.6e12, 0.864e12,
           "NVIDIA L40S datasheet: BF16 733 TFLOPS with sparsity (362 dense), FP32 91.6 TFLOPS, 864 GB/s"),
    Device("AMD Instinct MI300X", r"mi300x", 1307e12, 163.4e12, 5.3e12,
           "AMD Instinct MI300X datasheet (amd.com): BF16 1,307.4 TFLOPS dense, FP32 163.4 TFLOPS, 5.3 TB/s"),
)


def lookup(device_name: str | None) -> Device | None:
    """The table's entry for torch's device name (e.g. "NVIDIA H100 80GB HBM3"); None for a CPU,
    an empty name or a device the table does not list."""
    if not device_name or device_name.lower() == "cpu":
        return None
    for d in DEVICES:
        if re.search(d.pattern, device_name, re.IGNORECASE):
            return d
    return None


def memory_bandwidth(cluster: ClusterConfig) -> float:
    """A cluster's device memory bandwidth, bytes a second: the table's for `cluster.gpu`, or
    `cluster.memory_bandwidth_Bps` where the cluster gives one (a device the table lacks:
    cluster=here measures its CPU's). ConfigError (one line) where neither says."""
    if cluster.memory_bandwidth_Bps is not None:
        return cluster.memory_bandwidth_Bps
    if (device := lookup(cluster.gpu)) is not None:
        return device.memory_bandwidth_Bps
    raise ConfigError(f"cluster.gpu={cluster.gpu!r}: not in the device table, so its memory bandwidth is unknown "
                      f"(allowed: a gpu harness/planning/devices.py lists ({', '.join(d.name for d in DEVICES)}), "
                      "or cluster.memory_bandwidth_Bps=<bytes a second>)")
