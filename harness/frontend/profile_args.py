"""`python -m harness.profile`'s flags: its parser and what they alone must be, torch-free.

harness/profile.py imports torch at its top (it measures layers); run as a module, it asks this
one first, before that import, so a bad flag (or --help) answers in one line without torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.config import MAX_DIM, MAX_WORLD
from harness.frontend.args import OneLineParser
from harness.records.outputs import out_problem

MAX_REPEATS = 10_000  # --warmup, --repeats: timed runs of each layer at each size


def parser(description: str | None = None) -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m harness.profile", description=description,
                       allowed="python -m harness.profile [key=value ...] [--out FILE] [--microbatch-sizes B ...] "
                               "[--blocks K] [--estimate KIND ...]; --help lists them",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="config keys, as for python -m harness")
    ap.add_argument("--out", type=Path, default=Path("profile.json"))
    ap.add_argument("--microbatch-sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=None,
                    help="run only the first K of each group of identical layers, copy the rest (default: run all)")
    ap.add_argument("--estimate", nargs="+", default=[], metavar="KIND",
                    help="layer kinds not run: their times scaled by FLOPs from a measured block (e.g. head)")
    ap.add_argument("--compare", type=int, nargs="*", default=[2, 4, 8], help="pipeline depths to compare")
    return ap


def check_args(args: argparse.Namespace) -> str | None:
    """What the options alone must be (one line naming the option), before anything is built."""
    for b in args.microbatch_sizes:
        if not 1 <= b <= MAX_DIM:
            return f"--microbatch-sizes {b}: samples per microbatch (allowed: integers 1..{MAX_DIM:,})"
    if not 1 <= args.repeats <= MAX_REPEATS:
        return f"--repeats {args.repeats}: timed runs of each layer (allowed: 1..{MAX_REPEATS:,})"
    if not 0 <= args.warmup <= MAX_REPEATS:
        return f"--warmup {args.warmup}: untimed runs first (allowed: 0..{MAX_REPEATS:,})"
    if args.blocks is not None and args.blocks < 1:
        return f"--blocks {args.blocks}: must be >= 1 (or left out: run every layer)"
    for n in args.compare:
        if not 1 <= n <= MAX_WORLD:
            return f"--compare {n}: a pipeline depth (allowed: 1..{MAX_WORLD:,})"
    out = args.out
    if why := out_problem(out, f"--out {out}"):
        return why
    if out.is_dir():
        return f"--out {out}: a directory (allowed: the profile JSON's file path, e.g. {out / 'profile.json'})"
    if out.exists() and not out.is_file() or out.is_symlink() and not out.exists():
        return f"--out {out}: exists and is not a regular file (allowed: a new file, or a profile JSON to replace)"
    return None


def refuse_bad_flags(argv: list[str], description: str | None) -> None:
    """--help, or a bad flag as one line and exit 2; else nothing (main parses them again)."""
    if why := check_args(parser(description).parse_args(argv)):
        print(f"harness.profile: error: {why}", file=sys.stderr)
        sys.exit(2)
