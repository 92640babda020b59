"""PyTorch's "compute_only" schedule CSV: what torch.distributed.pipelining's
PipelineScheduleMulti._load_csv(path, format="compute_only") reads and torchtitan takes as
`pipeline_parallel_schedule_csv`.

No header; row r is rank r's actions in order, one action string per cell ("2F0", "0B3",
"1I2", "1W2"). torch reads an empty cell as an idle slot (None) and skips it, and an
overlapped pair "(0F3;1B2)OVERLAP_F_B" (what its DualPipeV dumps) as its sub-actions in
order; so do we. We write no empty cells and no overlap cells.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from harness.schedules.ir import Action, Schedule
from harness.schedules.validate import ScheduleError

_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")


def to_csv(schedule: Schedule) -> str:
    """One row per rank 0..max rank (a rank without actions is an empty row)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank in range(max(schedule, default=-1) + 1):
        writer.writerow(str(a) for a in schedule.get(rank, []))
    return out.getvalue()


def _cell(text: str, row: int, col: int) -> list[Action]:
    overlap = _OVERLAP.match(text)
    try:
        return [Action.parse(part) for part in (overlap.group(1).split(";") if overlap else [text])]
    except ValueError:
        raise ScheduleError(f"schedule CSV row {row + 1} (rank {row}), column {col + 1}: {text!r} is not a compute "
                            "action (expected e.g. 0F3, 1B0, 2I1, 2W1, or an empty cell)") from None


def from_csv(text: str) -> Schedule:
    """Rank -> actions; ScheduleError whose first line names the row, column and cell of the
    first malformed cell. Parses only: validate() checks the schedule itself."""
    return {row: [a for col, cell in enumerate(cells) if cell.strip() for a in _cell(cell.strip(), row, col)]
            for row, cells in enumerate(csv.reader(io.StringIO(text)))}


def write_csv(path: str | Path, schedule: Schedule) -> None:
    Path(path).write_text(to_csv(schedule))


def read_csv(path: str | Path) -> Schedule:
    return from_csv(Path(path).read_text())
