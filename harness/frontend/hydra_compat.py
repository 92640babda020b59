"""Every private Hydra API the harness uses, in one place, behind a version guard (as
compat.py does for torch's).

The sweeper (harness/frontend/sweeper.py) composes a sweep point by copying a composed config and
setting the values that differ, as composition itself sets them, and subclasses Hydra's basic
sweeper; Hydra exposes no public hook for either. A Hydra outside TESTED_HYDRA is refused when
a sweep starts, unless HARNESS_ALLOW_UNTESTED_HYDRA=1 says to try anyway.
"""

from __future__ import annotations

import os

import hydra
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname  # noqa: F401
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # noqa: F401

TESTED_HYDRA = ("1.3",)  # major.minor releases the private uses were checked on
ALLOW_ENV = "HARNESS_ALLOW_UNTESTED_HYDRA"


def untested_hydra() -> str | None:
    """One line saying why this Hydra is refused for the sweeper's private uses, or None."""
    version = ".".join(hydra.__version__.split(".")[:2])
    if version in TESTED_HYDRA or os.environ.get(ALLOW_ENV) == "1":
        return None
    return (f"hydra-core {hydra.__version__}: untested with the harness sweeper's uses of Hydra internals (tested: "
            f"{', '.join(TESTED_HYDRA)}; set {ALLOW_ENV}=1 to try anyway, or hydra/sweeper=basic)")


def runs_jobs_here(launcher: object) -> bool:
    """Whether `launcher` is Hydra's basic launcher (its jobs run in this process). Looked up
    now: Hydra's plugin scan re-executes hydra._internal.core_plugins, rebinding the class."""
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    return isinstance(launcher, BasicLauncher)


def apply_overrides(overrides: list, cfg) -> None:
    """Set parsed value overrides on a composed config as composition sets them."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)
