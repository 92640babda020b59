"""A torchtitan config registry for tests/test_export.py: `--module tests.torchtitan_registry
--config harness_export` makes torchtitan's own ConfigManager parse an exported command line.

torchtitan's Trainer.Config cannot be imported without its training stack (datasets, torchdata,
triton via its models), so this container holds the three sections the export writes, under
Trainer.Config's own field names and with its own types: TrainingConfig and ParallelismConfig
(torchtitan/config/configs.py) and the activation-checkpointing union of tyro subcommands
(torchtitan/distributed/activation_checkpoint.py). test_export checks those names and types
against torchtitan/trainer.py's source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC


@dataclass(kw_only=True, slots=True)
class ExportedSections:
    hf_assets_path: str = "."  # ConfigManager checks that it exists
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)


def harness_export() -> ExportedSections:
    return ExportedSections()
