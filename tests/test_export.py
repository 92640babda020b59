"""python -m harness.export: torchtitan's overrides parsed by torchtitan 0.3.0's own ConfigManager,
Megatron-LM's arguments by its own parse_args and validate_args (megatron-core, unpacked by make
venv), each held to the point; what the source does not give asked for, never defaulted; uneven
stages, schedules a tool has no name for, and bad input said in one line."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import shlex
import sys
import types
import typing
import warnings
from pathlib import Path

import pytest

from harness.export.__main__ import main
from harness.export.point import load
from harness.schedules.csv_io import from_csv
from tests.conftest import megatron_runnable_rank

ROOT = Path(__file__).resolve().parents[1]
ADVICE = ROOT / "reports" / "advise_example" / "advice.json"


def export(capsys, *argv: str, nearest: bool = True) -> tuple[int, str, str]:
    """python -m harness.export with argv (and --nearest: most tests read what the nearest export
    writes; test_a_point_the_tool_cannot_run_as_it_is_is_refused_without_nearest, the default)."""
    capsys.readouterr()
    code = main(list(argv) + (["--nearest"] if nearest and "--to" in argv else []))
    out, err = capsys.readouterr()
    return code, out, err


def unwrapped(script: str) -> str:
    """The script with its header's wrapped comment lines joined."""
    return script.replace("\n#   ", " ")


PLACEHOLDER = re.compile(r"\$\{([A-Z_]+):\?[^}]*\}|\$([A-Z_]+)")
FILLED = {"LR": "0.0003", "TRAIN_ITERS": "100", "TRAIN_STEPS": "100", "LOG_INTERVAL": "10", "LOG_FREQ": "10",
          "SAVE_INTERVAL": "50", "HF_ASSETS_PATH": "."}  # what a user sets; any other: a path


def filled(script: str) -> str:
    """The script with each variable it asks for set, as bash would expand them."""
    return PLACEHOLDER.sub(lambda m: FILLED.get(m[1] or m[2], f"/set/{m[1] or m[2]}"), script)


def command(script: str, after: str) -> list[str]:
    """The words of the script's command after `after` (the entry point), "$@" left out, with
    every variable it asks for set."""
    body = filled(script).split("set -euo pipefail\n", 1)[1].replace(" \\\n", " ")
    words = shlex.split(body)
    return [w for w in words[words.index(after) + 1:] if w != "$@"]


@pytest.fixture
def run_dir(tmp_path, config):
    """A planned run directory: executor=sim (no processes), a small GPT."""
    from harness.job import run_job

    def make(name: str, **keys) -> Path:
        c = config(**{"model.name": "gpt", "executor": "sim", "steps": 1, "warmup_steps": 0, **keys})
        out = tmp_path / name
        out.mkdir()
        r = run_job(c, out, "test", name)
        assert r.status == "ok", r.error
        return out

    return make


# -- torchtitan, parsed by its own ConfigManager -------------------------------------------------
def need_torchtitan() -> None:
    """Skip, saying why, where torchtitan's config parser cannot be imported."""
    for module in ("tyro", "spmd_types", "torchtitan.config"):
        pytest.importorskip(module, reason=f"{module} not importable: make venv installs requirements-test.txt "
                                           "(torchtitan==0.3.0 with --no-deps and its config parser's few dependencies)")


def titan(args: list[str]):
    """torchtitan's ConfigManager on the exported overrides, the model (--module/--config) swapped
    for tests/torchtitan_registry.py's sections."""
    need_torchtitan()
    from torchtitan.config import manager

    rest = list(args)
    for key, value in (("--module", "tests.torchtitan_registry"), ("--config", "harness_export")):
        rest[rest.index(key) + 1] = value
    return manager.ConfigManager().parse_args(rest)


def stage_layers_of_fqns(parts: list[list[str]]) -> list[int]:
    """Harness layers per stage from torchtitan module names (norm and lm_head are the one head)."""
    return [len([m for m in part if m != "norm"]) for part in parts]


def test_the_registry_sections_are_trainer_configs_own():
    """tests/torchtitan_registry.py stands for Trainer.Config: the same field names and types,
    read from torchtitan/trainer.py's source (importing it needs torchtitan's training stack)."""
    need_torchtitan()
    import torchtitan

    tree = ast.parse((Path(torchtitan.__file__).parent / "trainer.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    config = next(n for n in trainer.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    fields = {n.target.id: ast.unparse(n.annotation) for n in config.body if isinstance(n, ast.AnnAssign)}
    assert fields["training"] == "TrainingConfig" and fields["parallelism"] == "ParallelismConfig"
    assert fields["activation_checkpoint"] == "ActivationCheckpointingConfig"
    assert fields["hf_assets_path"] == fields["dump_folder"] == "str"
    assert fields["metrics"] == "MetricsProcessor.Config" and fields["checkpoint"] == "BaseCheckpointManager.Config"
    assert fields["lr_scheduler"] == "LRSchedulersContainer.Config"
    assert fields["dataloader"] == "BaseDataLoader.Config"  # llama3's registry: HuggingFaceTextDataLoader's


def test_torchtitan_parses_the_best_interleaved_advice_point_as_the_point(capsys):
    """The 70B example's best interleaved 1F1B point: Interleaved1F1B over its uneven stages
    (module names per part), its tp, FSDP over dp for ZeRO-1, M of B=1, full AC where it
    checkpoints, bf16 mixed precision; torchtitan's own stage placement puts each part on the rank the harness does."""
    need_torchtitan()
    from torchtitan.distributed.activation_checkpoint import FullAC
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    point = next(p for p in json.loads(ADVICE.read_text())["points"]
                 if p["overrides"]["schedule"] == "interleaved_1f1b" and p["overrides"]["pp"] == 8 and p["rank"])
    code, out, err = export(capsys, "--to", "torchtitan", f"{ADVICE}#{point['rank']}")
    assert code == 0, err
    args = command(out, "torchtitan.train")
    assert args[:4] == ["--module", "llama3", "--config", "llama3_70b"]
    c = titan(args)
    o, par = point["overrides"], c.parallelism
    assert par.pipeline_parallel_degree == o["pp"] == 8
    assert par.pipeline_parallel_schedule == "Interleaved1F1B" and not par.pipeline_parallel_schedule_csv
    assert par.pipeline_parallel_microbatch_size == o["microbatch_size"]
    assert stage_layers_of_fqns(par.module_fqns_per_model_part) == point["layers_per_stage"]
    # ZeRO-1 as FSDP over dp, plain DDP as replicate
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == ((1, o["dp"]) if o["zero"]
                                                                                    else (o["dp"], 1))
    assert (par.tensor_parallel_degree, par.context_parallel_degree) == (o.get("tp", 1), 1)
    t = c.training
    assert t.local_batch_size // par.pipeline_parallel_microbatch_size == o["microbatches"]
    assert t.global_batch_size == o["global_batch"] == t.local_batch_size * o["dp"]
    assert (t.dtype, t.mixed_precision_param, t.seq_len) == ("float32", "bfloat16", 4096)
    # Trainer.Config.__post_init__'s rules (trainer.py): B divides the local batch, no CUDA graphs with PP
    assert t.local_batch_size % par.pipeline_parallel_microbatch_size == 0 and t.disable_cuda_graphs
    assert isinstance(c.activation_checkpoint, FullAC.Config) == o["checkpointing"]
    stages = len(point["layers_per_stage"])
    assert [s for r in range(8) for s in _get_pp_rank_to_stage_indices_mapping(r, 8, "Interleaved1F1B", stages)
            if s % 8 != r] == []


def test_torchtitan_layers_per_stage_where_its_own_split_is_the_points(capsys, tmp_path):
    """A 1F1B pp=8 advice point on [11, 11, 10, ...] (the example's first 1F1B point, its stages
    set so: which split the search finds depends on the profile's costs): one
    pipeline_parallel_layers_per_stage, which torchtitan's own metadata and split turn back
    into the point's stages."""
    need_torchtitan()
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _get_pipeline_metadata

    doc = json.loads(ADVICE.read_text())
    point = next(p for p in doc["points"] if p["overrides"]["schedule"] == "1f1b" and p["overrides"]["pp"] == 8
                 and p["rank"])
    point["layers_per_stage"] = [11, 11, 10, 10, 10, 10, 10, 10]
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps(doc))
    code, out, err = export(capsys, "--to", "torchtitan", f"{advice}#{point['rank']}")
    assert code == 0, err
    c = titan(command(out, "torchtitan.train"))
    par = c.parallelism
    assert par.pipeline_parallel_schedule == "1F1B" and par.module_fqns_per_model_part is None
    assert par.pipeline_parallel_layers_per_stage is not None
    stages, blocks, first, last = _get_pipeline_metadata(types.SimpleNamespace(pp=par.pipeline_parallel_degree),
                                                         par, types.SimpleNamespace(layers=[None] * 80))
    parts = _generate_llm_fqn_per_model_part(stages, blocks, first, last)
    assert stage_layers_of_fqns(parts) == point["layers_per_stage"] == [11, 11, 10, 10, 10, 10, 10, 10]


def test_torchtitan_gets_a_csv_for_a_schedule_it_has_no_name_for(capsys, run_dir, tmp_path):
    """zb_h1 runs one stage per rank, where torchtitan builds InterleavedZeroBubble with two:
    the run's own actions go as torch's CSV beside --out, named in the command; torchtitan's
    metadata gives one stage per rank, as the run had."""
    need_torchtitan()
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

    run = run_dir("zb", **{"schedule.name": "zb_h1"}, pp=2, microbatches=4, microbatch_size=2)
    out = tmp_path / "titan.sh"
    code, _, err = export(capsys, "--to", "torchtitan", str(run), "--out", str(out))
    assert code == 0, err
    csv = tmp_path / "titan.schedule.csv"
    assert f"wrote the schedule's CSV to {csv}" in err
    script = unwrapped(out.read_text())
    assert "no torch class" not in script and "at least 2 stages per rank" in script
    c = titan(command(script, "torchtitan.train"))
    par = c.parallelism
    assert par.pipeline_parallel_schedule_csv == str(csv.resolve())
    assert from_csv(csv.read_text()) == load(str(run)).actions()
    assert issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
    stages, *_ = _get_pipeline_metadata(types.SimpleNamespace(pp=2), par, types.SimpleNamespace(layers=[None] * 4))
    assert stages == 2 and (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (1, 1)
    assert par.pipeline_parallel_microbatch_size == 2 and c.training.local_batch_size == 8
    assert c.activation_checkpoint is None  # the run did not checkpoint
    assert "CANNOT EXPRESS: model=gpt" in script and "TORCHTITAN_MODULE" in script  # no registry builds it


@pytest.mark.parametrize("schedule, name, v", [("gpipe", "GPipe", 1), ("1f1b", "1F1B", 1),
                                               ("interleaved_1f1b", "Interleaved1F1B", 2),
                                               ("zbv", "ZBVZeroBubble", 2), ("dualpipev", "DualPipeV", 2)])
def test_torchtitan_places_every_named_schedules_stages_as_the_run(capsys, run_dir, schedule, name, v):
    """Each schedule torchtitan has a name for: that name, and torchtitan's own stage placement
    and layer split give the run's stages on the run's ranks."""
    need_torchtitan()
    from torchtitan.distributed.pipeline_parallel import (_generate_llm_fqn_per_model_part,
                                                          _get_pipeline_metadata,
                                                          _get_pp_rank_to_stage_indices_mapping)

    run = run_dir(schedule, **{"schedule.name": schedule, "model.layers": 6}, pp=2, microbatches=4,
                  virtual_stages=v if schedule == "interleaved_1f1b" else 1)
    code, out, err = export(capsys, "--to", "torchtitan", str(run))
    assert code == 0, err
    par = titan(command(out, "torchtitan.train")).parallelism
    assert par.pipeline_parallel_schedule == name and not par.pipeline_parallel_schedule_csv
    point = load(str(run))
    if par.module_fqns_per_model_part is None:
        stages, blocks, first, last = _get_pipeline_metadata(types.SimpleNamespace(pp=2), par,
                                                             types.SimpleNamespace(layers=[None] * 6))
        parts = _generate_llm_fqn_per_model_part(stages, blocks, first, last)
    else:
        parts = par.module_fqns_per_model_part
    assert stage_layers_of_fqns(parts) == list(point.layers_per_stage)
    placed = {s: r for r in range(2) for s in _get_pp_rank_to_stage_indices_mapping(r, 2, name, len(parts))}
    assert [placed[s] for s in range(len(parts))] == list(point.stage_rank)


def test_torchtitan_ddp_for_zero_0(capsys, run_dir):
    run = run_dir("ddp", pp=2, dp=2, microbatches=2)
    code, out, err = export(capsys, "--to", "torchtitan", str(run))
    assert code == 0, err
    par = titan(command(out, "torchtitan.train")).parallelism
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (2, 1)
    assert "CANNOT EXPRESS: placement=pp_inner" in unwrapped(out) and "CANNOT EXPRESS: placement=pp_inner" in err


def titan_held_to_the_point(c, p, csv: Path | None) -> None:
    """What torchtitan's ConfigManager made of the overrides is the point: parallel degrees,
    batch, stages (torchtitan's own split and placement), schedule or its CSV, run length."""
    from torchtitan.distributed.pipeline_parallel import (_generate_llm_fqn_per_model_part, _get_pipeline_metadata,
                                                          _get_pp_rank_to_stage_indices_mapping)

    par, t, pt = c.parallelism, c.training, p.point
    assert (par.pipeline_parallel_degree, par.tensor_parallel_degree, par.context_parallel_degree) == (pt.pp, p.tp, 1)
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == pt.dp
    assert par.enable_sequence_parallel == (p.sequence_parallel or p.tp == 1)
    assert t.local_batch_size == p.local_batch and t.global_batch_size == p.global_batch
    assert t.steps == (p.steps if p.steps is not None else int(FILLED["TRAIN_STEPS"]))
    assert c.dump_folder == "/set/OUTPUT_DIR" and c.dataloader.dataset == "/set/DATASET" and c.checkpoint.enable
    assert (c.lr_scheduler.warmup_steps, c.lr_scheduler.decay_ratio) == (0, 0)
    if pt.pp == 1:
        return
    assert par.pipeline_parallel_microbatch_size == pt.microbatch_size
    assert t.local_batch_size // par.pipeline_parallel_microbatch_size == pt.microbatches
    if csv is not None:
        assert par.pipeline_parallel_schedule_csv == str(csv.resolve()) and from_csv(csv.read_text()) == p.actions()
    if not p.decoder:
        return
    parts = par.module_fqns_per_model_part
    if parts is None:
        stages, blocks, first, last = _get_pipeline_metadata(types.SimpleNamespace(pp=pt.pp), par,
                                                             types.SimpleNamespace(layers=[None] * p.model["layers"]))
        parts = _generate_llm_fqn_per_model_part(stages, blocks, first, last)
    assert stage_layers_of_fqns(parts) == list(p.layers_per_stage)
    if p.placement_kind() != "other":
        placed = {s: r for r in range(pt.pp) for s in _get_pp_rank_to_stage_indices_mapping(
            r, pt.pp, par.pipeline_parallel_schedule, len(parts))}
        assert [placed[s] for s in range(len(parts))] == list(p.stage_rank)


def titan_parses(capsys, source: str, out: Path) -> None:
    code, _, err = export(capsys, "--to", "torchtitan", source, "--out", str(out))
    assert code == 0, err
    csv = out.with_name(out.stem + ".schedule.csv")
    script = out.read_text()
    titan_held_to_the_point(titan(command(script, "torchtitan.train")), load(source),
                            csv if "pipeline_parallel_schedule_csv" in script else None)


def test_torchtitan_parses_advice_points_of_each_kind_as_the_points(capsys, tmp_path):
    need_torchtitan()
    for point in advice_points(SAMPLE[1:]):  # zb_auto's order at pp=32 takes seconds to make: a run's below
        titan_parses(capsys, f"{ADVICE}#{point['rank']}", tmp_path / f"p{point['rank']}.sh")


@pytest.mark.slow
def test_torchtitan_parses_every_advice_point_as_the_point(capsys, tmp_path):
    need_torchtitan()
    for point in advice_points():
        titan_parses(capsys, f"{ADVICE}#{point['rank']}", tmp_path / f"p{point['rank']}.sh")


# a small sweep, every schedule and what an export maps differently: (name, keys)
SWEEP = [("gpipe", {"schedule.name": "gpipe", "pp": 2, "microbatches": 4}),
         ("1f1b_ddp", {"schedule.name": "1f1b", "pp": 2, "dp": 2, "microbatches": 4}),
         ("interleaved_zero1_ckpt", {"schedule.name": "interleaved_1f1b", "pp": 2, "dp": 2, "zero": 1,
                                     "virtual_stages": 2, "microbatches": 4, "model.layers": 6,
                                     "checkpointing": True, "placement": "dp_inner"}),
         ("zb_h1", {"schedule.name": "zb_h1", "pp": 2, "microbatches": 4}),
         ("zbv", {"schedule.name": "zbv", "pp": 2, "microbatches": 4, "model.layers": 6}),
         ("dualpipev", {"schedule.name": "dualpipev", "pp": 2, "microbatches": 4, "model.layers": 6}),
         ("zb_auto", {"schedule.name": "zb_auto", "pp": 2, "microbatches": 4}),
         ("mlp", {"model.name": "mlp", "schedule.name": "1f1b", "pp": 2, "microbatches": 4})]


def test_every_run_of_a_small_sweep_exports_to_both_tools(capsys, run_dir, tmp_path, megatron):
    """Every run: torchtitan's ConfigManager parses its export as the run; Megatron-LM's
    parse_args and validate_args take its export as the run, or the export is refused in one
    line with exit 2 (an mlp: no decoder to give Megatron)."""
    need_torchtitan()
    refused = {}
    for name, keys in SWEEP:
        run = run_dir(name, **keys)
        titan_parses(capsys, str(run), tmp_path / f"{name}.sh")
        code, out, err = export(capsys, "--to", "megatron", str(run))
        if code == 2:
            assert out == "" and len(err.strip().splitlines()) == 1 and "allowed" in err, err
            refused[name] = err.split(":", 2)[1].strip()
            continue
        assert code == 0, err
        args = megatron_validated(megatron, out)
        held_to_the_point(args, load(str(run)))
        cannot = [x for x in unwrapped(out).splitlines() if "CANNOT EXPRESS" in x]
        if keys["schedule.name"] in ("gpipe", "zb_h1", "zbv", "dualpipev"):  # the nearest Megatron runs, said
            assert cannot[0].startswith("# CANNOT EXPRESS: Megatron-LM has no") and cannot[0][2:] in err
        if keys["schedule.name"] == "zb_auto":  # an order made from costs: 1F1B on its stages, said
            assert cannot[0].startswith("# CANNOT EXPRESS: schedule=zb_auto: an order made from") and \
                "1F1B on the same stages" in unwrapped(out) and args.virtual_pipeline_model_parallel_size is None
        if keys["schedule.name"] in ("zbv", "dualpipev"):  # 2 stages a rank: interleaved, in loop order
            assert "not in a V" in cannot[0] and args.virtual_pipeline_model_parallel_size == 2
    assert refused == {"mlp": "model=mlp"}


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_tensor_and_sequence_parallelism_in_both_tools_own_parsers(capsys, run_dir, tmp_path, megatron,
                                                                   sequence_parallel):
    """tp and sequence_parallel (executor=sim plans no tp, so a run's recipe given them): Megatron's
    --tensor-model-parallel-size and --sequence-parallel, torchtitan's tensor_parallel_degree and
    its enable_sequence_parallel switch, each as the tool's own parser reads them."""
    from dataclasses import replace

    from harness.export import megatron as to_megatron
    from harness.export import torchtitan as to_titan
    from harness.export.point import Launch

    need_torchtitan()
    run = run_dir("tp", pp=2, dp=2, microbatches=4)
    p = replace(load(str(run)), tp=2, sequence_parallel=sequence_parallel, launch=Launch(1, 8, None))
    held_to_the_point(megatron_validated(megatron, to_megatron.render(p).text()), p)
    done = to_titan.render(p, "unused.csv")
    titan_held_to_the_point(titan(command(done.script.text(), "torchtitan.train")), p, None)


def test_what_the_source_does_not_give_the_script_refuses_to_run_without(capsys, run_dir, tmp_path):
    """An advice point's export asks for its run length, learning rate and logging; a run's
    takes them from the run; both ask for data, tokenizer and outputs. bash runs the script
    (a torchrun that prints its arguments) only once each variable is set."""
    run = run_dir("run", pp=2, microbatches=4, lr=0.003, steps=4, warmup_steps=2)
    code, ran, err = export(capsys, "--to", "megatron", str(run))
    assert code == 0, err
    args = megatron_args(ran)
    assert args[args.index("--lr") + 1] == "0.003" and args[args.index("--train-iters") + 1] == "6"
    assert "${LR:?" not in ran and "${DATA_PATH:?" in ran and "--log-throughput" in args
    code, advised, err = export(capsys, "--to", "megatron", f"{ADVICE}#{megatron_runnable_rank(ADVICE)}")
    assert code == 0, err
    header = unwrapped(advised).split("set -euo pipefail", 1)[0]
    wanted = ["LR", "TRAIN_ITERS", "LOG_INTERVAL", "DATA_PATH", "TOKENIZER_MODEL", "CHECKPOINT_DIR", "SAVE_INTERVAL"]
    assert all(f"# set before running: {var}, " in header for var in wanted)
    assert "--lr 0.01" not in advised and "--train-iters 5" not in advised and "--mock-data" not in advised
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    script = tmp_path / "m.sh"
    script.write_text(advised)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HEAD": "node0", "MEGATRON": "/m",
           **{var: FILLED.get(var, f"/set/{var}") for var in wanted}}
    import subprocess

    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    words = done.stdout.splitlines()
    assert words[words.index("--data-path") + 1] == "/set/DATA_PATH" and words[words.index("--lr") + 1] == "0.0003"
    del env["DATA_PATH"]
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "DATA_PATH: see the header of this script" in done.stderr and done.stdout == ""


# -- Megatron-LM, by its own parse_args and validate_args -----------------------------------------
@pytest.fixture(scope="module")
def megatron():
    """megatron/training/arguments.py of megatron-core (requirements-megatron.txt), imported from
    $(VENV)/megatron where make venv unpacks it. It is a Python 3.12 package: on 3.11 it needs
    typing.override (typing_extensions' stands in while it imports) and its GPU kernels import
    triton (an empty stand-in while it imports; torch has looked for triton and found none first,
    so nothing of torch's sees it). Neither is left behind for the other tests."""
    root = Path(sys.prefix) / "megatron"
    if not (root / "megatron" / "training" / "arguments.py").exists():
        pytest.skip(f"{root} has no Megatron-LM parser: make venv unpacks megatron-core there "
                    "(requirements-megatron.txt)")
    import torch
    import typing_extensions

    torch.compile(lambda x: x)  # torch imports its compiler (and looks for triton) before the stand-in exists

    class Anything:
        """triton.jit, triton.autotune(...), tl.constexpr: a decorator leaves the function as it is."""

        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return Anything()

        def __call__(self, *args, **kwargs):
            return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else Anything()

    class StandIn(types.ModuleType):
        __version__ = "99.0"  # no version check of megatron's takes its CPU fallbacks

        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return Anything()

    added = [n for n in ("triton", "triton.language") if n not in sys.modules]
    for name in added:
        sys.modules[name] = StandIn(name)
    shimmed = not hasattr(typing, "override")
    if shimmed:
        typing.override = typing_extensions.override
    sys.path.insert(0, str(root))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.training import arguments
    finally:
        for name in added:
            del sys.modules[name]
        if shimmed:
            del typing.override
    return arguments


def world_of(script: str) -> int:
    words = shlex.split(filled(script).split("set -euo pipefail\n", 1)[1].replace(" \\\n", " "))
    nodes = int(words[words.index("--nnodes") + 1]) if "--nnodes" in words else 1
    return nodes * int(words[words.index("--nproc-per-node") + 1])


def megatron_args(script: str) -> list[str]:
    return command(script, "/set/MEGATRON/pretrain_gpt.py")


def megatron_validated(arguments, script: str) -> argparse.Namespace:
    """Megatron-LM's parse_args and validate_args on the script's arguments, with the world size
    and rank as torchrun gives them (Megatron reads WORLD_SIZE and RANK) and, where validate_args
    asks the GPU its architecture (tp > 1), a Hopper's (9: the H100 and H200 the example priced)."""
    exported = dict(re.findall(r"^export (\w+)=(\S+)$", script, re.M))  # the script's own, before the command
    names = ("WORLD_SIZE", "RANK", *exported)
    saved, before = (sys.argv, arguments.get_device_arch_version), {k: os.environ.get(k) for k in names}
    sys.argv = ["pretrain_gpt.py", *megatron_args(script)]
    os.environ.update(exported, WORLD_SIZE=str(world_of(script)), RANK="0")
    arguments.get_device_arch_version = lambda: 9
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = arguments.parse_args()
            arguments.validate_args(args, {})
    finally:
        sys.argv, arguments.get_device_arch_version = saved
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return args


def layout_stages(args: argparse.Namespace) -> list[list[str]] | None:
    """Megatron's own reading of --pipeline-model-parallel-layout, stages in model order, each
    layer by its layout letter."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    if args.pipeline_model_parallel_layout is None:
        return None
    text = args.pipeline_model_parallel_layout
    stages = PipelineParallelLayerLayout.parse_str_to_list(text if isinstance(text, str) else text.input_data)
    letter = {"embedding": "E", "decoder": "t", "loss": "L", "mtp": "m"}
    return [[letter[layer.name] for layer in stage] for stage in stages]


def held_to_the_point(args: argparse.Namespace, p) -> None:
    """What Megatron made of the arguments is the point: its parallel sizes, batch, model, layers."""
    pt = p.point
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (p.tp, pt.pp)
    assert args.data_parallel_size == pt.dp and args.world_size == p.world
    assert (args.micro_batch_size, args.global_batch_size) == (pt.microbatch_size, p.global_batch)
    assert args.global_batch_size // (args.micro_batch_size * args.data_parallel_size) == pt.microbatches
    assert args.sequence_parallel == (p.sequence_parallel and p.tp > 1)
    assert args.use_distributed_optimizer == (pt.zero >= 1 and pt.dp > 1)
    assert (args.recompute_granularity == "full") == pt.checkpointing
    assert (args.num_layers, args.hidden_size, args.seq_length) == (p.model["layers"], p.model["hidden"],
                                                                   p.model["seq"])
    assert (args.virtual_pipeline_model_parallel_size or 1) == p.stages // pt.pp
    assert args.log_throughput and args.lr_decay_style == "constant"
    stages = layout_stages(args)
    if stages is not None:
        assert [len(s) for s in stages] == list(p.layers_per_stage)
    if p.steps is not None:  # a run: its own length and learning rate
        assert (args.train_iters, args.lr, args.log_interval) == (p.steps, p.lr, 1)


def advice_points(ranks: tuple[int, ...] | None = None) -> list[dict]:
    return [p for p in json.loads(ADVICE.read_text())["points"] if p.get("rank") and (ranks is None or p["rank"] in ranks)]


# one ranked point of each kind in the committed example (make test; make test-all takes every point):
# zb_auto (Megatron's nearest: 1F1B on its stages), dualpipev zero=0 pp_inner (Megatron's nearest, no distributed
# optimizer, its tp-pp-dp mapping), interleaved 1F1B zero=1 (a layout over 16 stages), zbv, 1F1B
SAMPLE = (4, 9, 29, 1, 23)


def megatron_validates_or_refuses(capsys, arguments, points: list[dict]) -> list[str]:
    """Each point exported and run through Megatron-LM's parse_args and validate_args and held to
    the point, or refused in one line with exit 2; the refused points' schedules."""
    refused = []
    for point in points:
        code, out, err = export(capsys, "--to", "megatron", f"{ADVICE}#{point['rank']}")
        if code == 2:
            assert out == "" and len(err.strip().splitlines()) == 1 and "allowed" in err, err
            refused.append(point["overrides"]["schedule"])
            continue
        assert code == 0, err
        assert "${LR:?" in out and "${TRAIN_ITERS:?" in out and "--mock-data" not in out
        held_to_the_point(megatron_validated(arguments, out), load(f"{ADVICE}#{point['rank']}"))
    return refused


def test_megatron_validates_advice_points_of_each_kind_zb_auto_included(capsys, megatron):
    assert megatron_validates_or_refuses(capsys, megatron, advice_points(SAMPLE)) == []


@pytest.mark.slow
def test_megatron_validates_every_advice_point_or_refuses_it_in_one_line(capsys, megatron):
    """Every ranked point of the committed example (the sample above is make test's share)."""
    points = advice_points()
    refused = megatron_validates_or_refuses(capsys, megatron, points)
    assert refused == []


def test_megatron_first_and_last_stages_or_a_layout(capsys, run_dir, megatron):
    """Equal stages counting the embedding and the loss: --account-for-*; only the first and last
    stages differ: --decoder-first/last-pipeline-num-layers; a middle stage differs too: the
    layout, which Megatron's own parser reads back as the stages."""

    def args_of(name: str, layers: int, split: list[int]) -> argparse.Namespace:
        run = run_dir(name, pp=4, microbatches=4, **{"model.layers": layers, "partition.name": "explicit",
                                                     "partition.layers_per_stage": split})
        code, out, err = export(capsys, "--to", "megatron", str(run))
        assert code == 0, err
        args = megatron_validated(megatron, out)
        held_to_the_point(args, load(str(run)))
        return args

    counted = args_of("even", 6, [2, 2, 2, 2])
    assert counted.account_for_embedding_in_pipeline_split and counted.account_for_loss_in_pipeline_split
    first_last = args_of("fl", 8, [2, 3, 3, 2])
    assert (first_last.decoder_first_pipeline_num_layers, first_last.decoder_last_pipeline_num_layers) == (1, 1)
    assert first_last.pipeline_model_parallel_layout is None
    middle = args_of("mid", 6, [2, 3, 1, 2])
    assert layout_stages(middle) == [["E", "t"], ["t"] * 3, ["t"], ["t", "L"]]
    assert middle.decoder_first_pipeline_num_layers is None


@pytest.mark.parametrize("split", [[5], [3, 3, 2], [1, 1, 2, 1], [2, 3, 3, 3, 3, 2, 2, 2]])
def test_megatrons_parser_reads_each_layout_back(split, megatron):
    from harness.export.megatron import layout

    stages = layout_stages(argparse.Namespace(pipeline_model_parallel_layout=layout(split)))
    assert [len(s) for s in stages] == split and stages[0][0] == "E" and stages[-1][-1] == "L"
    assert [x for s in stages for x in s].count("E") == 1 and [x for s in stages for x in s].count("L") == 1


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, key", [
    (["--to", "torchtitan", "no/such/dir"], "source=no/such/dir"),
    (["--to", "torchtitan", f"{ADVICE}#999"], "rank=999"),
    (["--to", "megatron", f"{ADVICE}#0"], "rank=0"),
    (["--to", "megatron", f"{ADVICE}#best"], "rank=best"),
    (["--to", "deepspeed", str(ADVICE)], "--to=deepspeed"),
    ([str(ADVICE)], "--to"),
    (["--to", "megatron", str(ROOT / "harness")], "result.json"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, key):
    code, out, err = export(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and key in err and "allowed" in err, err


def test_a_point_the_tool_cannot_run_as_it_is_is_refused_without_nearest(capsys, tmp_path):
    """The default: a point Megatron would run as another schedule (zb_h1 -> 1F1B) is refused in
    one line, exit 2, nothing written; --nearest writes the nearest, the difference said."""
    point = next(p for p in advice_points() if p["overrides"]["schedule"] == "zb_h1")
    out = tmp_path / "m.sh"
    code, stdout, err = export(capsys, "--to", "megatron", f"{ADVICE}#{point['rank']}", "--out", str(out), nearest=False)
    assert code == 2 and stdout == "" and err.count("\n") == 1 and not out.exists(), err
    assert "Megatron-LM has no zb_h1 schedule" in err and "(allowed: --nearest" in err
    code, _, err = export(capsys, "--to", "megatron", f"{ADVICE}#{point['rank']}", "--out", str(out))
    assert code == 0 and out.exists() and "CANNOT EXPRESS: Megatron-LM has no zb_h1 schedule" in err
