"""python -m harness.export: torchtitan's overrides parsed by torchtitan 0.3.0's own ConfigManager
and held to the point; every Megatron-LM flag written checked against the parser's source (a
copy of megatron/training/arguments.py and the dataclasses it turns into flags, tests/data/);
uneven stages, schedules a tool has no name for, and bad input said in one line."""

from __future__ import annotations

import ast
import json
import re
import shlex
import types
from pathlib import Path

import pytest

from harness.export.__main__ import main
from harness.export.point import load
from harness.schedules.csv_io import from_csv
from harness.schedules.registry import chunks_per_rank

ROOT = Path(__file__).resolve().parents[1]
ADVICE = ROOT / "reports" / "advise_example" / "advice.json"
DATA = Path(__file__).resolve().parent / "data"


def export(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def unwrapped(script: str) -> str:
    """The script with its header's wrapped comment lines joined."""
    return script.replace("\n#   ", " ")


def command(script: str, after: str) -> list[str]:
    """The words of the script's command after `after` (the entry point), "$@" left out."""
    body = script.split("set -euo pipefail\n", 1)[1].replace(" \\\n", " ")
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
    assert fields["hf_assets_path"] == "str"


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


# -- Megatron-LM, against its parser's source --------------------------------------------------
def _classes() -> dict[str, ast.ClassDef]:
    out = {}
    for f in DATA.glob("megatron_*.py.txt"):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.ClassDef):
                out[node.name] = node
    return out


def _factory_flags(name: str, exclude: set[str], classes: dict[str, ast.ClassDef]) -> set[str]:
    """The flags megatron/training/argument_utils.py's ArgumentGroupFactory makes of a dataclass's
    fields (with its bases'): --field-name; a bool that defaults to True as --no-/--disable-;
    metadata argparse_meta's arg_names instead, where given; init=False and excluded fields none."""
    flags: set[str] = set()
    cls = classes[name]
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            flags |= _factory_flags(base.id, exclude, classes)
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        field, annotation = node.target.id, ast.unparse(node.annotation)
        if field in exclude or annotation.startswith("ClassVar"):
            continue
        default, meta = node.value, {}
        if isinstance(default, ast.Call) and ast.unparse(default.func) in ("field", "dataclasses.field"):
            kw = {k.arg: k.value for k in default.keywords}
            if isinstance(kw.get("init"), ast.Constant) and kw["init"].value is False:
                continue
            default = kw.get("default")
            if "metadata" in kw:
                try:
                    meta = ast.literal_eval(kw["metadata"]).get("argparse_meta", {})
                except ValueError:
                    meta = {}
        if "arg_names" in meta:
            flags |= set(meta["arg_names"])
        elif annotation in ("bool", "Optional[bool]", "bool | None") and isinstance(default, ast.Constant) \
                and default.value is True:
            flags |= {"--no-" + field.replace("_", "-"), "--disable-" + field.replace("_", "-")}
        else:
            flags.add("--" + field.replace("_", "-"))
    return flags


def megatron_flags() -> set[str]:
    """Every flag the copied parser defines: its add_argument strings, and the fields of each
    ArgumentGroupFactory(Class, exclude=...) whose class is among the copied sources."""
    tree = ast.parse((DATA / "megatron_arguments.py.txt").read_text())
    classes = _classes()
    flags: set[str] = set()
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        lists = {t.id: [e.value for e in a.value.elts] for a in ast.walk(func) if isinstance(a, ast.Assign)
                 and isinstance(a.value, ast.List) and all(isinstance(e, ast.Constant) for e in a.value.elts)
                 for t in a.targets if isinstance(t, ast.Name)}
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
                flags |= {a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
            elif isinstance(call.func, ast.Name) and call.func.id == "ArgumentGroupFactory":
                cls = call.args[0]
                if not (isinstance(cls, ast.Name) and cls.id in classes):
                    continue
                kw = {k.arg: k.value for k in call.keywords}
                ex = kw.get("exclude")
                exclude = set(lists[ex.id] if isinstance(ex, ast.Name) else ast.literal_eval(ex) if ex else [])
                flags |= _factory_flags(cls.id, exclude, classes)
    return flags


def test_the_megatron_flag_reader_reads_the_parser():
    """Literal add_argument flags, dataclass-generated ones (renamed by metadata, bool negations),
    and what the parser leaves out (no --virtual-pipeline-model-parallel-size: excluded there)."""
    flags = megatron_flags()
    assert {"--use-distributed-optimizer", "--seq-length", "--pipeline-model-parallel-layout",
            "--num-layers", "--pipeline-model-parallel-size", "--micro-batch-size", "--bf16",
            "--disable-bias-linear", "--use-tp-pp-dp-mapping", "--recompute-granularity",
            "--microbatch-group-size-per-virtual-pipeline-stage", "--vocab-size"} <= flags
    assert "--virtual-pipeline-model-parallel-size" not in flags and "--add-bias-linear" not in flags
    assert all(f.startswith("-") for f in flags) and len(flags) > 500


def megatron_args(script: str) -> list[str]:
    return command(script, '${MEGATRON:?set MEGATRON to your Megatron-LM checkout}/pretrain_gpt.py')


def parse_layout(layout: str) -> list[list[str]]:
    """Megatron's own PipelineParallelLayerLayout.parse_str_to_list, from the copied source, each
    layer type standing for its layout character."""
    tree = ast.parse((DATA / "megatron_pipeline_parallel_layer_layout.py.txt").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "parse_str_to_list")
    fn.decorator_list = []
    space = {"re": re, "LayerType": types.SimpleNamespace(embedding="E", loss="L", decoder="t", mtp="m")}
    exec(compile(ast.Module([fn], []), "parse_str_to_list", "exec"), space)  # noqa: S102 - Megatron's code, copied
    return space["parse_str_to_list"](layout)


@pytest.mark.parametrize("rank", [1, 6, 80])
def test_megatron_flags_of_advice_points_are_the_parsers(capsys, rank):
    code, out, err = export(capsys, "--to", "megatron", f"{ADVICE}#{rank}")
    assert code == 0, err
    args = megatron_args(out)
    assert {a for a in args if a.startswith("--")} - megatron_flags() == set()
    point = next(p for p in json.loads(ADVICE.read_text())["points"] if p["rank"] == rank)
    o = point["overrides"]
    value = lambda flag: args[args.index(flag) + 1]  # noqa: E731
    assert value("--pipeline-model-parallel-size") == str(o["pp"])
    assert value("--tensor-model-parallel-size") == str(o.get("tp", 1))
    assert value("--micro-batch-size") == str(o["microbatch_size"])
    assert value("--global-batch-size") == str(o["global_batch"])
    assert ("--use-distributed-optimizer" in args) == (o["zero"] == 1)
    assert ("--recompute-granularity" in args) == o["checkpointing"] and "--bf16" in args
    if "--pipeline-model-parallel-layout" in args:
        stages = parse_layout(value("--pipeline-model-parallel-layout"))
        assert [len(s) for s in stages] == point["layers_per_stage"]
        assert stages[0][0] == "E" and stages[-1][-1] == "L" and sum(s.count("t") for s in stages) == 80
        chunks = chunks_per_rank(o["schedule"], o["virtual_stages"] or 1)  # zbv, dualpipev: 2 whatever v says
        assert len(stages) == o["pp"] * chunks


def test_megatron_first_and_last_stages_or_a_layout(capsys, run_dir):
    """Equal stages counting the embedding and the loss: --account-for-*; only the first and last
    stages differ: --decoder-first/last-pipeline-num-layers; a middle stage differs too: the
    layout, which Megatron's own parser reads back as the stages."""

    def args_of(name: str, layers: int, split: list[int]) -> list[str]:
        run = run_dir(name, pp=4, microbatches=4, **{"model.layers": layers, "partition.name": "explicit",
                                                     "partition.layers_per_stage": split})
        code, out, err = export(capsys, "--to", "megatron", str(run))
        assert code == 0, err
        args = megatron_args(out)
        assert {a for a in args if a.startswith("--")} - megatron_flags() == set()
        return args

    counted = args_of("even", 6, [2, 2, 2, 2])
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(counted)
    first_last = args_of("fl", 8, [2, 3, 3, 2])
    assert first_last[first_last.index("--decoder-first-pipeline-num-layers") + 1] == "1"  # embedding + 1 block
    assert first_last[first_last.index("--decoder-last-pipeline-num-layers") + 1] == "1"  # 1 block + head
    assert "--pipeline-model-parallel-layout" not in first_last
    middle = args_of("mid", 6, [2, 3, 1, 2])
    layout = middle[middle.index("--pipeline-model-parallel-layout") + 1]
    assert parse_layout(layout) == [["E", "t"], ["t"] * 3, ["t"], ["t", "L"]]
    assert "--decoder-first-pipeline-num-layers" not in middle


@pytest.mark.parametrize("split", [[5], [3, 3, 2], [1, 1, 2, 1], [2, 3, 3, 3, 3, 2, 2, 2]])
def test_megatrons_parser_reads_each_layout_back(split):
    from harness.export.megatron import layout

    stages = parse_layout(layout(split))
    assert [len(s) for s in stages] == split and stages[0][0] == "E" and stages[-1][-1] == "L"
    assert [x for s in stages for x in s].count("E") == 1 and [x for s in stages for x in s].count("L") == 1


@pytest.mark.parametrize("schedule", ["gpipe", "zb_h1", "zbv"])
def test_megatron_says_what_it_cannot_run(capsys, run_dir, schedule):
    run = run_dir(schedule, **{"schedule.name": schedule}, pp=2, microbatches=4)
    code, out, err = export(capsys, "--to", "megatron", str(run))
    assert code == 0, err
    line = next(x for x in unwrapped(out).splitlines() if "CANNOT EXPRESS" in x)
    assert line.startswith("# CANNOT EXPRESS: Megatron-LM has no")
    assert "CANNOT EXPRESS: Megatron-LM has no" in err
    args = megatron_args(out)
    assert {a for a in args if a.startswith("--")} - megatron_flags() == set()
    if schedule == "zbv":  # 2 stages a rank: interleaved over the same stages, in loop order
        assert "not in a V" in line and "--microbatch-group-size-per-virtual-pipeline-stage" in args


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
