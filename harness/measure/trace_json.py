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
from itertools import compress, repeat
from operator import eq
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from harness.measure.columns import Columns, whole_ns
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
    src, dst, producer, activation = _message_rows(Columns.of(trace), pp)
    return [(trace[i], trace[j], ("activation " if a else "gradient ") + p)
            for i, j, p, a in zip(src.tolist(), dst.tolist(), producer, activation.tolist())]


# the actions that receive a message: an F its activation, a B or I its input gradient
_PASSES = frozenset("FBI")


def _message_rows(c: Columns, pp: int) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """`messages` as rows of the columns: (source rows, destination rows, the producer's name,
    whether it is an activation, else a gradient), in the order of the consuming actions' first
    appearance. Per replica and step, the actions and the sends by name in a dict (a later event
    of one name replaces an earlier one), looked up a column at a time."""
    pp = pp or 1
    n = len(c)
    rank = c.rank_array
    step = np.array(c.step, dtype=np.int64)
    consumer = np.fromiter(map(_PASSES.__contains__, c.kind), bool, n) & np.fromiter(
        map(eq, c.cat, repeat(COMPUTE)), bool, n)
    sending = np.fromiter(map(eq, c.kind, repeat("send")), bool, n)
    sending[sending] = [c.name[i].startswith("send ") for i in np.flatnonzero(sending).tolist()]
    # a group per (replica, step): its rows in trace order
    key = (rank // pp) * (int(step.max() - step.min()) + 1 if n else 1) + (step - (step.min() if n else 0))
    groups = key[:1] if n and key.min() == key.max() else np.unique(key[consumer | sending])  # one: a sim's
    firsts, dsts, srcs, producers = [], [], [], []
    name, stage, mb, kind = c.name, c.stage, c.microbatch, c.kind
    for g in groups.tolist():
        mine = key == g
        rows = np.flatnonzero(mine & consumer).tolist()
        names = list(map(name.__getitem__, rows))
        compute = dict(zip(names, rows))
        sends = {name[i][5:]: i for i in np.flatnonzero(mine & sending).tolist()}
        dst = list(compute.values())
        # the key's first row orders the messages (the last is its event); they differ for a name twice
        first = dst if len(compute) == len(rows) else list(map(dict(zip(names[::-1], rows[::-1])).__getitem__, compute))

        def find(names: list[str]) -> np.ndarray:
            """The source of each producer name: its send, else its action, else -1."""
            found = np.fromiter(map(compute.get, names, repeat(-1)), np.int64, len(names))
            if sends:
                sent = np.fromiter(map(sends.get, names, repeat(-1)), np.int64, len(names))
                found = np.where(sent >= 0, sent, found)
            return found

        producer = [f"{stage[i] - 1}F{mb[i]}" if kind[i] == "F" else f"{stage[i] + 1}B{mb[i]}" for i in dst]
        src = find(producer)
        # a gradient whose B is not there comes from an I (zero-bubble schedules split B)
        retry = [j for j in np.flatnonzero(src < 0).tolist() if kind[dst[j]] != "F"]
        if retry:
            second = [f"{stage[dst[j]] + 1}I{mb[dst[j]]}" for j in retry]
            src[retry] = find(second)
            for j, p in zip(retry, second):
                producer[j] = p
        firsts += first
        dsts += dst
        srcs.append(src)
        producers += producer
    firsts = np.array(firsts, dtype=np.int64)
    src = np.concatenate(srcs) if srcs else np.zeros(0, dtype=np.int64)
    dst = np.array(dsts, dtype=np.int64)
    if not (firsts[1:] > firsts[:-1]).all():  # groups interleaved in the trace (ranks' steps, replicas)
        order = np.argsort(firsts, kind="stable")
        src, dst, producers = src[order], dst[order], [producers[j] for j in order.tolist()]
    keep = (src >= 0) & (rank[np.maximum(src, 0)] != rank[dst])
    activation = np.fromiter(map(eq, c.kind, repeat("F")), bool, n)[dst[keep]]
    return src[keep], dst[keep], list(compress(producers, keep.tolist())), activation


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


def _clock(c: Columns, origin_wall_s: float | None, written_s: float) -> dict:
    """trace.json's wall-clock fields: the wall-clock time at ts 0 and at step 0's first event,
    and where they come from. Without an anchor, they are estimated when the file is written:
    that time minus the trace's last event, so late by what happened between (measuring)."""
    def extreme(pick, values: np.ndarray) -> float:  # max or min of the finite ones (0.0: none)
        values = values[np.isfinite(values)]
        return float(pick(values)) if len(values) else 0.0

    if origin_wall_s is not None:
        source = "anchor: the recording process's wall clock against its monotonic clock (rank 0's)"
    else:
        origin_wall_s = written_s - extreme(np.max, c.end)
        source = ("estimated when trace.json was written: that time minus the trace's last event "
                  "(late by the time between them, measuring)")
    step0 = np.asarray(c.step) == 0
    return {"ts_origin_wall_clock": iso_utc(origin_wall_s),
            "step0_wall_clock": iso_utc(origin_wall_s + extreme(np.min, c.start[step0])) if step0.any() else None,
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


def write_trace_json(path: Path, trace: Trace | Columns, memory: list[MemorySample] = (), pp: int = 0,
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
    `trace` may come as its Columns (a caller that has them: the job, for its metrics too).
    Returns what was kept, also written in the file under `otherData.trace_cap`:
    {"steps_kept": [...], "steps_dropped": n, "events_written": n, "events_dropped": n,
    "max_events": cap, "truncated_step": step or None}."""
    written_s = time.time()
    memory = list(memory)
    cols = trace if isinstance(trace, Columns) else Columns.of(trace)
    ranks = sorted(set(cols.rank) | {m[0] for m in memory})
    pp = pp or len(ranks) or 1
    clock = _clock(cols, origin_wall_s, written_s)
    peaks = peaks_per_step(memory)
    cols, memory, cap = _capped(cols, memory, max_events)
    start, start_ok = whole_ns(cols.start)
    end, end_ok = whole_ns(cols.end)
    flows = _flows(cols, pp, start, end, start_ok & end_ok)
    nranks = max(ranks) + 1 if ranks else 0
    other = {"trace_cap": cap, **clock, "flows": len(flows[0]), "peak_activation_bytes_per_step": {
        str(s): [by_rank.get(r) for r in range(nranks)] for s, by_rank in sorted(peaks.items())}}
    compact = {"separators": (",", ":")}
    # the head stays one line: read_trace_meta reads otherData from it alone
    head = '{"displayTimeUnit":"ms","otherData":%s,"metadata":%s,"traceEvents":[\n' % (
        json.dumps(strict(other), **compact), json.dumps(clock, **compact))
    n = 20_000  # events formatted and written at a time: no second copy of the whole file in memory

    def write(out: IO) -> None:
        out.write(head)
        sep = ""
        # step slices before the actions: of an action and its step slice of one start and length
        # (a rank's only event in a step), a viewer puts the first in the file outside
        for lines in (_track_names(ranks, pp), _step_slices(_step_spans(cols), pp)):
            for line in lines:
                out.write(sep + line)
                sep = ",\n"
        for i in range(0, len(cols), n):
            out.write(sep + ",\n".join(_actions(cols, slice(i, i + n), pp, start, end, start_ok, end_ok)))
            sep = ",\n"
        for i in range(0, len(memory), n):
            out.write(sep + ",\n".join(_samples(memory[i:i + n], pp)))
            sep = ",\n"
        for i in range(0, len(flows[0]), n):
            out.write(sep + ",\n".join(_flow_lines(flows, slice(i, i + n), pp)))
            sep = ",\n"
        out.write("\n]}\n")

    write_atomic(path, write)
    return cap


def _capped(c: Columns, memory: list[MemorySample], max_events: int | None
            ) -> tuple[Columns, list[MemorySample], dict]:
    """The events kept under the cap (write_trace_json says which), and what was kept."""
    count = Counter(c.step)
    count.update(m[1] for m in memory)
    steps_kept, truncated = _trace_steps(count, max_events)
    total = len(c) + len(memory)
    if len(steps_kept) < len(count) or truncated is not None:
        keep = set(steps_kept)
        c = c.take(np.fromiter(map(keep.__contains__, c.step), bool, len(c)))
        memory = [m for m in memory if m[1] in keep]
        if truncated is not None:  # the step's first max_events events, X and C together, in time order
            first = sorted([(t, 0, i) for i, t in enumerate(c.start.tolist())]
                           + [(m[2], 1, i) for i, m in enumerate(memory)])[:max(max_events, 0)]
            rows = np.zeros(len(c), dtype=bool)
            rows[[i for _, k, i in first if k == 0]] = True
            c = c.take(rows)
            memory = [memory[i] for i in sorted(i for _, k, i in first if k == 1)]
    written = len(c) + len(memory)
    return c, memory, {"steps_kept": steps_kept, "steps_dropped": len(count) - len(steps_kept),
                       "events_written": written, "events_dropped": total - written, "max_events": max_events,
                       "truncated_step": truncated}


def _step_spans(c: Columns) -> dict[tuple[int, int], list[float]]:
    """(rank, step) -> [first start, last end] of its events: where its step slice goes; only
    the finite ones. Per (rank, step) group of rows at once where all its times are finite (then
    min and max do not depend on the order); a group with a non-finite time event by event, as
    Python's min and max meet a NaN (kept where it came first, passed over after)."""
    if not len(c):
        return {}
    rank, step = c.rank_array, np.asarray(c.step, dtype=np.int64)
    order = np.lexsort((step, rank))  # stable: a group's rows in trace order
    rank, step, start, end = rank[order], step[order], c.start[order], c.end[order]
    heads = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])])
    bounds = np.r_[heads, len(order)]
    finite = np.isfinite(start) & np.isfinite(end)
    whole = np.logical_and.reduceat(finite, heads)
    lo, hi = np.minimum.reduceat(start, heads), np.maximum.reduceat(end, heads)
    spans = {}
    for g, (r, s) in enumerate(zip(rank[heads].tolist(), step[heads].tolist())):
        if whole[g]:
            spans[(r, s)] = [float(lo[g]), float(hi[g])]
            continue
        span = None
        for t0, t1 in zip(start[bounds[g]:bounds[g + 1]].tolist(), end[bounds[g]:bounds[g + 1]].tolist()):
            span = [t0, t1] if span is None else [min(span[0], t0), max(span[1], t1)]
        if _finite(*span):
            spans[(r, s)] = span
    return spans


# One event a line, each line joined from its pieces a column at a time (C-level map and zip,
# no Python call per event: issue #39). Strings escaped and quoted as json.dumps does (_q). ts
# and dur in microseconds, each a whole number of nanoseconds (_us); a non-finite time or value
# is written as null (_num).
_q = json.encoder.encode_basestring_ascii
_X = ('{"ph":"X","name":%s,"cat":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,"args":{"step":%d,"kind":%s,"stage":%d,'
      '"microbatch":%d}}')
_C = '{"ph":"C","name":"activations rank %d","pid":%d,"tid":%d,"ts":%s,"args":{"MiB":%s}}'
_THOUSANDTHS = np.array([".%03d" % i for i in range(1000)], dtype=object)
# a flow's line up to its producer's name: [gradient, activation]
_FLOW_S = np.array(['{"ph":"s","name":"gradient ', '{"ph":"s","name":"activation '], dtype=object)
_FLOW_F = np.array(['},\n{"ph":"f","bp":"e","name":"gradient ', '},\n{"ph":"f","bp":"e","name":"activation '],
                   dtype=object)


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


def _us_pieces(ns: np.ndarray) -> tuple[list[str], list[str]]:
    """_us of each of an array of whole nanoseconds (int64, or object: Python ints) as two
    pieces to join: the whole microseconds, signed, and ".fff"."""
    mag = np.abs(ns)
    whole = list(map(str, (mag // 1000).tolist()))  # np.divmod has no object loop
    for i in np.flatnonzero(ns < 0).tolist():
        whole[i] = "-" + whole[i]
    return whole, _THOUSANDTHS[(mag % 1000).astype(np.intp)].tolist()


def _track_names(ranks: list[int], pp: int) -> list[str]:
    """Metadata events: a process per dp replica, a thread (track) per rank."""
    compact = {"separators": (",", ":")}
    meta = [json.dumps({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"pipeline (dp replica {d})"}},
                       **compact) for d in sorted({r // pp for r in ranks})]
    return meta + [json.dumps({"ph": "M", "name": "thread_name", "pid": r // pp, "tid": r,
                               "args": {"name": f"rank {r} (pipeline rank {r % pp})"}}, **compact) for r in ranks]


def _actions(c: Columns, rows: slice, pp: int, start: np.ndarray, end: np.ndarray, start_ok: np.ndarray,
             end_ok: np.ndarray) -> list[str]:
    """A complete event (X) per action of `rows`: its start and end rounded to ns (`start`,
    `end`: whole_ns of the columns), dur their difference; an action with a time whole_ns does
    not hold formatted alone."""
    cats, ranks, steps, kinds, stages, mbs = (x[rows] for x in (c.cat, c.rank, c.step, c.kind, c.stage, c.microbatch))
    # the pieces that repeat (category and track, step and kind, stage and microbatch numbers)
    # formatted once per distinct value, then looked up
    track = {k: ',"cat":%s,"pid":%d,"tid":%d,"ts":' % (_q(k[0]), k[1] // pp, k[1]) for k in set(zip(cats, ranks))}
    args = {k: ',"args":{"step":%d,"kind":%s,"stage":' % (k[0], _q(k[1])) for k in set(zip(steps, kinds))}
    number = {v: "%d" % v for v in {*stages, *mbs}}
    ts = _us_pieces(start[rows])
    dur = _us_pieces(end[rows] - start[rows])
    lines = list(map("".join, zip(
        repeat('{"ph":"X","name":'), map(_q, c.name[rows]), map(track.__getitem__, zip(cats, ranks)), *ts,
        repeat(',"dur":'), *dur, map(args.__getitem__, zip(steps, kinds)), map(number.__getitem__, stages),
        repeat(',"microbatch":'), map(number.__getitem__, mbs), repeat("}}"))))
    first = rows.start or 0
    for i in np.flatnonzero(~(start_ok[rows] & end_ok[rows])).tolist():
        j = first + i
        t0, t1 = float(c.start[j]), float(c.end[j])
        if isfinite(t0) and isfinite(t1):  # finite, past whole_ns's range
            t0, t1 = round(t0 * 1e9), round(t1 * 1e9)
            ts, dur = _us(t0), _us(t1 - t0)
        else:
            ts, dur = _us(_ns(t0)), "null"
        lines[i] = _X % (_q(c.name[j]), _q(c.cat[j]), c.rank[j] // pp, c.rank[j], ts, dur, c.step[j], _q(c.kind[j]),
                         c.stage[j], c.microbatch[j])
    return lines


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
    where a time is not finite. (`_flows` does the same a column at a time.)"""
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


# flows as (source ranks, destination ranks, the producer's name, whether an activation (else a
# gradient), s, f): s and f in ns
Flows = tuple[np.ndarray, np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray]


def _flows(c: Columns, pp: int, start: np.ndarray, end: np.ndarray, ok: np.ndarray) -> Flows:
    """Every message (`_message_rows`) at `_flow_times`, the ones it gives None left out: its
    cases as masks over the messages (`start`, `end`: whole_ns of the columns, `ok` where both
    hold); a message with a time past whole_ns's range alone."""
    src, dst, producer, activation = _message_rows(c, pp)
    s0, s1, d0, d1 = start[src], end[src], start[dst], end[dst]
    s, f = np.maximum(s1 - 1, s0), np.minimum(d0 + 1, d1)
    inside = f >= s
    running = ~inside & (d1 - 1 >= s)  # the consumer was running when the send ended
    ended = ~inside & ~running & (d1 - 1 >= s0 + 1)  # the consumer ended while the send was on
    keep = (inside | running | ended) & ok[src] & ok[dst]
    ts = np.where(ended, d1 - 1, s)
    tf = np.where(inside, f, ts)
    finite = np.isfinite(c.start) & np.isfinite(c.end)
    far = np.flatnonzero(~(ok[src] & ok[dst]) & finite[src] & finite[dst]).tolist()  # past whole_ns's range
    if far:
        ts, tf = ts.astype(object), tf.astype(object)  # Python ints
    for i in far:
        at = _flow_times(*(Event(0, 0, "", "", "", 0, 0, float(c.start[j]), float(c.end[j])) for j in (src[i], dst[i])))
        if at is not None:
            keep[i] = True
            ts[i], tf[i] = at
    rows = np.flatnonzero(keep)
    rank = c.rank_array
    return rank[src[rows]], rank[dst[rows]], [producer[i] for i in rows.tolist()], activation[rows], ts[rows], tf[rows]


def _flow_lines(flows: Flows, rows: slice, pp: int) -> list[str]:
    """A flow (s and f: two lines in one string, ids from 1) per message of `rows`. Names are a
    word and an action's numbers and letter: nothing to escape."""
    src, dst, producer, activation, ts, tf = (x[rows] for x in flows)
    src, dst = src.tolist(), dst.tolist()
    track = {r: ',"pid":%d,"tid":%d,"ts":' % (r // pp, r) for r in {*src, *dst}}
    first = (rows.start or 0) + 1
    ids = list(map(str, range(first, first + len(producer))))
    word = activation.astype(np.intp)
    message = repeat('","cat":"message","id":')
    return list(map("".join, zip(
        _FLOW_S[word].tolist(), producer, message, ids, map(track.__getitem__, src), *_us_pieces(ts),
        _FLOW_F[word].tolist(), producer, message, ids, map(track.__getitem__, dst), *_us_pieces(tf), repeat("}"))))


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
