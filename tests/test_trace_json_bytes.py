"""trace.json byte for byte: the writer is tuned for speed (issue #39: records under 10 us an
event), and a faster formatting path must write the same file. The expected files were written
by the writer before that tuning, from the same small traces as here: two replicas of a
2-stage pipeline, sends, memory samples, a start before 0, a sub-ns action, non-finite times and
bytes (a clock or meter gone wrong), and a cap that cuts the last step short."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.measure.trace import COMPUTE, Event
from harness.measure.trace_json import write_trace_json

GOLDEN = Path(__file__).parent / "golden"


def _trace() -> tuple[list[Event], list[tuple[int, int, float, int]]]:
    """4 ranks (pp=2, 2 replicas), 2 steps: F then B of 3 microbatches per stage, a send after
    each cross-rank producer; odd times on a few."""
    events, memory = [], []
    for step in range(2):
        for rank in range(4):
            stage = rank % 2
            t = step * 0.01 + rank * 1.5e-6 - 2e-6
            for kind in "FB":
                for mb in range(3):
                    end = t + 0.0004 + mb * 3.3e-7
                    events.append(Event(rank, step, f"{stage}{kind}{mb}", COMPUTE, kind, stage, mb, t, end))
                    if (kind == "F") == (stage == 0):
                        events.append(Event(rank, step, f"send {stage}{kind}{mb}", "comm", "send", stage, mb,
                                            end, end + 2.5e-6))
                    memory.append((rank, step, end, (mb + 1) * 3 * 2**20 + rank))
                    t = end + 1e-7
    nan, inf = float("nan"), float("inf")
    events[5] = Event(0, 0, "0B2", COMPUTE, "B", 0, 2, events[5].start, inf)
    events[20] = Event(1, 0, "1F1", COMPUTE, "F", 1, 1, nan, events[20].end)
    events[30] = Event(2, 0, "0F0", COMPUTE, "F", 0, 0, 0.0, 4e-10)
    memory += [(3, 1, nan, 7), (2, 1, 0.5, inf)]
    return events, memory


@pytest.mark.parametrize("name, max_events", [("trace.json", None), ("trace_capped.json", 40)])
def test_trace_json_bytes_unchanged(tmp_path: Path, name: str, max_events: int | None):
    events, memory = _trace()
    write_trace_json(tmp_path / name, events, memory, pp=2, max_events=max_events, origin_wall_s=1.7e9)
    assert (tmp_path / name).read_bytes() == (GOLDEN / name).read_bytes()
