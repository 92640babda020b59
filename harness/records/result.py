"""result.json as typed records: what a job writes, and how any reader reads it back.

One schema, versioned (`schema_version`); `read` upgrades older records, so no reader
patches them. Per-rank lists end in `_per_rank` and are indexed by pipeline rank (replica
0's, or the mean over replicas where said); `_per_global_rank` by global rank
(replica * pp + pipeline rank). Version history:
- 1 (no `schema_version`): per-rank lists named `_per_stage`, bubble `measured_per_rank`
  by global rank; no schedule or transport in `plan`.
- 2: `_per_rank` / `_per_global_rank` names; `plan.schedule` (every rank's action list),
  `plan.sim_cost` and `plan.p2p`, so a report never plans again.
- 3: a config group holds its option's keys only (model=mlp records no `seq`: harness/config.py
  has one dataclass per option); `plan.simulated` (the timings are the simulator's: a record's
  headline and report come from the record alone); `plan.sim_cost` with the simulator's whole
  cost model (per-direction hops, each stage's gradient sync, the optimizer step, overheads);
  `config.cluster`; `plan.schedule` a string per rank (its actions space-separated: a big
  schedule's record stays a few lines); executor=sim's trace.json holds one measured step
  (every step is the same).
- 4: `metrics.flops`: model and hardware FLOPs per step, achieved TFLOP/s per device, MFU and
  HFU where the device's peak is known (harness/planning/flops.py); older records read it as null.
- 5: `metrics.bubble.steady_measured` and `steady_simulated`: the bubble of overlapped steps
  (each rank's span, first compute start to last compute end, against the longest: the
  zero-bubble paper's bubble rate); older records read them as null. `metrics.intervals`: 95%
  confidence intervals of step time, bubble and throughput over the measured steps.
  `metrics.clock_offset_ns_per_global_rank`, `clock_uncertainty_ns_per_global_rank`,
  `clock_uncertainty_ns` (the worst) and `clock_note` (the bubble flagged where that is > 5% of
  the mean compute action): each rank's clock put on rank 0's (harness/runtime/clock.py); null
  for executor=sim and in older records (one host, one clock). `provenance` (optional, null in
  older records): the point's overrides, the code's commit and dirty flag, a sha256 of every
  file the run reads and when it started (harness/records/record.py `provenance`): what resume compares.
- 6: run control in its own section: `config.run` holds max_processes, start_method, timeout_s,
  resume, rerun, skip_invalid, debug, repeats, fault and clock_skew_s (top-level keys before;
  harness/config.py MOVED). `provenance.point` is the point's identity, the sha256 of its
  resolved config without run control (`<sha256> #2` for a second point of one identity in a
  sweep; its overrides before), and `provenance.identity` (new) the sha256 of that, the code and
  every input file (harness/records/identity.py); `provenance.code.untracked_sha256` (new) the
  harness's untracked files. Older records are read with both computed from their stored config
  and provenance, as a new record's are: resume after the upgrade reruns only what changed.
  Optional, null in older records: `env.host_load`, the host's load over the execution
  (harness/measure/host_load.py: other processes' CPU time from /proc, the load average at both
  ends, and `busy` by its stated rule).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.config import Config, config_from_record
from harness.schedules.ir import Action
from harness.simulate.cost import CostModel

SCHEMA_VERSION = 6
MEASUREMENTS = ("measured", "emulated", "simulated")  # Result.measurement: what made a record's times


def measurement_of(executor: str, compute: str, simulated: bool | None = None) -> str | None:
    """What made a run's times: `simulated` (the simulator, executor=sim: no clock ran),
    `emulated` (workers held each action to its modeled cost, compute=emulated) or `measured`
    (workers timed real compute); None where that is not known yet (compute=auto unplanned)."""
    if simulated if simulated is not None else executor == "sim":
        return "simulated"
    return {"emulated": "emulated", "real": "measured"}.get(compute) if isinstance(compute, str) else None


class RecordError(ValueError):
    """A record that cannot be read as a Result; str() says what is wrong, in one line."""


@dataclass
class HostLoad:
    """What else ran on the host while the run's workers did (harness/measure/host_load.py)."""
    source: str  # where the figures come from
    rule: str  # what `busy` means
    wall_s: float  # the window: the execution, start to end
    cores: int  # the host's CPUs
    load_avg_start: list[float]  # 1, 5, 15 minutes
    load_avg_end: list[float]
    own_cpu_s: float  # this run's process tree over the window
    other_cpu_s: float  # every other process's over the window
    other_cores: float  # other_cpu_s / wall_s: the cores they kept busy on average
    busy: bool  # other_cores over the rule's threshold: these timings include contention


@dataclass
class Env:
    torch: str
    python: str
    device: str  # cpu | cuda
    device_name: str
    world_size: int
    git_commit: str | None
    hostname: str
    cpu_count: int | None
    cores: int | None = None  # cores this run could use (CPU affinity)
    ranks_on_host: int | None = None  # worker processes that shared them
    oversubscribed: bool | None = None  # compute=real with more busy ranks than cores (or GPUs): timings show contention
    host_load: HostLoad | None = None  # other processes' use of the host over the run; None: not sampled (sim, not Linux, older records)


@dataclass
class PlanRecord:
    stage_layers: list[list[int]]  # [stage] [first layer, end layer)
    partition: dict
    stage_rank: dict[str, int]  # stage -> pipeline rank (JSON keys are strings)
    device: str
    backend: str  # gloo | nccl
    emulated_cost: dict  # CostModel's fields: what compute=emulated holds each action for
    p2p: str | None = None  # eager | safe; None in version-1 records
    schedule: dict[str, str] | None = None  # pipeline rank -> its actions in order, space-separated ("0F0 0F1 0B0 ...")
    sim_cost: dict | None = None  # CostModel's fields with comm.*: what executor=sim and the gallery simulate
    notes: list[str] = field(default_factory=list)  # how the plan was made, where the user should know
    simulated: bool = False  # its timings come from the simulator, not from clocks (executor=sim)

    def schedule_actions(self) -> dict[int, list[Action]]:
        if self.schedule is None:
            raise RecordError("plan.schedule: not recorded (a version-1 record)")
        return {int(r): [Action.parse(a) for a in acts.split()] for r, acts in self.schedule.items()}

    def cost_model(self) -> CostModel:
        if self.sim_cost is None:
            raise RecordError("plan.sim_cost: not recorded (a version-1 record)")
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in self.sim_cost.items()}
        if fields.get("p2p_bandwidth_Bps") is None:  # infinite bandwidth is written as null (strict JSON)
            fields["p2p_bandwidth_Bps"] = float("inf")
        return CostModel(**fields)

    def stages_of(self, pipeline_rank: int) -> list[int]:
        return sorted(int(s) for s, r in self.stage_rank.items() if r == pipeline_rank)

    def layers_label(self, rank: int, pp: int, dp: int = 1) -> str:
        """"layers 0-3, layers 12-15": what global `rank` holds, for a Gantt row or a table."""
        replica = f"replica {rank // pp}\n" if dp > 1 else ""
        return replica + ", ".join(f"layers {self.stage_layers[s][0]}-{self.stage_layers[s][1] - 1}"
                                   for s in self.stages_of(rank % pp))


@dataclass
class Attribution:
    """Why the measured bubble is what it is; the parts sum to `Bubble.measured`
    (harness.measure.metrics.attribution)."""
    schedule: float  # theory: the schedule's own fill and drain on equal stages
    imbalance: float  # the simulator on the measured per-stage costs, no communication, minus schedule
    communication: float  # the same with the measured hop (tp > 1: TP collectives, tp_sync), minus the previous
    overhead: float  # measured minus that simulation: the runtime, jitter, contention


@dataclass
class Bubble:
    theory: float | None  # this schedule and (N, M, v) on equal stages in the run's costs; None: no theory
    simulated: float  # the simulator on this run's measured op costs and hop
    measured: float  # mean of measured_per_rank
    # [pipeline rank] idle fraction of the step window, mean over replicas (tp > 1: an action's TP
    # collectives, traced inside it, count as idle, not compute: harness/measure/trace.py compute_s)
    measured_per_rank: list[float]
    measured_per_step: list[float]  # [measured step] mean over ranks
    measured_per_global_rank: list[float]  # [global rank]
    theory_source: str | None = None  # "closed form" | "simulated ideal (equal stages, free communication)"
    theory_costs: dict[str, float] | None = None  # the costs theory was taken at: bwd_over_fwd, weight_grad_share
    measured_step_iqr: list[float] | None = None  # [25th, 75th] percentile of measured_per_step
    attribution: Attribution | None = None
    # with steps overlapped (no barrier between them): 1 - a rank's compute / the longest rank
    # span, first compute start to last compute end (harness/simulate/engine.py `steady_bubble`)
    steady_measured: float | None = None  # from the measured spans, mean over ranks and steps
    steady_simulated: float | None = None  # the simulator on the measured costs and hop


@dataclass
class Budget:
    bytes: int  # memory_budget_gib in bytes
    source: str  # "measured" (the accounted peak) or "theory" (nothing measured: executor=sim)
    fits_per_rank: list[bool]  # [global rank] peak <= budget
    headroom_bytes_per_rank: list[int]  # [global rank] budget - peak (negative: over by that much)


@dataclass
class Memory:
    """Every byte of every rank. Activations: bytes held for a later backward. None where the
    executor cannot meter it."""
    peak_activation_bytes_per_rank: list[int] | None  # [pipeline rank] of replica 0
    theory_peak_microbatches_per_rank: list[int | None]  # the schedule's in-flight (stage, microbatch) count
    activation_bytes_per_microbatch_per_rank: list[float] | None  # one (stage, microbatch)'s; chunked: one chunk's
    cuda_max_memory_allocated_per_rank: list[int] | None = None  # torch.cuda.max_memory_allocated, on CUDA
    # [global rank] {params, grads, optimizer, activations, peak} bytes, largest over measured
    # steps: measured (by accounting tensors, each storage once) and theory (harness/planning/memory_theory.py)
    measured_per_rank: list[dict[str, int | None]] | None = None
    theory_per_rank: list[dict[str, int]] | None = None
    cuda_per_rank: list[dict[str, int]] | None = None  # [global rank] torch.cuda allocated, reserved, max_allocated
    budget: Budget | None = None  # memory_budget_gib: does each rank fit


@dataclass
class GradCheck:
    max_rel_diff: float  # max over parameters of max |g - r| / max |r| against one process
    worst_param: str | None
    params: int
    tolerance: float | None = None  # the dtype's (harness/measure/metrics.py GRAD_TOLERANCE): beyond it the job failed


@dataclass
class Flops:
    """Compute throughput (harness/planning/flops.py). Per device: over every rank (pp x dp)."""
    model_per_step: float  # 3 x forward FLOPs x microbatches x dp, in `convention`
    hardware_per_step: float  # + checkpointing's recomputed forwards
    tflops_per_device: float  # model FLOPs / step time / devices / 1e12
    hardware_tflops_per_device: float
    peak_tflops_per_device: float | None  # the device's dense peak in the run's dtype
    mfu: float | None  # tflops_per_device / peak; None: see note
    hfu: float | None
    device: str | None  # harness/planning/devices.py's name for the device
    source: str  # where the forward FLOPs came from
    note: str | None = None  # why MFU is n/a
    convention: str | None = None  # "megatron": causal attention's whole s^2 term (planning/flops.py); None: older records (the causal half)
    model_per_step_causal: float | None = None  # model FLOPs with the causal half of the s^2 term (the older count)


@dataclass
class Intervals:
    """Intervals of a job's figures over its measured steps (harness/measure/intervals.py: order
    statistics of the median, whose coverage `level` the number of steps sets: 5 give 93.8%, 6 or
    more at least 95%; records before them: a bootstrap of the median, nominal 95%); one step, or
    a simulation's identical steps, give a point."""
    level: float  # the interval's coverage of the median
    method: str
    steps: int  # the samples
    step_time_s: list[float]  # [lo, hi]
    bubble: list[float]  # [lo, hi] of the step bubble (bubble.measured_per_step)
    throughput_samples_s: list[float]  # [lo, hi]: samples per step over the step-time interval


@dataclass
class Metrics:
    step_time_s: float  # median over measured steps, optimizer included
    step_times_s: list[float]
    throughput_samples_s: float  # M x B x dp / step_time_s
    throughput_tokens_s: float | None  # gpt: x seq
    losses: list[float | None] | None  # every step, warm-up included (null where not finite); None for executor=sim
    bubble: Bubble
    dp_sync_s: float | None
    dp_sync_share: float | None
    dp_sync_theory_s: float | None
    memory: Memory
    recompute_s: float
    p2p_hop_s: float | None
    stage_time_s: list[float]  # [stage] measured F + B (or F + I + W) per microbatch
    measured_imbalance: float | None
    mean_op_s: dict[str, list[float]]  # kind -> [stage] mean seconds (tp > 1: compute, its TP collectives left out)
    grad_check: GradCheck | None = None
    step_time_iqr_s: list[float] | None = None  # [25th, 75th] percentile of step_times_s
    model_step_s: float | None = None  # the cost model's step (executor=sim's): what this run is held against
    flops: Flops | None = None
    # each rank's clock on rank 0's (harness/measure/execution.py clock_record): [global rank] ns added to
    # its timestamps, and how far off that may be (0 and 0 on rank 0's host); None: executor=sim
    clock_offset_ns_per_global_rank: list[int] | None = None
    clock_uncertainty_ns_per_global_rank: list[int] | None = None
    clock_uncertainty_ns: int | None = None  # the worst of them
    clock_note: str | None = None  # the bubble flagged: that uncertainty is > 5% of the mean compute action
    intervals: Intervals | None = None
    # tp > 1: median over measured steps of the longest per-rank total of TP gradient syncs (tp_sync
    # events: the replicated parameters' partial gradients summed over the TP group). None at tp=1
    tp_sync_s: float | None = None
    # tp > 1: the same of the TP collectives inside the F, B, I and W (trace category "tp", kinds
    # tp_F, tp_B, tp_I, tp_W: harness/parallel/tp_trace.py), tp_sync not included; and its share of
    # step_time_s. None at tp=1 and where none were traced (executor=sim)
    tp_comm_s: float | None = None
    tp_comm_share: float | None = None


@dataclass
class Result:
    status: str  # ok | diverged (a loss not finite) | failed | interrupted | skipped (over memory_budget_gib)
    error: str | None  # one line
    config: dict  # the resolved (and, once planned, the planned) config
    env: Env | None = None
    plan: PlanRecord | None = None
    partition: dict | None = None
    metrics: Metrics | None = None
    worker_pids: list[int] = field(default_factory=list)
    wall_s: float | None = None
    error_detail: str | None = None  # more than a line: a schedule's grid
    wandb_dir: str | None = None
    trace_json: dict | None = None  # what trace.json kept: steps and events written and dropped (a size cap)
    nulls: list[str] = field(default_factory=list)  # fields written as null because they were not finite numbers
    provenance: dict | None = None  # point, identity, code, input files' sha256, start (identity.provenance): what resume compares
    # measured | emulated | simulated (MEASUREMENTS, measurement_of): what made its times; set once
    # planned, derived from config and plan on reading a record that lacks it; None: not planned
    measurement: str | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "Result":
        return _build(cls, upgrade(data), "result")

    @functools.cached_property
    def cfg(self) -> Config:
        """`config` as the typed Config (harness/config.py config_from_record), built once: what
        readers of a record (the report) read, never the dict."""
        return config_from_record(self.config)

    @property
    def simulated(self) -> bool:
        """Whether its timings came from the simulator, not from clocks (as recorded)."""
        if self.measurement is not None:
            return self.measurement == "simulated"
        return self.plan.simulated if self.plan is not None else self.config.get("executor") == "sim"

    def headline(self) -> str:
        """One line, from the record alone: what ran, how its numbers were made, the bubble and
        why, speed."""
        c, m = self.config, self.metrics
        simulated = self.simulated
        mode = (f"simulated: executor={c['executor']}" if simulated else
                c["compute"] if c["executor"] == "native" else f"{c['compute']}, executor={c['executor']}")
        tp = c.get("tp") or 1  # a record from before tp has none
        tensor = f" tp={tp}" + (" sequence_parallel" if c.get("sequence_parallel") else "") if tp > 1 else ""
        what = f"{c['schedule']['name']} pp={c['pp']}{tensor} M={c['microbatches']} B={c['microbatch_size']} ({mode})"
        if self.status == "skipped":
            return f"{what}: skipped: {self.error}"
        if self.status not in ("ok", "diverged") or m is None:
            return f"{what}: {self.status}: {self.error}"
        b = m.bubble
        theory = "n/a" if b.theory is None else f"{b.theory:.3f}"
        overlapped = "" if b.steady_measured is None else f"; {b.steady_measured:.3f} with steps overlapped"
        if simulated:
            bubble = f"bubble {b.measured:.3f} (theory {theory}{overlapped})"
        else:
            bubble = f"bubble measured {b.measured:.3f} (theory {theory}, simulated {b.simulated:.3f}{overlapped})"
            if (a := b.attribution) is not None:
                bubble += (f" = schedule {a.schedule:.3f} + imbalance {a.imbalance:.3f} + communication "
                           f"{a.communication:.3f} + overhead {a.overhead:.3f}")
        # a replay (profile=, times not measured) runs a stand-in: its tokens/s counts the stand-in's sequence,
        # its FLOPs are the profiled model's; the headline keeps to the profiled model's units
        replay = m.flops is not None and m.flops.source.startswith("profile=") and self.measurement != "measured"
        line = (f"{what}: {bubble}, step {m.step_time_s * 1e3:.1f} ms, {m.throughput_samples_s:.0f} samples/s"
                + (f", {m.throughput_tokens_s:.0f} tokens/s" if m.throughput_tokens_s and not replay else "")
                + (f", {flops_phrase(m.flops)}" if m.flops is not None else "")
                + (f" (the profiled model's, {c['profile']}; tokens/s n/a: the stand-in's sequence)" if replay else ""))
        if m.clock_note:
            line += f" [{m.clock_note}]"
        if self.status == "diverged":
            line += f" [diverged: {self.error}]"
        if self.env is not None and self.env.oversubscribed:
            line += (f" [oversubscribed: {self.env.ranks_on_host} busy ranks on {self.env.cores} cores, so these "
                     "timings measure contention; compute=emulated shows the schedule]")
        if self.env is not None and (h := self.env.host_load) is not None and h.busy:
            line += f" [{busy_phrase(h)}]"
        return line


def busy_phrase(h: HostLoad) -> str:
    """'busy host: other processes kept 1.8 cores busy on average (load average 2.1 -> 3.9)'."""
    return (f"busy host: other processes kept {h.other_cores:.1f} of {h.cores} cores busy on average over the run "
            f"(load average {h.load_avg_start[0]:.1f} -> {h.load_avg_end[0]:.1f}), so these timings include contention")


def flops_phrase(f: Flops) -> str:
    """'3.1 TFLOP/s per device, MFU 41.2%, HFU 54.9%' (MFU n/a and why, where no peak is known)."""
    rate = f"{f.tflops_per_device:.3g} TFLOP/s per device"
    if f.mfu is None:
        return f"{rate} (MFU n/a: {f.note})" if f.note else rate
    return rate + f", MFU {f.mfu:.1%}" + (f", HFU {f.hfu:.1%}" if f.hfu is not None and f.hfu != f.mfu else "")


_RENAMED_V1 = {  # version 1 name -> version 2 name, per object
    "bubble": {"measured_per_rank": "measured_per_global_rank", "measured_per_stage": "measured_per_rank"},
    "memory": {"peak_activation_bytes_per_stage": "peak_activation_bytes_per_rank",
               "theory_peak_microbatches_per_stage": "theory_peak_microbatches_per_rank",
               "activation_bytes_per_microbatch_per_stage": "activation_bytes_per_microbatch_per_rank",
               "cuda_max_memory_allocated_per_stage": "cuda_max_memory_allocated_per_rank"},
}


def upgrade(data: Any) -> dict:
    """Any version's record as the current version's JSON (a new dict; `data` is untouched)."""
    if not isinstance(data, dict):
        raise RecordError("not a JSON object")
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RecordError(f"schema_version={version!r}: written by a newer harness (this one reads <= {SCHEMA_VERSION})")
    data = json.loads(json.dumps(data))
    if version == 1 and isinstance(data.get("metrics"), dict):
        for part, names in _RENAMED_V1.items():
            old = data["metrics"].get(part)
            if isinstance(old, dict):
                data["metrics"][part] = {names.get(k, k): v for k, v in old.items()}
    if version < 3 and isinstance(data.get("plan"), dict) and isinstance(data.get("config"), dict):
        plan = data["plan"]
        plan.setdefault("simulated", data["config"].get("executor") == "sim")  # the only simulated one then
        if isinstance(plan.get("schedule"), dict):
            plan["schedule"] = {r: " ".join(map(str, acts)) if isinstance(acts, list) else acts
                                for r, acts in plan["schedule"].items()}
    if version < 6 and isinstance(data.get("config"), dict):
        from harness.config import upgrade_config
        from harness.records.identity import upgrade_provenance

        data["config"] = upgrade_config(data["config"])
        data["provenance"] = upgrade_provenance(data.get("provenance"), data["config"])
    if data.get("measurement") not in (None, *MEASUREMENTS):
        raise RecordError(f"measurement={data['measurement']!r}: unknown (allowed: {', '.join(MEASUREMENTS)}, null)")
    if "measurement" not in data and isinstance(data.get("config"), dict):  # records before the field
        c, plan = data["config"], data.get("plan")
        simulated = plan.get("simulated") if isinstance(plan, dict) else None
        data["measurement"] = measurement_of(c.get("executor"), c.get("compute"),
                                             simulated if isinstance(simulated, bool) else None)
    data["schema_version"] = SCHEMA_VERSION
    return data


def _build(cls: type, data: Any, where: str) -> Any:
    """A dataclass from its JSON, recursively; RecordError naming the first missing or
    mistyped field. Unknown keys are ignored (a later minor addition)."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: not a JSON object")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{where}.{f.name}: missing")
            continue
        kwargs[f.name] = _value(hints[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


def _value(hint: Any, value: Any, where: str) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = type(None) in typing.get_args(hint)
    if value is None:
        if optional or hint is Any:
            return None
        raise RecordError(f"{where}: null where a value is required")
    base = args[0] if optional and len(args) == 1 else hint
    if dataclasses.is_dataclass(base):
        return _build(base, value, where)
    origin = typing.get_origin(base) or base
    if origin is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise RecordError(f"{where}: {type(value).__name__} where float belongs")
    if origin in (int, str, bool, list, dict) and not isinstance(value, origin) or (
            origin is int and isinstance(value, bool)):
        raise RecordError(f"{where}: {type(value).__name__} where {getattr(origin, '__name__', origin)} belongs")
    inner = typing.get_args(base)
    if origin is list and inner:
        return [_value(inner[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict and len(inner) == 2:
        return {k: _value(inner[1], v, f"{where}.{k}") for k, v in value.items()}
    return value


def read(path: Path, max_bytes: int = 64 * 2**20) -> Result:
    """A result.json as a Result; RecordError (one line) for anything unreadable. Only a regular
    file is opened, and read only up to max_bytes: a FIFO, socket or device in its place (which
    would block, or never end) or a directory is refused without opening it."""
    import os
    import stat

    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))

    def regular(mode: int) -> None:
        if not stat.S_ISREG(mode):
            kind = next((k for test, k in kinds if test(mode)), f"mode {stat.filemode(mode)}")
            raise RecordError(f"unreadable: not a regular file ({kind})")

    try:
        regular(os.stat(path).st_mode)
        # O_NONBLOCK: if a FIFO took the file's place since the stat, opening it still returns at once
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            regular(st.st_mode)
            if st.st_size > max_bytes:
                raise RecordError(f"unreadable: {st.st_size} bytes, over the {max_bytes}-byte limit of a record")
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:  # grew since the fstat
            raise RecordError(f"unreadable: over the {max_bytes}-byte limit of a record")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # RecordError is a ValueError: pass it on as it is
        if isinstance(e, RecordError):
            raise
        raise RecordError(f"unreadable: {type(e).__name__}: {e}") from None
    return Result.from_json(data)
