"""A point as Megatron-LM's pretrain_gpt.py arguments, as megatron/training/arguments.py of
megatron-core (VERSION) defines them (tests/test_export.py runs that parser's parse_args and
validate_args on every export).

Megatron-LM runs 1F1B, or interleaved 1F1B with virtual pipeline stages; it has no GPipe, no
zero-bubble and no V-shape schedule: such a named schedule is written as the nearest Megatron
schedule on the same stages, with a CANNOT EXPRESS line saying what differs; so is an order made
from the point's costs or read from a file (zb_auto, csv: Megatron reads no schedule as data). A
model that is no decoder has no shape to give: it is refused (ExportError, exit 2). Any split of layers is expressible: its
even split (with or without the embedding and the loss counted as layers), uneven first and
last stages, or, for anything else, --pipeline-model-parallel-layout.

What the source does not give (data, tokenizer, checkpoint directory, and for an advice point
the run length, learning rate and logging interval) is an environment variable the script
refuses to run without.
"""

from __future__ import annotations

from itertools import groupby

from harness.export.point import ExportError, Recipe
from harness.export.script import ARGS, Raw, Script, Word, launch_fact, torchrun
from harness.schedules.registry import COUNTS, spec

VERSION = "0.19.2"  # megatron-core, whose megatron/training/arguments.py these flags are validated by
LLAMA_LIKE = ("llama", "mistral", "qwen2")  # RMSNorm, SwiGLU, rotary positions, no linear biases
FP16_LOSS_SCALE = "1024"  # the harness's fixed fp16 loss scale (harness/runtime/precision.py)


def render(p: Recipe) -> Script:
    """The script for `p`; ExportError where Megatron-LM cannot run anything like it."""
    _refuse(p)
    s = Script(f"harness export -> Megatron-LM pretrain_gpt.py (arguments as megatron/training/arguments.py of "
               f"megatron-core {VERSION} defines them)", p.source)
    s.facts.append(launch_fact(p.launch, p.world))
    pt = p.point
    cmd: list[list[Word]] = [torchrun(p.launch),
                             [Raw('"${MEGATRON:?set MEGATRON to your Megatron-LM checkout}/pretrain_gpt.py"')],
                             ["--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(pt.pp)]]
    if p.sequence_parallel:
        cmd.append(["--sequence-parallel"])
    if p.tp > 1:
        # validate_args refuses TP without it before Blackwell (one CUDA queue keeps TP's communication ahead of
        # the GEMMs it overlaps)
        s.environment["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        s.facts.append(f"tensor parallel: tp={p.tp} = --tensor-model-parallel-size {p.tp}, sequence_parallel="
                       f"{str(p.sequence_parallel).lower()}"
                       + (" = --sequence-parallel" if p.sequence_parallel else ""))
    if p.point.pp > 1:
        chunks = _schedule(p, s)
        cmd += _layers(p, chunks, s)
        if chunks > 1:
            cmd += _interleaving(p, s)
    cmd += _model(p, s)
    cmd.append(["--micro-batch-size", str(p.point.microbatch_size), "--global-batch-size", str(p.global_batch)])
    s.facts.append(f"batch: Megatron's data-parallel size = world / (tensor x pipeline) = {p.world} / "
                   f"({p.tp} x {pt.pp}) = {pt.dp}, microbatches = global / (micro x dp) = {p.global_batch} / ({pt.microbatch_size} x "
                   f"{pt.dp}) = {pt.microbatches}")
    cmd += _recompute(p, s)
    cmd += _data_parallel(p, s)
    cmd += _precision(p, s)
    cmd += _training(p, s)
    cmd.append([ARGS])
    s.command = cmd
    return s


def _refuse(p: Recipe) -> None:
    if not p.decoder:
        raise ExportError(f"model={p.model.get('name')}: Megatron-LM's pretrain_gpt.py trains a GPT-style decoder "
                          "(embedding, transformer layers, output layer) and this model is none, so there is no "
                          "shape to give (allowed: --to megatron for model=gpt or model=hf)")


def _training(p: Recipe, s: Script) -> list[list[Word]]:
    """Optimizer, run length, data, logging and checkpoints: the run's where it has them, else asked for."""
    out: list[list[Word]] = []
    lr: Word = f"{p.lr:g}" if p.lr is not None else s.need("LR", "the learning rate (the advice point has none)")
    out.append(["--optimizer", "sgd" if p.optimizer == "sgd" else "adam", "--lr", lr, "--lr-decay-style",
                "constant"])
    if p.optimizer not in ("sgd", "adamw"):
        s.cannot.append(f"optimizer={p.optimizer}: Megatron's --optimizer takes adam (AdamW), sgd and others; "
                        "below: adam")
    iters, log = s.run_length(p.steps, "TRAIN_ITERS", "LOG_INTERVAL")
    s.facts.append(f"training: the run's lr {p.lr:g}, constant as in the harness; its {p.steps} steps (warm-up and "
                   "measured) as --train-iters; logged every step as the harness records them" if p.steps is not None
                   else "training: constant learning rate as in the harness (--lr-decay-style constant)")
    out.append(["--train-iters", iters, "--log-interval", log, "--log-throughput"])
    out.append(["--data-path", s.need("DATA_PATH", "your Megatron dataset prefix (the .bin/.idx pair without "
                                      "extension; the harness trained on synthetic batches)"),
                "--tokenizer-type", "HuggingFaceTokenizer",
                "--tokenizer-model", s.need("TOKENIZER_MODEL", "a Hugging Face tokenizer name or directory")])
    ckpt = s.need("CHECKPOINT_DIR", "where Megatron saves and resumes from (an empty directory: a fresh start)")
    out.append(["--save", ckpt, "--load", Raw('"$CHECKPOINT_DIR"'),
                "--save-interval", s.need("SAVE_INTERVAL", "steps between checkpoints")])
    s.facts.append(f"data: the model's vocabulary is the tokenizer's (the point's: {p.model['vocab']})")
    return out


def _schedule(p: Recipe, s: Script) -> int:
    """Model chunks per rank of the Megatron schedule run: 1 (1F1B) or more (interleaved)."""
    per_rank = p.stages // p.point.pp
    if p.point.schedule in ("1f1b", "interleaved_1f1b"):
        return per_rank
    if spec(p.point.schedule).needs != COUNTS:
        what = (f"schedule={p.point.schedule}: an order made from the point's costs or read from a file, which "
                "Megatron-LM cannot take (its schedules are 1F1B and interleaved 1F1B, none read as data; --to "
                "torchtitan runs the order itself as a CSV)")
    elif p.placement_kind() == "v":
        what = f"Megatron-LM has no zero-bubble or V-shape schedule (schedule={p.point.schedule})"
    else:
        what = f"Megatron-LM has no {p.point.schedule} schedule (its pipeline schedules are 1F1B and interleaved 1F1B)"
    nearest = "1F1B on the same stages" if per_rank == 1 else (
        f"interleaved 1F1B over the same {p.stages} stages, placed in loop order (stage s on rank s % pp)"
        + (", not in a V" if p.placement_kind() == "v" else ""))
    s.cannot.append(f"{what}: below, {nearest}")
    return per_rank


def _interleaving(p: Recipe, s: Script) -> list[list[Word]]:
    """torch's Interleaved1F1B (the harness's order) runs rounds of M // max(1, M // pp) microbatches
    per chunk; Megatron's microbatch group per virtual stage is the same knob, in [pp, M]."""
    group = p.point.microbatches // max(1, p.point.microbatches // p.point.pp)
    if p.point.microbatches < p.point.pp:
        s.cannot.append(f"microbatches={p.point.microbatches}: Megatron's interleaved schedule needs at least "
                        f"pp={p.point.pp} microbatches a step (its microbatch group per virtual stage is in [pp, M])")
        return []
    s.facts.append(f"interleaving: microbatch groups of {group} per virtual stage, torch's Interleaved1F1B rounds "
                   "(the harness's order)")
    return [["--microbatch-group-size-per-virtual-pipeline-stage", str(group)]]


def _layers(p: Recipe, chunks: int, s: Script) -> list[list[Word]]:
    lps = list(p.layers_per_stage)
    blocks = list(p.blocks_per_stage())
    vpp = [] if chunks == 1 else ["--num-virtual-stages-per-pipeline-rank", str(chunks)]
    if len(set(blocks)) == 1:
        s.facts.append(f"layers: {blocks[0]} transformer layers on every stage, Megatron's even split (the "
                       "embedding on the first stage, the output layer on the last, beside them)")
        return [vpp] if vpp else []
    if len(set(lps)) == 1:
        s.facts.append(f"layers: {lps[0]} layers on every stage counting the embedding and the loss as one each "
                       "(--account-for-embedding/loss-in-pipeline-split)")
        return [["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
                *([vpp] if vpp else [])]
    middle = set(blocks[1:-1])
    if chunks == 1 and blocks[0] >= 1 and blocks[-1] >= 1 and len(middle) <= 1 and 0 not in middle:
        s.facts.append(f"layers: {blocks} transformer layers per stage: the first and last stages differ "
                       "(--decoder-first/last-pipeline-num-layers), the others Megatron's even split")
        return [["--decoder-first-pipeline-num-layers", str(blocks[0]),
                 "--decoder-last-pipeline-num-layers", str(blocks[-1])]]
    s.facts.append(f"layers: {lps} per stage (model order): --pipeline-model-parallel-layout, E the embedding, "
                   "t a transformer layer, L the output layer and loss, | between stages, stage s on rank s % pp")
    return [["--pipeline-model-parallel-layout", layout(lps)]]


def layout(layers_per_stage: list[int]) -> str:
    """Megatron's layout string for harness layer counts (embedding, blocks, head): each stage's
    layers, runs of identical stages as (stage|)*n, as its parse_str_to_list unrolls them."""
    last = len(layers_per_stage) - 1
    stages = []
    for i, count in enumerate(layers_per_stage):
        blocks = count - (i == 0) - (i == last)
        stages.append(("E" if i == 0 else "") + (f"t*{blocks}" if blocks > 1 else "t" * blocks)
                      + ("L" if i == last else ""))
    # runs of identical stages as (stage|)*n; the last stage (the only one with L) ends the string
    runs = [(text, len(list(group))) for text, group in groupby(stages)]
    return ",".join(f"({text}|)*{n}" if n > 1 else f"{text}|" for text, n in runs).removesuffix("|")


def _model(p: Recipe, s: Script) -> list[list[Word]]:
    m = p.model
    heads, kv = m["heads"], m.get("kv_heads") or m["heads"]
    ffn = m.get("ffn") or 4 * m["hidden"]
    args: list[list[Word]] = [["--num-layers", str(m["layers"]), "--hidden-size", str(m["hidden"]),
                               "--num-attention-heads", str(heads), "--ffn-hidden-size", str(ffn)],
                              ["--seq-length", str(m["seq"]), "--max-position-embeddings", str(m["seq"])],
                              ["--untie-embeddings-and-output-weights"]]  # the harness never ties them across stages
    if kv != heads:
        args.append(["--group-query-attention", "--num-query-groups", str(kv)])
    arch = m.get("arch", "gpt2") if m["name"] == "hf" else "gpt2"
    if arch in LLAMA_LIKE:
        args.append(["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                     "--disable-bias-linear", *(["--add-qkv-bias"] if arch == "qwen2" else [])])
        s.notes.append(f"model: {arch}'s RMSNorm, SwiGLU, rotary positions, no linear biases"
                       f"{' but QKV' if arch == 'qwen2' else ''}; the rotary base and the norm epsilon are Megatron's")
    s.facts.append(f"model: {m['name']}{' ' + arch if m['name'] == 'hf' else ''}, {m['layers']} transformer layers, "
                   f"hidden {m['hidden']}, {heads} heads, {kv} kv heads, ffn {ffn}, sequence {m['seq']}, vocab "
                   f"{m['vocab']}")
    return args


def _recompute(p: Recipe, s: Script) -> list[list[Word]]:
    if not p.point.checkpointing:
        return []
    per = max(p.blocks_per_stage()) if p.checkpoint_every == 0 else max(1, p.checkpoint_every)
    segment = "each stage's transformer layers as one segment" if p.checkpoint_every == 0 else \
        f"segments of {p.checkpoint_every} layers"
    s.facts.append(f"checkpointing: full recompute of {segment} (--recompute-method uniform, {per} layers a unit)")
    s.notes.append("Megatron recomputes transformer layers only: the embedding and the output layer keep their "
                   "activations, where the harness's stage segment held only the stage's input")
    return [["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", str(per)]]


def _data_parallel(p: Recipe, s: Script) -> list[list[Word]]:
    out: list[list[Word]] = []
    if p.point.zero >= 1 and p.point.dp > 1:
        out.append(["--use-distributed-optimizer"])
        s.facts.append(f"zero={p.point.zero}: --use-distributed-optimizer (the optimizer state sharded across "
                       f"dp={p.point.dp})")
        s.notes.append("Megatron's distributed optimizer also shards the fp32 master weights, which the harness's "
                       "ZeRO-1 keeps whole on every replica: it needs less memory than predicted")
    if p.point.dp > 1 and p.point.placement == "pp_inner":
        out.append(["--use-tp-pp-dp-mapping"])  # rank order tp-cp-ep-pp-dp: a pipeline on consecutive ranks
        s.facts.append("placement=pp_inner: --use-tp-pp-dp-mapping (a pipeline's ranks consecutive)")
    elif p.point.dp > 1:
        s.facts.append("placement=dp_inner: Megatron's default rank order tp-cp-ep-dp-pp (a stage's replicas "
                       "consecutive)")
    return out


def _precision(p: Recipe, s: Script) -> list[list[Word]]:
    if p.dtype == "bf16":
        s.facts.append("precision: dtype=bf16 = --bf16 (bf16 parameters and activations, fp32 main weights in the "
                       "optimizer, as the harness)")
        return [["--bf16"]]
    if p.dtype == "fp16":
        s.facts.append(f"precision: dtype=fp16 = --fp16 with the harness's fixed loss scale {FP16_LOSS_SCALE}")
        return [["--fp16", "--loss-scale", FP16_LOSS_SCALE]]
    return []
