"""A model built once, with what planning, pricing and the memory theory read of it.

The main process builds the model of a job once (`build_model`, in planning) and the Plan
carries it: the partitioners, the cost model, the size checks and the memory theory all read
this object instead of building the model again (with model=custom, running the user's
factory again). Its parameter tensors are counted once, on the meta device (no memory).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import cached_property

import torch

from harness.config import ModelConfig
from harness.model import Model, get_model


EXACT_LAYERS = 4096


class BuiltModel:
    def __init__(self, config: ModelConfig, model: Model | None = None):
        self.config = config
        self.model = model if model is not None else get_model(config)

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @cached_property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.model.kind(i) for i in range(self.num_layers))

    @cached_property
    def _meta(self) -> tuple[tuple[tuple[int, ...], str], ...] | None:
        """Each layer built on the meta device: its parameter tensors' sizes and its structure
        (the module's repr); None where the model cannot be built there (a custom model may not
        support it), or has more than EXACT_LAYERS layers (no pipeline runs that many)."""
        if self.num_layers > EXACT_LAYERS:
            return None
        return self._build_meta(range(self.num_layers))

    def _build_meta(self, layers: range | tuple[int, ...]) -> tuple[tuple[tuple[int, ...], str], ...] | None:
        try:
            with torch.device("meta"):
                built = [self.model.build_layer(i) for i in layers]
        except Exception:  # noqa: BLE001 - the counts are then unknown; the workers say what fails
            return None
        return tuple((tuple(p.numel() for p in m.parameters()), repr(m)) for m in built)

    @cached_property
    def numels(self) -> tuple[tuple[int, ...], ...] | None:
        """Each layer's parameter tensors' sizes (None: see _meta)."""
        return None if self._meta is None else tuple(n for n, _ in self._meta)

    @cached_property
    def structures(self) -> tuple[str, ...] | None:
        """Each layer's module structure, as its repr: what tells two layers of one kind apart."""
        return None if self._meta is None else tuple(r for _, r in self._meta)

    @cached_property
    def layer_params(self) -> list[int]:
        """Parameters per layer (0 for every layer where they cannot be counted)."""
        return [sum(n) for n in self.numels] if self.numels is not None else [0] * min(self.num_layers, EXACT_LAYERS)

    @cached_property
    def total_params(self) -> int | None:
        """Parameters of the whole model; past EXACT_LAYERS layers, the first, a middle and the
        last layer built and the middle one standing for the others (a size check's bound)."""
        n = self.num_layers
        if self.numels is not None:
            return sum(self.layer_params)
        picked = self._build_meta((0, n // 2, n - 1)) if n > EXACT_LAYERS else None
        if picked is None:
            return None
        first, middle, last = (sum(x) for x, _ in picked)
        return first + last + (n - 2) * middle

    def build_stage(self, a: int, b: int, seed: int, dtype: torch.dtype, device: torch.device | str = "cpu"
                    ) -> torch.nn.Sequential:
        """Layers [a, b) as a stage in `dtype` on `device`: what every runner and the
        single-process reference build (layer i from its own seed: the same whatever the split)."""
        return self.model.build_layers(a, b, seed=seed).to(device=device, dtype=dtype)

    def activation_numel(self, microbatch_size: int) -> int:
        """Elements of the one tensor between two stages, for one microbatch."""
        return math.prod(self.model.activation_shape(microbatch_size))

    def __getstate__(self) -> dict:
        """Pickled as its config: a worker builds the model again, once (a user's model may not pickle)."""
        return {"config": self.config}

    def __setstate__(self, state: dict) -> None:
        self.config = state["config"]
        self.model = get_model(self.config)


_BUILT: OrderedDict[str, BuiltModel] = OrderedDict()  # the last few configs' models, by their repr
KEEP_BUILT = 8


def built_model(config: ModelConfig) -> BuiltModel:
    """The BuiltModel of `config`, shared by every plan in this process that has the same one (a
    sweep's jobs, the planner's commands, a calibration's runs): each model is built, and its
    layers counted on the meta device, once."""
    key = repr(config)
    hit = _BUILT.pop(key, None)
    _BUILT[key] = hit if hit is not None else BuiltModel(config)
    while len(_BUILT) > KEEP_BUILT:
        _BUILT.popitem(last=False)
    return _BUILT[key]
