"""The Hydra front end: `python -m harness`, its sweeper, callbacks and composition."""
