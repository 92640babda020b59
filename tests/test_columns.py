"""The trace read a column at a time (harness/measure/columns.py; issue #39: a 65,536-action
simulated job under 10 us an action) gives what the per-event definitions give, to the bit:
the bubble, the steady bubble, the mean costs and the step time (metrics.py), and the messages
between ranks (trace_json.py), on a trace made to trip a vectorised version: two replicas and
two steps interleaved, TP collectives inside actions, a send, an action recorded twice,
zero-bubble I and W, NaN and infinite times, and times past int64 nanoseconds. The per-event
definitions below are the ones the columns replaced (harness before issue #39)."""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from harness.measure.metrics import bubble_per_rank, mean_costs, steady_per_rank, step_time
from harness.measure.trace import COMPUTE, TP, Event, compute_s, tp_inside
from harness.measure.trace_json import messages, write_trace_json


def _trace(odd: bool, seed: int = 0) -> list[Event]:
    """pp=2, dp=2 (global ranks 0-3), steps 0 and 1 interleaved rank by rank; F, I, W and B of 3
    microbatches per rank (1B2 not there); a TP slice in some actions; a send after each stage-0 F."""
    rng = random.Random(seed)
    events = []
    for rank in range(4):
        stage = rank % 2
        for step in (0, 1):
            t = step * 10.0 + rank * 0.01
            for kind in "FIWB":
                for mb in range(3):
                    if (stage, kind, mb) == (1, "B", 2):  # its I alone sends 0B2 its gradient
                        continue
                    end = t + rng.uniform(0.1, 0.3)
                    events.append(Event(rank, step, f"{stage}{kind}{mb}", COMPUTE, kind, stage, mb, t, end))
                    if kind in "FB" and mb != 1:
                        events.append(Event(rank, step, f"tp {stage}{kind}{mb} L0 all_reduce", TP, f"tp_{kind}",
                                            stage, mb, t + 0.01, t + 0.03))
                    if kind == "F" and stage == 0:
                        events.append(Event(rank, step, f"send 0F{mb}", "comm", "send", 0, mb, end, end + 0.02))
                    t = end + rng.uniform(0.0, 0.05)
            events.append(Event(rank, step, "optim", COMPUTE, "optim", -1, -1, t, t + 0.05))
    if odd:
        e = events[7]
        events.append(Event(e.rank, e.step, e.name, e.cat, e.kind, e.stage, e.microbatch, e.start + 1, e.end + 1))
        for i, (t0, t1) in zip((3, 30, 31, 60, 90), ((math.nan, None), (None, math.inf), (-math.inf, None),
                                                    (None, math.nan), (1e13, 2e13))):
            e = events[i]
            events[i] = Event(e.rank, e.step, e.name, e.cat, e.kind, e.stage, e.microbatch,
                              e.start if t0 is None else t0, e.end if t1 is None else t1)
    return events


# the per-event definitions (harness before issue #39)

def _window(trace):
    ev = [e for e in trace if e.in_window]
    return min(e.start for e in ev), max(e.end for e in ev)


def _bubble_per_rank(step_trace, ranks, pp):
    busy, inside = [0.0] * ranks, tp_inside(step_trace)
    for e in step_trace:
        if e.in_window:
            busy[e.rank] += compute_s(e, inside)
    out = []
    for d in range(ranks // pp):
        t0, t1 = _window([e for e in step_trace if e.rank // pp == d])
        out += [1.0 - busy[r] / (t1 - t0) for r in range(d * pp, (d + 1) * pp)]
    return out


def _steady_per_rank(step_trace, ranks, pp):
    busy, first, last = [0.0] * ranks, [float("inf")] * ranks, [0.0] * ranks
    inside = tp_inside(step_trace)
    for e in step_trace:
        if e.in_window:
            busy[e.rank] += compute_s(e, inside)
            first[e.rank], last[e.rank] = min(first[e.rank], e.start), max(last[e.rank], e.end)
    out = []
    for d in range(ranks // pp):
        mine = range(d * pp, (d + 1) * pp)
        period = max((last[r] - first[r] for r in mine if busy[r]), default=0.0)
        out += [1.0 - busy[r] / period if period > 0 else 0.0 for r in mine]
    return out


def _mean_costs(trace, stages, tp=False):
    inside = tp_inside(trace)
    if tp and not inside:
        return {}
    acc = defaultdict(list)
    for e in trace:
        if e.in_window:
            own = compute_s(e, inside)
            acc[(e.kind, e.stage)].append(e.dur - own if tp else own)
    return {k: [statistics.fmean(acc[(k, s)]) if acc[(k, s)] else 0.0 for s in range(stages)]
            for k in {k for k, _ in acc}}


def _messages(trace, pp):
    compute, sends = {}, {}
    for e in trace:
        if e.cat == COMPUTE and e.kind in ("F", "B", "I"):
            compute[(e.rank // pp, e.step, e.name)] = e
        elif e.kind == "send" and e.name.startswith("send "):
            sends[(e.rank // pp, e.step, e.name[5:])] = e
    out = []
    for (replica, step, _), e in compute.items():
        s, mb = e.stage, e.microbatch
        what, producers = ("activation", (f"{s - 1}F{mb}",)) if e.kind == "F" else (
            "gradient", (f"{s + 1}B{mb}", f"{s + 1}I{mb}"))
        for p in producers:
            source = sends.get((replica, step, p)) or compute.get((replica, step, p))
            if source is not None:
                if source.rank != e.rank:
                    out.append((source, e, f"{what} {p}"))
                break
    return out


def _same(a, b) -> bool:
    """Equal to the bit, NaN equal to NaN."""
    return repr(a) == repr(b)


@pytest.mark.parametrize("odd", [False, True])
def test_the_metrics_a_column_at_a_time_are_the_per_event_ones(odd):
    trace = _trace(odd)
    for step in (0, 1):
        events = [e for e in trace if e.step == step]
        assert _same(bubble_per_rank(events, 4, 2), _bubble_per_rank(events, 4, 2))
        assert _same(steady_per_rank(events, 4, 2), _steady_per_rank(events, 4, 2))
        assert _same(step_time(events), max(e.end for e in events) - min(e.start for e in events))
    for tp in (False, True):
        got, want = mean_costs(trace, 2, tp), _mean_costs(trace, 2, tp)
        assert _same(got, want) and list(got) == list(want)  # the kinds' order too: the record's


def test_a_nan_at_a_window_edge_is_taken_as_pythons_min_takes_it():
    trace = _trace(False)
    events = [e for e in trace if e.step == 0]
    first = min(i for i, e in enumerate(events) if e.in_window and e.rank == 0)
    e = events[first]
    events[first] = Event(e.rank, e.step, e.name, e.cat, e.kind, e.stage, e.microbatch, math.nan, e.end)
    assert _same(bubble_per_rank(events, 4, 2), _bubble_per_rank(events, 4, 2))


@pytest.mark.parametrize("odd", [False, True])
def test_the_messages_a_column_at_a_time_are_the_per_event_ones(odd):
    trace = _trace(odd)
    want = _messages(trace, 2)
    assert messages(trace, 2) == want and any(w.startswith("gradient 1I") for _, _, w in want)


def test_times_past_int64_nanoseconds_are_written_as_the_small_ones(tmp_path: Path):
    """1e13 s is 1e22 ns, past int64: the action and its flow are formatted one at a time, exactly."""
    trace = _trace(True)
    write_trace_json(tmp_path / "t.json", trace, pp=2, max_events=None, origin_wall_s=1.7e9)
    text = (tmp_path / "t.json").read_text()
    assert '"ts":10000000000000000000.000,"dur":10000000000000000000.000' in text
