"""Models built layer by layer (any contiguous split is a stage), and partitioners.

The registry: `model=<name>` -> a factory `(ModelConfig) -> Model` (protocol.py says what a
model provides). A new model is one module and one `register(...)` line here; a model
outside the package needs neither (`model=custom model.target=my_module:build`, custom.py).
`get_model(cfg)` builds the named model and checks it against the protocol.
"""

from __future__ import annotations

import importlib
from typing import Callable

from harness.config import ModelConfig
from harness.model.custom import build_custom
from harness.model.gpt import GPT
from harness.model.mlp import MLP
from harness.model.protocol import MEMBERS, Model, ModelError, check_model

Factory = Callable[[ModelConfig], Model]

MODELS: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """`model=name` builds its models with `factory(cfg)`."""
    MODELS[name] = factory


def lazy(target: str) -> Factory:
    """A factory named "module:function", imported on first use (keeps heavy imports, such
    as transformers, out of every run that does not use them)."""
    module, _, attr = target.partition(":")

    def factory(cfg: ModelConfig) -> Model:
        return getattr(importlib.import_module(module), attr)(cfg)

    factory.__qualname__ = factory.__name__ = target
    return factory


register("mlp", MLP)  # identical Linear + GELU layers, regression
register("gpt", GPT)  # a small GPT: embedding, pre-norm blocks, LM head
register("hf", lazy("harness.model.hf:build"))  # a Hugging Face decoder (model.arch), random weights
register("custom", build_custom)  # your factory: model.target=module:function


def get_model(cfg: ModelConfig) -> Model:
    """The model `cfg.name` names, checked against the protocol; ModelError (one line)
    for an unknown name or a factory that cannot build one."""
    factory = MODELS.get(cfg.name)
    if factory is None:
        raise ModelError(f"model={cfg.name}: unknown (allowed: {', '.join(MODELS)})")
    return check_model(factory(cfg), f"model={cfg.name}")


__all__ = ["MEMBERS", "MODELS", "Model", "ModelError", "check_model", "get_model", "register"]
