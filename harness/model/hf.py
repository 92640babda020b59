"""model=hf: a Hugging Face decoder (model.arch: gpt2, llama, mistral, qwen2) built from
transformers' own config class and modeling code, with random weights (no download, no
from_pretrained), split into partitionable layers:

    layer 0          the embedding (llama family: embed_tokens; gpt2: wte + wpe)
    layers 1..L      the decoder blocks, transformers' own classes (LlamaDecoderLayer, GPT2Block...)
    layer L + 1      the final norm + the LM head

What travels between stages is the hidden state [B, T, d] alone: each block recomputes what
the HF model computes once and hands to every block, from the sequence length: the position
ids (arange(T)), the rotary cos/sin (the arch's own RotaryEmbedding module, its inv_freq a
non-persistent buffer: no parameters), and the causal mask (transformers' own
create_causal_mask, or create_sliding_window_causal_mask where the HF model uses it;
with sdpa and no padding that is None and sdpa's is_causal). So a stage computes exactly what
the same blocks compute inside XForCausalLM: tests/test_hf_model.py checks losses and
gradients against the HF model itself, loaded with these weights (`to_hf`).

The LM head is NOT tied to the embedding (the config says tie_word_embeddings=False, so the
HF model it is compared with is untied too): tying across stages needs the embedding and head
stages to all-reduce their gradients (Megatron's embedding group), not modelled here. Dropout
is 0 (deterministic, comparable); attention is transformers' "sdpa" (model.attention=eager: its
eager one, which keeps the T x T scores for the backward). Every nn.Linear (and GPT-2's
Conv1D, transposed once) becomes a SplitLinear of the same weights and math, so the zero-bubble
schedules defer the blocks' and head's weight gradients to W; norms and embeddings get theirs
in I. Weights are initialised as transformers does: normal(0,
initializer_range) linears and embeddings, zero biases, unit norms, and GPT-2's residual
projections scaled by 1/sqrt(2 n_layer).

transformers is imported on first use only (a run of another model never pays for it).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.config import ModelConfig
from harness.model.protocol import ModelError
from harness.model.split_linear import SplitLinear, to_split_linear
from harness.model.stack import TokenStack


@dataclass(frozen=True)
class Arch:
    """Where an architecture's pieces live in transformers, and how the HF model names them."""

    config: str  # the config class (transformers top level)
    causal_lm: str  # the *ForCausalLM class
    module: str  # transformers.models.<x>.modeling_<x>
    block: str  # the decoder layer class
    rotary: str | None  # the rotary embedding class (None: learned positions, gpt2)
    norm: str | None  # the RMSNorm class (None: nn.LayerNorm, gpt2)
    base: str  # the base model's attribute in *ForCausalLM
    blocks: str  # the ModuleList of blocks in the base model
    final_norm: str  # the final norm's attribute in the base model
    gqa: bool  # has key/value heads of its own (grouped-query attention)


ARCHS: dict[str, Arch] = {
    "gpt2": Arch("GPT2Config", "GPT2LMHeadModel", "transformers.models.gpt2.modeling_gpt2", "GPT2Block", None, None,
                 "transformer", "h", "ln_f", gqa=False),
    "llama": Arch("LlamaConfig", "LlamaForCausalLM", "transformers.models.llama.modeling_llama", "LlamaDecoderLayer",
                  "LlamaRotaryEmbedding", "LlamaRMSNorm", "model", "layers", "norm", gqa=True),
    "mistral": Arch("MistralConfig", "MistralForCausalLM", "transformers.models.mistral.modeling_mistral",
                    "MistralDecoderLayer", "MistralRotaryEmbedding", "MistralRMSNorm", "model", "layers", "norm",
                    gqa=True),
    "qwen2": Arch("Qwen2Config", "Qwen2ForCausalLM", "transformers.models.qwen2.modeling_qwen2", "Qwen2DecoderLayer",
                  "Qwen2RotaryEmbedding", "Qwen2RMSNorm", "model", "layers", "norm", gqa=True),
}
GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _transformers(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ModelError(f"model=hf: needs transformers ({e}; install the pinned requirements: "
                         "pip install -r requirements.txt)") from None


def check(cfg: ModelConfig) -> None:
    """Everything model=hf refuses, as one line "model.<key>=<value>: <what is allowed>"."""
    if cfg.arch not in ARCHS:
        raise ModelError(f"model.arch={cfg.arch}: unknown (allowed: {', '.join(ARCHS)})")
    for key in ("layers", "hidden", "heads", "seq", "vocab"):
        if getattr(cfg, key) < 1:
            raise ModelError(f"model.{key}={getattr(cfg, key)}: must be an integer >= 1")
    if cfg.attention not in ("sdpa", "eager"):
        raise ModelError(f"model.attention={cfg.attention}: unknown (allowed: sdpa, eager)")
    if cfg.hidden % cfg.heads:
        raise ModelError(f"model.heads={cfg.heads}: must divide model.hidden={cfg.hidden}")
    kv = cfg.heads if cfg.kv_heads is None else cfg.kv_heads
    if not ARCHS[cfg.arch].gqa and kv != cfg.heads:
        raise ModelError(f"model.kv_heads={cfg.kv_heads}: {cfg.arch} has no grouped-query attention "
                         f"(allowed: null or model.heads={cfg.heads})")
    if kv < 1 or cfg.heads % kv:
        raise ModelError(f"model.kv_heads={cfg.kv_heads}: must divide model.heads={cfg.heads} "
                         "(allowed: a divisor of model.heads, or null for one per head)")
    if ARCHS[cfg.arch].rotary and (cfg.hidden // cfg.heads) % 2:
        raise ModelError(f"model.heads={cfg.heads}: {cfg.arch}'s rotary embedding needs an even head width, "
                         f"model.hidden / model.heads = {cfg.hidden // cfg.heads} "
                         "(allowed: heads giving an even width)")
    if cfg.ffn is not None and cfg.ffn < 1:
        raise ModelError(f"model.ffn={cfg.ffn}: must be an integer >= 1 (or null: 4 x model.hidden)")


def hf_config(cfg: ModelConfig) -> Any:
    """transformers' config for `cfg` (checked): untied head, no dropout, its attention."""
    check(cfg)
    arch = ARCHS[cfg.arch]
    config_class = getattr(_transformers("transformers"), arch.config)
    ffn = cfg.ffn or 4 * cfg.hidden
    kv = cfg.kv_heads or cfg.heads
    common = dict(vocab_size=cfg.vocab, tie_word_embeddings=False, attn_implementation=cfg.attention)
    if cfg.arch == "gpt2":
        last = cfg.vocab - 1  # its defaults (50256) lie outside a small vocabulary
        return config_class(n_embd=cfg.hidden, n_layer=cfg.layers, n_head=cfg.heads, n_positions=cfg.seq, n_inner=ffn,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=last, eos_token_id=last,
                            **common)
    extra = {"use_sliding_window": False} if cfg.arch == "qwen2" else {}
    return config_class(hidden_size=cfg.hidden, intermediate_size=ffn, num_hidden_layers=cfg.layers,
                        num_attention_heads=cfg.heads, num_key_value_heads=kv, max_position_embeddings=cfg.seq,
                        attention_dropout=0.0, bos_token_id=None, eos_token_id=None, **extra, **common)


def _init(module: nn.Module, std: float) -> None:
    """transformers' _init_weights: normal(0, std) linears and embeddings (a padding row 0),
    zero biases; norms keep their ones and zeros."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()


class Embed(nn.Module):
    """Token ids [B, T] -> hidden [B, T, d]; gpt2 adds its learned positions (arange(T))."""

    def __init__(self, config: Any, gpt2: bool):
        super().__init__()
        self.gpt2 = gpt2
        if gpt2:
            self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
            self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        else:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.gpt2:
            return self.embed_tokens(ids)
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)  # as GPT2Model's position_ids
        return self.wte(ids) + self.wpe(positions)


class Block(nn.Module):
    """One transformers decoder layer (`self.layer`) as a pipeline layer: hidden [B, T, d]
    in and out. Position ids, rotary cos/sin and the causal mask are recomputed here from
    T exactly as the HF base model computes them before its first block."""

    def __init__(self, arch: Arch, config: Any, index: int):
        super().__init__()
        modeling = _transformers(arch.module)
        masks = _transformers("transformers.masking_utils")
        self.layer = getattr(modeling, arch.block)(config, layer_idx=index)
        self.rotary = getattr(modeling, arch.rotary)(config=config) if arch.rotary else None
        types = getattr(config, "layer_types", None)
        sliding = (types[index] == "sliding_attention") if types is not None else \
            getattr(config, "sliding_window", None) is not None  # mistral's rule (its model's forward)
        self.make_mask = masks.create_sliding_window_causal_mask if sliding else masks.create_causal_mask
        self.config = config
        self.seq_shards = 1  # sequence_parallel: h is one of this many sequence shards (HFModel.tp_plan)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # positions, rotary tables and mask are the whole sequence's: attention sees it whole
        T = h.shape[1] * self.seq_shards
        whole = h if self.seq_shards == 1 else h[:, :1].expand(-1, T, -1)  # a view: shape, dtype, device
        positions = torch.arange(T, device=h.device).unsqueeze(0)
        mask = self.make_mask(config=self.config, inputs_embeds=whole, attention_mask=None, cache=None,
                              position_ids=positions)
        extra = {} if self.rotary is None else {"position_embeddings": self.rotary(whole, position_ids=positions)}
        return self.layer(h, attention_mask=mask, position_ids=positions, **extra)


class Head(nn.Module):
    """Final norm + LM head (untied): hidden [B, T, d] -> logits [B, T, vocab]."""

    def __init__(self, arch: Arch, config: Any):
        super().__init__()
        if arch.norm is None:
            self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        else:
            self.norm = getattr(_transformers(arch.module), arch.norm)(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = SplitLinear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(h) if hasattr(self, "ln_f") else self.norm(h))


class HFModel(TokenStack):
    """A transformers decoder as embedding, model.layers blocks, head (module docstring)."""

    def __init__(self, cfg: ModelConfig):
        check(cfg)
        super().__init__(cfg)
        self.arch = ARCHS[cfg.arch]

    @property
    def preload(self) -> tuple[str, ...]:
        """Modules every rank imports to build its layers (~1 s of transformers' import): a
        launcher may import them once, in the process its workers fork from."""
        return (self.arch.module, "transformers.masking_utils")

    @cached_property
    def config(self) -> Any:
        """transformers' config object (imports transformers on first use)."""
        return hf_config(self.cfg)

    def build_layer(self, i: int) -> nn.Module:
        c, std = self.config, self.config.initializer_range
        kind = self.kind(i)
        if kind == "embed":
            layer: nn.Module = Embed(c, gpt2=self.cfg.arch == "gpt2")
        elif kind == "head":
            layer = Head(self.arch, c)
        else:
            layer = Block(self.arch, c, i - 1)
            to_split_linear(layer.layer)
        _init(layer, std)
        if kind == "block" and self.cfg.arch == "gpt2":  # GPT-2's scaled residual projections
            for proj in (layer.layer.attn.c_proj, layer.layer.mlp.c_proj):
                nn.init.normal_(proj.weight, 0.0, std / math.sqrt(2 * c.n_layer))
        return layer

    def fwd_flops(self, i: int, microbatch_size: int) -> float:
        """Forward FLOPs (2 per multiply-add) of layer i on one microbatch: the block's linears
        (q, k, v, o with kv_heads key/value heads; the MLP: 3 matrices gated, 2 for gpt2) plus
        attention's QK^T and AV (2 T^2 d per sequence, causal half); the head's d x vocab."""
        c, tokens = self.cfg, microbatch_size * self.cfg.seq
        kind = self.kind(i)
        if kind == "embed":
            return 0.0
        if kind == "head":
            return 2.0 * tokens * c.hidden * c.vocab
        d, ffn = c.hidden, c.ffn or 4 * c.hidden
        kv_width = (c.kv_heads or c.heads) * (d // c.heads)
        attn = 2 * d * d + 2 * d * kv_width
        mlp = (2 if c.arch == "gpt2" else 3) * d * ffn
        return 2.0 * tokens * (attn + mlp) + 2.0 * microbatch_size * c.seq ** 2 * d

    def tp_plan(self, i: int, tp: int, sequence_parallel: bool, stage: range) -> dict | None:
        """Megatron's tensor parallelism on transformers' own decoder layers
        (harness/parallel/tensor.py), as torchtitan's llama plan:
        - attention by heads: q, k, v column-parallel (GPT-2's fused c_attn: each rank keeps
          its heads' q, k and v, styles.FusedColwiseParallel), the output projection
          row-parallel; the MLP column then row parallel (llama family: gate and up column,
          down row; gpt2: c_fc column, c_proj row). One all-reduce after each (forward), one
          before each (backward: the block's input is made a DTensor once, at the attention
          and the MLP, so q, k and v share it);
        - grouped-query attention: the KV heads are split where tp divides them; where tp is a
          multiple of them they are replicated, each rank keeping the one its query heads use
          (styles.ReplicatedKVHeads; its gradient summed over the ranks sharing it); anything
          else is refused (parallel/checks.py). Each rank's attention module is told its KV
          groups (query heads per KV head on the rank);
        - the embedding and the LM head vocabulary-parallel, as GPT.tp_plan (why there);
          GPT-2's position embedding replicated, split by positions under sequence_parallel;
        - sequence_parallel: the norms on sequence shards, reduce-scatters after the
          row-parallel linears and the embedding, all-gathers before the column-parallel ones;
          the block computes positions, rotary tables and the mask for the whole sequence."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                       SequenceParallel)

        from harness.parallel.styles import Attributes, FusedColwiseParallel, ReplicatedKVHeads, Sequenced, \
            VocabParallelEmbedding

        c, gpt2 = self.cfg, self.cfg.arch == "gpt2"
        seq = Shard(1) if sequence_parallel else Replicate()
        kind = self.kind(i)

        def norms(*names: str) -> dict:  # on sequence shards under sequence parallelism, else replicated
            return {name: SequenceParallel() for name in names} if sequence_parallel else {}

        def gathered(kwarg: str | None = None) -> PrepareModuleInput:  # the sublayer's input, whole, once
            if kwarg is None:
                return PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
            return PrepareModuleInput(input_kwarg_layouts={kwarg: seq},
                                      desired_input_kwarg_layouts={kwarg: Replicate()})

        if kind == "embed":
            if not gpt2:
                return {"embed_tokens": VocabParallelEmbedding(seq)}
            return {"wte": VocabParallelEmbedding(seq), **({"wpe": VocabParallelEmbedding(Shard(1))}
                                                         if sequence_parallel else {})}
        if kind == "head":
            return {**norms("ln_f" if gpt2 else "norm"),
                    "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate())}
        root = {"": Attributes(seq_shards=tp)} if sequence_parallel else {}
        heads = c.heads // tp
        if gpt2:
            return {**root, **norms("layer.ln_1", "layer.ln_2"),
                    "layer.attn": Sequenced(gathered(), Attributes(split_size=c.hidden // tp, num_heads=heads)),
                    "layer.attn.c_attn": FusedColwiseParallel(3),
                    "layer.attn.c_proj": RowwiseParallel(output_layouts=seq),
                    "layer.mlp": gathered(), "layer.mlp.c_fc": ColwiseParallel(),
                    "layer.mlp.c_proj": RowwiseParallel(output_layouts=seq)}
        kv = c.kv_heads or c.heads
        head_dim = c.hidden // c.heads
        split_kv = kv % tp == 0
        kv_style = ColwiseParallel if split_kv else (lambda: ReplicatedKVHeads(kv, head_dim))
        return {**root, **norms("layer.input_layernorm", "layer.post_attention_layernorm"),
                "layer.self_attn": Sequenced(gathered("hidden_states"),
                                             Attributes(num_key_value_groups=heads // (kv // tp if split_kv else 1))),
                "layer.self_attn.q_proj": ColwiseParallel(), "layer.self_attn.k_proj": kv_style(),
                "layer.self_attn.v_proj": kv_style(), "layer.self_attn.o_proj": RowwiseParallel(output_layouts=seq),
                "layer.mlp": gathered(), "layer.mlp.gate_proj": ColwiseParallel(),
                "layer.mlp.up_proj": ColwiseParallel(), "layer.mlp.down_proj": RowwiseParallel(output_layouts=seq)}

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy, the mean over tokens: transformers' ForCausalLMLoss with
        shift_labels=target (fp32 logits, ignore_index -100)."""
        return F.cross_entropy(output.flatten(0, 1).float(), target.flatten(), ignore_index=-100)

    # -- to and from transformers' own model ------------------------------------------------
    def hf_name(self, name: str) -> tuple[str, bool]:
        """The HF *ForCausalLM parameter name of "<layer>.<param>" (the reference's and
        named_gradients' names), and whether the tensor is transposed there (GPT-2's Conv1D)."""
        layer, _, rest = name.partition(".")
        i, a = int(layer), self.arch
        if i == 0:
            return f"{a.base}.{rest}", False
        if i == self.num_layers - 1:
            return ("lm_head.weight", False) if rest == "lm_head.weight" else (f"{a.base}.{rest}", False)
        sub = rest.removeprefix("layer.")
        return f"{a.base}.{a.blocks}.{i - 1}.{sub}", self.cfg.arch == "gpt2" and sub in GPT2_CONV1D

    def to_hf_tensors(self, named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Tensors by pipeline name ("<layer>.<param>") -> by HF name, transposed where HF's are."""
        out = {}
        for name, t in named.items():
            hf, transposed = self.hf_name(name)
            out[hf] = t.t() if transposed else t
        return out

    def to_hf(self, net: nn.Module) -> nn.Module:
        """transformers' own *ForCausalLM for this config, holding the weights of `net` (all
        the model's layers in order, as build_layers(0, num_layers, seed) gives): every
        parameter mapped by name, strictly."""
        model = getattr(_transformers("transformers"), self.arch.causal_lm)(self.config)
        state = {k: v.detach().clone() for k, v in self.to_hf_tensors(dict(net.named_parameters())).items()}
        model.load_state_dict(state, strict=True)
        return model


def build(cfg: ModelConfig) -> HFModel:
    return HFModel(cfg)
