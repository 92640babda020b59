"""Every private torch API the harness reaches into, in one place, behind a version guard.

torch.distributed.pipelining and DDP expose no public hook for what the harness needs:
arming DDP's reducer for one chosen backward (as torch's own PipelineStage does), timing
torch's P2P batches, loading a CSV schedule, reading a stage's placement. Each use is a
function here; a torch outside TESTED_TORCH is refused before any worker starts
(`untested_torch`), unless HARNESS_ALLOW_UNTESTED_TORCH=1 says to try anyway.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

TESTED_TORCH = ("2.11", "2.13")  # major.minor releases the private uses below were checked on
ALLOW_ENV = "HARNESS_ALLOW_UNTESTED_TORCH"


def untested_torch() -> str | None:
    """One line saying why this torch is refused for private-API work, or None."""
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if version in TESTED_TORCH or os.environ.get(ALLOW_ENV) == "1":
        return None
    return (f"torch {torch.__version__}: untested with the harness's uses of torch internals (tested: "
            f"{', '.join(TESTED_TORCH)}; set {ALLOW_ENV}=1 to try anyway)")


# -- fake tensors: shapes, dtypes and storages without memory (harness/planning/memory_theory.py) ---------
def fake_tensors() -> Any:
    """A context in which tensors are fakes: what runs inside allocates nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def storage_id(t: torch.Tensor) -> int:
    """Identity of a tensor's storage, fake or real (a fake storage's data_ptr is 0 for all)."""
    return t.untyped_storage()._cdata


# -- DDP ------------------------------------------------------------------------------
def arm_ddp_backward(module: torch.nn.Module, output: Any) -> None:
    """Make DDP's reducer all-reduce in the backward of `output`: what DDP's forward does
    when not under no_sync, done for the one backward that should sync (torch's
    PipelineStage does the same for its last backward)."""
    from torch.nn.parallel.distributed import _find_tensors

    module.reducer.prepare_for_backward(list(_find_tensors(output)))


# -- torch.distributed.pipelining -------------------------------------------------------
@contextmanager
def traced_pipelining_p2p(post: Callable, wait: Callable) -> Iterator[None]:
    """Within: torch's schedules post each P2P batch through `post(original, ops, desc)` and
    wait on it through `wait(original, works)` (every schedule calls these two module
    functions; only this rank's process runs them meanwhile)."""
    import torch.distributed.pipelining.schedules as schedules

    original_post, original_wait = schedules._batch_p2p, schedules._wait_batch_p2p
    schedules._batch_p2p = lambda ops, desc=None: post(original_post, ops, desc)
    schedules._wait_batch_p2p = lambda works: wait(original_wait, works)
    try:
        yield
    finally:
        schedules._batch_p2p, schedules._wait_batch_p2p = original_post, original_wait


def csv_schedule(stages: list, microbatches: int, loss_fn: Callable, path: str) -> Any:
    """torch's runtime schedule loaded from a compute_only CSV (its own loader)."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    schedule = _PipelineScheduleRuntime(stages, microbatches, loss_fn=loss_fn, scale_grads=True)
    schedule._load_csv(path, format="compute_only")
    return schedule


def is_single_stage_schedule(cls: type) -> bool:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    return issubclass(cls, PipelineScheduleSingle)


def stage_placement(stage: Any) -> dict[int, int]:
    """Which rank torch's P2P sends each stage to (loop, V, or the CSV's placement)."""
    return dict(stage.stage_index_to_group_rank)


# PipelineStage methods the peer executor shadows on the instance to time them and label
# their P2P ops; the schedules call them on the instance.
STAGE_COMPUTE = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
STAGE_P2P = ("get_fwd_recv_ops", "get_bwd_recv_ops", "get_fwd_send_ops", "get_bwd_send_ops")
