from __future__ import annotations

import pytest

from harness.config import Config


@pytest.fixture
def config():
    """A small, fast job: fp32 mlp, real compute, wandb off. Tests override what they study."""

    def make(**overrides) -> Config:
        c = Config()
        c.wandb.mode = "disabled"
        c.compute = "real"  # tests that study emulated costs say so
        c.model.layers, c.model.hidden = 8, 32
        c.steps, c.warmup_steps = 3, 1
        c.timeout_s = 120
        for key, value in overrides.items():
            target = c
            *path, leaf = key.split(".")
            for part in path:
                target = getattr(target, part)
            setattr(target, leaf, value)
        return c

    return make
