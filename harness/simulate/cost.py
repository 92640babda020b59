"""Typed cost model: what each action, message, gradient sync and optimizer step costs, in seconds.

One CostModel says everything the simulator (engine.py) prices; harness/simulate/pricing.py
makes it from a plan (the run's modeled compute, comm.* or a cluster's links, the optimizer).
Every field past the per-stage op costs is zero by default, so `CostModel.uniform(S)` is the
schedule alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from harness.schedules.ir import Action, Kind


@dataclass(frozen=True)
class CostModel:
    """Per-stage op costs; a message's hop; the data-parallel sync, per-action overheads and
    the optimizer step.

    I and W default to half of B each (a split backward does the same work as B). A message
    between two ranks costs p2p_latency_s + bytes / p2p_bandwidth_Bps in both directions,
    unless fwd_hop_s / bwd_hop_s price each direction on its own (a cluster's links); one
    between two stages of the same rank is a local hand-off and costs nothing."""

    fwd_s: tuple[float, ...]  # [stage] forward seconds per microbatch
    bwd_s: tuple[float, ...]  # [stage] full backward seconds per microbatch
    input_grad_s: tuple[float, ...] | None = None  # [stage] I seconds; default bwd / 2
    weight_grad_s: tuple[float, ...] | None = None  # [stage] W seconds; default bwd / 2
    p2p_latency_s: float = 0.0
    p2p_bandwidth_Bps: float = float("inf")
    message_bytes: tuple[int, ...] = field(default=())  # [stage] bytes of its output message
    fwd_hop_s: tuple[float, ...] | None = None  # [stage] seconds for its activation to reach s + 1 (another rank)
    bwd_hop_s: tuple[float, ...] | None = None  # [stage] seconds for its input gradient to reach s - 1
    sync_s: tuple[float, ...] = ()  # [stage] dp > 1: the all-reduce in its last B, or after its last W
    action_overhead_s: float = 0.0  # added to every compute action (what an executor adds)
    send_s: float = 0.0  # posting a send to another rank, after the action that made it
    recv_s: float = 0.0  # taking a message from another rank that has arrived, before the action
    optimizer_s: tuple[float, ...] = ()  # [pipeline rank] the optimizer step after its last action
    step_overhead_s: float = 0.0  # per step, after the last rank's optimizer

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

    @property
    def igrad(self) -> tuple[float, ...]:
        return self.input_grad_s if self.input_grad_s is not None else tuple(b / 2 for b in self.bwd_s)

    @property
    def wgrad(self) -> tuple[float, ...]:
        return self.weight_grad_s if self.weight_grad_s is not None else tuple(b / 2 for b in self.bwd_s)

    def compute(self, a: Action) -> float:
        if a.kind is Kind.F:
            return self.fwd_s[a.stage]
        if a.kind is Kind.B:
            return self.bwd_s[a.stage]
        return (self.igrad if a.kind is Kind.I else self.wgrad)[a.stage]

    def p2p(self, from_stage: int) -> float:
        """Seconds for the message that leaves `from_stage` on the uniform link."""
        nbytes = self.message_bytes[from_stage] if self.message_bytes else 0
        return self.p2p_latency_s + nbytes / self.p2p_bandwidth_Bps

    def hops(self, stages: int) -> tuple[list[float], list[float]]:
        """(fwd, bwd): seconds for stage s's activation to reach s + 1 and its input gradient
        to reach s - 1, where they cross ranks (the simulator charges a local hand-off nothing)."""
        fwd = list(self.fwd_hop_s) if self.fwd_hop_s is not None else [self.p2p(s) for s in range(stages)]
        bwd = list(self.bwd_hop_s) if self.bwd_hop_s is not None else [self.p2p(s) for s in range(stages)]
        return fwd, bwd

    def without_comm(self) -> "CostModel":
        """The same compute on free links (no hop, no sync, no send or receive cost)."""
        free = (0.0,) * len(self.fwd_s)
        return replace(self, p2p_latency_s=0.0, p2p_bandwidth_Bps=float("inf"), fwd_hop_s=free, bwd_hop_s=free,
                       sync_s=(), send_s=0.0, recv_s=0.0)
