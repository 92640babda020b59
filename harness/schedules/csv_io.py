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
from harness.schedules.registry import FROM_DATA, ScheduleSpec, register
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


MAX_CSV_BYTES = 64 * 2**20  # a million actions of a few characters each, with room to spare


def read_csv(path: str | Path) -> Schedule:
    """The schedule in a CSV file, every rank with at least one action (a rank without any
    would hold no stage). ScheduleError whose first line says what is wrong: not readable,
    too large, not UTF-8 text (random bytes), not CSV, a malformed cell, an idle rank."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_CSV_BYTES:
            raise ScheduleError(f"schedule CSV: {size:,} bytes, more than {MAX_CSV_BYTES:,} (not a schedule)")
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScheduleError(f"schedule CSV: not UTF-8 text (byte {e.start} is 0x{e.object[e.start]:02x}); "
                            "expected rows of actions like 0F0,0B0") from None
    except OSError as e:
        raise ScheduleError(f"schedule CSV: cannot read it ({e.strerror or e})") from None
    try:
        schedule = from_csv(text)
    except csv.Error as e:
        raise ScheduleError(f"schedule CSV: not a CSV file ({e})") from None
    if not schedule:
        raise ScheduleError("schedule CSV: empty (expected one row of actions per rank, like 0F0,0B0)")
    for rank, actions in sorted(schedule.items()):
        if not actions:
            raise ScheduleError(f"schedule CSV row {rank + 1} (rank {rank}): no actions (every rank must run at "
                                "least one stage's forward and backward)")
    return schedule


def _check_csv(c) -> str | None:
    """schedule=csv: the file must exist (its contents are checked when the plan reads it)."""
    path = getattr(c.schedule, "csv_path", None)
    if not path or not Path(path).is_file():
        return (f"schedule.csv_path={path}: schedule=csv needs an existing compute_only CSV file "
                "(export one: python -m harness.schedules.export)")
    return None


register(ScheduleSpec("csv", "any schedule as data: torch's compute_only CSV (schedule.csv_path), validated",
                      None, placement=FROM_DATA, check=_check_csv, color="#7f7f7f"))
