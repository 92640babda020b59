"""Registers harness's submitit launchers with Hydra (plugins must live under hydra_plugins; the
code is harness/runtime/cluster.py): hydra/launcher=submitit_local, submitit_slurm and slurm."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from harness.runtime import cluster  # the module, not its classes: Hydra lists every class found here


class HarnessLocalLauncher(cluster.LocalLauncher):
    """hydra/launcher=submitit_local: one job at a time on this machine (array_parallelism)."""


class HarnessSlurmLauncher(cluster.SlurmLauncher):
    """hydra/launcher=slurm (and submitit_slurm): each point its own allocation, sized to its pp x dp."""


class HarnessLauncherConfigs(SearchPathPlugin):
    """Adds no path: Hydra calls it after its plugin scan and before composing, which is when
    harness's launcher configs can replace the plugin's under their names (`register_configs`)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        cluster.register_configs()
