"""A torchtitan config registry for tests/test_export.py: `--module tests.torchtitan_registry
--config harness_export` makes torchtitan's own ConfigManager parse an exported command line.

torchtitan's Trainer.Config cannot be imported without its training stack (datasets, torchdata,
triton via its models), so this container holds the sections the export writes, under
Trainer.Config's own field names and with its own types: TrainingConfig and ParallelismConfig
(torchtitan/config/configs.py), the activation-checkpointing union of tyro subcommands
(torchtitan/distributed/activation_checkpoint.py), the learning-rate schedule, checkpointing,
metrics and llama3's dataloader (HuggingFaceTextDataLoader, what its config registry sets).
test_export checks those names and types against torchtitan/trainer.py's source.

The metrics and dataloader modules import tensorboard, torchdata and datasets at the top for
what they run, not for their configs: where those are not installed, empty stand-ins are in
sys.modules only while those modules are imported.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass, field

from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC


def _import_with_stand_ins():
    """torchtitan's metrics and dataloader modules, with stand-ins for their run-time imports."""
    placeholder = type("StandIn", (), {"__init__": lambda self, *a, **k: None})
    # module -> (the package it needs, the names imported from it)
    names = {"torch.utils.tensorboard": ("tensorboard", ["SummaryWriter"]), "torchdata": ("torchdata", []),
             "torchdata.stateful_dataloader": ("torchdata", ["StatefulDataLoader"]),
             "datasets": ("datasets", ["Dataset", "IterableDataset", "load_dataset"]),
             "datasets.distributed": ("datasets", ["split_dataset_by_node"])}
    missing = {package for package, _ in names.values() if importlib.util.find_spec(package) is None}
    added = []
    for name, (package, attrs) in names.items():
        if package not in missing or name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__path__ = []
        for attr in attrs:
            setattr(module, attr, placeholder)
        sys.modules[name] = module
        added.append(name)
    try:
        from torchtitan.components.checkpointer import CheckpointManager
        from torchtitan.components.metrics import MetricsProcessor
        from torchtitan.components.optimizer import LRSchedulersContainer
        from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    finally:
        for name in added:
            del sys.modules[name]
    return CheckpointManager, MetricsProcessor, LRSchedulersContainer, HuggingFaceTextDataLoader


CheckpointManager, MetricsProcessor, LRSchedulersContainer, HuggingFaceTextDataLoader = _import_with_stand_ins()


@dataclass(kw_only=True, slots=True)
class ExportedSections:
    hf_assets_path: str = "."  # ConfigManager checks that it exists
    dump_folder: str = "./outputs"
    metrics: MetricsProcessor.Config = field(default_factory=MetricsProcessor.Config)
    dataloader: HuggingFaceTextDataLoader.Config = field(default_factory=HuggingFaceTextDataLoader.Config)
    lr_scheduler: LRSchedulersContainer.Config = field(default_factory=LRSchedulersContainer.Config)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    checkpoint: CheckpointManager.Config = field(default_factory=CheckpointManager.Config)
    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)


def harness_export() -> ExportedSections:
    return ExportedSections()
