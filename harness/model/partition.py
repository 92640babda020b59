"""Partitioners: which contiguous layers each stage holds."""

from __future__ import annotations


def uniform(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Equal layer counts; the first num_layers % stages stages take one more.
    Returns [start, end) per stage; never an empty stage (needs stages <= num_layers)."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {stages} non-empty stages")
    base, extra = divmod(num_layers, stages)
    bounds, start = [], 0
    for s in range(stages):
        end = start + base + (1 if s < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds
