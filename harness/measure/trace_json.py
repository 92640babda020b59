"""trace.json: a run's Trace as Chrome trace-event JSON (Perfetto, chrome://tracing), capped so
a viewer opens it, and read back (`read_trace`, `read_trace_meta`). `write_trace_json` says
what the file holds; its parts: the cap (`_capped`), the tracks (`_track_names`), an event per
action (`_actions`) and per memory sample (`_samples`), a slice per rank and step
(`_step_slices`) and an arrow per message between ranks (`messages`, `_flow_lines`)."""

from __future__ import annotations

import json
import time
from math import isfinite
from collections import Counter
from datetime import datetime, timezone
from operator import attrgetter
from pathlib import Path
from typing import IO, TYPE_CHECKING

from harness.measure.trace import COMPUTE, Event, Trace
from harness.records.jsonsafe import strict
from harness.records.atomic import write_atomic
from harness.records.safe_io import check, read_text

if TYPE_CHECKING:
    from harness.measure.execution import Execution, RankReport

# trace.json holds at most this many events (complete + counter): ~165 bytes each, so ~33 MB,
# which Perfetto opens in seconds. A step of interleaved 1F1B at pp=32, M=512 is 65,536
# events (3 of its 6 steps are kept); uncapped, a long or deep run is a file no viewer opens.
# What is drawn from the kept events comes on top: a step slice per rank and step (an X) and a
# flow per message between ranks (s and f: at most 2 per compute action).
MAX_TRACE_EVENTS = 200_000

# (rank, step, s, bytes) as write_trace_json takes the activation meter's samples
MemorySample = tuple[int, int, float, int]


def _trace_steps(count: Counter, max_events: int | None) -> tuple[list[int], int | None]:
    """(the steps kept, oldest first; the step cut short, if any) from events per step:
    whole steps from the last backwards while they fit in max_events; when the last step
    alone does not fit, it is kept alone and cut short."""
    steps = sorted(count)
    if max_events is None:
        return steps, None
    kept, total = [], 0
    for s in reversed(steps):
        if total + count[s] > max_events:
            break
        kept.append(s)
        total += count[s]
    if steps and not kept:
        return [steps[-1]], steps[-1]
    return kept[::-1], None


def messages(trace: Trace, pp: int) -> list[tuple[Event, Event, str]]:
    """Every message between ranks the trace shows, as (source, destination, what): an F's
    activation goes from stage s to s + 1, a B's or I's input gradient from s to s - 1, within
    a replica (global rank // pp) and a step. The source is the producer's send event
    (`send 0F1`) where the executor recorded one, else the producing action itself (executor=sim
    without send costs, a send torch fused with a receive); the destination is the consuming
    action (its data has arrived when it starts). A hand-off between stages of one rank is no
    message; a message whose end the trace lacks (a capped trace) is left out."""
    pp = pp or 1
    compute: dict[tuple[int, int, str], Event] = {}
    sends: dict[tuple[int, int, str], Event] = {}
    for e in trace:
        if e.cat == COMPUTE and e.kind in ("F", "B", "I"):
            compute[(e.rank // pp, e.step, e.name)] = e
        elif e.kind == "send" and e.name.startswith("send "):
            sends[(e.rank // pp, e.step, e.name[5:])] = e
    out = []
    for (replica, step, _), e in compute.items():
        s, mb = e.stage, e.microbatch
        if e.kind == "F":
            what, producers = "activation", (f"{s - 1}F{mb}",)
        else:
            what, producers = "gradient", (f"{s + 1}B{mb}", f"{s + 1}I{mb}")
        for p in producers:
            source = sends.get((replica, step, p)) or compute.get((replica, step, p))
            if source is not None:
                if source.rank != e.rank:
                    out.append((source, e, f"{what} {p}"))
                break
    return out


def iso_utc(t: float) -> str:
    """Epoch seconds as ISO 8601, UTC, to the microsecond."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="microseconds")


def _finite(*values: float) -> bool:
    return all(map(isfinite, values))


def wall_clock_origin(run: "Execution") -> float | None:
    """Epoch seconds at an Execution's time 0 (its trace's origin), or None without clocks
    (executor=sim). The timeline is rank 0's clock (CLOCK_MONOTONIC, plus each rank's offset to
    it where the Execution has them); the origin is its earliest event, as from_reports takes
    it, read against a (wall clock, monotonic clock) pair sampled here, now. Exact to
    microseconds where this process reads rank 0's clock (forked ranks; rank 0 of torchrun or
    SLURM records the job itself); a rank 0 on another host, or a test's injected skew, needs
    the pair sampled by rank 0 (not in its RankReport yet)."""
    reports: list[RankReport] = getattr(run, "reports", None) or []
    if not reports or not any(r.events for r in reports):
        return None
    offsets = getattr(run, "clock_offset_ns", None) or [0] * len(reports)
    origin = min(e[6] + offsets[i] for i, r in enumerate(reports) for e in r.events)
    mono, wall = time.perf_counter_ns(), time.time_ns()
    return (wall - (mono - origin)) / 1e9


def _clock(trace: Trace, origin_wall_s: float | None, written_s: float) -> dict:
    """trace.json's wall-clock fields: the wall-clock time at ts 0 and at step 0's first event,
    and where they come from. Without an anchor, they are estimated when the file is written:
    that time minus the trace's last event, so late by what happened between (measuring)."""
    def extreme(pick, values):  # max or min, the non-finite left out (looked for only when one came out)
        v = pick(values(), default=0.0)
        return v if _finite(v) else pick((x for x in values() if _finite(x)), default=0.0)

    if origin_wall_s is not None:
        source = "anchor: the recording process's wall clock against its monotonic clock (rank 0's)"
    else:
        origin_wall_s = written_s - extreme(max, lambda: (e.end for e in trace))
        source = ("estimated when trace.json was written: that time minus the trace's last event "
                  "(late by the time between them, measuring)")
    step0 = any(e.step == 0 for e in trace)
    return {"ts_origin_wall_clock": iso_utc(origin_wall_s),
            "step0_wall_clock": iso_utc(origin_wall_s + extreme(min, lambda: (e.start for e in trace if e.step == 0)))
            if step0 else None,
            "wall_clock_source": source}


def peaks_per_step(memory: list[MemorySample]) -> dict[int, dict[int, int]]:
    """step -> global rank -> the most activation bytes the rank held in the step (the meter's
    samples: every change of what it holds)."""
    out: dict[int, dict[int, int]] = {}
    for rank, step, _t, nbytes in memory:
        ranks = out.setdefault(step, {})
        if nbytes > ranks.get(rank, -1):
            ranks[rank] = nbytes
    return out


def write_trace_json(path: Path, trace: Trace, memory: list[MemorySample] = (), pp: int = 0,
                     max_events: int | None = MAX_TRACE_EVENTS, origin_wall_s: float | None = None) -> dict:
    """Chrome trace-event JSON (Perfetto, chrome://tracing): one process per dp replica, one
    track per rank in it, one complete event (ph X) per action, and a counter track (ph C) per
    rank of activation bytes held (memory: (rank, step, s, bytes)). Global rank = replica * pp +
    pipeline rank. Every timestamp is a whole nanosecond (`_us`: written as microseconds with
    exactly three decimals), each event's start and end rounded once, so slices that follow each
    other on a track touch at most, never overlap. On each rank's track, a slice per step
    (`step N`, cat `step`, an X written before the actions) spans the rank's events of that step
    exactly (at one start, a viewer puts the longer X, or the earlier of equal ones, outside). A
    flow (ph s and f, one id each) draws each message between ranks (`messages`, `_flow_times`:
    from the end of the producer's send, or of the producing action, to the start of the
    consuming action; never backwards in time).

    `otherData` (and the clock's three in `metadata`, which Perfetto shows): `trace_cap`
    (below), `ts_origin_wall_clock` and `step0_wall_clock` (ISO 8601,
    UTC: the wall-clock time at ts 0 and at step 0's first event; origin_wall_s, epoch seconds
    at ts 0, where the caller knows it: `wall_clock_origin`; else estimated now, and
    `wall_clock_source` says which), `flows` (how many), and `peak_activation_bytes_per_step`
    ({step: [bytes per global rank, null where none was metered]}, from every sample, before
    the cap).

    Capped so that a viewer opens it: at most `max_events` X and C events together
    (MAX_TRACE_EVENTS by default; None: no cap). Whole steps are kept from the last one
    backwards while they fit, each with its memory samples; earlier steps are dropped. If the
    last step alone is over the cap, it alone is written, cut to its first `max_events` events
    in time order (`truncated_step`). Step slices and flows are drawn from the events kept.
    Returns what was kept, also written in the file under `otherData.trace_cap`:
    {"steps_kept": [...], "steps_dropped": n, "events_written": n, "events_dropped": n,
    "max_events": cap, "truncated_step": step or None}."""
    written_s = time.time()
    memory = list(memory)
    ranks = sorted({e.rank for e in trace} | {m[0] for m in memory})
    pp = pp or len(ranks) or 1
    clock = _clock(trace, origin_wall_s, written_s)
    peaks = peaks_per_step(memory)
    trace, memory, cap = _capped(trace, memory, max_events)
    flows = [(src, dst, what, at) for src, dst, what in messages(trace, pp)
             if (at := _flow_times(src, dst)) is not None]
    nranks = max(ranks) + 1 if ranks else 0
    other = {"trace_cap": cap, **clock, "flows": len(flows), "peak_activation_bytes_per_step": {
        str(s): [by_rank.get(r) for r in range(nranks)] for s, by_rank in sorted(peaks.items())}}
    compact = {"separators": (",", ":")}
    # the head stays one line: read_trace_meta reads otherData from it alone
    head = '{"displayTimeUnit":"ms","otherData":%s,"metadata":%s,"traceEvents":[\n' % (
        json.dumps(strict(other), **compact), json.dumps(clock, **compact))
    n = 20_000  # events formatted and written at a time: no second copy of the whole file in memory
    chunks = [(_actions, trace[i:i + n]) for i in range(0, len(trace), n)] + [
        (_samples, memory[i:i + n]) for i in range(0, len(memory), n)]

    def write(out: IO) -> None:
        out.write(head)
        sep = ""
        # step slices before the actions: of an action and its step slice of one start and length
        # (a rank's only event in a step), a viewer puts the first in the file outside
        for lines in (_track_names(ranks, pp), _step_slices(_step_spans(trace), pp)):
            for line in lines:
                out.write(sep + line)
                sep = ",\n"
        for fmt, items in chunks:
            out.write(sep + ",\n".join(fmt(items, pp)))
            sep = ",\n"
        lines = _flow_lines(flows, pp)
        for i in range(0, len(lines), n):
            out.write(sep + ",\n".join(lines[i:i + n]))
            sep = ",\n"
        out.write("\n]}\n")

    write_atomic(path, write)
    return cap


def _capped(trace: Trace, memory: list[MemorySample], max_events: int | None
            ) -> tuple[Trace, list[MemorySample], dict]:
    """The events kept under the cap (write_trace_json says which), and what was kept."""
    count = Counter(map(attrgetter("step"), trace))
    count.update(m[1] for m in memory)
    steps_kept, truncated = _trace_steps(count, max_events)
    total = len(trace) + len(memory)
    if len(steps_kept) < len(count) or truncated is not None:
        keep = set(steps_kept)
        trace = [e for e in trace if e.step in keep]
        memory = [m for m in memory if m[1] in keep]
        if truncated is not None:  # the step's first max_events events, X and C together, in time order
            first = sorted([(e.start, 0, i) for i, e in enumerate(trace)]
                           + [(m[2], 1, i) for i, m in enumerate(memory)])[:max(max_events, 0)]
            trace = [trace[i] for i in sorted(i for _, k, i in first if k == 0)]
            memory = [memory[i] for i in sorted(i for _, k, i in first if k == 1)]
    written = len(trace) + len(memory)
    return trace, memory, {"steps_kept": steps_kept, "steps_dropped": len(count) - len(steps_kept),
                           "events_written": written, "events_dropped": total - written, "max_events": max_events,
                           "truncated_step": truncated}


def _step_spans(trace: Trace) -> dict[tuple[int, int], list[float]]:
    """(rank, step) -> [first start, last end] of its events: where its step slice goes."""
    spans: dict[tuple[int, int], list[float]] = {}
    for e in trace:
        span = spans.get((e.rank, e.step))
        if span is None:
            spans[(e.rank, e.step)] = [e.start, e.end]
        else:
            span[0], span[1] = min(span[0], e.start), max(span[1], e.end)
    return {k: v for k, v in spans.items() if _finite(*v)}


# One event a line, formatted here rather than built as dicts for json.dumps: 2x faster.
# Strings escaped and quoted as json.dumps does (_q). ts and dur in microseconds, each a whole
# number of nanoseconds (_us); a non-finite time or value is written as null (_num).
_q = json.encoder.encode_basestring_ascii
_X = ('{"ph":"X","name":%s,"cat":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,"args":{"step":%d,"kind":%s,"stage":%d,'
      '"microbatch":%d}}')
_C = '{"ph":"C","name":"activations rank %d","pid":%d,"tid":%d,"ts":%s,"args":{"MiB":%s}}'


def _ns(t: float) -> int | None:
    """Seconds as whole nanoseconds, rounded (None if not finite). Rounding is monotonic: events
    that follow each other in seconds still do in ns, so no rounding makes two of a track overlap."""
    return round(t * 1e9) if isfinite(t) else None


def _us(ns: int | None) -> str:
    """Whole nanoseconds as a JSON number of microseconds with exactly three decimals (a decimal
    a reader scales back to the same ns: no float arithmetic on our side); null for None."""
    if ns is None:
        return "null"
    if ns >= 0:
        return "%d.%03d" % divmod(ns, 1000)
    return "-%d.%03d" % divmod(-ns, 1000)


def _track_names(ranks: list[int], pp: int) -> list[str]:
    """Metadata events: a process per dp replica, a thread (track) per rank."""
    compact = {"separators": (",", ":")}
    meta = [json.dumps({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"pipeline (dp replica {d})"}},
                       **compact) for d in sorted({r // pp for r in ranks})]
    return meta + [json.dumps({"ph": "M", "name": "thread_name", "pid": r // pp, "tid": r,
                               "args": {"name": f"rank {r} (pipeline rank {r % pp})"}}, **compact) for r in ranks]


def _actions(evs: Trace, pp: int) -> list[str]:
    """A complete event (X) per action: its start and end rounded to ns, dur their difference."""
    out = []
    append, q, us = out.append, _q, _us  # locals: this runs once per action
    for e in evs:
        t0, t1 = e.start, e.end
        if isfinite(t0) and isfinite(t1):
            t0, t1 = round(t0 * 1e9), round(t1 * 1e9)
            ts, dur = us(t0), us(t1 - t0)
        else:
            ts, dur = us(_ns(t0)), "null"
        append(_X % (q(e.name), q(e.cat), e.rank // pp, e.rank, ts, dur, e.step, q(e.kind), e.stage, e.microbatch))
    return out


def _samples(samples: list[MemorySample], pp: int) -> list[str]:
    """A counter event (C) per activation-meter sample, in MiB."""
    return [_C % (rank, rank // pp, rank, _us(_ns(t)), _num(nbytes / 2**20)) for rank, _step, t, nbytes in samples]


def _step_slices(spans: dict[tuple[int, int], list[float]], pp: int) -> list[str]:
    """A step slice per rank and step, an X from its first event's start to its last event's end
    (in ns, as the events are rounded: it encloses them exactly; finite by construction; args as
    an action's, kind "step": a reader of X events' args reads them too)."""
    x = ('{"ph":"X","name":"step %d","cat":"step","pid":%d,"tid":%d,"ts":%s,"dur":%s,'
         '"args":{"step":%d,"kind":"step","stage":-1,"microbatch":-1}}')
    slices = []
    for (rank, step), (t0, t1) in sorted(spans.items()):
        b, e = _ns(t0), _ns(t1)
        slices.append(x % (step, rank // pp, rank, _us(b), _us(e - b), step))
    return slices


def _flow_times(src: Event, dst: Event) -> tuple[int, int] | None:
    """(s, f) in ns for a message from `src` to `dst`: s 1 ns before the end of the send (or
    producing action), f 1 ns after the start of the consuming action, each strictly inside its
    slice (a viewer binds a flow's end to the slice enclosing it). Where the consumer started
    before the send ended (it had posted its receive, or a sender's call returned after the data
    was taken), the arrow still never points back in time: it goes from the send's end to the
    point in the consumer at that moment, or, where the consumer ended first, from the point in
    the send at the consumer's end. None where the two share no moment and the consumer ended
    before the send began (two hosts' clocks further apart than their offset estimate), or
    where a time is not finite."""
    s0, s1, d0, d1 = src.start, src.end, dst.start, dst.end
    if not (isfinite(s0) and isfinite(s1) and isfinite(d0) and isfinite(d1)):
        return None
    s0, s1, d0, d1 = round(s0 * 1e9), round(s1 * 1e9), round(d0 * 1e9), round(d1 * 1e9)
    s, f = max(s1 - 1, s0), min(d0 + 1, d1)  # inside, or at the edge of a slice under 2 ns
    if f >= s:
        return s, f
    if d1 - 1 >= s:  # the consumer was running when the send ended
        return s, s
    if d1 - 1 >= s0 + 1:  # the consumer ended while the send was still on
        return d1 - 1, d1 - 1
    return None


def _flow_lines(flows: list[tuple[Event, Event, str, tuple[int, int]]], pp: int) -> list[str]:
    """A flow (s and f: two lines in one string) per message, at `_flow_times`. Names are a word
    and an action's numbers and letter: nothing to escape."""
    sf = ('{"ph":"s","name":"%s","cat":"message","id":%d,"pid":%d,"tid":%d,"ts":%s},\n'
          '{"ph":"f","bp":"e","name":"%s","cat":"message","id":%d,"pid":%d,"tid":%d,"ts":%s}')
    us = _us
    return [sf % (what, i, src.rank // pp, src.rank, us(ts), what, i, dst.rank // pp, dst.rank, us(tf))
            for i, (src, dst, what, (ts, tf)) in enumerate(flows, 1)]


def _num(v: float) -> str:
    """A JSON number: repr of a finite float (what json.dumps writes), null otherwise."""
    return float.__repr__(v) if isfinite(v) else "null"


def read_trace(path: Path) -> Trace:
    """trace.json (write_trace_json) back into events (its actions: the X events but step
    slices); ValueError (safe_io.FileRefused) for anything but a regular file within the trace
    cap (a FIFO would block the reader, a sparse file fill memory)."""
    text = read_text(path, "trace.json", "trace")
    return [Event(e["tid"], e["args"]["step"], e["name"], e["cat"], e["args"]["kind"], e["args"]["stage"],
                  e["args"]["microbatch"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
            for e in json.loads(text)["traceEvents"] if e["ph"] == "X" and e.get("cat") != "step"]


def read_trace_meta(path: Path) -> dict:
    """trace.json's `otherData` (write_trace_json), from its first line alone where it was
    written so (a large trace is not parsed for it), else from the whole file; ValueError as
    read_trace's."""
    check(path, "trace.json", "trace")
    with open(path, encoding="utf-8") as f:
        first = f.readline(1 << 20)
    if first.rstrip().endswith('"traceEvents":['):
        try:
            return json.loads(first.rstrip() + "]}").get("otherData") or {}
        except ValueError:
            pass
    data = json.loads(read_text(path, "trace.json", "trace"))
    return (data.get("otherData") or {}) if isinstance(data, dict) else {}
