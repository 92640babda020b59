"""Where an entry point's `--out` may write (harness.profile, harness.advise, harness.export,
harness.report): never into the harness's own source tree, never over a record a run wrote.

`profile --out result.json` in a run directory overwrote that run's record, and `--out
harness/` would write reports among the modules; both are refused in one line before any
work, with nothing written. `data/` and `reports/` (what `make profile` and `make report`
refresh) are outputs, not sources.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) holding the harness package
SOURCE_DIRS = ("harness", "hydra_plugins", "tests", "tools", "benchmarks", ".git")  # ROOT's code, never an output
RECORDS = ("result.json", "running.json", "trace.json", "sweep.json", "multirun.yaml")  # what a run or sweep wrote


def source_dir(path: str | Path) -> Path | None:
    """The harness source directory `path` is (or is within), links followed; else None."""
    resolved = Path(os.path.abspath(path)).resolve()
    for name in SOURCE_DIRS:
        top = ROOT / name
        if resolved == top or top in resolved.parents:
            return top
    return None


def out_problem(path: str | Path, said: str, kind: str = "file") -> str | None:
    """Why `path` is no place for this output (one line starting with `said`, the flag and its
    value as the entry point writes them), or None. `kind`: "file" (the output itself) or
    "dir" (a directory the outputs go into)."""
    top = source_dir(path)
    if top is not None:
        return (f"{said}: inside the harness's source tree ({top}) (allowed: a path outside "
                f"{', '.join(n + '/' for n in SOURCE_DIRS)} of {ROOT}, e.g. runs/ or reports/)")
    p = Path(path)
    if kind == "file" and p.name in RECORDS and os.path.lexists(p):
        return (f"{said}: an existing {p.name}, a record the harness wrote (allowed: a new file, or one that is "
                "not a run's record)")
    return None
