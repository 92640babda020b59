"""harness: an experiment-sweep benchmarking harness for pipeline parallelism."""

# the built-in schedules register their entries, and with them their config sections (config.OPTIONS'
# `schedule` group), before any Config is built from a name (torch-free, ~0.1 s)
from harness import schedules  # noqa: F401, E402
