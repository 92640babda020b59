"""Models built layer by layer (any contiguous split is a stage), and partitioners.

The registry: `model=<name>` -> a factory `(ModelConfig) -> Model` (protocol.py says what a
model provides) and, where the config alone says it, its layer count (shapes.py). A new model
is one module and one `register(...)` line here; a model outside the package needs neither
(`model=custom model.target=my_module:build`, custom.py). `get_model(cfg)` builds the named
model and checks it against the protocol; `num_layers(cfg)` counts its layers without building it.

Importing this package imports no torch: the factories are imported on first use (`lazy`), and
the protocol's names (Model, ModelError, check_model, MEMBERS) when first asked for, so the
refusals that need only a model's shape answer before torch (harness/planning/early.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

from harness.config import ModelConfig
from harness.model.shapes import stack_layers, token_layers

if TYPE_CHECKING:
    from harness.model.protocol import MEMBERS, Model, ModelError, check_model  # noqa: F401

Factory = Callable[[ModelConfig], "Model"]
Shape = Callable[[ModelConfig], int]

MODELS: dict[str, Factory] = {}
SHAPES: dict[str, Shape] = {}  # name -> its layer count from the config alone (torch-free); absent: build it

_PROTOCOL = ("MEMBERS", "Model", "ModelError", "check_model")


def register(name: str, factory: Factory, layers: Shape | None = None) -> None:
    """`model=name` builds its models with `factory(cfg)`; `layers(cfg)`, where given, is their
    num_layers from the config alone (torch-free: it must agree with the built model's)."""
    MODELS[name] = factory
    if layers is not None:
        SHAPES[name] = layers
    else:
        SHAPES.pop(name, None)


def lazy(target: str) -> Factory:
    """A factory named "module:function", imported on first use (keeps heavy imports, torch and
    transformers, out of every process that does not build a model)."""
    module, _, attr = target.partition(":")

    def factory(cfg: ModelConfig) -> Model:
        return getattr(importlib.import_module(module), attr)(cfg)

    factory.__qualname__ = factory.__name__ = target
    return factory


register("mlp", lazy("harness.model.mlp:MLP"), stack_layers)  # identical Linear + GELU layers, regression
register("gpt", lazy("harness.model.gpt:GPT"), token_layers)  # a small GPT: embedding, pre-norm blocks, LM head
register("hf", lazy("harness.model.hf:build"), token_layers)  # a Hugging Face decoder (model.arch), random weights
register("custom", lazy("harness.model.custom:build_custom"))  # your factory: model.target=module:function


def num_layers(cfg: ModelConfig) -> int | None:
    """The partitionable layers of the model `cfg` names, from its config alone (no torch);
    None where only the built model says (custom, an unknown name)."""
    shape = SHAPES.get(cfg.name)
    return shape(cfg) if shape is not None else None


def get_model(cfg: ModelConfig) -> Model:
    """The model `cfg.name` names, checked against the protocol; ModelError (one line)
    for an unknown name or a factory that cannot build one."""
    from harness.model.protocol import ModelError, check_model

    factory = MODELS.get(cfg.name)
    if factory is None:
        raise ModelError(f"model={cfg.name}: unknown (allowed: {', '.join(MODELS)})")
    return check_model(factory(cfg), f"model={cfg.name}")


def __getattr__(name: str) -> Any:
    """The protocol's names, imported (with torch) when first asked for."""
    if name in _PROTOCOL:
        return getattr(importlib.import_module("harness.model.protocol"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MEMBERS", "MODELS", "SHAPES", "Model", "ModelError", "check_model", "get_model", "num_layers",
           "register"]
