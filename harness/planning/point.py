"""A point of the plan space: the keys a plan is chosen by (schedule, pp, dp, M, B, virtual
stages, checkpointing, ZeRO, placement, the memory limit of a schedule that takes one, tp and
sequence parallelism), as the
planner (harness/advise/search.py) searches them and the exporters (harness/export/) render
them. `Point.of` reads one off a Config, `config` puts one on a Config, `overrides` are its keys."""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.config import Config, planned_microbatch_size
from harness.schedules.registry import SCHEDULES, chunks_per_rank


def limit_label(x: float) -> str:
    """A memory limit as a point's label shows it (4 significant digits)."""
    return f"{x:.4g}"


@dataclass(frozen=True, order=True)
class Point:
    schedule: str
    pp: int
    microbatches: int
    virtual_stages: int
    dp: int
    microbatch_size: int
    checkpointing: bool
    zero: int
    placement: str
    # the memory limit of a schedule that takes one (its entry's limit_key: zb_auto's schedule.memory_limit, in
    # units of 1F1B's peak); None for the others
    memory_limit: float | None = None
    tp: int = 1  # tensor-parallel ranks inside each stage (world = pp x tp x dp)
    sequence_parallel: bool = False

    @property
    def chunks(self) -> int:
        return chunks_per_rank(self.schedule, self.virtual_stages)

    def overrides(self) -> dict[str, object]:
        """The harness's keys for this point (global_batch sets B = it / (dp x M))."""
        o: dict[str, object] = {"schedule": self.schedule}
        if self.memory_limit is not None:
            o[f"schedule.{SCHEDULES[self.schedule].limit_key}"] = self.memory_limit
        return o | {"pp": self.pp, "dp": self.dp, "microbatches": self.microbatches,
                    "microbatch_size": self.microbatch_size, "virtual_stages": self.virtual_stages,
                    "checkpointing": self.checkpointing, "zero": self.zero, "placement": self.placement,
                    "tp": self.tp, "sequence_parallel": self.sequence_parallel}

    def config(self, base: Config) -> Config:
        """`base` with this point's keys (B set by its global batch, dp x M x B, as the printed
        commands set it)."""
        entry = SCHEDULES[self.schedule]
        if entry.config is None:
            schedule = replace(base.schedule, name=self.schedule)
        else:  # its own section, at its defaults and this point's memory limit
            limit = {entry.limit_key: self.memory_limit} if self.memory_limit is not None and entry.limit_key else {}
            schedule = entry.config(name=self.schedule, **limit)
        return replace(base, schedule=schedule, pp=self.pp, dp=self.dp,
                       microbatches=self.microbatches, global_batch=self.dp * self.microbatches * self.microbatch_size,
                       virtual_stages=self.virtual_stages, checkpointing=self.checkpointing, zero=self.zero,
                       placement=self.placement, tp=self.tp, sequence_parallel=self.sequence_parallel)

    def label(self) -> str:
        entry = SCHEDULES[self.schedule]
        v = f" v={self.virtual_stages}" if entry.reads_virtual_stages else ""
        limit = f" {entry.limit_key}={limit_label(self.memory_limit)}" if self.memory_limit is not None else ""
        tp = f" tp={self.tp}{' sp' if self.sequence_parallel else ''}" if self.tp > 1 else ""
        return (f"{self.schedule} pp={self.pp}{tp} dp={self.dp} M={self.microbatches} B={self.microbatch_size}"
                f"{v}{limit}"
                f"{' ckpt' if self.checkpointing else ''}{' zero1' if self.zero else ''}"
                f"{' dp_inner' if self.placement == 'dp_inner' else ''}")

    @classmethod
    def of(cls, c: Config) -> "Point":
        """The point a harness Config runs."""
        b = planned_microbatch_size(c)
        entry = SCHEDULES[c.schedule.name]
        v = c.virtual_stages if entry.reads_virtual_stages else 1
        limit = float(getattr(c.schedule, entry.limit_key)) if entry.limit_key else None
        return cls(c.schedule.name, c.pp, c.microbatches, v, c.dp, b, c.checkpointing, c.zero, c.placement, limit,
                   c.tp, c.sequence_parallel)
