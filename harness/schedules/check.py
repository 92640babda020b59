"""Check that a schedule runs under a backend's point-to-point rules (p2p.py), before any run.

    python -m harness.schedules.check --schedule 1f1b --pp 2 --microbatches 2 --p2p eager --backend nccl
    python -m harness.schedules.check --csv zbv.csv --p2p safe --backend nccl [--dp 2] [--single-tag]

Prints "ok: ..." and exits 0; or the one-line reason and the per-rank grid, exit 1; bad
arguments (or a schedule that does not build or parse) exit 2 with one line.
"""

from __future__ import annotations

import sys

from harness.frontend.args import OneLineParser
from harness.schedules import p2p
from harness.schedules.registry import built_in, build, requirements
from harness.schedules.csv_io import read_csv
from harness.schedules.validate import ScheduleError


class _BadArgs(Exception):
    pass


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m harness.schedules.check", description=__doc__.splitlines()[0],
                      raises=_BadArgs)  # one line, and no SystemExit from main()
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--schedule", choices=sorted(built_in()), help="a built-in schedule")
    src.add_argument("--csv", help="a compute_only schedule CSV (row r: rank r's actions)")
    p.add_argument("--pp", type=int, help="pipeline ranks N (required with --schedule; a CSV's rows by default)")
    p.add_argument("--microbatches", type=int, help="microbatches M per step (with --schedule)")
    p.add_argument("--virtual-stages", type=int, default=1, help="chunks per rank V (interleaved_1f1b)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    p.add_argument("--p2p", choices=p2p.TRANSPORTS, default="safe", help="transport (default: safe)")
    p.add_argument("--backend", choices=p2p.BACKENDS, default="nccl", help="matching rules (default: nccl)")
    p.add_argument("--single-tag", action="store_true", help="send every message with tag 0")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        a = _parser().parse_args(argv)
        if a.dp < 1:
            raise _BadArgs(f"--dp={a.dp}: needs at least 1")
        if a.schedule:
            if a.pp is None or a.microbatches is None:
                raise _BadArgs("--schedule needs --pp and --microbatches")
            if (why := requirements(a.schedule, a.pp, a.microbatches, a.virtual_stages)) is not None:
                raise _BadArgs(why)
            schedule = build(a.schedule, a.pp, a.microbatches, a.virtual_stages)
            chunks = f" V={a.virtual_stages}" if a.virtual_stages > 1 else ""
            what = f"{a.schedule} pp={a.pp} M={a.microbatches}{chunks}"
        else:
            try:
                schedule = read_csv(a.csv)
            except OSError as e:
                raise _BadArgs(f"--csv {a.csv}: {e.strerror or e}") from None
            except ScheduleError as e:
                raise _BadArgs(str(e).splitlines()[0]) from None
            rows = max(schedule, default=-1) + 1
            if a.pp is not None and a.pp < rows:
                raise _BadArgs(f"--pp={a.pp}: {a.csv} has {rows} rows (one per rank)")
            a.pp = rows if a.pp is None else a.pp
            if a.pp < 1:
                raise _BadArgs(f"--csv {a.csv}: no rows")
            what = f"{a.csv} pp={a.pp}"
    except _BadArgs as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        p2p.check(schedule, a.p2p, a.backend, a.pp, a.dp, a.single_tag)
    except (p2p.P2PError, ScheduleError) as e:
        print(e)
        return 1
    n = len(p2p.channels(schedule, a.p2p, a.pp, a.dp))
    print(f"ok: {what} dp={a.dp} runs under {a.backend} with p2p={a.p2p}"
          + (" and one tag" if a.single_tag else "") + f" ({n} channels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
