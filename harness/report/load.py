"""Find sweeps and read their records. A record that cannot be read, or lacks what the report
needs, is listed with the reason, never fatal."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.record import RESULT
from harness.result import RecordError, Result, read

# What a record's config (a free dict in the schema) must hold to be reported.
CONFIG_KEYS = ("schedule", "pp", "microbatches", "microbatch_size", "compute", "executor")


@dataclass
class Sweep:
    path: Path
    runs: list[dict] = field(default_factory=list)  # result.json contents, with "_dir" added
    corrupt: list[tuple[str, str]] = field(default_factory=list)  # (record path relative to the sweep, why)

    @property
    def name(self) -> str:
        return self.path.name


def newest_sweep(root: Path) -> Path:
    """The most recently modified directory under root/sweeps (or root) holding records."""
    candidates = [p for p in (root / "sweeps").glob("*") if p.is_dir() and any(p.rglob(RESULT))]
    if not candidates:
        candidates = [p for p in root.glob("*/*") if p.is_dir() and any(p.rglob(RESULT))]
    if not candidates:
        raise FileNotFoundError(f"no sweep with a {RESULT} under {root}/ (run `make sweep` first)")
    return max(candidates, key=lambda p: max(f.stat().st_mtime for f in p.rglob(RESULT)))


def problem(result: Result) -> str | None:
    """Why a well-formed record still cannot be reported, or None."""
    if missing := [k for k in CONFIG_KEYS if k not in result.config]:
        return f"config lacks {', '.join(missing)}"
    if result.status == "ok" and result.metrics is None:
        return "status ok but no metrics"
    return None


def load_sweep(path: Path) -> Sweep:
    sweep = Sweep(path)
    for f in sorted(path.rglob(RESULT), key=str):
        rel = str(f.relative_to(path))
        try:
            result = read(f)
        except RecordError as e:
            sweep.corrupt.append((rel, str(e)))
            continue
        if why := problem(result):
            sweep.corrupt.append((rel, why))
            continue
        # the current schema's JSON (older records upgraded), plus where it lives
        sweep.runs.append({**result.to_json(), "_dir": str(f.parent.relative_to(path))})
    return sweep
