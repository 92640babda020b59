"""Hydra config package (read through pkg://harness.conf): the schema is harness/config.py."""
