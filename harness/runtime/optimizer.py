"""The optimizer every executor and the reference share: `optimizer=sgd|adamw` (torch's own,
with lr, momentum, betas, weight decay), fp32 master weights in low precision
(harness/runtime/precision.py), and ZeRO-1 (`zero=1`): the optimizer state sharded across a stage's
data-parallel replicas with torch.distributed.optim.ZeroRedundancyOptimizer (Rajbhandari et
al., 2020, "ZeRO", stage 1), composed with the stages' DDP.

`state_bytes()` is what the optimizer holds beyond the parameters: its state tensors (each
storage once) and, in low precision, the fp32 masters; what the memory breakdown reports.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from harness.runtime.precision import Precision


def _factory(name: str, lr: float, cfg) -> tuple[type[torch.optim.Optimizer], dict]:
    if name == "sgd":
        return torch.optim.SGD, {"lr": lr, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay}
    return torch.optim.AdamW, {"lr": lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class Optimizer:
    """step() and zero_grad() over a rank's parameters, whatever the precision and sharding."""

    def __init__(self, params: list[torch.Tensor], lr: float, cfg, precision: Precision,
                 zero_group: dist.ProcessGroup | None = None):
        self.params, self.precision = params, precision
        # low precision: the optimizer steps fp32 copies, copied back after each step
        self.masters = ([p.detach().float().clone().requires_grad_(True) for p in params]
                        if precision.master_weights else params)
        cls, kwargs = _factory(cfg.name, lr, cfg)
        if zero_group is not None:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.inner = ZeroRedundancyOptimizer(self.masters, optimizer_class=cls, process_group=zero_group, **kwargs)
            self._local = self.inner.optim  # this rank's shard's optimizer
        else:
            self.inner = self._local = cls(self.masters, **kwargs)

    def step(self) -> None:
        if self.precision.master_weights:
            for p, m in zip(self.params, self.masters):
                m.grad = None if p.grad is None else p.grad.float().div_(self.precision.loss_scale)
        self.inner.step()
        if self.precision.master_weights:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        if self.precision.master_weights:
            for m in self.masters:
                m.grad = None

    def state_bytes(self) -> int:
        """Optimizer state held here (this rank's shard under ZeRO-1), masters included."""
        state = [t for s in self._local.state.values() for t in s.values()]
        return _storage_bytes(state) + (_storage_bytes(self.masters) if self.precision.master_weights else 0)
