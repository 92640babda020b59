"""From the command line's keys to a Problem: the harness config (model, dtype, optimizer,
cost.*, profile) composed by Hydra exactly as `python -m harness` composes it, the profile
(expanded from one block when it has fewer layers than the model), the cluster."""

from __future__ import annotations

import json
from pathlib import Path

from harness.config import ConfigError, register, to_config

from .cluster import AdviseError, ClusterConfig
from .memory import LayerMemory
from .profiles import LayerCosts, expand, profile_model, read_profile
from .search import Problem


def shown(path: str | Path) -> str:
    """`path` relative to the working directory when it lies below it (what advice.md prints:
    its commands run from there), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(cluster=..., cluster.*=...) and the harness's own keys."""
    mine = [o for o in overrides if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == "cluster"]
    return mine, [o for o in overrides if o not in mine]


def compose_config(overrides: list[str]):
    """The harness Config for `overrides`, as python -m harness composes it; AdviseError (one line)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="harness.conf", version_base="1.3"):
            return to_config(compose(config_name="config", overrides=overrides))
    except ConfigError as e:
        raise AdviseError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - Hydra's own errors, one line as python -m harness says them
        from harness.cli import hydra_problem

        raise AdviseError(hydra_problem(e, overrides)) from None
    finally:
        GlobalHydra.instance().clear()


def _names_model(overrides: list[str]) -> bool:
    keys = [o.lstrip("+~").split("=", 1)[0] for o in overrides]
    return any(k == "model" or k.startswith("model.") or k == "scenario" for k in keys)


def build_problem(overrides: list[str], cluster: ClusterConfig, global_batch: int | None, out_dir: Path,
                  emulated: bool | None = None) -> Problem:
    """The Problem the search runs on. A profile with fewer layers than the model is expanded
    by kind and written to out_dir/profile_expanded.json (what the run commands replay)."""
    c = compose_config(overrides)
    notes: list[str] = []
    data = None
    if c.profile:
        data = read_profile(c.profile)
        described = profile_model(data)
        if described and not _names_model(overrides):
            for k, v in described.items():
                if hasattr(c.model, k):
                    setattr(c.model, k, v)
            notes.append(f"model from the profile: {described}")
    from harness.model import ModelError, get_model

    try:
        model = get_model(c.model)
        kinds = [model.kind(i) for i in range(model.num_layers)]
    except (ModelError, ConfigError) as e:
        raise AdviseError(str(e)) from None
    path = c.profile
    if data is not None:
        full = expand(data, kinds, str(c.profile))
        if full is not data:
            out_dir.mkdir(parents=True, exist_ok=True)
            path = str((out_dir / "profile_expanded.json").resolve())
            Path(path).write_text(json.dumps(full, indent=1))
            notes.append(f"profile {shown(c.profile)}: {len(data['layers'])} layers expanded by kind to the model's "
                         f"{len(kinds)} -> {shown(path)}")
            c.profile = path
        data = full
        dtype = str(data.get("dtype", ""))
        want = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[c.dtype]
        if dtype and want not in dtype:
            notes.append(f"the profile was measured in {dtype}; memory is counted in dtype={c.dtype}")
    gb = global_batch if global_batch is not None else c.global_batch
    if gb is None:
        raise AdviseError("--global-batch: needed (samples per step over all replicas; or global_batch=N)")
    costs = LayerCosts(c, len(kinds), data, path)
    try:
        memory = LayerMemory(c, cluster.device)
    except (ModelError, ConfigError) as e:
        raise AdviseError(str(e)) from None
    emulated = (c.compute == "emulated") if emulated is None else emulated
    if emulated and cluster.device != "cpu":
        notes.append("compute=emulated predicts the harness's replay: recompute is not timed")
    tokens = c.model.seq if c.model.name in ("gpt", "hf") else None
    return Problem(c, cluster, int(gb), costs, memory, emulated, tokens, notes)


def problem_for(c, cluster: ClusterConfig, emulated: bool | None = None) -> Problem:
    """A Problem straight from a harness Config (no Hydra): its profile (or cost.*), its model,
    its global batch (or dp x M x B). What calibrate.py and validate.py predict their runs with."""
    from harness.model import get_model

    model = get_model(c.model)
    data = read_profile(c.profile) if c.profile else None
    costs = LayerCosts(c, model.num_layers, data, c.profile)
    gb = c.global_batch if c.global_batch is not None else c.dp * c.microbatches * c.microbatch_size
    emulated = (c.compute == "emulated") if emulated is None else emulated
    tokens = c.model.seq if c.model.name in ("gpt", "hf") else None
    return Problem(c, cluster, int(gb), costs, LayerMemory(c, cluster.device), emulated, tokens, [])


def point_for(c):
    """The search Point a harness Config runs."""
    from .search import Point

    b = c.global_batch // (c.dp * c.microbatches) if c.global_batch is not None else c.microbatch_size
    v = c.virtual_stages if c.schedule.name == "interleaved_1f1b" else 1
    return Point(c.schedule.name, c.pp, c.microbatches, v, c.dp, b, c.checkpointing, c.zero, c.placement)
