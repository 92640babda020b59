"""What the harness assumes of Hydra beyond its public API, in one place, behind a version
guard (as runtime/compat.py does for torch's); tests/test_hydra_compat.py fails when a Hydra
release changes any of it.

No private module is imported: the sweeper is built on hydra.plugins.sweeper.Sweeper,
hydra.core (Plugins, the override parser, the ConfigLoader interface) and OmegaConf. What is
left is Hydra's basic launcher, known by name: whether a sweep's jobs run in this process
(each then under its directory's lock, on one pool of rank processes), and the logger that
says "Launching N jobs locally" before each batch. The sweeper's cheap composition copies what
composition does for a plain value (tests/test_cli.py compares the two). A Hydra outside
TESTED_HYDRA is refused when a sweep starts, unless HARNESS_ALLOW_UNTESTED_HYDRA=1 says to try.
"""

from __future__ import annotations

import os

import hydra

TESTED_HYDRA = ("1.3",)  # major.minor releases these assumptions were checked on
ALLOW_ENV = "HARNESS_ALLOW_UNTESTED_HYDRA"
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"  # hydra/launcher=basic's _target_
BASIC_LAUNCHER_LOGGER = BASIC_LAUNCHER.rpartition(".")[0]  # its module's logger


def untested_hydra() -> str | None:
    """One line saying why this Hydra is refused for the sweeper, or None."""
    version = ".".join(hydra.__version__.split(".")[:2])
    if version in TESTED_HYDRA or os.environ.get(ALLOW_ENV) == "1":
        return None
    return (f"hydra-core {hydra.__version__}: untested with the harness sweeper (tested: {', '.join(TESTED_HYDRA)}; "
            f"set {ALLOW_ENV}=1 to try anyway, or hydra/sweeper=basic)")


def runs_jobs_here(launcher: object) -> bool:
    """Whether `launcher` is Hydra's basic launcher (its jobs run in this process). By name:
    Hydra's plugin scan re-imports its core plugins, so a class imported earlier need not be
    the one it instantiated."""
    kind = type(launcher)
    return f"{kind.__module__}.{kind.__qualname__}" == BASIC_LAUNCHER
