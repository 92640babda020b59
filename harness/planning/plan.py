"""Plan = validated config -> the built model, partition + schedule + modeled costs + device,
backend and transport. Picklable: workers receive it whole and build their stage from it.

The plan carries what everything after it needs, computed once: the model (built once in
this process; a worker builds it again, once), the compiled schedule and each rank's replay,
the priced cost model and its simulation (memoized per cost model: a job simulates each
distinct cost model once), and the model's per-layer memory.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from dataclasses import asdict, dataclass, field, replace

from harness.planning.checks import check_stages, ranks_on_host, validate
from harness.config import MAX_TIMEOUT_S, Config, ConfigError, planned_microbatch_size
from harness.planning.memory_theory import LayerMemory, RankBytes, Replay, layer_memory, replay, theory_per_rank
from harness.model.built import BuiltModel
from harness.model.partition import Partition, explicit, min_max, uniform
from harness.model.profile_data import ProfileError, load_profile, read_profile
from harness.records.result import PlanRecord, RecordError
from harness.records.result import read as read_result
from harness.runtime.registry import EXECUTORS
from harness.schedules import p2p
from harness.schedules.ir import Schedule
from harness.schedules.registry import COSTS, COUNTS, ScheduleInputs, ScheduleSpec, build, spec
from harness.schedules.validate import ScheduleError
from harness.schedules.validate import validate as validate_schedule
from harness.simulate import engine
from harness.simulate.cost import CostModel
from harness.simulate.engine import Compiled
from harness.simulate.pricing import message_bytes_of, plan_tp_collectives, price


@dataclass(frozen=True, eq=False)
class ScheduleArtifacts:
    """A validated schedule with what is derived from it alone (cached for the built-ins:
    the planner's points and a sweep's jobs share them)."""
    schedule: Schedule
    compiled: Compiled

    @functools.cached_property
    def replays(self) -> tuple[Replay, ...]:
        return tuple(replay(self.schedule[r]) for r in sorted(self.schedule))

    @property
    def stages(self) -> int:
        return self.compiled.stages


@dataclass(frozen=True)
class Plan:
    config: Config
    schedule: Schedule
    stage_layers: tuple[tuple[int, int], ...]  # [stage] (first layer, end layer)
    partition: Partition
    stage_rank: dict[int, int]
    emulated_cost: CostModel  # what compute=emulated holds each action for, per stage
    device: str  # cpu | cuda (auto resolved)
    backend: str  # nccl (a GPU per rank) | gloo (CPU, or ranks sharing GPUs: tensors through host memory)
    p2p: str  # eager | safe (auto resolved): the transport of the native executor's messages
    model: BuiltModel = field(compare=False, repr=False)  # built once here (a worker builds it again, once)
    notes: tuple[str, ...] = ()  # what the user should know about how this plan was made (printed, recorded)
    cores: int = 1  # CPU cores this process may run on
    ranks_on_host: int = 1  # worker processes on this host
    oversubscribed: bool = False  # compute=real with more busy ranks than cores (or ranks sharing a GPU)
    # derived once per process, never pickled: schedule artifacts, the priced costs, simulations
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "derived": {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @property
    def world(self) -> int:
        return self.config.pp * self.config.dp * self.config.tp

    @property
    def simulated(self) -> bool:
        return EXECUTORS[self.config.executor].simulated

    @property
    def model_device(self) -> str:
        """The device the run is modeled on: the cluster's where executor=sim prices one, else its own."""
        cl = self.config.cluster
        return cl.device if (cl is not None and self.simulated) else self.device

    def _derive(self, key: str, make):
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]

    @property
    def artifacts(self) -> ScheduleArtifacts:
        return self._derive("artifacts", lambda: artifacts_of(self.schedule))

    @property
    def compiled(self) -> Compiled:
        return self.artifacts.compiled

    @property
    def replays(self) -> tuple[Replay, ...]:
        return self.artifacts.replays

    def sim_cost(self) -> CostModel:
        """The plan priced (harness/simulate/pricing.py): what executor=sim runs on, and what a
        run's modeled step is."""
        def make() -> CostModel:
            c, layers = self.config, self.model.layer_params
            stage_params = [sum(layers[a:b]) // c.tp for a, b in self.stage_layers]  # a TP rank's share
            owner = tuple(self.stage_rank[s] for s in range(len(self.stage_layers)))
            return price(c, self.emulated_cost, owner, stage_params, message_bytes_of(c, self.model),
                         plan_tp_collectives(c, self.model, list(self.stage_layers)))

        return self._derive("sim_cost", make)

    def timing(self, cost: CostModel) -> list[float]:
        """Each action's end in the simulator on `cost` (memoized per cost model)."""
        memo = self._derive("timings", dict)
        if cost not in memo:
            memo[cost] = engine.timing(self.compiled, cost)
        return memo[cost]

    def modeled_step(self, step: int = 0) -> list:
        """One step as the plan's cost model predicts it: the simulator's trace (executor=sim's step)."""
        cost = self.sim_cost()
        return engine.trace(self.compiled, cost, step, self.timing(cost))

    def modeled_step_s(self) -> float:
        cost = self.sim_cost()
        return engine.step_time(self.compiled, cost, self.timing(cost))

    def memory(self) -> LayerMemory:
        """The model's per-layer memory in the run's dtype, traced on the modeled device."""
        return layer_memory(self.model, self.config.dtype, self.model_device)

    def theory_per_rank(self) -> list[RankBytes]:
        """harness/planning/memory_theory.py's bytes of every global rank (once per plan)."""
        return self._derive("theory_per_rank", lambda: theory_per_rank(self))

    def record(self) -> PlanRecord:
        """What result.json keeps of the plan: enough to draw and simulate it again without planning."""
        return PlanRecord(stage_layers=[list(b) for b in self.stage_layers], partition=self.partition.describe(),
                          stage_rank={str(k): v for k, v in self.stage_rank.items()}, device=self.device,
                          backend=self.backend, emulated_cost=asdict(self.emulated_cost),
                          sim_cost=asdict(self.sim_cost()), p2p=self.p2p, notes=list(self.notes),
                          schedule={str(r): " ".join(map(str, acts)) for r, acts in sorted(self.schedule.items())},
                          simulated=self.simulated)


def artifacts_of(schedule: Schedule, microbatches: int | None = None) -> ScheduleArtifacts:
    """A schedule's artifacts, validated (counts, order, no deadlock) against `microbatches`
    (default: as many as it names); ScheduleError if invalid."""
    stages = 1 + max(a.stage for acts in schedule.values() for a in acts)
    if microbatches is None:
        microbatches = 1 + max(a.microbatch for acts in schedule.values() for a in acts)
    return ScheduleArtifacts(schedule, validate_schedule(schedule, stages, microbatches))


@functools.lru_cache(maxsize=64)
def builtin_artifacts(name: str, pp: int, m: int, v: int) -> ScheduleArtifacts:
    """A built-in schedule, built and validated once per process."""
    return artifacts_of(build(name, pp, m, v))


def load_schedule(c: Config) -> ScheduleArtifacts:
    """The schedule of an entry made from its counts (built and validated once per process) or
    from a file (its entry's `make`); validated (counts, order, no deadlock)."""
    entry = spec(c.schedule.name)
    if entry.needs == COUNTS:
        try:
            return builtin_artifacts(c.schedule.name, c.pp, c.microbatches, c.virtual_stages)
        except ScheduleError as e:
            raise _schedule_error(entry, c, e) from None
    return made_artifacts(c, entry, ScheduleInputs(c))


def made_artifacts(c: Config, entry: ScheduleSpec, inputs: ScheduleInputs) -> ScheduleArtifacts:
    """The plan `entry` makes from `inputs`, one row of actions per rank, validated against the
    run's microbatches; ConfigError (one line) naming the entry's key (`ScheduleSpec.where`)."""
    try:
        schedule = entry.make(inputs)
        if sorted(schedule) != list(range(c.pp)):
            raise ConfigError(f"{entry.where(c)}: {len(schedule)} rows (ranks), pp={c.pp} (allowed: one row per rank)")
        return artifacts_of(schedule, c.microbatches)
    except ConfigError:
        raise
    except ValueError as e:  # ScheduleError, and what the entry refuses to make
        raise _schedule_error(entry, c, e) from None


def _schedule_error(entry: ScheduleSpec, c: Config, e: Exception) -> ConfigError:
    first, _, grid = str(e).partition("\n")
    return ConfigError(f"{entry.where(c)}: {first}", detail=grid)


def make_partition(c: Config, model: BuiltModel, stages: int) -> Partition:
    """With a profile, params and flops come from it too: the profile describes the model
    under study (a GPU model replayed by a small stand-in has the profile's layers, not the
    stand-in's parameters)."""
    n, method = model.num_layers, c.partition.name
    if method == "uniform":
        return Partition(method, uniform(n, stages), "layers", [1.0] * n)
    if method == "explicit":
        return Partition(method, explicit(list(c.partition.layers_per_stage), n), "layers", [1.0] * n)
    prof = load_profile(c.profile, c.microbatch_size, model.kinds) if c.profile else None
    if method == "params":
        costs = [float(lc.params) for lc in prof] if prof else [float(p) for p in model.layer_params]
        unit = "params"
    elif method == "flops":  # forward + backward = 3 forward
        costs = [3 * (lc.fwd_flops if prof else model.model.fwd_flops(i, c.microbatch_size))
                 for i, lc in enumerate(prof or [None] * n)]
        unit = "flops"
    else:  # profile: measured forward + backward seconds
        costs, unit = [lc.fwd_s + lc.bwd_s for lc in prof], "s"
    return Partition(method, _min_max(tuple(costs), stages), unit, costs)


@functools.lru_cache(maxsize=1024)
def _min_max(costs: tuple[float, ...], stages: int) -> list[tuple[int, int]]:
    """min_max, once per cost vector and stage count (O(S L^2): the planner asks it often)."""
    return min_max(list(costs), stages)


def emulated_costs(c: Config, bounds: list[tuple[int, int]], model: BuiltModel) -> tuple[CostModel, list[str]]:
    """What compute=emulated holds each action for, per stage, and notes for the user: the
    profile's per-layer times at B when a profile is given (a one-block profile expanded by
    kind), else CostConfig's fixed part plus per-sample part; a split backward as
    I = (1 - w) B, W = w B; all times cost.time_scale."""
    k, w = c.cost.time_scale, c.cost.weight_grad_share
    notes: list[str] = []
    if c.profile:
        layers = load_profile(c.profile, c.microbatch_size, model.kinds, notes)
        fwd = tuple(k * sum(lc.fwd_s for lc in layers[a:b]) for a, b in bounds)
        bwd = tuple(k * sum(lc.bwd_s for lc in layers[a:b]) for a, b in bounds)
    else:
        cc = c.cost
        per_layer_s = cc.fwd_ms_per_layer / 1e3 * (cc.fixed_fraction + (1 - cc.fixed_fraction) * c.microbatch_size
                                                   / cc.at_microbatch_size)
        fwd = tuple(k * (b - a) * per_layer_s for a, b in bounds)
        bwd = tuple(f * cc.bwd_over_fwd for f in fwd)
    return CostModel(fwd_s=fwd, bwd_s=bwd, input_grad_s=tuple((1 - w) * b for b in bwd),
                     weight_grad_s=tuple(w * b for b in bwd)), notes


def make_plan(c: Config, cuda_devices: int = 0, model: BuiltModel | None = None,
              ranks_here: int | None = None) -> Plan:
    """Raises ConfigError (one line) for any input that cannot run. `model`: the config's model,
    when the caller built it already (the planner builds it once for all its points);
    `ranks_here`: the ranks this machine runs (checks.validate)."""
    model = validate(c, cuda_devices, model, ranks_here)
    if c.global_batch is not None:  # fixed global batch: the microbatch follows dp and M
        c = replace(c, microbatch_size=planned_microbatch_size(c))
    executor = EXECUTORS[c.executor]
    world = c.pp * c.dp * c.tp
    device = c.device if c.device != "auto" else ("cuda" if cuda_devices >= world else "cpu")
    entry = spec(c.schedule.name)
    # made from costs: its order comes once the costs below are priced, on the stages its placement says
    art = None if entry.needs == COSTS else load_schedule(c)
    stages = c.pp * entry.chunks(c.virtual_stages) if art is None else art.stages
    if entry.needs != COUNTS:  # a schedule made from more than its counts: its stages are known now
        check_stages(c, stages, model.num_layers)
    try:
        partition = make_partition(c, model, stages)
        cost, notes = emulated_costs(c, partition.bounds, model)
    except ProfileError as e:
        raise ConfigError(str(e)) from None
    if art is None:
        cl = c.cluster
        inputs = costed_inputs(c, entry, partition, cost, model,
                               cl.device if cl is not None and executor.simulated else device)
        art = made_artifacts(c, entry, inputs)
        notes += inputs.notes
    schedule = art.schedule
    # NCCL needs a GPU per rank (it refuses two ranks on one device); ranks sharing GPUs
    # exchange through host memory over gloo
    backend = "nccl" if device == "cuda" and cuda_devices >= world else "gloo"
    cores, on_host = host_cores(), ranks_on_host(world)
    # busy ranks outnumber what they run on: real timings would measure the contention
    crowded = (on_host > cores) if device == "cpu" else backend == "gloo"
    if executor.simulated:  # no process: its timings are the modeled costs
        crowded, on_host = False, 0
        c = replace(c, compute="emulated") if c.compute == "auto" else c
    if c.compute == "auto":
        c = replace(c, compute="emulated" if crowded else "real")
        if crowded:
            notes.append(f"compute=auto: emulated, since {on_host} ranks would share "
                         f"{f'{cores} cores' if device == 'cpu' else f'{cuda_devices} GPUs'} (compute=real times the "
                         "contention)")
    if device == "cuda" and backend == "gloo" and not executor.transport and not executor.simulated:
        raise ConfigError(f"device=cuda: executor={c.executor} needs a GPU per rank ({world} ranks, "
                          f"{cuda_devices} GPUs); only harness's own transport stages through host memory")
    if c.tp > 1:
        notes.append(f"tp={c.tp}: the memory theory per rank and the measured figures are tp rank 0's of each TP "
                     "group; the modeled step adds the TP collectives to the modeled compute (cost.* or the profile: "
                     "a TP rank's)")
        at = (read_profile(c.profile).get("model") or {}).get("tp", 1) if c.profile else c.tp
        if at != c.tp:
            notes.append(f"profile={c.profile}: its times are at tp={at}, taken as a TP rank's at tp={c.tp} (not "
                         "split: derive one at this tp, as tools/sc21.py does, or profile one TP rank)")
    transport = c.p2p if c.p2p != "auto" else ("safe" if backend == "nccl" else "eager")
    if executor.transport:
        check_transport(c, schedule, transport, backend)
    plan = Plan(c, schedule, tuple(partition.bounds), partition, dict(enumerate(art.compiled.owner)), cost, device, backend,
                transport, model, tuple(notes), cores, on_host, crowded and c.compute == "real")
    plan.derived["artifacts"] = art
    if c.run.timeout_s is None:  # 60 s to start, then 10x the modeled run: a hang ends, a slow run does not
        step_s = plan.modeled_step_s()
        timeout_s = round(60.0 + 10 * step_s * (c.warmup_steps + c.steps), 1)
        plan = replace(plan, config=replace(c, run=replace(c.run, timeout_s=timeout_s)), derived=plan.derived)
    return plan


def costed_inputs(c: Config, entry: ScheduleSpec, partition: Partition, cost: CostModel, model: BuiltModel,
                  device: str) -> ScheduleInputs:
    """What an entry made from costs makes its plan from, each priced when it asks: the plan's
    costs priced on the stages as its placement puts them (its compute, links, syncs, overheads:
    what executor=sim runs on), a prior run's measured costs over them, and what each stage's
    deferred W keeps of a microbatch's activations (memory theory's trace on `device`)."""
    stage_params = [sum(model.layer_params[a:b]) // c.tp for a, b in partition.bounds]  # a TP rank's share
    nbytes = message_bytes_of(c, model)
    owner = entry.owner(len(partition.bounds), c.pp)
    inputs = ScheduleInputs(c)

    def deferred() -> tuple[float, ...]:
        try:
            mem = layer_memory(model, c.dtype, device)
            acts = [mem.stage(a, e, c.microbatch_size, c.checkpointing, c.checkpoint_every, split=True)
                    for a, e in partition.bounds]
            return tuple(min(1.0, x.deferred / x.kept) if x.kept else 1.0 for x in acts)
        except ValueError:  # no per-layer memory (a model not buildable on the meta device): count it whole
            return (1.0,) * len(partition.bounds)

    tp_s = plan_tp_collectives(c, model, partition.bounds)
    inputs.priced = lambda: price(c, cost, owner, stage_params, nbytes, tp_s)
    inputs.deferred = deferred
    inputs.measured = lambda run_dir: measured_costs(run_dir, c.pp, inputs.costs())
    return inputs


def measured_costs(run_dir: str, pp: int, priced: CostModel) -> CostModel:
    """`priced` with a prior run's measured per-stage F, I and W (a run without a split backward:
    its B split as `priced` splits it) and its measured hop each way; ConfigError (one line)
    for a record that has none or another number of stages."""
    where = f"schedule.costs={run_dir}"
    try:
        m = read_result(Path(run_dir) / "result.json").metrics
    except (OSError, RecordError) as e:
        raise ConfigError(f"{where}: {e}") from None
    if m is None or "F" not in m.mean_op_s or len(m.mean_op_s["F"]) != pp:
        got = "no measured costs" if m is None or "F" not in m.mean_op_s else f"{len(m.mean_op_s['F'])} stages"
        raise ConfigError(f"{where}: {got} (allowed: a run with one stage per rank at pp={pp})")
    op = m.mean_op_s
    check_measured(where, op, m.p2p_hop_s, pp)
    f = tuple(op["F"])
    if "I" in op and "W" in op:
        i, w = tuple(op["I"]), tuple(op["W"])
    else:
        share = [pw / (pi + pw) if pi + pw > 0 else 0.5 for pi, pw in zip(priced.igrad, priced.wgrad)]
        i = tuple(b * (1 - x) for b, x in zip(op["B"], share))
        w = tuple(b * x for b, x in zip(op["B"], share))
    hop = (m.p2p_hop_s,) * pp if m.p2p_hop_s is not None else None
    return replace(priced, fwd_s=f, bwd_s=tuple(a + b for a, b in zip(i, w)), input_grad_s=i, weight_grad_s=w,
                   fwd_hop_s=hop or priced.fwd_hop_s, bwd_hop_s=hop or priced.bwd_hop_s)


def check_measured(where: str, op: dict, hop: object, pp: int) -> None:
    """A record's measured costs as zb_auto takes them: F, and I and W (or B), each a list of
    pp finite seconds >= 0 (a week at most, as auto.MAX_COST_S), the hop one such number or null;
    ConfigError (one line) naming the record's key at fault. An edited or corrupt record
    (NaN, -1, a key gone) would otherwise time every order at NaN and be reported as deadlock."""
    kinds = ("F", "I", "W") if "I" in op or "W" in op else ("F", "B")
    for kind in kinds:
        key = f"metrics.mean_op_s.{kind}"
        values = op.get(kind)
        if not isinstance(values, list) or len(values) != pp:
            got = "missing" if values is None else f"{values!r:.60}"
            raise ConfigError(f"{where}: {key} is {got} (allowed: {pp} measured seconds, one per stage)")
        for s, x in enumerate(values):
            if not _seconds(x):
                raise ConfigError(f"{where}: {key}[{s}]={x!r}: not a measured cost (allowed: a finite number of "
                                  f"seconds in 0..{MAX_TIMEOUT_S:,.0f})")
    if hop is not None and not _seconds(hop):
        raise ConfigError(f"{where}: metrics.p2p_hop_s={hop!r}: not a measured cost (allowed: a finite number of "
                          f"seconds in 0..{MAX_TIMEOUT_S:,.0f}, or null)")


def _seconds(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= MAX_TIMEOUT_S


def host_cores() -> int:
    """CPU cores this process may run on (its affinity: a container's or taskset's share)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_transport(c: Config, schedule: Schedule, transport: str, backend: str) -> None:
    """The schedule's messages, as the transport sends them, run on this backend: no
    deadlock, every receive matched with its own message (harness/schedules/p2p.py)."""
    try:
        p2p.check(schedule, transport, backend, c.pp, c.dp, c.p2p_single_tag, validated=True)
    except p2p.P2PError as e:
        first, _, grid = str(e).partition("\n")
        raise ConfigError(f"p2p={transport} on {backend}: {first}", detail=grid) from None
