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
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = SplitLinear(d, 3 * d), SplitLinear(d, d)
        self.fc, self.out = SplitLinear(d, 4 * d), SplitLinear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, d]
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
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

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
