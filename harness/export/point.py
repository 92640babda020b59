"""The point to export, from either source, as one record: a run directory (its result.json:
the config as planned and the plan's stages, ranks and schedule) or an advice point
(advice.json#RANK: its overrides, its layers per stage, the cluster it was priced on).

Every problem with the input is an ExportError whose text is one line naming the key, the
value and what is allowed.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.frontend.compose import compose_config, schedule_key
from harness.config import MAX_ACTIONS, MAX_DIM, MAX_GPUS, MAX_STEPS, MAX_WORLD, Config, ConfigError
from harness.planning.point import Point
from harness.records.record import RESULT
from harness.records.result import RecordError, read
from harness.records.safe_io import FileRefused, read_bytes
from harness.schedules.ir import Schedule
from harness.schedules.registry import COUNTS, SCHEDULES, build, spec

ALLOWED_SOURCE = "a run directory (with result.json), its result.json, or advice.json[#RANK]"
DECODERS = ("gpt", "hf")  # harness models whose layers are embedding, blocks, head (harness/model/)


class ExportError(ValueError):
    """One line: the key, the value and what is allowed."""


@dataclass(frozen=True)
class Launch:
    """Where the ranks go: `nodes` machines of `per_node` GPUs (None: one machine, as many as ranks)."""

    nodes: int
    per_node: int
    cluster: str | None  # the harness cluster it came from, for the header


@dataclass(frozen=True)
class Recipe:
    """What a script needs to reproduce a run or an advice point: the point (the planner's,
    harness/planning/point.py) and, beyond it, the model, how its layers sit on stages and
    ranks, training settings, tensor parallelism and where the ranks go."""

    source: str  # what the header says it came from
    point: Point  # schedule, pp, dp, M, B (as planned), virtual stages, checkpointing, ZeRO, placement, memory limit
    checkpoint_every: int
    dtype: str
    optimizer: str
    lr: float | None  # a run's; None: the source sets none (an advice point), the script asks for it
    steps: int | None  # the steps a run ran (warm-up and measured); None as lr
    model: dict[str, Any]  # the config's model group, as recorded
    layers_per_stage: tuple[int, ...]  # harness layers of each stage, stages in model order
    stage_rank: tuple[int, ...]  # the pipeline rank of each stage
    recorded_schedule: Schedule | None  # the actions a run ran; None: made by `order`, else from the counts
    launch: Launch
    tp: int = 1  # tensor-parallel ranks inside each stage
    sequence_parallel: bool = False
    # an advice point's order made from its costs, planned only when an export writes it (seconds at pp=32)
    order: Callable[[], Schedule] | None = field(default=None, compare=False)

    @property
    def stages(self) -> int:
        return len(self.layers_per_stage)

    @property
    def world(self) -> int:
        return self.point.pp * self.point.dp * self.tp

    @property
    def local_batch(self) -> int:
        """Samples per data-parallel replica per step: M x B."""
        return self.point.microbatches * self.point.microbatch_size

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.point.dp

    @property
    def decoder(self) -> bool:
        """Embedding, model.layers blocks, head: what torchtitan's and Megatron's decoders are."""
        return self.model.get("name") in DECODERS and sum(self.layers_per_stage) == self.model["layers"] + 2

    def blocks_per_stage(self) -> tuple[int, ...]:
        """Transformer blocks of each stage: its layers less the embedding (first) and head (last)."""
        out = list(self.layers_per_stage)
        out[0] -= 1
        out[-1] -= 1
        return tuple(out)

    def placement_kind(self) -> str:
        """"loop" (stage s on rank s % pp), "v" (s and 2pp-1-s share a rank) or "other"."""
        n = self.point.pp
        if all(r == s % n for s, r in enumerate(self.stage_rank)):
            return "loop"
        if self.stages == 2 * n and all(r == min(s, 2 * n - 1 - s) for s, r in enumerate(self.stage_rank)):
            return "v"
        return "other"

    def actions(self) -> Schedule:
        """The schedule's actions per rank: as the run recorded them (or the planner made them), else as the
        registry builds them from the counts."""
        if self.recorded_schedule is not None:
            return self.recorded_schedule
        if self.order is not None:
            return self.order()
        return build(self.point.schedule, self.point.pp, self.point.microbatches, self.point.virtual_stages)


def load(text: str) -> Recipe:
    """The point `text` names: a run directory or its result.json, or advice.json[#RANK]."""
    path_text, hash_, rank_text = text.rpartition("#") if "#" in text else (text, "", "")
    path = Path(path_text)
    if not path.exists():
        raise ExportError(f"source={text}: no such file or directory (allowed: {ALLOWED_SOURCE})")
    if path.is_dir():
        if hash_:
            raise ExportError(f"source={text}: #RANK names an advice point, and {path_text} is a directory "
                              f"(allowed: {ALLOWED_SOURCE})")
        return from_run(path / RESULT)
    data = _json(path, text)
    if isinstance(data, dict) and "points" in data:
        return from_advice(path, data, rank_text if hash_ else "1")
    if hash_:
        raise ExportError(f"source={text}: {path_text} has no advice points (allowed: {ALLOWED_SOURCE})")
    return from_run(path)


def _json(path: Path, text: str) -> Any:
    try:  # a regular file of a record's size only: a FIFO or /dev/zero is refused unread
        return json.loads(read_bytes(path, "source", "advice"))
    except FileRefused as e:
        raise ExportError(f"source={text}: {e.reason}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ExportError(f"source={text}: not readable JSON ({type(e).__name__}: {e}) "
                          f"(allowed: {ALLOWED_SOURCE})") from None


# -- a run directory -----------------------------------------------------------------------------
def from_run(result_path: Path) -> Recipe:
    if not result_path.exists() and not result_path.is_symlink():  # anything else there: read() says what it is
        raise ExportError(f"source={result_path.parent}: no {RESULT} in it (allowed: {ALLOWED_SOURCE})")
    try:
        result = read(result_path)
    except RecordError as e:
        raise ExportError(f"source={result_path}: {e} (allowed: {ALLOWED_SOURCE})") from None
    if result.plan is None:
        raise ExportError(f"source={result_path}: status={result.status}, no plan recorded ({result.error}); "
                          "allowed: a run that was planned")
    plan = result.plan
    layers = tuple(end - first for first, end in plan.stage_layers)
    ranks = tuple(plan.stage_rank[str(s)] for s in range(len(layers)))
    _checked(result.config, layers)
    recorded = plan.schedule_actions() if plan.schedule is not None else None
    return _recipe(f"run {result_path.parent} (status {result.status})", result.cfg, layers, ranks, recorded,
                   _launch(result.config.get("cluster"), _world(result.config)), ran=True)


# -- an advice point -----------------------------------------------------------------------------
def from_advice(path: Path, data: dict, rank_text: str) -> Recipe:
    ranked = {p["rank"]: p for p in data["points"] if isinstance(p, dict) and p.get("rank") is not None}
    allowed = f"1..{max(ranked)}, the points that fit" if ranked else "none: no point of it fits"
    try:
        rank = int(rank_text)
    except ValueError:
        raise ExportError(f"rank={rank_text}: not a whole number (allowed: {allowed})") from None
    if rank not in ranked:
        raise ExportError(f"rank={rank}: no point of {path} has that rank (allowed: {allowed})")
    point = ranked[rank]
    try:
        typed = _config(data.get("overrides", []), point["overrides"])
        config = asdict(typed)
        layers = tuple(int(n) for n in point["layers_per_stage"])
        _checked(config, layers)  # before anything is planned from them
        entry = spec(typed.schedule.name)
        # an order made from the point's costs: made again as the planner made it (its plan, executor=sim)
        order = None if entry.needs == COUNTS else functools.cache(lambda: _planned(typed, f"{path}#{rank}"))
    except ExportError:
        raise
    except ConfigError as e:
        raise ExportError(f"source={path}#{rank}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"source={path}#{rank}: not an advice point (its overrides and layers_per_stage, "
                          f"as harness.advise writes them: {type(e).__name__} {e})") from None
    ranks = entry.owner(len(layers), typed.pp)
    label = f"{path}#{rank}: {point.get('label', '')}".rstrip(": ")
    return replace(_recipe(label, typed, layers, ranks, None, _launch(data.get("cluster"), _world(config)), ran=False),
                   order=order)


def _planned(c: Config, source: str) -> Schedule:
    """The actions `python -m harness executor=sim` plans for `c` (imports the planner, and torch, only here)."""
    from harness.planning.plan import make_plan

    try:
        return make_plan(replace(c, executor="sim")).schedule
    except ConfigError as e:
        raise ExportError(f"source={source}: {e}") from None


def _config(keys: list[str], overrides: dict[str, Any]) -> Config:
    """The Config `python -m harness <the advice's keys> <the point's>` runs (Hydra composes it:
    scenarios and groups as on the command line; no file the keys name is read)."""
    point = [schedule_key(overrides["schedule"])] + [f"{k}={_hydra(v)}" for k, v in overrides.items()
                                                      if k != "schedule"]
    return compose_config([*keys, *point])


def _hydra(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# -- both ----------------------------------------------------------------------------------------
def _world(c: dict[str, Any]) -> int:
    return c["pp"] * c["dp"] * int(c.get("tp") or 1)  # a record from before tp has none


def _launch(cluster: dict | None, world: int) -> Launch:
    if not cluster:
        return Launch(1, world, None)
    per_node = cluster.get("gpus_per_node")
    if per_node is None:
        per_node = world
    _whole("cluster.gpus_per_node", per_node, 1, MAX_GPUS, "GPUs a machine has (torchrun's --nproc-per-node)")
    return Launch(math.ceil(world / per_node), min(world, per_node), cluster.get("name"))


def _whole(key: str, value: object, low: int, high: int, what: str) -> int:
    """`value` as the integer the script writes, within low..high; ExportError (one line)
    naming the source's key otherwise: an edited or corrupt record (pp=0, dp=2**40, 1.5, true)
    would write a script torchrun or the tool refuses, or one that asks for a machine no one has."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ExportError(f"{key}={value!r}: {what} (allowed: integers {low:,}..{high:,})")
    return value


def _checked(c: dict[str, Any], layers: tuple[int, ...]) -> None:
    """The recorded config's numbers the export writes, each within what the harness itself
    would run (harness/config.py's bounds), before anything is rendered."""
    pp = _whole("pp", c.get("pp"), 1, MAX_WORLD, "pipeline ranks")
    _whole("dp", c.get("dp"), 1, MAX_WORLD // pp, f"data-parallel replicas (pp x dp <= {MAX_WORLD:,} ranks)")
    v = _whole("virtual_stages", c.get("virtual_stages"), 1, MAX_ACTIONS // (3 * pp), "model chunks per rank")
    _whole("microbatches", c.get("microbatches"), 1, max(1, MAX_ACTIONS // (3 * pp * v)),
           "microbatches a step (pp x chunks x M x 3 <= 1,000,000 actions)")
    if c.get("global_batch") is None:
        _whole("microbatch_size", c.get("microbatch_size"), 1, MAX_DIM, "samples per microbatch")
    else:
        _whole("global_batch", c.get("global_batch"), 1, MAX_DIM * MAX_WORLD, "samples per step")
    _whole("steps", c.get("steps", 5), 1, MAX_STEPS, "measured steps")
    if not layers or len(layers) > MAX_ACTIONS or any(isinstance(n, bool) or not 1 <= n <= 2**16 for n in layers):
        raise ExportError(f"layers_per_stage={list(layers)[:8]!r}: (allowed: one count of 1..65,536 layers per stage)")
    lr = c.get("lr", 0.01)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise ExportError(f"lr={lr!r}: the learning rate (allowed: a finite number > 0)")


def _recipe(source: str, c: Config, layers: tuple[int, ...], ranks: tuple[int, ...],
            recorded: Schedule | None, launch: Launch, ran: bool) -> Recipe:
    """`ran`: a run's record, whose learning rate and step count are its own; an advice point's
    config has only the harness's defaults for them, which no export may pass off as the point's."""
    if c.schedule.name not in SCHEDULES:
        raise ExportError(f"schedule={c.schedule.name}: not a registered schedule (allowed: "
                          f"{', '.join(SCHEDULES)})")
    point = Point.of(c)
    if c.global_batch:
        _whole("microbatch_size", point.microbatch_size, 1, MAX_DIM,
               "samples per microbatch (global_batch / (dp x microbatches))")
    return Recipe(source=source, point=point, checkpoint_every=int(c.checkpoint_every or 0), dtype=c.dtype,
                  optimizer=c.optimizer.name, lr=float(c.lr) if ran else None,
                  steps=int(c.warmup_steps + c.steps) if ran else None, model=asdict(c.model),
                  layers_per_stage=layers, stage_rank=ranks, recorded_schedule=recorded, launch=launch,
                  tp=int(c.tp or 1), sequence_parallel=bool(c.sequence_parallel))
