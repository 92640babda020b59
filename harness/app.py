"""Entry point: `python -m harness [key=value ...]`, `-m` for a sweep. Thin on purpose:
the work is in job.run_job."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.config import ConfigError, register, to_config
from harness.job import headline, run_job

register()


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    group = Path(hc.sweep.dir).name if sweep else "single"
    name = hc.job.override_dirname or "default"
    try:
        result = run_job(to_config(cfg), out, group, name, _cuda_devices())
    except ConfigError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        if not sweep:
            sys.exit(2)
        return  # recorded as failed; the sweep goes on and its exit status counts it
    print(f"harness: {headline(result)}", flush=True)
    print(f"harness: records in {out}", flush=True)
    if result["status"] != "ok" and not sweep:
        sys.exit(1)
