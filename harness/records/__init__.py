"""Records and safe file I/O: result.json, its writer, locks, bounded reads, wandb, Gantt charts."""
