"""harness: an experiment-sweep benchmarking harness for pipeline parallelism."""
