"""Partitioners: which contiguous layers each stage holds.

uniform: equal layer counts. params / flops / profile: the contiguous split into S
non-empty stages that minimises the largest stage cost, found exactly by dynamic
programming over prefix sums (O(S L^2); L is a few hundred at most), not greedily.
params balances parameter counts (DeepSpeed's partition_method="parameters"), flops the
analytic forward FLOPs, profile the measured forward + backward time per layer.
explicit: the user's layers_per_stage (Megatron's uneven first/last stages).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

Bounds = list[tuple[int, int]]  # [stage] (first layer, end layer)


def uniform(num_layers: int, stages: int) -> Bounds:
    """Equal layer counts; the first num_layers % stages stages take one more."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {stages} non-empty stages")
    base, extra = divmod(num_layers, stages)
    bounds, start = [], 0
    for s in range(stages):
        end = start + base + (1 if s < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def min_max(costs: list[float], stages: int) -> Bounds:
    """The contiguous split of `costs` into `stages` non-empty parts with the smallest
    largest part. best[k][j]: smallest largest part over splits of layers [0, j) into k."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} layers into {stages} non-empty stages")
    prefix = [0.0, *accumulate(costs)]
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1][i], prefix[j] - prefix[i])
                if v < best[k][j]:
                    best[k][j], cut[k][j] = v, i
    bounds, j = [], n
    for k in range(stages, 0, -1):
        bounds.append((cut[k][j], j))
        j = cut[k][j]
    return bounds[::-1]


def explicit(layers_per_stage: list[int], num_layers: int) -> Bounds:
    if any(n < 1 for n in layers_per_stage) or sum(layers_per_stage) != num_layers:
        raise ValueError(f"layers_per_stage={layers_per_stage} must be positive and sum to {num_layers}")
    starts = [0, *accumulate(layers_per_stage)]
    return list(zip(starts[:-1], starts[1:]))


@dataclass(frozen=True)
class Partition:
    method: str
    bounds: Bounds
    cost_unit: str  # what `layer_costs` measure: layers | params | flops | s
    layer_costs: list[float]

    @property
    def stage_costs(self) -> list[float]:
        return [sum(self.layer_costs[a:b]) for a, b in self.bounds]

    @property
    def imbalance(self) -> float:
        """Slowest (largest) stage over the mean stage: 1.0 is perfect balance."""
        costs = self.stage_costs
        return max(costs) / (sum(costs) / len(costs)) if sum(costs) else 1.0

    def describe(self) -> dict:
        return {"method": self.method, "layers_per_stage": [b - a for a, b in self.bounds],
                "stage_layers": [list(b) for b in self.bounds], "cost_unit": self.cost_unit,
                "predicted_cost_per_stage": self.stage_costs, "imbalance": self.imbalance}
