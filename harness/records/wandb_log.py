"""A job's wandb run (log_wandb), which never changes the job's status or the sweep's exit
code: whatever goes wrong in wandb becomes one line on stderr,
`harness: warning: wandb: <why>; records are in <job dir>`, and the job goes on.

Time is bounded. Before an online run, the API key is looked up without prompting and the
W&B host (or the proxy to it) is connected to within CONNECT_TIMEOUT_S; a job that cannot go
online is logged offline instead (under its directory, for `wandb sync` later) and says so.
wandb.init waits at most INIT_TIMEOUT_S, run.finish at most FINISH_TIMEOUT_S for uploads.

Everything wandb writes goes under <job dir>/wandb/: the run, its logs, and the staged copies
of artifact files (WANDB_DATA_DIR), the cache (WANDB_CACHE_DIR) and the artifact directory
(WANDB_ARTIFACT_DIR), set for the call only. A run directory synced later, or moved with its
sweep, still finds its trace."""

from __future__ import annotations

import netrc
import os
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 2.0  # reaching the W&B host (or its proxy) before an online run
# wandb's own variables WANDB_INIT_TIMEOUT and WANDB_FINISH_TIMEOUT override these two
INIT_TIMEOUT_S = 20.0  # wandb.init (wandb's own default: 90 s)
FINISH_TIMEOUT_S = 60.0  # run.finish waiting for uploads; what is left stays on disk for `wandb sync`
UNREACHABLE_TTL_S = 60.0  # a host found unreachable is not tried again for this long (a sweep's next jobs)

# <job dir>/wandb/<name>: where each of wandb's own directories goes while a job is logged
WANDB_DIRS = {"WANDB_DATA_DIR": "data", "WANDB_CACHE_DIR": "cache", "WANDB_ARTIFACT_DIR": "artifacts"}

# unless set: no console chatter, and no telemetry of wandb's own (its exporter holds the
# process's exit up to 30 s when the server is slow)
QUIET = {"WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false"}

_unreachable: dict[tuple[str, int], tuple[float, str]] = {}


def warn(why: str, out_dir: Path) -> None:
    """The one warning line of a job whose wandb run did not go as asked."""
    why = " ".join(str(why).split())
    print(f"harness: warning: wandb: {why[:500]}; records are in {out_dir}", file=sys.stderr, flush=True)


def _why(e: BaseException | None) -> str:
    text = str(e) if e is not None else ""
    return f"{type(e).__name__}: {text}" if text and text != "<no message>" else type(e).__name__


@contextmanager
def wandb_environment(out_dir: Path) -> Iterator[None]:
    """WANDB_DATA_DIR, WANDB_CACHE_DIR, WANDB_ARTIFACT_DIR under <out_dir>/wandb/ (and QUIET's
    variables unless set) for the block only; the previous values come back after."""
    new = {k: str(Path(out_dir).resolve() / "wandb" / d) for k, d in WANDB_DIRS.items()}
    new |= {k: v for k, v in QUIET.items() if k not in os.environ}
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _base_url() -> str:
    """The W&B server wandb would use (WANDB_BASE_URL, its settings file, or its default)."""
    try:
        from wandb.sdk import wandb_setup

        return str(wandb_setup.singleton().settings.base_url)
    except Exception:  # noqa: BLE001 - an older or newer wandb: its documented variable and default
        return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def credentials_problem(base_url: str) -> str | None:
    """Why an online run would stop at login (no API key, or a malformed one), or None.
    Never prompts: a sweep has no one to answer."""
    try:
        from wandb.sdk.lib.wbauth import authenticate

        auth = authenticate.authenticate_session(host=base_url, source="harness", prompt=False,
                                                 update_session=False)
    except (ImportError, AttributeError, TypeError):  # wandb's internals moved: look where they look
        host = urlsplit(base_url).hostname or ""
        try:
            auth = os.environ.get("WANDB_API_KEY") or (netrc.netrc().authenticators(host) or (None,) * 3)[2]
        except (OSError, netrc.NetrcParseError):
            auth = None
    except Exception as e:  # noqa: BLE001 - wandb says why the key it found is unusable
        return f"the API key for {base_url} is unusable ({_why(e)})"
    return None if auth else f"no API key for {base_url} (`wandb login`, or WANDB_API_KEY)"


def _endpoint(base_url: str) -> tuple[str, int, str]:
    """(host, port, what) to connect to for base_url: the proxy when one is set for it."""
    u = urlsplit(base_url)
    host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(u.scheme)
    if proxy and host and not urllib.request.proxy_bypass(host):
        p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if p.hostname:
            return p.hostname, p.port or 80, f"the proxy {p.hostname}:{p.port or 80} to {base_url}"
    return host, port, base_url


def reach_problem(base_url: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why base_url's host (or the proxy to it) cannot be reached, found within `timeout`
    seconds (name lookup included: it runs in a thread that is abandoned when late), or None.
    A failure is remembered for UNREACHABLE_TTL_S, so the next jobs of a sweep do not wait."""
    host, port, what = _endpoint(base_url)
    if not host:
        return f"no host in the W&B base URL {base_url!r}"
    seen = _unreachable.get((host, port))
    if seen and time.monotonic() - seen[0] < UNREACHABLE_TTL_S:
        return seen[1]
    box: dict = {}

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            box["ok"] = True
        except Exception as e:  # noqa: BLE001 - said in the warning, never a thread's traceback
            box["error"] = e

    t = threading.Thread(target=connect, name="harness-wandb-reach", daemon=True)
    t.start()
    t.join(timeout)
    if box.get("ok"):
        _unreachable.pop((host, port), None)
        return None
    detail = _why(box["error"]) if "error" in box else f"no answer within {timeout:g} s"
    why = f"cannot reach {what} ({detail})"
    _unreachable[(host, port)] = (time.monotonic(), why)
    return why


def online_problem() -> str | None:
    """Why an online run would fail or hang now (credentials first, then the network), or None."""
    base_url = _base_url()
    return credentials_problem(base_url) or reach_problem(base_url)


def log_wandb(result: dict, out_dir: Path, group: str, name: str, mode: str, project: str,
              entity: str | None) -> str | None:
    """One wandb run per job, wandb imported only when enabled; returns the run's directory
    (offline, the default: <job dir>/wandb/offline-run-*/, what `wandb sync` takes), or None
    when there is none. Never raises (but KeyboardInterrupt): a problem is one warning line.

    mode=online first checks the API key and the host (online_problem); when either fails, or
    wandb.init online fails, the run is written offline instead and the warning says so.

    group = sweep name, job_type = schedule, name = the job's override string, config = the
    resolved config. Summary: `status`, `error`, `wall_s`, and every leaf of result.json's
    `metrics` under its path joined by "/" (`bubble/measured`, `memory/peak_activation_bytes_per_rank`),
    lists kept whole as in result.json, plus `<key>/max` for each list of numbers (a scalar a
    chart can plot: the fullest or slowest rank, the worst step). History (`history_rows`):
    per step, against the step as its x-axis (`step`, wandb.define_metric), `loss` (warm-up
    included) and per measured step `per_step/*`: step time, bubble, throughput, TFLOP/s and
    MFU per device, peak activation memory. Media: `gantt` (image), `stages` (table, one row
    per rank), `memory` (table: every byte of every global rank, measured and theory), and
    trace.json as an artifact of type `trace`."""
    if mode == "disabled":
        return None
    out_dir = Path(out_dir)
    note = None  # why the run is not what was asked (online written offline)
    try:
        with wandb_environment(out_dir):
            try:
                import wandb  # noqa: F401
            except Exception as e:  # noqa: BLE001
                warn(f"cannot import wandb ({_why(e)})", out_dir)
                return None
            if mode == "online" and (note := online_problem()):
                mode = "offline"
            try:
                run_dir = _write_run(result, out_dir, group, name, mode, project, entity)
            except _InitError as e:
                if mode != "online":
                    raise
                note = f"online wandb.init failed ({_why(e.__cause__)}; wandb/debug-internal.log says more)"
                mode = "offline"
                run_dir = _write_run(result, out_dir, group, name, mode, project, entity)
    except Exception as e:  # noqa: BLE001 - the records on disk are what counts
        start = isinstance(e, _InitError)
        warn(f"{note + '; then ' if note else ''}the {mode} run could not {'start' if start else 'be written'} "
             f"({_why(e.__cause__ if start else e)})", out_dir)
        return None
    if note:
        warn(f"{note}; logged offline to {os.path.relpath(run_dir, out_dir)} instead (`wandb sync` it later)",
             out_dir)
    return run_dir


def summary_metrics(metrics: dict, prefix: str = "") -> dict:
    """The run summary's metrics: every leaf of result.json's `metrics` under its path joined by
    "/" (`bubble/measured`), lists whole, and `<key>/max` beside each list of numbers but
    `losses` (`memory/peak_activation_bytes_per_rank/max`). The names harness.records.dashboard plots."""
    out: dict = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out |= summary_metrics(v, f"{prefix}{k}/")
            continue
        out[prefix + k] = v
        if k != "losses" and isinstance(v, list) and v and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out[f"{prefix}{k}/max"] = max(v)
        if k in ("measured_per_rank", "theory_per_rank") and isinstance(v, list) and v and isinstance(v[0], dict):
            # per-rank byte breakdowns: the fullest rank's bytes of each part, as plottable scalars
            # (`memory/measured_per_rank/peak/max`)
            for part in v[0]:
                values = [r.get(part) for r in v if isinstance(r, dict)]
                if values and all(isinstance(x, (int, float)) for x in values):
                    out[f"{prefix}{k}/{part}/max"] = max(values)
    return out


# The history's x-axis (wandb.define_metric's step_metric): the training step, warm-up steps
# included (step_times_s[i] is step warmup_steps + i); and the prefix of the per-step metrics
# (apart from the summary's names: the summary keeps result.json's aggregates).
STEP, PER_STEP = "step", "per_step"
# per measured step: what it is (result.json's metric it comes from)
PER_STEP_METRICS = {
    f"{PER_STEP}/time_s": "metrics.step_times_s: the step, first event to last of any rank, optimizer included",
    f"{PER_STEP}/bubble": "metrics.bubble.measured_per_step: the idle share of the step window, mean over ranks",
    f"{PER_STEP}/throughput_samples_s": "samples per step (M x B x dp) / the step's time",
    f"{PER_STEP}/throughput_tokens_s": "tokens per step / the step's time (token models)",
    f"{PER_STEP}/tflops_per_device": "metrics.flops: model FLOPs per step / the step's time / devices / 1e12",
    f"{PER_STEP}/mfu": "that / the device's dense peak (where known)",
    f"{PER_STEP}/peak_activation_bytes": "the most activation bytes a rank of replica 0 held in the step (trace.json's "
                                          "otherData.peak_activation_bytes_per_step, where metered)",
}
# the same per pipeline rank of replica 0 (result.json's `_per_rank`), hidden from wandb's
# automatic charts: `per_step/peak_activation_bytes/rank_<r>`
RANK_PEAK = f"{PER_STEP}/peak_activation_bytes/rank_"


def history_rows(result: dict, out_dir: Path | None = None) -> list[dict]:
    """The run's history, one row per step in order, each with `step`: `loss` for every step
    that has one (warm-up included), and for each measured step (step_times_s[i] is step
    warmup_steps + i; executor=sim repeats its one simulated step) the PER_STEP_METRICS the
    record has: throughput, TFLOP/s and MFU are the record's own at its median step scaled by
    median / this step's time. Memory comes from <out_dir>/trace.json's per-step peaks, which
    write_trace_json takes from every sample of the activation meter (none: executor=sim, or a
    runner that cannot meter)."""
    m = result.get("metrics") or {}
    cfg = result.get("config") or {}
    rows: dict[int, dict] = {}

    def row(step: int) -> dict:
        return rows.setdefault(step, {STEP: step})

    for step, loss in enumerate(m.get("losses") or []):
        if loss is not None:
            row(step)["loss"] = loss
    times = m.get("step_times_s") or []
    bubbles = (m.get("bubble") or {}).get("measured_per_step") or []
    flops = m.get("flops") or {}
    median = m.get("step_time_s")
    first = int(cfg.get("warmup_steps") or 0)
    peaks = _peaks_per_step(out_dir, int(cfg.get("pp") or 0))
    for i, t in enumerate(times):
        r = row(first + i)
        if not isinstance(t, (int, float)) or not t > 0:
            continue
        r[f"{PER_STEP}/time_s"] = t
        if i < len(bubbles) and bubbles[i] is not None:
            r[f"{PER_STEP}/bubble"] = bubbles[i]
        scale = median / t if isinstance(median, (int, float)) else None
        for key, value in (("throughput_samples_s", m.get("throughput_samples_s")),
                           ("throughput_tokens_s", m.get("throughput_tokens_s")),
                           ("tflops_per_device", flops.get("tflops_per_device")), ("mfu", flops.get("mfu"))):
            if scale is not None and isinstance(value, (int, float)):
                r[f"{PER_STEP}/{key}"] = value * scale
        if (step_peaks := peaks.get(first + i)) is not None:
            r[f"{PER_STEP}/peak_activation_bytes"] = max(step_peaks.values())
            r |= {f"{RANK_PEAK}{rank}": b for rank, b in sorted(step_peaks.items())}
    return [rows[s] for s in sorted(rows)]


def _peaks_per_step(out_dir: Path | None, pp: int) -> dict[int, dict[int, int]]:
    """step -> pipeline rank of replica 0 -> its peak activation bytes in the step, from
    trace.json (empty where there is none, or it has no per-step peaks: an older file)."""
    from harness.records.record import TRACE
    from harness.measure.trace_json import read_trace_meta

    if out_dir is None or not (Path(out_dir) / TRACE).is_file():
        return {}
    try:
        per_step = read_trace_meta(Path(out_dir) / TRACE).get("peak_activation_bytes_per_step") or {}
    except (OSError, ValueError):
        return {}
    out = {}
    for step, per_rank in per_step.items():
        ranks = per_rank[:pp] if pp else per_rank
        got = {r: b for r, b in enumerate(ranks) if isinstance(b, int)}
        if got:
            out[int(step)] = got
    return out


def _log_history(run, rows: list[dict]) -> None:
    """rows (history_rows) against `step`: each metric's x-axis set with define_metric; the
    per-step metrics leave the summary alone (its aggregates are result.json's)."""
    keys = dict.fromkeys(k for r in rows for k in r if k != STEP)
    if not keys:
        return
    run.define_metric(STEP, hidden=True)
    for k in keys:
        if k == "loss":
            run.define_metric(k, step_metric=STEP)
        else:
            run.define_metric(k, step_metric=STEP, summary="none", hidden=k.startswith(RANK_PEAK) or None)
    for r in rows:
        run.log(r, step=r[STEP])


class _InitError(Exception):
    """wandb.init failed (its exception is the cause): nothing was logged yet."""


def _write_run(result: dict, out_dir: Path, group: str, name: str, mode: str, project: str,
               entity: str | None) -> str:
    import wandb

    from harness.records.record import GANTT, TRACE
    from harness.records.result import PlanRecord

    cfg, m = result["config"], result.get("metrics")
    # console off and no system stats: the job has finished when this runs, so wandb would
    # sample nothing but itself
    # bounded waits, unless set with wandb's own variables (WANDB_INIT_TIMEOUT, WANDB_FINISH_TIMEOUT)
    timeouts = {k: v for k, v in (("init_timeout", INIT_TIMEOUT_S), ("finish_timeout", FINISH_TIMEOUT_S))
                if f"WANDB_{k.upper()}" not in os.environ}
    settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False, **timeouts)
    try:
        run = wandb.init(project=project, entity=entity, mode=mode, dir=str(out_dir), group=group, name=name,
                         job_type=cfg["schedule"]["name"], config=cfg, settings=settings, reinit="finish_previous")
    except Exception as e:  # noqa: BLE001
        _teardown()
        raise _InitError() from e
    try:
        run.summary.update({"status": result["status"], "error": result.get("error"),
                            "wall_s": result.get("wall_s"), **summary_metrics(m or {})})
        if not m:
            return str(Path(run.dir).parent)
        _log_history(run, history_rows(result, out_dir))
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
        mem = m.get("memory") or {}
        if mem.get("theory_per_rank"):  # every byte of every global rank, measured beside theory
            parts = ("params", "grads", "optimizer", "activations", "peak")
            measured = mem.get("measured_per_rank") or [{}] * len(mem["theory_per_rank"])
            media["memory"] = wandb.Table(
                columns=["global_rank", *parts, *(f"theory_{p}" for p in parts)],
                data=[[g, *((meas or {}).get(p) for p in parts), *(theory[p] for p in parts)]
                      for g, (meas, theory) in enumerate(zip(measured, mem["theory_per_rank"]))])
        if media:
            run.log(media)
        if (out_dir / TRACE).exists():
            art = wandb.Artifact(f"trace-{run.id}", type="trace", description="Perfetto trace of the job")
            art.add_file(str(out_dir / TRACE))
            run.log_artifact(art)
        return str(Path(run.dir).parent)
    finally:
        try:
            run.finish()
        finally:
            _teardown()


def _teardown() -> None:
    """End wandb's service process: the next job starts its own, under its own directory
    (the service writes its log into WANDB_CACHE_DIR and keeps the environment it started with)."""
    try:
        import wandb

        wandb.teardown()
    except Exception:  # noqa: BLE001 - nothing left to save
        pass
