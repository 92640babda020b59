"""How many partitionable layers a built-in model has, from its config alone.

No torch and no transformers here: the refusals that need only the model's shape (more stages
than layers, an explicit partition that does not add up: harness/planning/early.py) answer from
these before the heavy imports, and the models take their `num_layers` from the same functions
(stack.py), so the two cannot disagree (tests/test_models.py checks them over a grid).
"""

from __future__ import annotations

from typing import Any


def stack_layers(cfg: Any) -> int:
    """A plain stack (mlp): model.layers."""
    return cfg.layers


def token_layers(cfg: Any) -> int:
    """A decoder language model (gpt, hf): the embedding, model.layers blocks, the head."""
    return cfg.layers + 2
