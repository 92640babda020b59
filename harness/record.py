"""Record a job: result.json and trace.json (Perfetto; capped), written atomically, and the
wandb run. The Gantt chart (gantt.png) is harness/gantt.py."""

from __future__ import annotations

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

from harness.result import Env, PlanRecord
from harness.trace import Event, Trace

if TYPE_CHECKING:
    from harness.plan import Plan

RESULT, TRACE, GANTT = "result.json", "trace.json", "gantt.png"


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
    """JSON through write_atomic: a reader never sees half a file."""
    write_atomic(path, lambda f: json.dump(data, f, indent=1, default=str))


def environment(plan: "Plan") -> Env:
    import torch

    device, world = plan.device, plan.world
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    name = torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine())
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
    # Strings escaped and quoted as json.dumps does; floats as repr, as json writes them (a
    # chunk with a non-finite one is formatted again with those as null: NaN is not JSON).
    q = json.encoder.encode_basestring_ascii
    compact = {"separators": (",", ":")}
    meta = [json.dumps({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"pipeline (dp replica {d})"}},
                       **compact) for d in sorted({r // pp for r in ranks})]
    meta += [json.dumps({"ph": "M", "name": "thread_name", "pid": r // pp, "tid": r,
                         "args": {"name": f"rank {r} (pipeline rank {r % pp})"}}, **compact) for r in ranks]
    x = ('{"ph":"X","name":%s,"cat":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,'  # ts, dur in microseconds
         '"args":{"step":%d,"kind":%s,"stage":%d,"microbatch":%d}}')
    c = '{"ph":"C","name":"activations rank %d","pid":%d,"tid":%d,"ts":%s,"args":{"MiB":%s}}'

    def xs(evs: Trace, f: Callable[[float], str]) -> list[str]:
        return [x % (q(e.name), q(e.cat), e.rank // pp, e.rank, f(e.start * 1e6), f((e.end - e.start) * 1e6),
                     e.step, q(e.kind), e.stage, e.microbatch) for e in evs]

    def cs(samples: list, f: Callable[[float], str]) -> list[str]:
        return [c % (rank, rank // pp, rank, f(t * 1e6), f(nbytes / 2**20)) for rank, _step, t, nbytes in samples]

    n = 20_000  # events formatted and written at a time: no second copy of the whole file in memory
    parts = [(xs, trace[i:i + n]) for i in range(0, len(trace), n)] + [
        (cs, memory[i:i + n]) for i in range(0, len(memory), n)]
    head = '{"displayTimeUnit":"ms","otherData":{"trace_cap":%s},"traceEvents":[\n' % json.dumps(cap, **compact)

    def write(out: IO) -> None:
        out.write(head)
        out.write(",\n".join(meta))
        sep = ",\n" if meta else ""
        for fmt, items in parts:
            text = ",\n".join(fmt(items, float.__repr__))
            if ("nan" in text or "inf" in text) and _NON_FINITE.search(text):
                text = ",\n".join(fmt(items, _num))
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


def log_wandb(result: dict, out_dir: Path, group: str, name: str, mode: str, project: str,
              entity: str | None) -> str | None:
    """One wandb run per job, wandb imported only when enabled; returns the run's directory
    (offline, the default: <job dir>/wandb/offline-run-*/, what `wandb sync` takes).

    group = sweep name, job_type = schedule, name = the job's override string, config = the
    resolved config. Summary: `status`, `error`, `wall_s`, and every leaf of result.json's
    `metrics` under its path joined by "/" (`bubble/measured`, `memory/peak_activation_bytes_per_rank`),
    lists kept whole as in result.json, plus `<key>/max` for each list of numbers (a scalar a
    chart can plot: the fullest or slowest rank, the worst step). History: `loss` per step,
    warm-up included. Media: `gantt` (image), `stages` (table, one row per rank), and
    trace.json as an artifact of type `trace`."""
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    def flat(d: dict, prefix: str = "") -> dict:
        out: dict = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out |= flat(v, f"{prefix}{k}/")
                continue
            out[prefix + k] = v
            if k != "losses" and isinstance(v, list) and v and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                out[f"{prefix}{k}/max"] = max(v)
        return out

    cfg, m = result["config"], result.get("metrics")
    # console off and no system stats: the job has finished when this runs, so wandb would
    # sample nothing but itself
    settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False)
    run = wandb.init(project=project, entity=entity, mode=mode, dir=str(out_dir), group=group, name=name,
                     job_type=cfg["schedule"]["name"], config=cfg, settings=settings, reinit="finish_previous")
    try:
        run.summary.update({"status": result["status"], "error": result.get("error"),
                            "wall_s": result.get("wall_s"), **flat(m or {})})
        if not m:
            return str(Path(run.dir).parent)
        for i, loss in enumerate(m.get("losses") or []):
            run.log({"loss": loss}, step=i)
        media: dict = {}
        if (out_dir / GANTT).exists():
            media["gantt"] = wandb.Image(str(out_dir / GANTT))
        if result.get("plan"):
            plan = PlanRecord(**result["plan"])
            ops, peaks = m.get("mean_op_s") or {}, m["memory"]["peak_activation_bytes_per_rank"]

            def op_s(kinds: str, stages: list[int]) -> float | None:
                """Mean seconds per microbatch of these kinds over a rank's stages (chunks)."""
                present = [k for k in kinds if k in ops]
                return sum(ops[k][s] for k in present for s in stages) if present else None

            rows = []
            for rank, bubble in enumerate(m["bubble"]["measured_per_rank"]):
                stages = plan.stages_of(rank)
                # backward: B, or input + weight gradient (I + W) for the split, zero-bubble schedules
                rows.append([rank, plan.layers_label(rank, len(m["bubble"]["measured_per_rank"])), bubble,
                             peaks[rank] if peaks else None, op_s("F", stages), op_s("BIW", stages)])
            media["stages"] = wandb.Table(columns=["rank", "layers", "bubble_measured", "peak_activation_bytes",
                                                   "mean_fwd_s", "mean_bwd_s"], data=rows)
        if media:
            run.log(media)
        if (out_dir / TRACE).exists():
            art = wandb.Artifact(f"trace-{run.id}", type="trace", description="Perfetto trace of the job")
            art.add_file(str(out_dir / TRACE))
            run.log_artifact(art)
        return str(Path(run.dir).parent)
    finally:
        run.finish()
