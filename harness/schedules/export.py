"""Write a built-in schedule as PyTorch's compute_only CSV (csv_io.py), after validating it.

    python -m harness.schedules.export zbv --pp 4 --microbatches 8 [--virtual-stages V] [-o zbv.csv]
"""

from __future__ import annotations

import argparse
import sys

from harness.schedules.registry import built_in, build, chunks_per_rank, requirements
from harness.schedules.csv_io import to_csv, write_csv
from harness.schedules.validate import validate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.schedules.export", description=__doc__.splitlines()[0])
    p.add_argument("schedule", choices=sorted(built_in()))
    p.add_argument("--pp", type=int, required=True, help="pipeline ranks N")
    p.add_argument("--microbatches", type=int, required=True, help="microbatches M per step")
    p.add_argument("--virtual-stages", type=int, default=1, help="chunks per rank V (interleaved_1f1b)")
    p.add_argument("-o", "--output", help="CSV file to write (default: stdout)")
    a = p.parse_args(argv)
    if (why := requirements(a.schedule, a.pp, a.microbatches, a.virtual_stages)) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    schedule = build(a.schedule, a.pp, a.microbatches, a.virtual_stages)
    validate(schedule, a.pp * chunks_per_rank(a.schedule, a.virtual_stages), a.microbatches)
    if a.output:
        write_csv(a.output, schedule)
    else:
        sys.stdout.write(to_csv(schedule))
    return 0


if __name__ == "__main__":
    sys.exit(main())
