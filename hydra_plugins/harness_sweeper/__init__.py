"""Registers harness's sweeper with Hydra (plugins must live under hydra_plugins; the code is
harness/frontend/sweeper.py). Selected by harness/conf/config.yaml: `override hydra/sweeper: harness`."""

from harness.frontend.sweeper import Sweeper


class HarnessSweeper(Sweeper):
    """hydra/sweeper=harness: every point planned before the first job, cheap composition."""
