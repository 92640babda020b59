"""Plan = validated config -> partition + schedule + modeled costs. Picklable: workers
receive it whole and build their stage from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.config import Config, validate
from harness.model import get_model
from harness.model.partition import uniform
from harness.schedules.builders import build
from harness.schedules.ir import Schedule, stage_to_rank
from harness.schedules.validate import validate as validate_schedule
from harness.simulate.cost import CostModel


@dataclass(frozen=True)
class Plan:
    config: Config
    schedule: Schedule
    stage_layers: tuple[tuple[int, int], ...]  # [stage] (first layer, end layer)
    stage_rank: dict[int, int]
    emulated_cost: CostModel  # what compute=emulated sleeps, per stage
    device: str  # cpu | cuda (auto resolved)

    @property
    def world(self) -> int:
        return self.config.pp * self.config.dp

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def describe(self) -> dict:
        return {
            "stage_layers": [list(b) for b in self.stage_layers],
            "stage_rank": {str(k): v for k, v in self.stage_rank.items()},
            "device": self.device,
            "backend": self.backend,
            "emulated_cost": asdict(self.emulated_cost),
        }


def make_plan(c: Config, cuda_devices: int = 0) -> Plan:
    """Raises ConfigError (one line) for any input that cannot run."""
    validate(c, cuda_devices)
    device = c.device if c.device != "auto" else ("cuda" if cuda_devices >= c.pp * c.dp else "cpu")
    model = get_model(c.model)
    bounds = tuple(uniform(model.num_layers, c.pp))
    schedule = build(c.schedule.name, c.pp, c.microbatches)
    validate_schedule(schedule, len(bounds), c.microbatches)  # builders are tested; this guards edits
    fwd = tuple((end - start) * c.cost.fwd_ms_per_layer / 1e3 for start, end in bounds)
    cost = CostModel(fwd_s=fwd, bwd_s=tuple(f * c.cost.bwd_over_fwd for f in fwd))
    return Plan(c, schedule, bounds, stage_to_rank(schedule), cost, device)
