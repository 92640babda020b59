"""What a run measured: events, executions, metrics, intervals, the single-process reference."""
