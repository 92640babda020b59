"""How busy the machine was during an emulated run, read from the run itself, so that a test
comparing its measured timings with the model can allow for a loaded machine without a
wall-clock threshold.

An emulated action sleeps for its modeled cost, so whatever it took beyond that is the wake-up
latency of this machine at that moment (a scheduler slice on a busy core). A receive wakes the
same way, so on a busy machine an action on the critical path also starts late after its
input, by up to WAKEUPS times its share of oversleep (its input's wake-up and its send's):
the step stretches by up to (1 + WAKEUPS) x that share, and the bubble, 1 - busy / period
(the actions' own overrun cancels), moves by at most WAKEUPS x (1 - bubble) x it. On a quiet
machine the share is ~0.5% and the tests' own allowances are what they always were. On these
2 cores with two `yes` beside the test: a share of 9-14%; pp=4, M=8 bubbles 0.065-0.134 over
3/11, i.e. 1.0-1.65 times (1 - 3/11) x share.
"""

from __future__ import annotations

from harness.config import Config
from harness.planning.plan import make_plan
from harness.records.result import Metrics

# the measured action kind -> the emulated cost's field for it
WAKEUPS = 2  # late wake-ups per critical-path action, each about as long as a sleep's overrun
_KINDS = {"F": "fwd_s", "B": "bwd_s", "I": "input_grad_s", "W": "weight_grad_s"}


def oversleep(c: Config, m: Metrics) -> float:
    """The share by which the run's emulated actions overran their modeled costs (>= 0): the
    measured mean seconds of each kind and stage (metrics.mean_op_s), summed, over the plan's
    emulated costs of the same kinds and stages, less one."""
    if c.compute != "emulated":
        raise ValueError(f"compute={c.compute}: only an emulated run's actions have a modeled duration")
    cost = make_plan(c).emulated_cost
    measured = modeled = 0.0
    for kind, per_stage in m.mean_op_s.items():
        if kind not in _KINDS:
            continue
        model = getattr(cost, _KINDS[kind])
        if model is None:  # I and W of a split backward: half of B each when not priced apart
            model = tuple(b / 2 for b in cost.bwd_s)
        measured += sum(per_stage)
        modeled += sum(model[:len(per_stage)])
    return max(0.0, measured / modeled - 1.0)


def bubble_allowance(quiet: float, theory: float, share: float) -> float:
    """How far a measured bubble may stand from `theory`: the allowance on a quiet machine plus
    what late wake-ups on a machine busy enough to overrun sleeps by `share` move a bubble."""
    return quiet + WAKEUPS * (1.0 - theory) * share


def stretch(share: float) -> float:
    """How much longer than modeled a step may take on a machine busy enough to overrun sleeps
    by `share`: each action's own overrun and its late wake-ups."""
    return 1.0 + (1 + WAKEUPS) * share
