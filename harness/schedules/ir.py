"""The Action IR: a schedule is data, one ordered list of compute actions per rank.

An action is (stage, kind, microbatch) with the string form "{stage}{kind}{microbatch}",
the same as torch.distributed.pipelining's: "2F0", "0B3", "1I2", "1W2".
Communication is never written: a stage's F output goes to stage+1, its B/I output to stage-1.
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple


class Kind(str, enum.Enum):
    F = "F"  # forward
    B = "B"  # full backward (inputs and weights)
    I = "I"  # backward for inputs only (zero-bubble split)  # noqa: E741
    W = "W"  # backward for weights only


_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")


class Action(NamedTuple):
    """Immutable, hashable and ordered (stage, kind, microbatch); a tuple, because schedules
    hold hundreds of thousands of them and a tuple is made and hashed several times faster
    than a frozen dataclass."""
    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        m = _ACTION_RE.match(text.strip())
        if not m:
            raise ValueError(f"not an action: {text!r} (expected e.g. 0F3, 1B0, 2I1, 2W1)")
        return cls(int(m.group(1)), Kind(m.group(2)), int(m.group(3)))


# rank -> ordered compute actions of that rank
Schedule = dict[int, list[Action]]


def stage_to_rank(schedule: Schedule) -> dict[int, int]:
    """Which rank runs each stage (a stage's actions all live on one rank)."""
    owner: dict[int, int] = {}
    for rank, actions in schedule.items():
        for a in actions:
            owner.setdefault(a.stage, rank)
    return owner


def replay_inflight(actions: list[Action]) -> int:
    """Peak count of (stage, microbatch) pairs whose F has run and whose B (or W) has not, over
    a rank's actions in order: the activations it holds, in chunk-sized units."""
    held = peak = 0
    for a in actions:
        held += 1 if a.kind is Kind.F else -1 if a.kind in (Kind.B, Kind.W) else 0
        peak = max(peak, held)
    return peak


def format_grid(schedule: Schedule, mark: dict[int, int] | None = None) -> str:
    """Per-rank grid, one row per rank, one column per step; cells in `mark` {rank: step}
    are wrapped in brackets so the failing step stands out."""
    mark = mark or {}
    width = max((len(str(a)) for acts in schedule.values() for a in acts), default=3) + 2
    lines = []
    for rank in sorted(schedule):
        cells = []
        for i, a in enumerate(schedule[rank]):
            text = f"[{a}]" if mark.get(rank) == i else f" {a} "
            cells.append(text.ljust(width))
        if rank in mark and mark[rank] >= len(schedule[rank]):
            cells.append("[end]")
        lines.append(f"rank {rank}: " + "".join(cells).rstrip())
    return "\n".join(lines)
