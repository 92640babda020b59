"""From the command line's keys to a Problem: the harness Config composed by Hydra exactly as
`python -m harness` composes it (cluster= included), made every point's base: executor=sim,
the model the profile describes (unless the keys name one), partition=profile with a profile,
the compute mode priced said explicitly. The keys that make that base are what every printed
command carries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.frontend.compose import compose_config
from harness.config import ConfigError, PartitionConfig, check_cluster
from harness.model.built import built_model
from harness.model.profile_data import ProfileError, profile_model, read_profile
from harness.runtime.precision import DTYPES

from .search import AdviseError, Problem, with_model

POINT_KEYS = ("schedule", "pp", "dp", "microbatches", "microbatch_size", "virtual_stages", "checkpointing", "zero",
              "global_batch", "placement", "tp", "sequence_parallel", "executor", "compute", "device", "partition")


def shown(path: str | Path) -> str:
    """`path` relative to the working directory when it lies below it (what advice.md prints:
    its commands run from there), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def key_of(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _names_model(overrides: list[str]) -> bool:
    keys = [key_of(o) for o in overrides]
    return any(k == "model" or k.startswith("model.") or k == "scenario" for k in keys)


def presets() -> list[str]:
    return sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "cluster").glob("*.yaml"))


def build_problem(overrides: list[str], global_batch: int | None, tp_profiles: list[str] | None = None) -> Problem:
    """The Problem the search runs on; AdviseError (one line) for anything it cannot plan for.
    `tp_profiles`: profiles of one TP rank each (their model.tp, model.sequence_parallel), of the
    config's profile's model."""
    for o in overrides:  # what every point sets itself: a fixed value would conflict with each point's
        if key_of(o) == "microbatch_size":
            raise AdviseError(f"{o}: every point sets B from the global batch (allowed: --microbatch-sizes "
                              f"{o.partition('=')[2]} to search only that B)")
    try:
        c = compose_config(overrides)
    except ConfigError as e:
        raise AdviseError(str(e)) from None
    if c.cluster is None:
        raise AdviseError(f"cluster: no cluster given (allowed: cluster=<{'|'.join(presets())}>)")
    try:
        check_cluster(c.cluster)
    except ConfigError as e:
        raise AdviseError(str(e)) from None
    # the keys the commands carry: the user's, less what each point, the cluster and this function set
    printed = [o for o in overrides if key_of(o).split(".")[0] not in POINT_KEYS + ("cluster", "profile")]
    notes: list[str] = []
    if c.profile:
        try:
            data = read_profile(c.profile)
        except ProfileError as e:
            raise AdviseError(str(e)) from None
        described = profile_model(data)
        if described and not _names_model(overrides):
            try:
                c = with_model(c, described)
            except ConfigError as e:
                raise AdviseError(f"profile={shown(c.profile)}: its model: {e}") from None
            printed += [f"model={c.model.name}"] + [f"model.{k}={v}" for k, v in described.items() if k != "name"]
            notes.append(f"model from the profile: {described}")
        c.partition = PartitionConfig("profile")
        printed += [f"profile={shown(c.profile)}", "partition=profile"]
        measured = str(data.get("dtype", ""))
        if measured and str(DTYPES[c.dtype]).removeprefix("torch.") not in measured:
            notes.append(f"the profile was measured in {measured}; memory is counted in dtype={c.dtype}")
    elif c.partition.name != "uniform":
        printed += [o for o in overrides if key_of(o).split(".")[0] == "partition"]
    gb = global_batch if global_batch is not None else c.global_batch
    if gb is None:
        raise AdviseError("--global-batch: needed (samples per step over all replicas; or global_batch=N)")
    if gb < 1:
        raise AdviseError(f"--global-batch {gb}: must be >= 1")
    # the mode priced, said in every command: a GPU cluster's runs are real; here, as asked (auto: real)
    compute = "real" if c.compute == "auto" else c.compute
    printed.append(f"compute={compute}")
    if compute == "emulated" and c.cluster.device != "cpu":
        notes.append("compute=emulated predicts the harness's replay: recompute is not timed")
    c = replace(c, executor="sim", compute=compute, device="cuda" if c.cluster.device == "cuda" else c.device,
                global_batch=gb)
    try:
        model = built_model(c.model)
        _ = model.num_layers
    except ConfigError as e:
        raise AdviseError(str(e)) from None
    cluster_keys = [o for o in overrides if key_of(o).split(".")[0] == "cluster"]
    return Problem(c, model, int(gb), printed, cluster_keys, notes, _tp_profiles(c, tp_profiles or []))


def _tp_profiles(c, paths: list[str]) -> dict[tuple[int, bool], str]:
    """--tp-profiles by the (tp, sequence_parallel) each says it times (python -m harness.advise.derive
    --tp N writes model.tp and model.sequence_parallel); AdviseError (one line) for a file that is no
    such profile, of another model than the config's profile, or a degree given twice."""
    if paths and not c.profile:
        raise AdviseError(f"--tp-profiles {paths[0]}: needs profile= (the tp=1 rank's) among the keys")
    out: dict[tuple[int, bool], str] = {}
    base = profile_model(read_profile(c.profile)) if paths else None
    for path in paths:
        try:
            data = read_profile(path)
        except ProfileError as e:
            raise AdviseError(f"--tp-profiles {path}: {e}") from None
        m = data.get("model") or {}
        tp, sp = m.get("tp"), m.get("sequence_parallel", False)
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 2 or not isinstance(sp, bool):
            raise AdviseError(f"--tp-profiles {path}: model.tp={tp!r}, model.sequence_parallel={sp!r} (allowed: a "
                              "profile of one TP rank, tp an integer >= 2: python -m harness.advise.derive --tp N)")
        if profile_model(data) != base:
            raise AdviseError(f"--tp-profiles {path}: its model {profile_model(data)} is not "
                              f"profile={shown(c.profile)}'s "
                              f"{base} (allowed: a profile of the same model at another tp)")
        if (tp, sp) in out:
            raise AdviseError(f"--tp-profiles {path}: tp={tp} sequence_parallel={str(sp).lower()} given twice "
                              f"(also {out[tp, sp]}; allowed: one profile per degree)")
        out[tp, sp] = path
    return out
