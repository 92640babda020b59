"""What planning refuses from the config and the model's shape alone, answered before torch.

Planning (checks.validate) checks, in order: the schema (config.check_values), the config's
own rules past it (`check_unbuilt`: tp, the registries, a profile's file, the schedule's own
check, requirements and size), the executor, faults and run, then the built model: its stages
(`check_stages`), sizes and modeled time. The built model costs torch's import and the build
(seconds); but where a model's layer count follows from its config (harness/model/shapes.py:
mlp, gpt, hf; not custom), the stage rule needs only that: `check_early` answers it, with the
same line (`stages_problem`, which validate and plan.py raise too), from the run guard and the
sweeper (harness/frontend/), right after check_values and before torch is imported.

A config with two faults can so be told of its stages before its executor, faults or run
section (validate checks those first); each is refused either way, in one line.

Torch-free: this module imports the config, the model registry (names and shapes, no model
module), the schedule and executor registries, parallel/checks.py, the device table and safe_io.
"""

from __future__ import annotations

from harness.config import MAX_ACTIONS, Config, ConfigError, one_of
from harness.model import MODELS, num_layers
from harness.planning.devices import memory_bandwidth
from harness.parallel.checks import check_tp
from harness.records.safe_io import FileRefused, check
from harness.runtime.registry import EXECUTORS
from harness.schedules.registry import FILE, SCHEDULES, chunks_per_rank, requirements


def check_early(c: Config) -> None:
    """What the config and the model's shape alone refuse, for a config check_values passed:
    check_unbuilt, then the stage rule where the model's layers and the schedule's stages
    follow from the config (a custom model's layers and a file's stages wait for planning)."""
    check_unbuilt(c)
    layers = num_layers(c.model)
    entry = SCHEDULES[c.schedule.name]
    if layers is not None and entry.needs != FILE:
        check_stages(c, c.pp * entry.chunks(c.virtual_stages), layers)


def check_unbuilt(c: Config) -> None:
    """validate's checks between the schema and the executor, none needing the model: what tp
    cannot split, the registries' names, a cluster's memory bandwidth, a profile's file (a regular file of a profile's size;
    read, parsed and checked where it is used), the schedule's own check, its requirements and
    its size. ConfigError (one line) for the first wrong."""
    check_tp(c.model, c.tp, c.sequence_parallel)
    one_of("schedule", c.schedule.name, tuple(SCHEDULES))
    one_of("model", c.model.name, tuple(MODELS))
    one_of("executor", c.executor, tuple(EXECUTORS))
    if c.cluster is not None:
        memory_bandwidth(c.cluster)  # the device table's or the cluster's own: else refused here, in one line
    if c.profile:
        try:
            check(c.profile, "profile", "profile")
        except FileRefused as e:
            raise ConfigError(str(e)) from None
    schedule = SCHEDULES[c.schedule.name]
    if schedule.check is not None and (problem := schedule.check(c)):
        raise ConfigError(problem)
    if schedule.build is not None:
        if (why := requirements(c.schedule.name, c.pp, c.microbatches, c.virtual_stages)) is not None:
            raise ConfigError(why)
        _check_actions(c)


def stages_problem(c: Config, stages: int, layers: int) -> str | None:
    """What depends on the number of stages, as one line (None: nothing): each needs a layer;
    checkpoint segments and an explicit partition must fit them."""
    if stages > layers:
        return (f"pp={c.pp}: {stages} stages, more than the model's {layers} layers "
                f"(allowed: pp x chunks per rank <= {layers}, or raise model.layers)")
    smallest = layers // stages
    if c.checkpointing and c.checkpoint_every > smallest:
        return f"checkpoint_every={c.checkpoint_every}: more than the {smallest} layers of the smallest stage " \
               f"(allowed: 1..{smallest})"
    if c.partition.name == "explicit":
        lps = getattr(c.partition, "layers_per_stage", None)
        if not lps or len(lps) != stages:
            return f"partition.layers_per_stage={lps}: partition=explicit needs {stages} entries (one per stage)"
        if any(n < 1 for n in lps) or sum(lps) != layers:
            return f"partition.layers_per_stage={lps}: entries must be >= 1 and sum to the model's {layers} layers"
    return None


def check_stages(c: Config, stages: int, layers: int) -> None:
    """stages_problem, raised as ConfigError."""
    if (problem := stages_problem(c, stages, layers)) is not None:
        raise ConfigError(problem)


def _check_actions(c: Config) -> None:
    """A schedule too long to build (microbatches=1000000000) is refused before it is built."""
    chunks = chunks_per_rank(c.schedule.name, c.virtual_stages)
    actions = c.pp * chunks * c.microbatches * 3
    if actions > MAX_ACTIONS:
        # the key at fault: the one whose reduction alone (the others kept, microbatches and
        # virtual_stages >= 1) brings the count within MAX_ACTIONS, the largest of them; else pp
        others = {"microbatches": c.pp * chunks, "virtual_stages": c.pp * c.microbatches,
                  "pp": chunks * c.microbatches}
        values = {"microbatches": c.microbatches, "virtual_stages": c.virtual_stages, "pp": c.pp}
        if chunks == 1:
            del others["virtual_stages"]
        fixable = [k for k in others if MAX_ACTIONS // (3 * others[k]) >= 1]
        big = max(fixable, key=lambda k: (values[k], k != "pp")) if fixable else "pp"
        allowed = max(1, MAX_ACTIONS // (3 * others[big]))
        raise ConfigError(f"{big}={values[big]}: pp={c.pp} x {chunks} chunks x {c.microbatches} microbatches x 3 = "
                          f"{actions:,} schedule actions, more than {MAX_ACTIONS:,} (allowed: {big} <= {allowed})")

