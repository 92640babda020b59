"""Schedules as data (ir.py), their registry (registry.py) and the built-ins, which register
themselves when imported here, in the order the report lists them: builders.py, v_shape.py,
auto.py (schedule=zb_auto, generated for the run's costs), csv_io.py (schedule=csv)."""

from harness.schedules import builders  # noqa: F401, I001 - each registers its schedules
from harness.schedules import v_shape  # noqa: F401
from harness.schedules import auto  # noqa: F401
from harness.schedules import csv_io  # noqa: F401
