"""`python -m harness.report [SWEEP_DIR] [--runs runs] [--out reports] [--copy-as NAME]`: the
newest sweep under runs/ by default, into reports/<sweep name>/."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from harness.report.build import build_report
from harness.report.load import load_sweep, newest_sweep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__)
    ap.add_argument("sweep", nargs="?", type=Path, help="sweep directory (default: newest under --runs)")
    ap.add_argument("--runs", type=Path, default=Path("runs"), help="where Hydra writes runs")
    ap.add_argument("--out", type=Path, default=Path("reports"), help="reports/<sweep name>/ goes here")
    ap.add_argument("--copy-as", help="also copy the report to <--out>/COPY_AS/, replacing it (make sweep: example)")
    args = ap.parse_args(argv)
    try:
        path = args.sweep or newest_sweep(args.runs)
        if not path.is_dir():
            raise FileNotFoundError(f"sweep directory {path} does not exist")
    except FileNotFoundError as e:
        print(f"harness.report: error: {e}", file=sys.stderr)
        return 2
    sweep = load_sweep(path)
    index = build_report(sweep, args.out / sweep.name)
    if args.copy_as:
        copy = args.out / args.copy_as
        shutil.rmtree(copy, ignore_errors=True)  # replaced whole, never merged with an older report
        shutil.copytree(index.parent, copy)
    print(f"harness.report: {len(sweep.runs)} runs ({len(sweep.corrupt)} corrupt) -> {index} "
          f"and {index.with_suffix('.html').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
