"""What every model shares: a stack of layers, each built from its own seed.

`LayerStack` implements the generic members of the `Model` protocol (protocol.py): the
seeded `build_layers`, and defaults for `num_layers` (model.layers), `kind` and
`input_shape`. A subclass writes `build_layer`, `batch`, `loss`, `activation_shape` and
`fwd_flops` (ABSTRACT: the protocol check reports one left unwritten as missing).
"""

from __future__ import annotations

import torch
from torch import nn

from harness.config import ModelConfig
from harness.model.shapes import stack_layers, token_layers


class LayerStack:
    """A model as `num_layers` layers (`build_layer(i)`, in subclasses). Layer i is built
    from seed (seed, i), so a rank builds only its stage's layers and the stages together
    equal the single-process model."""

    ABSTRACT = ("build_layer", "batch", "loss", "activation_shape", "fwd_flops")

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    @property
    def num_layers(self) -> int:
        """model.layers; a model with more (an embedding, a head) overrides this. From shapes.py,
        which the refusals before torch count with (harness/planning/early.py)."""
        return stack_layers(self.cfg)

    def build_layer(self, i: int) -> nn.Module:
        raise NotImplementedError

    def build_layers(self, start: int, end: int, seed: int) -> nn.Sequential:
        """Layers [start, end) of the model, each from its own generator."""
        layers = []
        for i in range(start, end):
            torch.manual_seed(seed * 1_000_003 + i)
            layers.append(self.build_layer(i))
        return nn.Sequential(*layers)

    def batch(self, seed: int, step: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def activation_shape(self, microbatch_size: int) -> tuple[int, ...]:
        raise NotImplementedError

    def kind(self, i: int) -> str:
        return "layer"

    def input_shape(self, i: int, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
        """Every layer takes the activation (float32); a model whose first layer takes
        something else (token ids) overrides this."""
        return self.activation_shape(microbatch_size), torch.float32

    def fwd_flops(self, i: int, microbatch_size: int) -> float:
        raise NotImplementedError


class TokenStack(LayerStack):
    """A decoder language model: token ids into an embedding, model.layers blocks, a head;
    hidden states [B, seq, hidden] between layers, next-token targets. What GPT and the
    Hugging Face decoders share."""

    @property
    def num_layers(self) -> int:
        """The embedding, model.layers blocks, the head (shapes.py)."""
        return token_layers(self.cfg)

    def kind(self, i: int) -> str:
        return "embed" if i == 0 else "head" if i == self.num_layers - 1 else "block"

    def batch(self, seed: int, step: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random token ids [samples, seq] and their next tokens as targets."""
        g = torch.Generator().manual_seed(seed * 7919 + step + 1)
        ids = torch.randint(0, self.cfg.vocab, (samples, self.cfg.seq + 1), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def activation_shape(self, microbatch_size: int) -> tuple[int, ...]:
        return (microbatch_size, self.cfg.seq, self.cfg.hidden)

    def input_shape(self, i: int, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
        """What layer i takes: token ids for the embedding, hidden states after it."""
        if i == 0:
            return (microbatch_size, self.cfg.seq), torch.int64
        return self.activation_shape(microbatch_size), torch.float32
