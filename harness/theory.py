"""Closed forms for the bubble and in-flight microbatches.

Bubble of GPipe and 1F1B with equal stage costs and free communication: the pipeline
fills and drains over N - 1 slots of (F + B) out of M + N - 1, so (N - 1) / (M + N - 1)
(GPipe, Huang et al. 2019, arXiv 1811.06965, sec. 2.2; 1F1B, Narayanan et al. 2021,
arXiv 2104.04473, sec. 2.2.1). 27% at N=4, M=8; 4.5% at N=4, M=64.
"""

from __future__ import annotations

SUPPORTED = ("gpipe", "1f1b")


def bubble_fraction(schedule: str, n: int, m: int) -> float:
    if schedule in ("gpipe", "1f1b"):
        return (n - 1) / (m + n - 1)
    raise KeyError(f"no closed form for schedule {schedule!r}")


def peak_inflight_microbatches(schedule: str, n: int, m: int, rank: int) -> int:
    """Microbatches whose activations rank `rank` holds at its peak: GPipe runs every
    forward before any backward (M); 1F1B starts backward after N - rank forwards."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, n - rank)
    raise KeyError(f"no closed form for schedule {schedule!r}")
