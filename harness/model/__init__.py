"""Models built layer by layer (any contiguous split is a stage), and partitioners."""

from __future__ import annotations

from harness.config import ModelConfig
from harness.model.mlp import MLP


def get_model(cfg: ModelConfig) -> MLP:
    if cfg.name == "mlp":
        return MLP(cfg)
    raise KeyError(f"model={cfg.name}: unknown")
