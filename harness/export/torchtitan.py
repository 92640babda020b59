"""A point as torchtitan 0.3.0's command line: `python -m torchtitan.train --module M --config C`
(a config registry function) and `--section.key value` overrides that tyro parses into the
registry's config (torchtitan/config/manager.py). The keys are ParallelismConfig's and
TrainingConfig's (torchtitan/config/configs.py), and activation checkpointing is the tyro
subcommand of Trainer.Config.activation_checkpoint (`activation-checkpoint:full|none`,
torchtitan/distributed/activation_checkpoint.py), written last.

Decisions, each said in the script's header:
- data parallelism: zero=0 is DDP in the harness (every replica holds everything), so
  data_parallel_replicate_degree=dp, shard degree 1. torchtitan has no ZeRO-1: zero=1 becomes
  FSDP (data_parallel_shard_degree=dp), which shards the optimizer state as ZeRO-1 does and the
  parameters and gradients too.
- layers: pipeline_parallel_layers_per_stage where torchtitan's own split of it (embedding and
  norm + head one layer each, its default first/last_stage_less_layers=1: the harness's own
  count) gives the point's stages exactly, else module_fqns_per_model_part (the decoder's
  module names per stage), which says any split.
- schedule: torch's class name where torchtitan builds the point's stages with it, else the
  point's actions as torch's compute_only CSV (pipeline_parallel_schedule_csv).
- precision: dtype=bf16 is fp32 master weights with bf16 compute parameters
  (training.dtype float32, mixed_precision_param bfloat16); torchtitan has no fp16.
- what the source does not give (data, assets, outputs; an advice point's steps and logging) is
  an environment variable the script refuses to run without, never the registry's default.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.export.point import Recipe
from harness.export.script import ARGS, Script, Word, launch_fact, torchrun
from harness.schedules.csv_io import to_csv
from harness.schedules.registry import spec

VERSION = "0.3.0"
# torch.distributed.pipelining's get_schedule_class names (torch 2.13), by the class the harness's
# registry names as each schedule's peer (torch_class)
SINGLE_STAGE = {"ScheduleGPipe": "GPipe", "Schedule1F1B": "1F1B"}
MULTI_STAGE = {"ScheduleInterleaved1F1B": "Interleaved1F1B", "ScheduleInterleavedZeroBubble": "InterleavedZeroBubble",
               "ScheduleZBVZeroBubble": "ZBVZeroBubble", "ScheduleDualPipeV": "DualPipeV"}
V_NAMES = ("ZBVZeroBubble", "DualPipeV")  # torchtitan places these stages in a V (distributed/pipeline_parallel.py)
# torchtitan's llama3 flavours with a config registry function (models/llama3/__init__.py and
# config_registry.py, 0.3.0): (blocks, hidden, heads, kv heads, ffn, vocab) -> the function
LLAMA3 = {(32, 4096, 32, 8, 14336, 128256): "llama3_8b", (80, 8192, 64, 8, 28672, 128256): "llama3_70b",
          (126, 16384, 128, 8, 53248, 128256): "llama3_405b"}
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # training.mixed_precision_param's values


@dataclass(frozen=True)
class Export:
    script: Script
    csv: str | None  # the schedule's CSV to write beside it, where the command names one


def render(p: Recipe, csv_path: str) -> Export:
    """The script for `p`; `csv_path` is where the CLI writes the schedule's CSV if one is needed."""
    s = Script(f"harness export -> torchtitan {VERSION}: python -m torchtitan.train, --section.key overrides "
               "(parsed by tyro into the --module/--config registry's config)", p.source)
    s.facts.append(launch_fact(p.launch, p.world))
    cmd: list[list[Word]] = [torchrun(p.launch), ["-m", "torchtitan.train"], _model(p, s)]
    csv = None
    if p.point.pp > 1:
        name, csv_reason = _schedule(p, s)
        cmd.append(["--parallelism.pipeline_parallel_degree", str(p.point.pp)])
        cmd.append(["--parallelism.pipeline_parallel_schedule", name])
        if csv_reason is not None:
            csv = to_csv(p.actions())
            cmd.append(["--parallelism.pipeline_parallel_schedule_csv", csv_path])
            s.facts.append(f"schedule: {csv_reason}; the CSV: {csv_path}")
        else:
            s.facts.append(f"schedule: {p.point.schedule} = torch's {name}, {p.stages // p.point.pp} stage(s) per rank")
        cmd.append(["--parallelism.pipeline_parallel_microbatch_size", str(p.point.microbatch_size)])
        cmd += _layers(p, name, s)
        cmd.append(["--training.disable_cuda_graphs"])  # torchtitan refuses CUDA graphs with pp > 1
    else:
        cmd.append(["--parallelism.pipeline_parallel_degree", "1"])
        s.facts.append("pipeline: pp=1, no pipeline")
    cmd += _data_parallel(p, s)
    cmd.append(["--parallelism.tensor_parallel_degree", str(p.tp), "--parallelism.context_parallel_degree", "1"])
    if p.tp > 1:
        sp = "enable_sequence_parallel" if p.sequence_parallel else "no-enable_sequence_parallel"
        cmd.append([f"--parallelism.{sp}"])
        s.facts.append(f"tensor parallel: tp={p.tp} = tensor_parallel_degree {p.tp}, sequence_parallel="
                       f"{str(p.sequence_parallel).lower()} = --parallelism.{sp}")
    cmd.append(["--training.local_batch_size", str(p.local_batch), "--training.global_batch_size",
                str(p.global_batch)])
    pt = p.point
    s.facts.append(f"batch: local_batch_size = M x B = {pt.microbatches} x {pt.microbatch_size} per replica, "
                   f"global {p.global_batch}; torchtitan's microbatches = local / microbatch size = {pt.microbatches}")
    if p.decoder and "seq" in p.model:
        cmd.append(["--training.seq_len", str(p.model["seq"])])
    cmd.append(_precision(p, s))
    _optimizer(p, s)
    cmd += _training(p, s)
    cmd.append([ARGS])  # before the subcommand: tyro reads the config's own keys before it
    cmd.append([_checkpointing(p, s)])
    s.command = cmd
    return Export(s, csv)


def _model(p: Recipe, s: Script) -> list[Word]:
    """--module/--config: torchtitan's model is its config registry's (model_spec is no CLI key)."""
    m = p.model
    if m.get("name") == "hf" and m.get("arch") in ("llama",):
        shape = (m["layers"], m["hidden"], m["heads"], m.get("kv_heads") or m["heads"],
                 m.get("ffn") or 4 * m["hidden"], m["vocab"])
        if shape in LLAMA3:
            s.facts.append(f"model: hf llama {shape[0]} blocks, hidden {shape[1]}, {shape[2]} heads, {shape[3]} kv "
                           f"heads, ffn {shape[4]}, vocab {shape[5]} = torchtitan's {LLAMA3[shape]}")
            return ["--module", "llama3", "--config", LLAMA3[shape]]
    s.cannot.append(f"model={m.get('name')}{' arch=' + m['arch'] if 'arch' in m else ''}: torchtitan takes the model "
                    "from a config registry function (model_spec is not a command-line key) and none of "
                    f"torchtitan's has this one's shape ({_shape(m)}); set TORCHTITAN_MODULE and TORCHTITAN_CONFIG "
                    "to a registry function of yours that builds it")
    return ["--module", s.need("TORCHTITAN_MODULE", "a torchtitan model module with a config_registry"),
            "--config", s.need("TORCHTITAN_CONFIG", "a config_registry function of it building this model")]


def _shape(m: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in m.items() if k != "name" and v is not None)


def _schedule(p: Recipe, s: Script) -> tuple[str, str | None]:
    """(pipeline_parallel_schedule, why a CSV carries the actions or None)."""
    per_rank = p.stages // p.point.pp
    cls = spec(p.point.schedule).torch_class
    kind = p.placement_kind()
    if cls in SINGLE_STAGE and per_rank == 1 and kind == "loop":
        return SINGLE_STAGE[cls], None
    if cls in MULTI_STAGE and per_rank >= 2 and (kind == "v") == (MULTI_STAGE[cls] in V_NAMES):
        return MULTI_STAGE[cls], None
    if kind == "other":
        s.cannot.append(f"schedule={p.point.schedule}: its stages sit on ranks {list(p.stage_rank)}; torchtitan places "
                        "stages in loop order (stage s on rank s % pp) or, for ZBVZeroBubble and DualPipeV, in a V")
    # with a CSV torchtitan runs _PipelineScheduleRuntime; the name only says how many stages a rank
    # holds and how they are placed
    name = "ZBVZeroBubble" if kind == "v" else "PipelineScheduleSingle" if per_rank == 1 else "PipelineScheduleMulti"
    if cls in MULTI_STAGE and per_rank == 1:
        why = (f"torchtitan builds {MULTI_STAGE[cls]} with at least 2 stages per rank, and "
               f"schedule={p.point.schedule} has 1: its actions go as torch's compute_only CSV under {name}")
    elif cls is None:
        why = f"schedule={p.point.schedule} has no torch class: its actions go as torch's compute_only CSV under {name}"
    else:
        why = f"schedule={p.point.schedule}'s actions go as torch's compute_only CSV under {name}"
    return name, why


def torchtitan_split(stages: int, blocks: int, first_less: int = 1, last_less: int = 1) -> list[int] | None:
    """Harness layers per stage (embedding and norm + head one each) as torchtitan 0.3.0's
    _generate_llm_fqn_per_model_part splits `blocks` transformer layers into `stages`
    (distributed/pipeline_parallel.py); None where it refuses."""
    if stages == 1:
        return [blocks + 2]
    effective = blocks + first_less + last_less
    per, extra = divmod(effective, stages)
    if stages > effective or per == 0 or first_less > per or last_less > per:
        return None
    out, current = [], 0
    for stage in range(stages):
        share = per + (stage < extra) - (first_less if stage == 0 else 0) - (last_less if stage == stages - 1 else 0)
        take = max(0, min(share, blocks - current))  # it stops adding layers once they run out
        current += take
        out.append(take + (stage == 0) + (stage == stages - 1))
    return out


def _layers(p: Recipe, schedule_name: str, s: Script) -> list[list[Word]]:
    lps = list(p.layers_per_stage)
    if not p.decoder:
        s.cannot.append(f"layers per stage {lps}: torchtitan splits its decoders (embedding, blocks, norm + head); "
                        f"model={p.model.get('name')} is not one, so no split is given")
        return []
    blocks = p.model["layers"]
    # torchtitan makes ceil((blocks + 2) / k) stages of k layers; its split depends on that count only
    same = torchtitan_split(p.stages, blocks) == lps
    for k in range(1, blocks + 3) if same else ():
        if -(-(blocks + 2) // k) == p.stages:
            s.facts.append(f"layers: {lps} per stage = torchtitan's split at pipeline_parallel_layers_per_stage {k} "
                           "with the embedding and the norm + head one layer each (first/last_stage_less_layers 1)")
            return [["--parallelism.pipeline_parallel_layers_per_stage", str(k)],
                    ["--parallelism.pipeline_parallel_first_stage_less_layers", "1",
                     "--parallelism.pipeline_parallel_last_stage_less_layers", "1"]]
    s.facts.append(f"layers: {lps} per stage (model order), which no pipeline_parallel_layers_per_stage gives: "
                   "module_fqns_per_model_part names each stage's modules (torchtitan's decoder names: "
                   "tok_embeddings, layers.<i>, norm, lm_head)")
    return [["--parallelism.module_fqns_per_model_part", *(",".join(part) for part in fqns(lps))]]


def fqns(layers_per_stage: list[int]) -> list[list[str]]:
    """torchtitan decoder module names per stage for harness layer counts (embedding, blocks, head)."""
    names = ["tok_embeddings"] + [f"layers.{i}" for i in range(sum(layers_per_stage) - 2)] + ["norm,lm_head"]
    out, first = [], 0
    for count in layers_per_stage:
        out.append(names[first:first + count])
        first += count
    return [[n for name in part for n in name.split(",")] for part in out]


def _data_parallel(p: Recipe, s: Script) -> list[list[Word]]:
    replicate, shard = (p.point.dp, 1) if p.point.zero == 0 else (1, p.point.dp)
    if p.point.dp > 1 and p.point.zero == 0:
        s.facts.append(f"data parallel: dp={p.point.dp}, zero=0 (DDP, every replica holds everything) = "
                       f"data_parallel_replicate_degree {p.point.dp}")
    elif p.point.dp > 1:
        s.facts.append(f"data parallel: dp={p.point.dp}, zero={p.point.zero} = data_parallel_shard_degree {p.point.dp}")
        s.notes.append("torchtitan has no ZeRO-1: FSDP shards the optimizer state as ZeRO-1 does, and the "
                       "parameters and gradients too (all-gathered around each use, gradients reduce-scattered), "
                       "so its memory and communication differ from the prediction's")
    if p.point.dp > 1 and p.point.placement == "pp_inner":
        s.cannot.append("placement=pp_inner: torchtitan's device mesh is [pp, dp_replicate, fsdp, cp, tp], pp "
                        "outermost, so a stage's replicas sit on consecutive ranks (the harness's dp_inner)")
    return [["--parallelism.data_parallel_replicate_degree", str(replicate),
             "--parallelism.data_parallel_shard_degree", str(shard)]]


def _precision(p: Recipe, s: Script) -> list[Word]:
    if p.dtype not in DTYPES:
        s.cannot.append(f"dtype={p.dtype}: torchtitan {VERSION} trains in bfloat16 or float32 only; below: bf16 "
                        "mixed precision")
    param = DTYPES.get(p.dtype, "bfloat16")
    s.facts.append(f"precision: dtype={p.dtype} = fp32 master weights and optimizer state (training.dtype float32), "
                   f"{param} parameters in compute (mixed_precision_param)")
    return ["--training.dtype", "float32", "--training.mixed_precision_param", param]


def _optimizer(p: Recipe, s: Script) -> None:
    if p.optimizer != "adamw":
        s.cannot.append(f"optimizer={p.optimizer}: torchtitan's optimizer is its config registry's param_groups, "
                        "not a command-line key (llama3's registry: AdamW)")
    where = (f"torchtitan {VERSION} takes the learning rate's value from the config registry's "
             "optimizer.param_groups, not the command line (llama3_8b's AdamW: 3e-4, llama3_70b's: 1.5e-4)")
    if p.lr is not None:  # a run's own lr, which the command cannot carry
        s.cannot.append(f"lr={p.lr:g}: {where}; set it in a registry function of yours (the schedule below is "
                        "constant, as the harness's)")
    else:
        s.notes.append(f"learning rate: the advice point has none; {where}: set yours there (the schedule below is "
                       "constant, as the harness's)")


def _training(p: Recipe, s: Script) -> list[list[Word]]:
    """Run length, data, logging and outputs: the run's where it has them, else asked for, so none of
    the registry's (llama3's: c4, its assets path, 1000 steps) stands in unseen."""
    steps, log = s.run_length(p.steps, "TRAIN_STEPS", "LOG_FREQ")
    if p.steps is not None:
        s.facts.append(f"training: the run's {p.steps} steps (warm-up and measured) as training.steps, logged every "
                       "step as the harness records them")
    s.facts.append("throughput: torchtitan logs tokens/s, TFLOP/s and MFU on every logged step")
    return [["--training.steps", steps, "--metrics.log_freq", log],
            ["--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay_ratio", "0"],  # constant, as the harness
            ["--hf_assets_path", s.need("HF_ASSETS_PATH", "the model's Hugging Face assets directory (tokenizer, "
                                        "config), as torchtitan's download_hf_assets writes it")],
            ["--dataloader.dataset", s.need("DATASET", "a dataset name torchtitan registers (e.g. c4); the harness "
                                            "trained on synthetic batches"),
             "--dataloader.dataset_path", s.need("DATASET_PATH", "where that dataset is on disk")],
            ["--dump_folder", s.need("OUTPUT_DIR", "torchtitan's outputs; checkpoints go to its checkpoint/"),
             "--checkpoint.enable", "--checkpoint.interval", s.need("SAVE_INTERVAL", "steps between checkpoints")]]


def _checkpointing(p: Recipe, s: Script) -> str:
    if not p.point.checkpointing:
        return "activation-checkpoint:none"
    segment = "each stage as one segment" if p.checkpoint_every == 0 else f"every {p.checkpoint_every} layers"
    s.notes.append(f"activation checkpointing: torchtitan's full AC recomputes each transformer block from its own "
                   f"input; the harness checkpointed {segment}, keeping one input per segment, so torchtitan holds "
                   "more activations than predicted")
    return "activation-checkpoint:full"
