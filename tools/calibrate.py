"""`python -m tools.calibrate [--out harness/conf/cluster/here.yaml]`: measure this
machine as a cluster (`cluster=here`), so predictions for it use its real figures.

What is measured (each fitted figure written with the raw points beside it):
- point to point over gloo between two local processes (ping-pong, half the round trip, 1 KB to
  8 MB): latency + bytes / bandwidth, least squares;
- all-reduce over gloo between two local processes (same sizes): the ring model's
  2 (n-1) latency + 2 (n-1)/n bytes / bandwidth at n = 2;
- memory bandwidth of one thread (an in-place add over 64 MB: 3 x 64 MB moved), which prices
  the optimizer step;
- what the harness's native executor adds to the modeled costs, from real jobs
  (harness.job.run_job) of the workload the advisor predicts here, the H200 GPT-2 profile
  replayed on the tiny stand-in GPT (+scenario=h200_emulated, compute=emulated), at 2, 4 and
  8 ranks (EXECUTOR_POINTS; none of them in advise_validate.py's grid): per action (measured mean
  F/B/I/W minus modeled), posting a send (the trace's send slices), each DDP sync beyond the
  ring model (metrics.dp_sync_s minus it: replicas reaching the sync at different times), and,
  fitted to the step times, a receive's cost (with the measured hop, metrics.p2p_hop_s, split
  into send + rest + receive) and a per-step constant (the step window's edges, the
  optimizer's launch); with compute=real, each F and B against the profile's time
  (harness.profile of the same mlp, one thread) as a factor;
- the host: CPU cores, memory (a rank's share: total / cores, less 0.5 GiB for its own
  interpreter and torch).
Every figure depends on how busy the machine is; the file records the load average before and
after. Rerun it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from harness.records.atomic import write_text

CONF = Path(__file__).resolve().parents[1] / "conf" / "cluster" / "here.yaml"
SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 23)


# -- gloo between two processes -------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _comm_worker(rank: int, port: int, sizes: tuple[int, ...], repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out: dict[str, dict[int, float]] = {"p2p": {}, "allreduce": {}}
    for n in sizes:
        x = torch.zeros(n // 4, dtype=torch.float32)
        times = []
        for i in range(repeats + 3):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(x, 1)
                dist.recv(x, 1)
            else:
                dist.recv(x, 0)
                dist.send(x, 0)
            if i >= 3:
                times.append((time.perf_counter() - t0) / 2)
        out["p2p"][n] = statistics.median(times)
        times = []
        for i in range(repeats + 3):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if i >= 3:
                times.append(time.perf_counter() - t0)
        out["allreduce"][n] = statistics.median(times)
    if rank == 0:
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def measure_comm(sizes: tuple[int, ...] = SIZES, repeats: int = 20) -> dict[str, dict[int, float]]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_comm_worker, args=(r, port, sizes, repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        out = queue.get(timeout=300)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


def fit_line(points: dict[int, float], scale: float = 1.0) -> tuple[float, float]:
    """Least squares t = a + scale x bytes / bw -> (a, bw); a >= 0."""
    xs = [scale * float(n) for n in points]
    ys = list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = max(0.0, my - slope * mx)
    return a, (1.0 / slope if slope > 0 else float("inf"))


def memory_bandwidth() -> float:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x, y = torch.ones(1 << 24), torch.ones(1 << 24)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            y.add_(x)
            times.append(time.perf_counter() - t0)
        return 3 * x.numel() * 4 / statistics.median(times)
    finally:
        torch.set_num_threads(threads)


# -- the executor ----------------------------------------------------------------------------
REAL_MLP = {"model.name": "mlp", "model.layers": 8, "model.hidden": 1024}  # advise_validate.py's real-compute model
REAL_B = 16
REAL_SIZES = (8, 16)  # the real group's microbatch sizes (advise_validate.py)
# inrun_profile's M (and advise_validate.py's 2-rank job's): no real grid point's (8 and 16), and
# enough that a step's steady state decides its typical action. The first actions after the
# optimizer step run slower (a 2-rank 1F1B step's third B up to 15%): at M=4, nearly all of them.
PROFILE_MICROBATCHES = 12


def _config(**kw):
    from harness.config import Config, set_keys

    c = Config()
    c.wandb.mode = "disabled"
    c.steps, c.warmup_steps, c.run.timeout_s = 5, 1, 300
    return set_keys(c, **kw)


# The executor's overheads are measured on the workload the advisor predicts here: the H200
# GPT-2 profile replayed on the tiny stand-in GPT (+scenario=h200_emulated) at STAND_IN_SCALE.
# These points are not in advise_validate.py's grid (it searches global batch 16; these are 8 and 4).
STAND_IN_SCALE = 6.0
STAND_IN = ["+scenario=h200_emulated", f"cost.time_scale={STAND_IN_SCALE}", "partition=profile", "wandb.mode=disabled"]
EXECUTOR_POINTS = (  # (schedule, pp, dp, M, B)
    ("1f1b", 2, 1, 8, 1), ("gpipe", 2, 1, 4, 2), ("zb_h1", 2, 1, 4, 2),
    ("1f1b", 4, 1, 8, 1), ("zbv", 4, 1, 4, 2), ("1f1b", 2, 2, 4, 1), ("gpipe", 2, 2, 2, 2),
    ("1f1b", 4, 2, 4, 1),
)


def measure_executor(tmp: Path, repeats: int = 2, log=print) -> dict:
    """The stand-in's emulated jobs at 2, 4 and 8 ranks: per-action excess over the modeled
    cost, send posting, quick receives, the measured hop, DDP sync, the step."""
    rows = []
    for rep in range(repeats):
        for name, pp, dp, m, b in EXECUTOR_POINTS:
            row = executor_job(name, pp, dp, m, b, tmp / f"emu_{name}_{pp}x{dp}_m{m}_{rep}")
            rows.append(row)
            log(f"tools.calibrate: {name} pp={pp} dp={dp} M={m}: step {row['step_s'] * 1e3:.1f} ms, "
                f"action +{row['action_excess_s'] * 1e3:.3f} ms, send {(row['send_s'] or 0) * 1e3:.3f} ms, hop "
                f"{(row['measured_hop_s'] or 0) * 1e3:.3f} ms, sync {(row['dp_sync_s'] or 0) * 1e3:.2f} ms")
    return {"runs": rows}


def executor_job(name: str, pp: int, dp: int, m: int, b: int, d: Path) -> dict:
    """One of the stand-in's emulated jobs: what the executor added to it (per action over the
    modeled cost, posting a send, quick receives, the measured hop, DDP sync) and its step."""
    from harness.frontend.compose import compose_config
    from harness.job import run_job
    from harness.planning.plan import make_plan

    c = compose_config([*STAND_IN, f"schedule={name}", f"pp={pp}", f"dp={dp}", f"microbatches={m}",
                        f"microbatch_size={b}", "steps=4", "warmup_steps=1"])
    r = run_job(c, d, "calibrate", "emu")
    if r.status != "ok":
        raise RuntimeError(f"calibration job {name} pp={pp} dp={dp}: {r.status}: {r.error}")
    plan = make_plan(c)
    mt, e = r.metrics, plan.emulated_cost
    excess = [a - x for k, model in (("F", e.fwd_s), ("B", e.bwd_s), ("I", e.input_grad_s), ("W", e.weight_grad_s))
              if k in mt.mean_op_s for a, x in zip(mt.mean_op_s[k], model)]
    send, recv = send_recv(d / "trace.json", c.warmup_steps)
    return {"schedule": name, "pp": pp, "dp": dp, "microbatches": m, "world": pp * dp,
            "step_s": statistics.median(mt.step_times_s), "config": _dict(plan.config),
            "action_excess_s": statistics.median(excess), "measured_hop_s": mt.p2p_hop_s,
            "send_s": send, "quick_recv_s": recv, "dp_sync_s": mt.dp_sync_s}


def inrun_profile(path: Path, work: Path, sizes: tuple[int, ...] = REAL_SIZES, log=print, steps: int = 4) -> Path:
    """The real-compute mlp profiled INSIDE the native executor: one pp=1 job per microbatch
    size (M=PROFILE_MICROBATCHES, compute=real), the stage's F and B in a typical step
    (step_medians) split evenly over its layers (the mlp's layers are identical: same
    parameters, same FLOPs), B also as a step's first and its others. harness.profile times
    each layer alone, without what the runtime adds to every action (each backward accumulating
    into .grad, a memory-bound pass over the parameters; the memory meter's hooks): here its
    backward came out 2-3x below the runtime's, so real compute is priced from the runtime."""
    from harness.job import run_job

    by: dict[str, dict[str, float]] = {}
    L = int(REAL_MLP["model.layers"])
    for b in sizes:
        c = _config(pp=1, dp=1, microbatches=PROFILE_MICROBATCHES, microbatch_size=b, compute="real", steps=steps,
                    **REAL_MLP)
        r = run_job(c, work / f"inrun_profile_b{b}", "calibrate", "profile")
        if r.status != "ok":
            raise RuntimeError(f"in-run profile B={b}: {r.status}: {r.error}")
        t = step_medians(work / f"inrun_profile_b{b}" / "trace.json", c.warmup_steps, 0)
        by[str(b)] = {"fwd_s": t["F"] / L, "bwd_s": t["B"] / L, "bwd_first_s": t["B_first"] / L,
                      "bwd_rest_s": t["B_rest"] / L, "microbatches": PROFILE_MICROBATCHES}
        log(f"tools.calibrate: in-run profile B={b}: F {by[str(b)]['fwd_s'] * 1e3:.3f} ms, B "
            f"{by[str(b)]['bwd_s'] * 1e3:.3f} ms per layer")
    from harness.model.built import BuiltModel

    built = BuiltModel(c.model)
    model, params = built.model, built.layer_params
    prof = {"device": "cpu (this machine)", "dtype": "torch.float32",
            "measurement": "inside the native executor: python -m harness pp=1 compute=real "
                           f"microbatches={PROFILE_MICROBATCHES}, "
                           "the stage's F and B in a typical step split evenly over its identical layers "
                           "(calibrate.inrun_profile)",
            "model": {"config": {k.split(".", 1)[1]: v for k, v in REAL_MLP.items()}},
            "layers": [{"index": i, "kind": model.kind(i), "params": params[i],
                        "by_microbatch": {k: {**v, "fwd_flops": model.fwd_flops(i, int(k))} for k, v in by.items()}}
                       for i in range(L)]}
    write_text(path, json.dumps(prof, indent=1))
    return path


def step_medians(trace_path: Path, warmup: int, stage: int) -> dict[str, float]:
    """A stage's seconds per action in a typical step of a run's trace.json: for F and B, the
    median over measured steps of the step's mean action (a median, as a run's step time is:
    a burst on this host inflates a mean by 2-3%); for B also the step's first ("B_first") and
    the mean of its others ("B_rest"). The first backward of a step creates each parameter's
    .grad; every later one reads and rewrites it (7-9 ms more here at 8 x 4 MiB of weights:
    10.9 against 18.3 ms at B=8), so a step's mean B depends on its M."""
    from harness.measure.trace_json import read_trace

    steps: dict[int, list] = {}
    for e in read_trace(trace_path):
        if e.kind in ("F", "B") and e.stage == stage and e.step >= warmup:
            steps.setdefault(e.step, []).append(e)

    def median_of(pick) -> float:
        return statistics.median(statistics.fmean(x.dur for x in es if pick(x)) for es in steps.values())

    first = {n: min(x.microbatch for x in es if x.kind == "B") for n, es in steps.items()}
    return {"F": median_of(lambda x: x.kind == "F"), "B": median_of(lambda x: x.kind == "B"),
            "B_first": median_of(lambda x: x.kind == "B" and x.microbatch == first[x.step]),
            "B_rest": median_of(lambda x: x.kind == "B" and x.microbatch != first[x.step])}


def real_scales(profile: Path, pp: int, microbatches: int, b: int, work: Path, steps: int = 5) -> dict:
    """One compute=real mlp job at `pp` ranks (1F1B, `microbatches` of `b`) against the in-run
    `profile`: its stages' F and B in a typical step over the profile's layers (the medians
    over stages): how much slower an action runs with `pp` ranks on the host than alone."""
    from harness.job import run_job
    from harness.planning.plan import make_plan

    layer = json.loads(profile.read_text())["layers"]
    c = _config(pp=pp, dp=1, microbatches=microbatches, microbatch_size=b, compute="real", steps=steps,
                profile=str(profile.resolve()), **{"partition.name": "profile"}, **REAL_MLP)
    r = run_job(c, work, "calibrate", "real")
    if r.status != "ok":
        raise RuntimeError(f"calibration job real pp={pp}: {r.status}: {r.error}")
    ratio: dict[str, list[float]] = {"F": [], "B": []}
    for s, (lo, hi) in enumerate(make_plan(c).stage_layers):
        t = step_medians(work / "trace.json", c.warmup_steps, s)
        for k, key in (("F", "fwd_s"), ("B", "bwd_s")):
            ratio[k].append(t[k] / sum(layer[i]["by_microbatch"][str(b)][key] for i in range(lo, hi)))
    return {"pp": pp, "dp": 1, "world": pp, "fwd_scale": statistics.median(ratio["F"]),
            "bwd_scale": statistics.median(ratio["B"]), "step_s": statistics.median(r.metrics.step_times_s),
            "config": _dict(c)}


def measure_real(tmp: Path, repeats: int = 2, log=print) -> dict:
    """compute=real mlp at 1 and 2 ranks against its in-run profile: F and B over it."""
    path = inrun_profile(tmp / "mlp_inrun_profile.json", tmp, (REAL_B,), log)
    rows = []
    for rep in range(repeats):
        for pp in (1, 2):
            row = real_scales(path, pp, 8, REAL_B, tmp / f"real_{pp}_{rep}")
            rows.append(row)
            log(f"tools.calibrate: real pp={pp}: step {row['step_s'] * 1e3:.1f} ms, F x"
                f"{row['fwd_scale']:.2f}, B x{row['bwd_scale']:.2f} the in-run profile's")
    return {"runs": rows}


def send_recv(trace_path: Path, warmup: int) -> tuple[float | None, float | None]:
    """(median seconds posting a send, median seconds of a receive whose message had been
    posted before it began) over the measured steps of a run's trace.json."""
    d = json.loads(trace_path.read_text())
    events = [e for e in (d["traceEvents"] if isinstance(d, dict) else d)
              if e.get("ph") == "X" and e.get("args", {}).get("step", -1) >= warmup]
    sends = {(e["pid"], e["args"]["step"], e["name"][5:]): e for e in events if e["name"].startswith("send ")}
    quick = []
    for e in events:
        if not e["name"].startswith("recv "):
            continue
        action = e["name"][5:]
        stage, kind, mb = _parse(action)
        producers = [f"{stage - 1}F{mb}"] if kind == "F" else [f"{stage + 1}B{mb}", f"{stage + 1}I{mb}"]
        for name in producers:
            snd = sends.get((e["pid"], e["args"]["step"], name))
            if snd is not None and snd["ts"] + snd["dur"] <= e["ts"]:
                quick.append(e["dur"] / 1e6)
    posted = [e["dur"] / 1e6 for e in sends.values()]
    return (statistics.median(posted) if posted else None, statistics.median(quick) if quick else None)


def _parse(action: str) -> tuple[int, str, int]:
    i = next(j for j, ch in enumerate(action) if ch.isalpha())
    return int(action[:i]), action[i], int(action[i + 1:])


def _dict(c) -> dict:
    from dataclasses import asdict

    return asdict(c)


def _by_world(rows: list[dict], key: str) -> dict[str, float]:
    worlds = sorted({r["world"] for r in rows if r.get(key) is not None})
    return {str(w): max(0.0, statistics.median(r[key] for r in rows if r["world"] == w and r.get(key) is not None))
            for w in worlds}


def here_cluster(comm: dict, membw: float, tables: dict, raw: dict) -> dict:
    """The cluster=here description (a dict, as here.yaml holds it)."""
    import torch

    from harness.planning.plan import host_cores

    lat, bw = fit_line(comm["p2p"])
    ar2, ar_bw = fit_line(comm["allreduce"])  # n = 2: t = 2 a + bytes / bw
    cores = host_cores()
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return {
        "name": "here",
        "description": f"this machine ({platform.node()}): {cores} CPU cores, ranks are processes over gloo",
        "source": f"python -m tools.calibrate, {time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}",
        "device": "cpu",
        "gpus_per_node": 16,  # Config.run.max_processes: ranks one harness forks here
        "nodes": 1,
        "cores": cores,
        "memory_per_gpu_gib": round(ram / cores, 3),
        "memory_reserve_gib": 0.5,
        "memory_bandwidth_Bps": membw,
        "intra": {"latency_s": lat, "bandwidth_Bps": bw},
        "inter": {"latency_s": lat, "bandwidth_Bps": bw},
        "allreduce": "ring",
        "allreduce_intra": {"latency_s": ar2 / 2, "bandwidth_Bps": ar_bw},
        "overhead": tables,
        "calibrated": raw,
    }


def fit_tables(executor: dict, real: dict, base: dict) -> dict:
    """The overhead tables, by ranks on the host. Measured directly: per action (mean F/B/I/W
    over the modeled cost), posting a send, each DDP sync beyond the ring model, real compute's
    F and B over the profile's. Then, per world, the two figures step times pin down best: the
    cost of a receive (each action whose input comes from another rank pays it; a waiting
    consumer's hop is the measured one, so the rest of a hop is it less send and receive) and
    the per-step constant, by least squares of the relative error over that world's jobs."""
    from harness.frontend.compose import cluster_from_dict, config_from_dict

    from harness.advise.search import predict

    parsed: dict[int, object] = {}  # each run's config, parsed once (the fit prices every run ~60 times)

    def predicted(r: dict, cl):
        if id(r) not in parsed:
            parsed[id(r)] = config_from_dict(r["config"])
        return predict(replace(parsed[id(r)], cluster=cl))

    runs = executor["runs"]
    tables = {"action_s": _by_world(runs, "action_excess_s"), "send_s": _by_world(runs, "send_s"),
              "recv_s": {}, "hop_s": {},
              "real_fwd_scale": _by_world(real["runs"], "fwd_scale"), "real_bwd_scale": _by_world(real["runs"], "bwd_scale"),
              "step_s": {}, "allreduce_s": {}}
    cl = cluster_from_dict({**base, "overhead": tables})
    skew = [{"world": r["world"], "excess": r["dp_sync_s"] - predicted(r, cl).allreduce_s} for r in runs
            if r["dp"] > 1 and r["dp_sync_s"] is not None]
    tables["allreduce_s"] = _by_world(skew, "excess")
    for world in sorted({r["world"] for r in runs}):
        mine = [r for r in runs if r["world"] == world]
        hop = statistics.median([r["measured_hop_s"] for r in mine if r["measured_hop_s"] is not None] or [0.0])
        send = tables["send_s"].get(str(world), 0.0)
        best = None
        for k in range(0, 61):  # a receive: 0 .. 6 ms in 0.1 ms
            recv = k * 1e-4
            trial = {**tables, "recv_s": {**tables["recv_s"], str(world): recv},
                     "hop_s": {**tables["hop_s"], str(world): max(0.0, hop - send - recv)}}
            cw = cluster_from_dict({**base, "overhead": trial})
            pred = [(r["step_s"], predicted(r, cw).step_time_s) for r in mine]
            const = statistics.median(m - x for m, x in pred)
            err = sum(((x + const) / m - 1) ** 2 for m, x in pred)
            if best is None or err < best[0]:
                best = (err, recv, const)
        _, recv, const = best
        tables["recv_s"][str(world)] = recv
        tables["hop_s"][str(world)] = max(0.0, hop - send - recv)
        tables["step_s"][str(world)] = max(0.0, const)
    cl = cluster_from_dict({**base, "overhead": tables})
    for r in real["runs"]:  # real compute's worlds (1, 2): their own per-step constant
        if str(r["world"]) in tables["step_s"] and r["world"] > 1:
            continue
        r["residual_s"] = r["step_s"] - predicted(r, cl).step_time_s
    tables["step_s"].update({k: v for k, v in _by_world([r for r in real["runs"] if "residual_s" in r],
                                                          "residual_s").items() if k not in tables["step_s"]})
    return tables


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _yaml(d: dict) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(d))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=CONF, help="the cluster preset to write (default: cluster=here)")
    ap.add_argument("--repeats", type=int, default=2, help="each executor job this many times")
    ap.add_argument("--work", type=Path, default=Path("runs/calibrate"), help="where the calibration jobs write")
    args = ap.parse_args(argv)
    load0 = load_average()
    log = lambda m: print(m, flush=True)  # noqa: E731
    log("tools.calibrate: gloo point to point and all-reduce between two processes")
    comm = measure_comm()
    membw = memory_bandwidth()
    args.work.mkdir(parents=True, exist_ok=True)
    executor = measure_executor(args.work, args.repeats, log)
    real = measure_real(args.work, args.repeats, log)
    raw = {"p2p_one_way_s_by_bytes": {str(k): v for k, v in comm["p2p"].items()},
           "allreduce_s_by_bytes_2_ranks": {str(k): v for k, v in comm["allreduce"].items()},
           "executor_runs": [{k: v for k, v in r.items() if k != "config"} for r in executor["runs"]],
           "real_runs": [{k: v for k, v in r.items() if k != "config"} for r in real["runs"]],
           "load_average_before": load0}
    base = here_cluster(comm, membw, {}, raw)
    tables = fit_tables(executor, real, base)
    cluster = here_cluster(comm, membw, tables, raw)
    cluster["calibrated"]["load_average_after"] = load_average()
    header = ("# @package cluster\n# This machine, measured by `python -m tools.calibrate` "
              f"({time.strftime('%Y-%m-%d %H:%M')}, {cluster['description']}).\n"
              "# intra/inter: gloo point to point between two local processes (ping-pong, least squares\n"
              "# latency + bytes / bandwidth); allreduce_intra: gloo all-reduce of two processes, the ring model;\n"
              "# overhead: what the native executor adds to modeled costs, by ranks on the host (see\n"
              "# tools/calibrate.py); calibrated: the raw points. Load average before/after: "
              f"{load0} / {cluster['calibrated']['load_average_after']}.\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, header + _yaml(cluster))
    o = cluster["overhead"]
    log(f"tools.calibrate: p2p {cluster['intra']['latency_s'] * 1e6:.0f} us + "
        f"{cluster['intra']['bandwidth_Bps'] / 1e9:.2f} GB/s, all-reduce {cluster['allreduce_intra']['latency_s'] * 1e6:.0f}"
        f" us/step + {cluster['allreduce_intra']['bandwidth_Bps'] / 1e9:.2f} GB/s, memory {membw / 1e9:.1f} GB/s; "
        f"executor by ranks: action {o['action_s']}, hop {o['hop_s']}, sync {o['allreduce_s']}, step {o['step_s']}, "
        f"real F x{o['real_fwd_scale']}, B x{o['real_bwd_scale']}")
    log(f"tools.calibrate: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
