"""The planning core: validation, the plan, theory, memory theory, FLOPs and the compute model."""
