"""Find sweeps and read their records; a corrupt record is listed, never fatal."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.record import RESULT


@dataclass
class Sweep:
    path: Path
    runs: list[dict] = field(default_factory=list)  # result.json contents, with "_dir" added
    corrupt: list[Path] = field(default_factory=list)

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


def load_sweep(path: Path) -> Sweep:
    sweep = Sweep(path)
    for f in sorted(path.rglob(RESULT), key=lambda p: str(p)):
        try:
            run = json.loads(f.read_text())
            run["status"], run["config"]  # noqa: B018 - the fields every record has
        except (OSError, ValueError, KeyError, TypeError):
            sweep.corrupt.append(f)
            continue
        run["_dir"] = str(f.parent.relative_to(path))
        sweep.runs.append(run)
    return sweep
