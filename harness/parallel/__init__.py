"""Parallelism inside and across stages beyond the pipeline itself: the (pp, dp, tp) grid and
its DeviceMesh (mesh.py), tensor parallelism of a stage's layers by the model's plan
(tensor.py, with the styles torch lacks in styles.py), and what tp refuses (checks.py).

Imports stay light here: mesh.py and checks.py need no torch.distributed; tensor.py imports
torch's tensor-parallel API only when a stage is parallelized.
"""

from harness.parallel.checks import check_tp, tp_problem
from harness.parallel.mesh import Coords, Grid, device_mesh

__all__ = ["Coords", "Grid", "check_tp", "device_mesh", "tp_problem"]
