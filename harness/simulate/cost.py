"""Typed cost model: what each action and each message costs, in seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.schedules.ir import Action, Kind


@dataclass(frozen=True)
class CostModel:
    """Per-stage op costs and a point-to-point cost of latency + bytes / bandwidth.

    I and W default to half of B each (a split backward does the same work as B)."""

    fwd_s: tuple[float, ...]  # [stage] forward seconds per microbatch
    bwd_s: tuple[float, ...]  # [stage] full backward seconds per microbatch
    input_grad_s: tuple[float, ...] | None = None  # [stage] I seconds; default bwd / 2
    weight_grad_s: tuple[float, ...] | None = None  # [stage] W seconds; default bwd / 2
    p2p_latency_s: float = 0.0
    p2p_bandwidth_Bps: float = float("inf")
    message_bytes: tuple[int, ...] = field(default=())  # [stage] bytes of its output message

    @classmethod
    def uniform(cls, stages: int, fwd_s: float = 1.0, bwd_s: float = 2.0,
                weight_grad_share: float = 0.5) -> "CostModel":
        """Equal stages: F = fwd_s, B = bwd_s, and a split backward's I = (1 - share) B,
        W = share B (the default half and half is what compute() assumes without them)."""
        if not 0 <= weight_grad_share <= 1:
            raise ValueError(f"weight_grad_share={weight_grad_share}: needs 0 <= share <= 1")
        return cls(fwd_s=(fwd_s,) * stages, bwd_s=(bwd_s,) * stages,
                   input_grad_s=((1 - weight_grad_share) * bwd_s,) * stages,
                   weight_grad_s=(weight_grad_share * bwd_s,) * stages)

    def compute(self, a: Action) -> float:
        if a.kind is Kind.F:
            return self.fwd_s[a.stage]
        if a.kind is Kind.B:
            return self.bwd_s[a.stage]
        if a.kind is Kind.I:
            return (self.input_grad_s or tuple(b / 2 for b in self.bwd_s))[a.stage]
        return (self.weight_grad_s or tuple(b / 2 for b in self.bwd_s))[a.stage]

    def p2p(self, from_stage: int) -> float:
        """Seconds for the message that leaves `from_stage` (activation or gradient)."""
        nbytes = self.message_bytes[from_stage] if self.message_bytes else 0
        return self.p2p_latency_s + nbytes / self.p2p_bandwidth_Bps
