"""The memory theory's tensor-parallel side (tp > 1): a stage's layers split exactly as a run
splits them (harness/parallel/tensor.py's `parallelize_stage`, the model's own `tp_plan`),
in this one process, over a fake process group (torch's FakeProcessGroup: every collective
returns its output shape without communicating), as TP rank 0 of its group, the rank whose
bytes a run's records measure.

What it gives memory_theory.py:
- `split_stage`: layers [a, e) of stage [sa, se) built and split (the plan of a layer depends
  on its stage: model=mlp pairs its layers from the stage's first), with the input a run
  hands layer a: the stage's input (whole, or its sequence shard under sequence parallelism),
  or, inside the stage, what layers [sa, a) compute from it (a row-parallel pair's shard);
- `stage_tensors`: a stage's parameter tensors as TP rank 0 holds them (local shards, the
  replicated parts whole), built on the meta device: element counts and storage bytes;
- `split_key`: what a layer's split is (its plan's styles and their layouts, by value), so the
  theory can tell a layer split alike in every stage (gpt's, hf's: per layer kind) from one
  whose split depends on its stage (mlp's column/row pairs), and trace the former once.

The activations are then counted by the same saved-tensor hooks as at tp=1: what torch's
DTensor graph saves (all-gathered inputs of column-parallel linears under sequence
parallelism, each rank's shard elsewhere) is what the theory counts, rather than Korthikanti
et al.'s closed forms, which assume Megatron's kernels (theirs save the sequence shard and
gather again in the backward; DTensor keeps the gathered input).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Hashable, Iterator

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from harness.model.built import BuiltModel
from harness.parallel.tensor import local, parallelize_stage

FAKE_GROUP = "harness_memory_theory_tp{tp}_rank{rank}"  # one fake group per TP degree and global rank


def fake_tp_mesh(tp: int) -> Any:
    """A 1-D DeviceMesh of `tp` ranks over a FakeProcessGroup in which this process is rank 0:
    DTensor's collectives run (output shapes, no communication, no other process). Built
    from torch's ProcessGroup and FakeProcessGroup by hand (what c10d's init does for a
    "fake" backend) rather than with init_process_group("fake"): a worker already has its
    default group, and the planner must not take one. Private torch API (torch 2.13)."""
    import torch.distributed as dist

    return _fake_tp_mesh(tp, dist.get_rank() if dist.is_initialized() else 0)


@functools.lru_cache(maxsize=8)
def _fake_tp_mesh(tp: int, me: int) -> Any:
    """(per global rank `me`: a process forked after making one has a rank of its own)"""
    import torch.distributed.distributed_c10d as c10d
    from torch._C._distributed_c10d import FakeProcessGroup, ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    store = FakeStore()
    group = ProcessGroup(store, 0, tp)
    backend = FakeProcessGroup._create_internal(0, tp, FakeProcessGroup.Options())
    group._set_default_backend(ProcessGroup.BackendType.CUSTOM)
    group._register_backend(torch.device("cpu"), ProcessGroup.BackendType.CUSTOM, backend)
    name = FAKE_GROUP.format(tp=tp, rank=me)
    group._set_group_name(name)
    c10d._register_process_group(name, group)
    c10d._world.pg_map[group] = ("fake", store)
    c10d._world.pg_names[group] = name
    c10d._world.pg_group_ranks[group] = {me + i: i for i in range(tp)}  # this process: the group's rank 0
    c10d._world.pg_backend_config[group] = "cpu:fake"
    # DeviceMesh.from_group's steps, with this process's rank given: it asks the default group
    class FakeMesh(DeviceMesh):
        """This process is the mesh's rank 0, without asking a default group."""

        def get_rank(self) -> int:
            return me

        def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
            return 0

    with torch.device("cpu"):  # the caller may be building on the meta device
        # its own dimension name: never equal to a run's TP mesh (DTensor's caches compare meshes)
        mesh = FakeMesh("cpu", torch.arange(me, me + tp, dtype=torch.int), mesh_dim_names=("tp_theory",),
                        _init_backend=False, _rank=me)
    mesh._dim_group_names = [name]
    mesh._pg_registry[name] = group
    return mesh


class _InStage:
    """The model with its `tp_plan` asked for `stage`, whatever layers are built: a part of a
    stage is split as the whole stage is."""

    def __init__(self, model: Any, stage: range):
        self.model, self.stage = model, stage

    def tp_plan(self, i: int, tp: int, sequence_parallel: bool, _stage: range) -> dict | None:
        return self.model.tp_plan(i, tp, sequence_parallel, self.stage)


@contextlib.contextmanager
def _group_rank_without_world() -> Iterator[None]:
    """Within: DTensor's scatter of a parameter's shards (parallelize_module scatters from rank
    0, whatever the styles say) asks this process's rank in the fake group through the
    default group, which the planner's process does not have: the group's own rank answers."""
    import torch.distributed as dist
    import torch.distributed.tensor._collective_utils as utils

    if dist.is_initialized():
        yield
        return
    asked = utils.get_rank
    utils.get_rank = lambda group=None: group.rank()
    try:
        yield
    finally:
        utils.get_rank = asked


def _split(built: BuiltModel, sa: int, se: int, tp: int, sequence_parallel: bool) -> nn.Sequential:
    layers = built.model.build_layers(sa, se, 0)
    with unset_fake_temporarily():  # a large stage is traced under FakeTensorMode; the mesh reads its ranks' values
        mesh = fake_tp_mesh(tp)
    with _group_rank_without_world():
        return parallelize_stage(layers, _InStage(built.model, range(sa, se)), mesh, sequence_parallel, sa)


def stage_input_shape(built: BuiltModel, a: int, b: int, tp: int, sequence_parallel: bool) -> tuple[int, ...]:
    """What a run hands a stage's first layer a: the model's input (whole on every TP rank),
    or the activation, its sequence (dim 1) divided by tp under sequence parallelism."""
    shape, _ = built.model.input_shape(a, b)
    if a == 0 or not sequence_parallel:
        return tuple(shape)
    return (shape[0], shape[1] // tp, *shape[2:])


def split_stage(built: BuiltModel, a: int, e: int, sa: int, se: int, b: int, dtype: torch.dtype, tp: int,
                sequence_parallel: bool, first: bool) -> tuple[nn.Sequential, torch.Tensor]:
    """Layers [a, e) of stage [sa, se), split for TP rank 0, and the input they take (needing a
    gradient unless `first`). Call inside the caller's tensor mode (real or fake)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in the dtype: .to() cannot convert fake parameters
    try:
        layers = _split(built, sa, se, tp, sequence_parallel)
    finally:
        torch.set_default_dtype(default)
    _, in_dtype = built.model.input_shape(sa, b)
    shape = stage_input_shape(built, sa, b, tp, sequence_parallel)
    x = torch.zeros(shape, dtype=in_dtype if not in_dtype.is_floating_point else dtype)
    if a > sa:  # inside the stage: what its layers before a give (a row-parallel pair's shard, say)
        with torch.no_grad():
            x = local(layers[:a - sa](x)).clone()
    if x.is_floating_point():
        x.requires_grad_(not first)
    return layers[a - sa:e - sa], x


def split_key(built: BuiltModel, i: int, tp: int, sequence_parallel: bool, stage: range) -> Hashable:
    """Layer i's TP plan in `stage`, by value: two keys are equal when the layer is split alike
    (the same styles on the same submodules, the same layouts and sizes), so it holds the same
    bytes and takes and gives the same shards. A part of a style that has no value to compare
    (a function, say) makes the key unequal to every other: such a layer is never assumed alike."""
    return _by_value(built.model.tp_plan(i, tp, sequence_parallel, stage))


def _by_value(x: Any) -> Hashable:
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (tuple, list)):
        return type(x).__name__, tuple(_by_value(v) for v in x)
    if isinstance(x, dict):
        return "dict", tuple(sorted((str(k), _by_value(v)) for k, v in x.items()))
    if type(x).__eq__ is not object.__eq__ and type(x).__hash__ is not None:  # a placement: Shard(1), Replicate()
        return type(x).__qualname__, x
    if hasattr(x, "__dict__") and not callable(x):  # a style: its class and its fields
        return type(x).__qualname__, _by_value(vars(x))
    return object()  # nothing to compare (a function...): unequal to everything


@functools.lru_cache(maxsize=1024)
def stage_tensors(built: BuiltModel, sa: int, se: int, tp: int, sequence_parallel: bool) -> tuple[int, ...]:
    """Stage [sa, se)'s parameter tensors on TP rank 0: each local shard's elements (a
    replicated tensor's all). Each is a storage of its own in a run: torch's parallelize_module
    scatters every shard from rank 0 into a new tensor, whatever the styles ask."""
    with torch.device("meta"):
        layers = _split(built, sa, se, tp, sequence_parallel)
    return tuple(local(p).numel() for p in layers.parameters())
