"""Hydra config package (read through pkg://conf)."""
