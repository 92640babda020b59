"""Pure schedules: the Action IR, one builder per schedule, validation."""
