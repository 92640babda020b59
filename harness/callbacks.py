"""Hydra callbacks: a sweep's closing summary and its exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.record import RESULT


class SweepSummary(Callback):
    """After a sweep: how many jobs ran ok, which failed; exit 1 if any did."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        status: dict[str, list[str]] = {}
        for path in sorted(sweep_dir.rglob(RESULT)):
            try:
                s = json.loads(path.read_text())["status"]
            except (OSError, ValueError, KeyError):
                s = "corrupt"
            status.setdefault(s, []).append(str(path.parent.relative_to(sweep_dir)))
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(status.items()))
        print(f"harness: sweep {sweep_dir}: {counts}", flush=True)
        bad = [j for k, v in status.items() if k != "ok" for j in v]
        if bad:
            print(f"harness: not ok: {', '.join(bad)}", file=sys.stderr)
            sys.exit(1)
