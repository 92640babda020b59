"""Parallelism inside and across stages beyond the pipeline itself: the (pp, dp, tp) grid and
its DeviceMesh (mesh.py), tensor parallelism of a stage's layers by the model's plan
(tensor.py, with the styles torch lacks in styles.py), and what tp refuses (checks.py).

Imports stay light here: importing the package imports no torch (checks.py is pure and answers
before torch: harness/planning/early.py; mesh.py's names are imported when first asked for);
mesh.py needs no torch.distributed; tensor.py imports torch's tensor-parallel API only when a
stage is parallelized.
"""

from typing import Any

from harness.parallel.checks import check_tp, tp_problem


def __getattr__(name: str) -> Any:
    """mesh.py's names (it imports torch), imported when first asked for."""
    if name in ("Coords", "Grid", "device_mesh"):
        from harness.parallel import mesh

        return getattr(mesh, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Coords", "Grid", "check_tp", "device_mesh", "tp_problem"]
