"""gpt: a small GPT built layer by layer: layer 0 embeds (token + position), layers
1..L are pre-norm transformer blocks, layer L+1 is the final norm + LM head. Any
contiguous split is a stage. Synthetic tokens (no downloads), next-token cross-entropy.

The LM head is not tied to the embedding: tying across stages needs a gradient
all-reduce between the first and last stage (Megatron's embedding group), not modelled.
Layer kinds match ../shared/data/gpt2_h200_profile.json (embed, block x L, head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.model.split_linear import SplitLinear
from harness.model.stack import TokenStack


class Embed(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [B, T] int64 -> [B, T, d]
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = SplitLinear(d, 3 * d), SplitLinear(d, d)
        self.fc, self.out = SplitLinear(d, 4 * d), SplitLinear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, d]
        # sizes from the QKV output, not from x: under tensor parallelism it holds this rank's
        # heads only, and under sequence parallelism x is a sequence shard (GPT.tp_plan)
        qkv = self.qkv(self.ln1(x))  # [B, T, 3 d], [q; k; v]
        B, T = qkv.shape[:2]
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, d: int, vocab: int):
        super().__init__()
        self.ln, self.lm = nn.LayerNorm(d), SplitLinear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, d] -> logits [B, T, vocab]
        return self.lm(self.ln(x))


class GPT(TokenStack):
    def build_layer(self, i: int) -> nn.Module:
        c = self.cfg
        kind = self.kind(i)
        if kind == "embed":
            return Embed(c.vocab, c.seq, c.hidden)
        if kind == "head":
            return Head(c.hidden, c.vocab)
        return Block(c.hidden, c.heads)

    def fwd_flops(self, i: int, microbatch_size: int) -> float:
        """Forward FLOPs (2 per multiply-add) of layer i for one microbatch: the linears
        (12 d^2 per token in a block, d x vocab in the head) plus attention's QK^T and AV
        (2 T^2 d per sequence, causal half counted). Embedding lookups: 0."""
        c, tokens = self.cfg, microbatch_size * self.cfg.seq
        kind = self.kind(i)
        if kind == "block":
            return 2 * tokens * 12 * c.hidden ** 2 + 2 * microbatch_size * c.seq ** 2 * c.hidden
        return 2 * tokens * c.hidden * c.vocab if kind == "head" else 0.0

    def tp_plan(self, i: int, tp: int, sequence_parallel: bool, stage: range) -> dict | None:
        """Megatron's tensor parallelism (harness/parallel/tensor.py), per layer:
        - a block: attention split by heads (the fused QKV column-parallel, each rank keeping
          its heads' q, k and v; the output projection row-parallel), the MLP column then row
          parallel: one all-reduce after each (forward), one before each (backward);
        - the embedding and the LM head are vocabulary-parallel, not replicated (as Megatron):
          each is vocab x d, as large as vocab / 12d blocks (1.3 blocks at the defaults, 5.5 at
          GPT-2 small's 50257 x 768), so replicated they would keep their weights, gradients
          and optimizer state whole on every TP rank, and the head's 2 T d vocab FLOPs unsplit.
          The embedding looks up its rows and all-reduces (styles.VocabParallelEmbedding); the
          head computes its vocabulary slice of the logits, all-gathered so the loss sees the
          whole logits (a vocabulary-parallel loss, torch's loss_parallel, would skip that
          gather but needs the executors to call the loss on DTensors). Position embeddings
          stay replicated ([seq, d], small);
        - sequence_parallel (Korthikanti et al. 2022): the norms run on sequence shards, the
          all-reduces become reduce-scatters (after the row-parallel linears and the
          embedding) and all-gathers (before the column-parallel ones); the position
          embedding is then split by positions so each rank adds its shard's rows."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

        from harness.parallel.styles import FusedColwiseParallel, VocabParallelEmbedding

        seq = Shard(1) if sequence_parallel else Replicate()
        kind = self.kind(i)
        if kind == "embed":
            plan: dict = {"tok": VocabParallelEmbedding(seq)}
            if sequence_parallel:
                plan["pos"] = VocabParallelEmbedding(Shard(0))  # pos(arange(T)) is [T, d]
            return plan

        def norms(*names: str) -> dict:  # on sequence shards under sequence parallelism, else replicated
            return {name: SequenceParallel() for name in names} if sequence_parallel else {}

        if kind == "head":
            return {**norms("ln"), "lm": ColwiseParallel(input_layouts=seq, output_layouts=Replicate())}
        return {**norms("ln1", "ln2"), "qkv": FusedColwiseParallel(3, input_layouts=seq),
                "proj": RowwiseParallel(output_layouts=seq), "fc": ColwiseParallel(input_layouts=seq),
                "out": RowwiseParallel(output_layouts=seq)}

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
