"""Find sweeps and read their records. A record that cannot be read, or lacks what the report
needs, is listed with the reason, never fatal."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.record import RESULT

# What every record must hold to be reported; an ok record also needs its headline metrics.
CONFIG_KEYS = ("schedule", "pp", "microbatches", "microbatch_size", "compute", "executor")
OK_METRICS = ("step_time_s", "throughput_samples_s", "bubble")


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


def problem(run: object) -> str | None:
    """Why a parsed record cannot be reported, or None."""
    if not isinstance(run, dict):
        return "not a JSON object"
    if "status" not in run or not isinstance(run.get("config"), dict):
        return "no status or config"
    if missing := [k for k in CONFIG_KEYS if k not in run["config"]]:
        return f"config lacks {', '.join(missing)}"
    if run["status"] == "ok":
        m = run.get("metrics")
        if not isinstance(m, dict) or (missing := [k for k in OK_METRICS if m.get(k) is None]):
            return f"status ok but metrics lack {', '.join(missing) if isinstance(m, dict) else 'everything'}"
        if "measured" not in m["bubble"]:
            return "status ok but metrics lack bubble.measured"
    return None


def load_sweep(path: Path) -> Sweep:
    sweep = Sweep(path)
    for f in sorted(path.rglob(RESULT), key=str):
        rel = str(f.relative_to(path))
        try:
            run = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            sweep.corrupt.append((rel, f"unreadable: {type(e).__name__}: {e}"))
            continue
        if why := problem(run):
            sweep.corrupt.append((rel, why))
            continue
        run["_dir"] = str(f.parent.relative_to(path))
        sweep.runs.append(run)
    return sweep
