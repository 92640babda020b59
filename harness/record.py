"""Record a job: result.json and trace.json (Perfetto; capped), written atomically. The Gantt
chart (gantt.png) is harness/gantt.py, the wandb run harness/wandb_log.py (log_wandb, also
importable from here)."""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import socket
import stat
import subprocess
import tempfile
from collections import Counter
from operator import attrgetter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable

from harness.jsonsafe import strict
from harness.result import Env
from harness.trace import Event, Trace

if TYPE_CHECKING:
    from harness.plan import Plan

RESULT, TRACE, GANTT, RUNNING = "result.json", "trace.json", "gantt.png", "running.json"


# New files get the usual permissions (0666 less the umask) rather than mkstemp's 0600.
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, write: Callable[[IO], object], binary: bool = False) -> None:
    """`write(f)` into a temporary file in the same directory, flushed and fsync'd, then
    renamed over `path`: a reader (or a crash) never sees half a file, and no temporary file
    is left behind when `write` raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: object) -> None:
    """Strict JSON through write_atomic (a reader never sees half a file): NaN and Infinity
    are not JSON, so a non-finite number is written as null, and a record (a dict) lists
    why under `nulls`."""
    reasons: list[str] = []
    data = strict(data, reasons)
    if reasons and isinstance(data, dict):
        data["nulls"] = reasons
    write_atomic(path, lambda f: json.dump(data, f, indent=1, default=str, allow_nan=False))


@functools.lru_cache(maxsize=1)
def _git_commit() -> str | None:
    """The harness's commit, asked once per process: the code that runs is what was imported
    (and a fork of this process per job costs ~10 ms)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(plan: "Plan") -> Env:
    import torch

    device, world = plan.device, plan.world
    commit = _git_commit()
    if plan.simulated:  # nothing ran on a device: what was modeled
        cluster = plan.config.cluster
        name = f"simulated ({f'cluster={cluster.name}' if cluster is not None else 'comm.*'})"
    elif device == "cuda":
        name = torch.cuda.get_device_name(0)
    else:
        name = platform.processor() or platform.machine()
    return Env(torch=torch.__version__, python=platform.python_version(), device=device, device_name=name,
               world_size=world, git_commit=commit, hostname=socket.gethostname(), cpu_count=os.cpu_count(),
               cores=plan.cores, ranks_on_host=plan.ranks_on_host, oversubscribed=plan.oversubscribed)


# trace.json holds at most this many events (complete + counter): ~165 bytes each, so ~33 MB,
# which Perfetto opens in seconds. A step of interleaved 1F1B at pp=32, M=512 is 65,536
# events (3 of its 6 steps are kept); uncapped, a long or deep run is a file no viewer opens.
MAX_TRACE_EVENTS = 200_000


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


def write_trace_json(path: Path, trace: Trace, memory: list[tuple[int, int, float, int]] = (), pp: int = 0,
                     max_events: int | None = MAX_TRACE_EVENTS) -> dict:
    """Chrome trace-event JSON: one process per dp replica, one track per rank in it, one
    complete event (ph X) per action, and a counter track (ph C) per rank of activation bytes
    held (memory: (rank, step, s, bytes)). Global rank = replica * pp + pipeline rank.

    Capped so that a viewer opens it: at most `max_events` X and C events together
    (MAX_TRACE_EVENTS by default; None: no cap). Whole steps are kept from the last one
    backwards while they fit, each with its memory samples; earlier steps are dropped. If the
    last step alone is over the cap, it alone is written, cut to its first `max_events` events
    in time order (`truncated_step`). Returns what was kept, also written in the file under
    `otherData.trace_cap`: {"steps_kept": [...], "steps_dropped": n, "events_written": n,
    "events_dropped": n, "max_events": cap, "truncated_step": step or None}."""
    memory = list(memory)
    ranks = sorted({e.rank for e in trace} | {m[0] for m in memory})
    pp = pp or len(ranks) or 1
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
    cap = {"steps_kept": steps_kept, "steps_dropped": len(count) - len(steps_kept), "events_written": written,
           "events_dropped": total - written, "max_events": max_events, "truncated_step": truncated}

    # One event a line, formatted here rather than built as dicts for json.dumps: 2x faster.
    # Strings escaped and quoted as json.dumps does.
    q = json.encoder.encode_basestring_ascii
    compact = {"separators": (",", ":")}
    meta = [json.dumps({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"pipeline (dp replica {d})"}},
                       **compact) for d in sorted({r // pp for r in ranks})]
    meta += [json.dumps({"ph": "M", "name": "thread_name", "pid": r // pp, "tid": r,
                         "args": {"name": f"rank {r} (pipeline rank {r % pp})"}}, **compact) for r in ranks]
    # floats as %r, what json writes for them (a chunk with a non-finite one is formatted again
    # with those as null); ts, dur in microseconds
    x = '{"ph":"X","name":%s,"cat":%s,"pid":%d,"tid":%d,"ts":%r,"dur":%r,"args":{"step":%d,"kind":%s,"stage":%d,"microbatch":%d}}'
    c = '{"ph":"C","name":"activations rank %d","pid":%d,"tid":%d,"ts":%r,"args":{"MiB":%r}}'
    x_null, c_null = x.replace("%r", "%s"), c.replace("%r", "%s")  # for _num's "null"

    def xs(evs: Trace, finite: bool) -> list[str]:
        if finite:
            return [x % (q(e.name), q(e.cat), e.rank // pp, e.rank, e.start * 1e6, (e.end - e.start) * 1e6, e.step,
                         q(e.kind), e.stage, e.microbatch) for e in evs]
        return [x_null % (q(e.name), q(e.cat), e.rank // pp, e.rank, _num(e.start * 1e6),
                          _num((e.end - e.start) * 1e6), e.step, q(e.kind), e.stage, e.microbatch) for e in evs]

    def cs(samples: list, finite: bool) -> list[str]:
        if finite:
            return [c % (rank, rank // pp, rank, t * 1e6, nbytes / 2**20) for rank, _step, t, nbytes in samples]
        return [c_null % (rank, rank // pp, rank, _num(t * 1e6), _num(nbytes / 2**20))
                for rank, _step, t, nbytes in samples]

    n = 20_000  # events formatted and written at a time: no second copy of the whole file in memory
    parts = [(xs, trace[i:i + n]) for i in range(0, len(trace), n)] + [
        (cs, memory[i:i + n]) for i in range(0, len(memory), n)]
    head = '{"displayTimeUnit":"ms","otherData":{"trace_cap":%s},"traceEvents":[\n' % json.dumps(cap, **compact)

    def write(out: IO) -> None:
        out.write(head)
        out.write(",\n".join(meta))
        sep = ",\n" if meta else ""
        for fmt, items in parts:
            text = ",\n".join(fmt(items, True))
            if ("nan" in text or "inf" in text) and _NON_FINITE.search(text):
                text = ",\n".join(fmt(items, False))
            out.write(sep + text)
            sep = ",\n"
        out.write("\n]}\n")

    write_atomic(path, write)
    return cap


_NON_FINITE = re.compile(r'[:,](?:-?inf|nan)[,}]')


def _num(v: float) -> str:
    """A JSON number: repr of a finite float (what json.dumps writes), null otherwise."""
    return float.__repr__(v) if v == v and v not in (float("inf"), float("-inf")) else "null"


def read_trace(path: Path) -> Trace:
    """trace.json (write_trace_json) back into events; ValueError for anything but a regular
    file (a FIFO would block the reader)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"{path.name}: not a regular file")
    return [Event(e["tid"], e["args"]["step"], e["name"], e["cat"], e["args"]["kind"], e["args"]["stage"],
                  e["args"]["microbatch"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
            for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
