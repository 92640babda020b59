"""Precision: `dtype=fp32|bf16|fp16`, one scheme everywhere (every executor, the profiler,
the single-process reference).

The scheme is pure low precision with fp32 master weights, as Megatron-LM's mixed
precision (Float16OptimizerWithFloat16Params) and DeepSpeed's fp16/bf16 modes: parameters,
activations, the tensors sent between stages and the accumulated gradients are all in
`dtype`; the optimizer keeps an fp32 copy of every parameter (the master), steps it on the
gradients cast to fp32, and copies it back (harness/runtime/optimizer.py). The loss is computed in
fp32 from the last stage's output. fp16 scales the loss by a fixed factor (LOSS_SCALE) so
small gradients do not underflow, and unscales in the master copy; bf16 has fp32's range
and needs none. Not autocast: under autocast a model's stage outputs change dtype with its
last op (a residual add promotes back to fp32), so neither the messages nor the memory
would follow `dtype`; here they do, and each record says which scheme ran
(`env.precision`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.config import DTYPE_BYTES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SCHEME = "pure low precision, fp32 master weights in the optimizer, fp32 loss"
LOSS_SCALE = {"fp32": 1.0, "bf16": 1.0, "fp16": 1024.0}  # static: enough for these models' gradients


@dataclass(frozen=True)
class Precision:
    name: str  # fp32 | bf16 | fp16

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    @property
    def bytes(self) -> int:
        """Bytes per element of parameters, gradients, activations and messages."""
        return DTYPE_BYTES[self.name]

    @property
    def master_weights(self) -> bool:
        """The optimizer keeps fp32 copies of the parameters (4 bytes each)."""
        return self.name != "fp32"

    @property
    def loss_scale(self) -> float:
        return LOSS_SCALE[self.name]

    def cast(self, t: torch.Tensor) -> torch.Tensor:
        """A batch tensor as a layer takes it: floating point in `dtype`, token ids as they are."""
        return t.to(self.dtype) if t.is_floating_point() else t
