"""Aggregate a sweep's result.json records into reports/<sweep>/ (tables and figures)."""
