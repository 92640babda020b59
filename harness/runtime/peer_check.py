"""executor=pytorch's constraints, asked of torch's own schedule classes before any worker
starts: each rank's schedule object is built on stand-in stages (what torch's constructors
read: index, count, group size and rank), so torch refuses here what it would refuse at run
time (1F1B with M < N, ZB-H1 with M not a multiple of its rounds, a CSV it cannot load). No
process group, no tensors. (The order torch runs is compared with the plan's in every step
of the run: its `pipeline_order` tables are not what its single-stage schedules execute.)"""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn

from harness.runtime import compat
from harness.runtime.peer import as_csv, torch_class
from harness.schedules.registry import COSTS, ScheduleInputs, spec
from harness.schedules.ir import Schedule


def _stand_in(stage: int, stages: int, pp: int, rank: int) -> SimpleNamespace:
    return SimpleNamespace(stage_index=stage, num_stages=stages, group_size=pp, group_rank=rank, is_first=stage == 0,
                           is_last=stage == stages - 1, submod=nn.Identity(), has_backward=True, scale_grads=True)


def _build_all(name: str, pp: int, m: int, schedule: Schedule) -> None:
    """torch's schedule object for every rank, on stand-in stages; raises what torch raises."""
    stages = 1 + max(a.stage for acts in schedule.values() for a in acts)
    held = {rank: [_stand_in(s, stages, pp, rank) for s in sorted({a.stage for a in schedule[rank]})]
            for rank in range(pp)}
    if spec(name).torch_class is None:  # csv and the rest: torch's CSV loader, as the peer runner does
        with as_csv(schedule) as path:
            for mine in held.values():
                compat.csv_schedule(mine, m, lambda out, target: out, path)
        return
    cls = torch_class(name)
    for mine in held.values():
        cls(mine[0] if compat.is_single_stage_schedule(cls) else mine, m, loss_fn=lambda out, target: out)


def check(c) -> str | None:
    """One line saying what torch refuses, or None."""
    name, pp, m = c.schedule.name, c.pp, c.microbatches
    entry = spec(name)
    if entry.needs == COSTS:  # its order comes with the plan's costs: torch's CSV loader runs whatever it is
        return None
    try:
        ours = entry.make(ScheduleInputs(c))
    except Exception:  # noqa: BLE001 - the plan reports a schedule that does not build or parse
        return None
    try:
        _build_all(name, pp, m, ours)
    except (ValueError, AssertionError, RuntimeError, KeyError, IndexError) as e:
        cls = "its CSV loader" if spec(name).torch_class is None else torch_class(name).__name__
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"schedule={name} pp={pp} microbatches={m}: executor=pytorch ({cls}) refuses it: {why}"
    return None
