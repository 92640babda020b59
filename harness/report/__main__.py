"""`python -m harness.report [SWEEP_DIR] [--runs runs] [--out reports] [--copy-as NAME]`: the
newest sweep under runs/ by default, into reports/<sweep name>/."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from harness.report.build import build_report
from harness.report.load import load_sweep, newest_sweep, status_of

NAME = re.compile(r"[A-Za-z0-9._-]+")


class Refused(Exception):
    """A command line that would write outside the report's own folders; str() is one line."""


def copy_target(out: Path, name: str, report: Path) -> Path:
    """<out>/NAME for --copy-as, where NAME is a plain folder name and what is there now (if
    anything) is an earlier report copy: the only folder the copy may replace."""
    if not NAME.fullmatch(name) or name in (".", ".."):
        raise Refused(f"--copy-as {name!r}: not a plain folder name (letters, digits, '-', '_', '.'; "
                      "not '.' or '..'); the copy goes to <--out>/NAME only")
    target = out / name
    if target.resolve() == report.resolve():
        raise Refused(f"--copy-as {name}: {target} is the report itself")
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise Refused(f"--copy-as {name}: {target} exists and is not a folder; not replaced")
    if target.is_dir() and not (target / "index.md").is_file():
        raise Refused(f"--copy-as {name}: {target} exists and is not a report (no index.md); not replaced")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__)
    ap.add_argument("sweep", nargs="?", type=Path, help="sweep directory (default: newest under --runs)")
    ap.add_argument("--runs", type=Path, default=Path("runs"), help="where Hydra writes runs")
    ap.add_argument("--out", type=Path, default=Path("reports"), help="reports/<sweep name>/ goes here")
    ap.add_argument("--copy-as", metavar="NAME",
                    help="also copy the report to <--out>/NAME/ (a plain folder name), replacing an earlier "
                         "report copy there and nothing else (make sweep: example)")
    args = ap.parse_args(argv)
    try:
        path = args.sweep or newest_sweep(args.runs)
        if not path.is_dir():
            raise FileNotFoundError(f"sweep directory {path} does not exist")
        if not path.resolve().name:
            raise Refused(f"sweep directory {path}: the file system's root is no sweep")
        report = args.out / path.resolve().name
        copy = None if args.copy_as is None else copy_target(args.out, args.copy_as, report)
    except (FileNotFoundError, Refused) as e:
        print(f"harness.report: error: {e}", file=sys.stderr)
        return 2
    sweep = load_sweep(path)
    index = build_report(sweep, report)
    if copy is not None:
        try:
            copy = copy_target(args.out, args.copy_as, report)  # again: the report took a while
            if copy.exists():
                shutil.rmtree(copy)  # replaced whole, never merged with an older report
            shutil.copytree(index.parent, copy)
        except Refused as e:
            print(f"harness.report: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"harness.report: error: --copy-as {args.copy_as}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    missing = sum(status_of(why) == "missing" for _, why in sweep.corrupt)
    print(f"harness.report: {len(sweep.runs)} runs ({len(sweep.corrupt) - missing} corrupt, {missing} missing) "
          f"-> {index} and {index.with_suffix('.html').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
