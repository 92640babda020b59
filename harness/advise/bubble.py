"""Why a point's bubble is what it is: the one simulator on four variants of the point's own
priced costs, each part the step from one variant to the next, so the parts add up to the
point's predicted bubble exactly (the last variant is the point itself):

  schedule ideal   equal stages (each the mean of the point's F, B, I, W), free links: the
                   schedule's own fill and drain (harness/planning/theory.py's closed form says the same)
  uneven stages    the point's own stage costs, free links (CostModel.without_comm)
  hops             + the point-to-point messages (and any send/receive overhead), no all-reduce
  dp all-reduce    + each stage's gradient all-reduce once its gradients are complete (in its
                   last B, or after its last W): the point

The order is a choice (communication is priced on top of the uneven stages, as a run has
them); a part may be negative where a variant idles less than the one before it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from harness.planning import theory
from harness.planning.plan import Plan, make_plan
from harness.schedules.registry import SCHEDULES
from harness.simulate import engine
from harness.simulate.cost import CostModel

from .search import Prediction, Problem


@dataclass(frozen=True)
class Part:
    name: str
    bubble: float  # its share of the point's bubble (a fraction of the step window, as the bubble is)
    why: str  # what the simulator priced for it, in words


@dataclass(frozen=True)
class Explained:
    bubble: float  # the point's bubble, as the search predicted it
    parts: tuple[Part, ...]  # sum to `bubble`
    theory: float | None  # harness/planning/theory.py's bubble for the schedule in the point's cost ratios

    def line(self) -> str:
        """`bubble 10.7% = 2.7% schedule ideal + 7.4% uneven stages + ...`"""
        return f"bubble {self.bubble:.1%} = " + " + ".join(f"{p.bubble:.1%} {p.name}" for p in self.parts)

    def as_dict(self) -> dict:
        return {"bubble": self.bubble, "theory": self.theory,
                "parts": [{"name": p.name, "bubble": p.bubble, "why": p.why} for p in self.parts]}


def equal_stages(cost: CostModel) -> CostModel:
    """`cost` on free links with every stage's F, B, I and W the mean over stages: the same
    work per step, evenly spread."""
    s = len(cost.fwd_s)
    mean = lambda xs: (statistics.fmean(xs),) * s  # noqa: E731
    return replace(cost.without_comm(), fwd_s=mean(cost.fwd_s), bwd_s=mean(cost.bwd_s),
                   input_grad_s=mean(cost.igrad), weight_grad_s=mean(cost.wgrad))


def _bubble(plan: Plan, cost: CostModel) -> float:
    return engine.bubble(plan.compiled, cost, plan.timing(cost))


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def _theory(plan: Plan, cost: CostModel) -> float | None:
    c = plan.config
    f, b = sum(cost.fwd_s), sum(cost.bwd_s)
    if f <= 0 or b <= 0:
        return None
    try:
        return theory.bubble(c.schedule.name, c.pp, c.microbatches, c.virtual_stages, b / f,
                             min(1.0, sum(cost.wgrad) / b), plan.compiled).value
    except (KeyError, ValueError):
        return None


def _uneven_why(plan: Plan, cost: CostModel) -> str:
    layers = [b - a for a, b in plan.stage_layers]
    work = [f + b for f, b in zip(cost.fwd_s, cost.bwd_s)]
    slow = max(range(len(work)), key=work.__getitem__)
    mean_work = statistics.fmean(work)
    return (f"{sum(layers)} layers over {len(layers)} stages; slowest stage {slow}: {layers[slow]} layers vs mean "
            f"{statistics.fmean(layers):.2g}, F + B "
            f"{_ms(work[slow])} vs mean {_ms(mean_work)} ({work[slow] / mean_work - 1:+.0%}) per microbatch; "
            f"layers per stage {','.join(map(str, layers))}")


def _hops_why(plan: Plan, cost: CostModel, crossings: int) -> str:
    owner, S = plan.compiled.owner, plan.compiled.stages
    fwd, bwd = cost.hops(S)
    crossing = [s for s in range(S - 1) if owner[s] != owner[s + 1]]
    if not crossing:
        return "no stage boundary between ranks"
    worst = max(max(fwd[s], bwd[s + 1]) for s in crossing)
    extra = f"; send/receive overhead {_ms(cost.send_s)} / {_ms(cost.recv_s)}" if cost.send_s or cost.recv_s else ""
    return (f"{len(crossing)} stage boundaries between ranks ({crossings} across nodes), up to {_ms(worst)} a "
            f"message each way{extra}")


def _sync_why(plan: Plan, cost: CostModel) -> str:
    if not cost.sync_s:
        return f"dp={plan.config.dp}: no gradient all-reduce"
    where = "after its last W" if SCHEDULES[plan.config.schedule.name].split_backward else "inside its last backward"
    return f"dp={plan.config.dp}: each stage's ring all-reduce, up to {_ms(max(cost.sync_s))} ({where}, not overlapped)"


def explain_plan(plan: Plan, crossings: int = 0) -> Explained:
    """The parts of `plan`'s predicted bubble (its priced costs, plan.sim_cost())."""
    c = plan.config
    cost = plan.sim_cost()
    ideal = _bubble(plan, equal_stages(cost))
    no_comm = _bubble(plan, cost.without_comm())
    no_sync = _bubble(plan, replace(cost, sync_s=()))
    full = _bubble(plan, cost)
    v = f", v={c.virtual_stages}" if plan.compiled.stages > c.pp else ""
    per = statistics.fmean(cost.fwd_s), statistics.fmean(cost.bwd_s)
    parts = (Part("schedule ideal", ideal, f"{c.schedule.name} (pp={c.pp}, M={c.microbatches}{v}) on equal stages "
                  f"(F {_ms(per[0])}, B {_ms(per[1])} each), free links"),
             Part("uneven stages", no_comm - ideal, _uneven_why(plan, cost)),
             Part("point-to-point hops", no_sync - no_comm, _hops_why(plan, cost, crossings)),
             Part("dp all-reduce", full - no_sync, _sync_why(plan, cost)))
    return Explained(full, parts, _theory(plan, cost))


def explain(p: Problem, x: Prediction) -> Explained:
    """The parts of point `x`'s predicted bubble, priced as the search priced it."""
    return explain_plan(make_plan(p.config_of(x.point), 0, p.model), x.cross_node_boundaries)
