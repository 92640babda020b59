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
import functools
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config import MAX_ACTIONS, ScheduleConfig
from harness.records.atomic import write_text
from harness.records.safe_io import CAPS, FileRefused, check, read_text
from harness.schedules.ir import Action, Kind, Schedule
from harness.schedules.registry import FILE, FROM_DATA, ScheduleInputs, ScheduleSpec, register
from harness.schedules.validate import ScheduleError

_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")


def to_csv(schedule: Schedule) -> str:
    """One row per rank 0..max rank (a rank without actions is an empty row)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank in range(max(schedule, default=-1) + 1):
        writer.writerow(str(a) for a in schedule.get(rank, []))
    return out.getvalue()


_KINDS = {k.value: k for k in Kind}
_ACTION = re.compile(r"\s*(\d+)([FBIW])(\d+)\s*")


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
    out: Schedule = {}
    for row, cells in enumerate(csv.reader(io.StringIO(text))):
        actions = out[row] = []
        for col, cell in enumerate(cells):
            if m := _ACTION.fullmatch(cell):  # the common cell, parsed here (a million of them in ~1.5 s)
                actions.append(Action(int(m[1]), _KINDS[m[2]], int(m[3])))
            elif cell.strip():
                actions.extend(_cell(cell.strip(), row, col))
    return out


def write_csv(path: str | Path, schedule: Schedule) -> None:
    write_text(path, to_csv(schedule))


MAX_CSV_BYTES = CAPS["schedule_csv"]  # a million actions of a few characters each, with room to spare
KEY = "schedule.csv_path"


def read_csv(path: str | Path, ranks: int | None = None) -> Schedule:
    """The schedule in a CSV file, every rank with at least one action (a rank without any
    would hold no stage), its stages 0..S-1 without a gap. ScheduleError whose first line says
    what is wrong: not a regular file (a FIFO, a device), too large (harness/records/safe_io.py), not
    UTF-8 text (random bytes; a UTF-8 byte order mark is fine), not CSV, more cells than
    MAX_ACTIONS, not `ranks` rows (when given), a malformed cell, an idle rank, a stage no
    action before it leads to. Rows and cells are counted before any cell is parsed; each
    file version is counted and parsed once (validation and the plan both read it)."""
    try:
        st = check(path, KEY, "schedule_csv")
        rows = _rows(str(path), st.st_mtime_ns, st.st_size)
        if ranks is not None and rows != ranks:
            raise ScheduleError(f"schedule CSV: {rows} rows (ranks), pp={ranks} (allowed: one row per rank)")
        schedule = _parsed(str(path), st.st_mtime_ns, st.st_size)
    except FileRefused as e:
        raise ScheduleError(f"schedule CSV: {e.reason}") from None
    return {rank: list(actions) for rank, actions in schedule.items()}  # the cached one stays as read


@functools.lru_cache(maxsize=8)
def _rows(path: str, mtime_ns: int, size: int) -> int:
    text = read_text(path, KEY, "schedule_csv")
    try:
        rows = sum(1 for _ in csv.reader(io.StringIO(text)))  # C speed: rows and cells before any action
    except csv.Error as e:
        raise ScheduleError(f"schedule CSV: not a CSV file ({e})") from None
    cells = text.count(",") + rows
    if cells > MAX_ACTIONS:
        raise ScheduleError(f"schedule CSV: {cells:,} cells, more than {MAX_ACTIONS:,} schedule actions (allowed: at "
                            f"most {MAX_ACTIONS:,} actions, one row per rank)")
    if not rows:
        raise ScheduleError("schedule CSV: empty (expected one row of actions per rank, like 0F0,0B0)")
    return rows


@functools.lru_cache(maxsize=2)  # a million actions are ~70 MB of tuples: the last two files only
def _parsed(path: str, mtime_ns: int, size: int) -> Schedule:
    schedule = from_csv(read_text(path, KEY, "schedule_csv"))
    for rank, actions in sorted(schedule.items()):
        if not actions:
            raise ScheduleError(f"schedule CSV row {rank + 1} (rank {rank}): no actions (every rank must run at "
                                "least one stage's forward and backward)")
    _check_stages(schedule)
    return schedule


def _check_stages(schedule: Schedule) -> None:
    """Stages 0..S-1, each named by some action: a stage past a gap (99F0 among stages 0..3)
    is named with its cell, not reported later as the missing actions of stages 4..99."""
    named = {a.stage for actions in schedule.values() for a in actions}
    gap = next(s for s in range(len(named) + 1) if s not in named)
    if gap < max(named):
        for rank, actions in sorted(schedule.items()):
            for col, a in enumerate(actions):
                if a.stage > gap:
                    raise ScheduleError(
                        f"schedule CSV row {rank + 1} (rank {rank}), action {col + 1}: {a} names stage {a.stage}, "
                        f"and no action names stage {gap} (allowed: stages 0..S-1 without a gap, each stage's "
                        "forward and backward of every microbatch)")


# -- the registry entry: schedule=csv, made from a file ---------------------------------------------
@dataclass
class CSVScheduleConfig(ScheduleConfig):
    name: str = "csv"
    csv_path: str | None = None  # PyTorch compute_only CSV, one row per rank


def _check_csv(c: Any) -> str | None:
    """schedule=csv: the file must be a regular file of a schedule CSV's size with one row per
    rank and at most MAX_ACTIONS cells, its actions well formed (checked here, before any
    worker; the plan validates the schedule itself)."""
    path = getattr(c.schedule, "csv_path", None)
    if not path:
        return (f"{KEY}={path}: schedule=csv needs an existing compute_only CSV file "
                "(export one: python -m harness.schedules.export)")
    try:
        read_csv(path, c.pp)
    except ScheduleError as e:
        return f"{KEY}={path}: {str(e).splitlines()[0]}"
    return None


def _actions(c: Any) -> int | None:
    """The file's own count a step (read, checked and cached by the check above); None where it does not read."""
    try:
        return sum(len(actions) for actions in read_csv(c.schedule.csv_path, c.pp).values())
    except ValueError:  # said by the schedule's own check
        return None


def _make(x: ScheduleInputs) -> Schedule:
    return read_csv(x.section.csv_path)


register(ScheduleSpec("csv", "any schedule as data: torch's compute_only CSV (schedule.csv_path), validated",
                      None, placement=FROM_DATA, check=_check_csv, color="#7f7f7f", needs=FILE, make=_make,
                      config=CSVScheduleConfig, paths=("csv_path",), actions=_actions))
