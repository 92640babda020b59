"""Models built layer by layer (any contiguous split is a stage), and partitioners."""

from __future__ import annotations

from harness.config import ModelConfig
from harness.model.gpt import GPT
from harness.model.mlp import MLP

Model = MLP | GPT


def get_model(cfg: ModelConfig) -> Model:
    if cfg.name == "mlp":
        return MLP(cfg)
    if cfg.name == "gpt":
        return GPT(cfg)
    raise KeyError(f"model={cfg.name}: unknown")
