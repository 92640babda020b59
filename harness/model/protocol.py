"""What every model provides: the `Model` protocol, and the check that names a missing member.

A model is a stack of `num_layers` partitionable layers; any contiguous run of them is a
pipeline stage. The executors, the partitioners, the profiler and the single-process
reference use only these members (harness/planning/plan.py, reference.py, profile.py,
runtime/native.py, runtime/peer.py). `LayerStack` (stack.py) implements the generic ones;
a model written outside this package may implement them all itself, no base class needed
(examples/my_model.py).

Contracts the runtime relies on:
- layer i, built by `build_layers(i, i + 1, seed)` in any process, is the same module
  (parameters included) as layer i of `build_layers(0, num_layers, seed)`: a rank builds
  only its stage's layers, and the stages together are the single-process model;
- every layer takes ONE tensor and returns ONE tensor. Between two stages exactly one tensor
  of `activation_shape(B)` (float32) travels; the first layer takes `input_shape(0, B)` (the
  batch's input), the last returns what `loss(output, target)` takes. Anything else a layer
  needs (positions, masks, rotary tables) it computes itself;
- `batch(seed, step, samples)` is a pure function of its arguments, splittable along dim 0
  into microbatches: (inputs, targets) of `samples` rows each;
- `loss` is a mean over the samples, so the mean of the M microbatch losses (what the
  executors sum, each scaled by 1/M) equals the loss of the whole batch;
- linear layers that are `SplitLinear` (split_linear.py) get their weight gradient deferred
  to W in zero-bubble schedules; other parameters get theirs in I (still correct).

Optional, not part of the check: `preload`, the modules a rank imports to build its layers
(model=hf: transformers' modeling code), for a launcher to import once before forking.

Optional, for tensor parallelism (tp > 1; harness/parallel/tensor.py applies it):
`tp_plan(i, tp, sequence_parallel, stage) -> dict[str, ParallelStyle] | None`, the
torch.distributed.tensor.parallel styles of layer i's submodules (keys: paths inside layer i,
"" for layer i itself) at TP degree tp, when `stage` (a range of global layer indices) is the
stage that holds it; None leaves layer i replicated. A plan keeps the one-tensor contract per
TP rank: each layer takes and returns the whole activation (its sequence shard [B, T/tp, ...]
with sequence_parallel, dim 1), so any split into stages works; layers of one stage may pass a
shard between them (mlp's column/row pairs), as `stage` tells. The first layer takes the whole
input and the last returns the whole output on every TP rank. A model without `tp_plan` runs
at tp=1 only (model=custom: refused with one line). mlp.py, gpt.py and hf.py are examples;
harness/parallel/styles.py has the styles torch lacks (fused QKV, vocabulary-parallel
embedding, replicated KV heads).
"""

from __future__ import annotations

import inspect
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from harness.config import ConfigError


class ModelError(ConfigError):
    """A model that cannot be built from its config; str() is one line,
    "model.<key>=<value>: <what is allowed>". A ConfigError (so a ValueError): refused
    before any worker starts, like every other bad input."""


@runtime_checkable
class Model(Protocol):
    """A model as partitionable layers, its data, its loss, and its costs."""

    @property
    def num_layers(self) -> int:
        """How many partitionable layers (>= 1)."""
        ...

    def build_layer(self, i: int) -> nn.Module:
        """Layer i, freshly initialised from the global torch RNG (build_layers seeds it)."""
        ...

    def build_layers(self, start: int, end: int, seed: int) -> nn.Sequential:
        """Layers [start, end), layer i from its own seed: the same whatever the split."""
        ...

    def batch(self, seed: int, step: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of one step's global batch, `samples` rows each; synthetic."""
        ...

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Scalar mean loss of the last layer's output against the targets."""
        ...

    def activation_shape(self, microbatch_size: int) -> tuple[int, ...]:
        """Shape of the one float32 tensor between two stages, for one microbatch."""
        ...

    def kind(self, i: int) -> str:
        """A short label of layer i ("embed", "block", "head", "linear"...): profiles, reports."""
        ...

    def input_shape(self, i: int, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
        """What layer i takes: (shape, dtype) for one microbatch (the profiler feeds it)."""
        ...

    def fwd_flops(self, i: int, microbatch_size: int) -> float:
        """Analytic forward FLOPs of layer i on one microbatch (2 per multiply-add)."""
        ...


MEMBERS: tuple[str, ...] = ("num_layers", "build_layer", "build_layers", "batch", "loss", "activation_shape",
                            "kind", "input_shape", "fwd_flops")


def missing_member(obj: object) -> str | None:
    """The first protocol member `obj` lacks (or leaves as LayerStack's unimplemented stub),
    or None when it has them all."""
    from harness.model.stack import LayerStack

    for name in MEMBERS:
        try:
            value = getattr(obj, name)
        except NotImplementedError:
            return name
        except AttributeError:
            return name
        if name == "num_layers":
            continue
        if not callable(value):
            return name
        if isinstance(obj, LayerStack) and getattr(type(obj), name, None) is getattr(LayerStack, name, None) \
                and name in LayerStack.ABSTRACT:
            return name
    return None


def check_model(obj: object, where: str) -> Model:
    """`obj` if it provides the whole protocol; else ModelError naming `where` (the config
    key and value that made it) and the missing member."""
    if inspect.isclass(obj):
        raise ModelError(f"{where}: returned the class {obj.__name__}, not a model (return an instance)")
    name = missing_member(obj)
    if name is not None:
        raise ModelError(f"{where}: returned a {type(obj).__name__} without `{name}` (a model provides "
                         f"{', '.join(MEMBERS)}: harness/model/protocol.py)")
    n = obj.num_layers  # type: ignore[attr-defined]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ModelError(f"{where}: returned a {type(obj).__name__} with num_layers={n!r} (allowed: an integer >= 1)")
    return obj  # type: ignore[return-value]
