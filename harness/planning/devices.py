"""What an accelerator can do at most: dense peak FLOP/s per dtype and memory bandwidth, from
the vendors' datasheets, looked up by the name torch reports (torch.cuda.get_device_name).

MFU and HFU (harness/planning/flops.py) divide achieved FLOP/s by `peak_flops`; the compute model
(harness/planning/compute_model.py) prices GEMM-bound work at most at `sustained` x peak and
memory-bound work at most at `memory_bandwidth_Bps`. Peaks are DENSE (the datasheets' "with
sparsity" figures are twice these). fp32 is the CUDA cores' rate: PyTorch runs fp32 matmuls
without TF32 unless told to (torch.backends.cuda.matmul.allow_tf32 is False by default).

`sustained` is the largest share of the dense peak a published transformer kernel has
sustained on that architecture, with its source; None where nothing is published here (the
compute model then needs it given). No CPU is listed: on CPU a record reports TFLOP/s, and
MFU is n/a.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.config import DTYPE_NAMES

_HOPPER_SUSTAINED = ("FlashAttention-3 (Shah et al., 2024, arXiv:2407.08608): 740 of 989 TFLOP/s BF16/FP16 on "
                     "H100 SXM5, 75% of the dense peak; H200 has the same GH100 chip and clocks")
_AMPERE_SUSTAINED = ("FlashAttention-2 (Dao, 2023, arXiv:2307.08691): up to 73% of the A100's theoretical "
                     "maximum FLOP/s")


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

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for the harness's dtype (fp32 | bf16 | fp16)."""
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype={dtype!r} (allowed: {', '.join(DTYPE_NAMES)})")
        return self.peak_fp32 if dtype == "fp32" else self.peak_bf16


# Ordered: the first match wins (GH200 before H200; NVL and PCIe before the SXM default).
DEVICES: tuple[Device, ...] = (
    Device("NVIDIA GH200", r"gh200", 989e12, 67e12, 4.0e12,
           "NVIDIA GH200 datasheet: BF16 1,979 TFLOPS with sparsity, FP32 67 TFLOPS, 96 GB HBM3 at 4 TB/s",
           0.75, _HOPPER_SUSTAINED),
    Device("NVIDIA H200 NVL", r"h200 nvl", 835e12, 60e12, 4.8e12,
           "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): H200 NVL BF16 1,671 TFLOPS with sparsity, "
           "FP32 60 TFLOPS, 4.8 TB/s", 0.75, _HOPPER_SUSTAINED),
    Device("NVIDIA H200 SXM", r"h200", 989e12, 67e12, 4.8e12,
           "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): H200 SXM BF16 1,979 TFLOPS with sparsity, "
           "FP32 67 TFLOPS, 4.8 TB/s", 0.75, _HOPPER_SUSTAINED),
    Device("NVIDIA H100 NVL", r"h100 nvl", 835e12, 60e12, 3.9e12,
           "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): H100 NVL BF16 1,671 TFLOPS with sparsity, "
           "FP32 60 TFLOPS, 3.9 TB/s", 0.75, _HOPPER_SUSTAINED),
    Device("NVIDIA H100 PCIe", r"h100 pcie", 756e12, 51e12, 2.0e12,
           "NVIDIA H100 datasheet: H100 PCIe BF16 1,513 TFLOPS with sparsity, FP32 51 TFLOPS, 2 TB/s",
           0.75, _HOPPER_SUSTAINED),
    Device("NVIDIA H100 SXM", r"h100", 989e12, 67e12, 3.35e12,
           "NVIDIA H100 datasheet: H100 SXM BF16 1,979 TFLOPS with sparsity, FP32 67 TFLOPS, 3.35 TB/s",
           0.75, _HOPPER_SUSTAINED),
    Device("NVIDIA A100 40GB", r"a100.*40\s*gb", 312e12, 19.5e12, 1.555e12,
           "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): BF16 312 TFLOPS (624 with sparsity), "
           "FP32 19.5 TFLOPS, 40 GB HBM2 at 1,555 GB/s", 0.73, _AMPERE_SUSTAINED),
    Device("NVIDIA A100 80GB", r"a100", 312e12, 19.5e12, 2.039e12,
           "NVIDIA A100 datasheet: BF16 312 TFLOPS (624 with sparsity), FP32 19.5 TFLOPS, 80 GB HBM2e SXM at "
           "2,039 GB/s (PCIe 1,935 GB/s)", 0.73, _AMPERE_SUSTAINED),
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
