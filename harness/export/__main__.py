"""python -m harness.export --to torchtitan|megatron <run dir | result.json | advice.json[#RANK]> [--out FILE] [--nearest]

Writes the script to FILE (else stdout). Where torchtitan needs the schedule as torch's CSV, it
is written beside FILE as <FILE's stem>.schedule.csv (else into the current directory, its path
printed on stderr) and the script names it by its absolute path. A point the tool cannot run as
it is (another schedule, placement, dtype, optimizer or split) is refused in one line, exit 2,
nothing written: what the script would run is not what was measured or predicted. `--nearest`
writes the nearest the tool can run instead, each difference a CANNOT EXPRESS line of the
header, also printed on stderr. Bad input: one line naming the key, the value and what is
allowed, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.frontend.args import OneLineParser
from harness.export import megatron, torchtitan
from harness.records.atomic import write_text
from harness.export.point import ExportError, Recipe, load
from harness.export.script import CANNOT, Script
from harness.records.outputs import out_problem

TOOLS = ("torchtitan", "megatron")
PROG = "python -m harness.export"


def csv_path(p: Recipe, out: Path | None) -> Path:
    """Where torchtitan's schedule CSV goes: beside --out, else the current directory."""
    if out is not None:
        return out.with_name(out.stem + ".schedule.csv")
    v = f"_v{p.point.virtual_stages}" if p.point.virtual_stages > 1 else ""
    return Path(f"torchtitan_{p.point.schedule}_pp{p.point.pp}_m{p.point.microbatches}{v}.schedule.csv")


def export(tool: str | None, source: str, out: Path | None) -> tuple[Script, str | None, Path]:
    """The script, the CSV it needs (or None) and where that CSV goes."""
    if tool is None:
        raise ExportError(f"--to: required (allowed: {', '.join(TOOLS)})")
    if tool not in TOOLS:
        raise ExportError(f"--to={tool}: unknown (allowed: {', '.join(TOOLS)})")
    p = load(source)
    where = csv_path(p, out)
    if tool == "megatron":
        return megatron.render(p), None, where
    done = torchtitan.render(p, str(where.resolve()))
    return done.script, done.csv, where


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=(__doc__ or "").splitlines()[0],
                           allowed=f"{PROG} --to {'|'.join(TOOLS)} SOURCE [--out FILE]", raises=ExportError)
    parser.add_argument("--to", help=f"the tool: {', '.join(TOOLS)} (required)")
    parser.add_argument("source", help="a run directory (or its result.json), or advice.json[#RANK] (default rank 1)")
    parser.add_argument("--out", type=Path, help="write the script here (default: stdout)")
    parser.add_argument("--nearest", action="store_true",
                        help="where the tool cannot run the point as it is, write the nearest it can (each "
                             "difference a CANNOT EXPRESS line) rather than refuse")
    try:
        a = parser.parse_args(argv)
        if a.out is not None and (a.out.is_dir() or a.out.exists() and not a.out.is_file()):
            raise ExportError(f"--out={a.out}: exists and is not a regular file (allowed: a file path for the "
                              "script, new or to replace)")
        if a.out is not None and (why := out_problem(a.out, f"--out={a.out}")):
            raise ExportError(why)
        script, csv, where = export(a.to, a.source, a.out)
        if script.cannot and not a.nearest:
            more = f" (and {len(script.cannot) - 1} more)" if len(script.cannot) > 1 else ""
            first = script.cannot[0].replace(": below, ", ", nearest: ").replace("; below: ", "; nearest: ")
            raise ExportError(f"{first}{more}: --to {a.to} cannot run this point as it is, so nothing "
                              "was written (allowed: --nearest, to write the nearest it can run, each difference "
                              "said)")
        text = script.text()
        try:
            if csv is not None:
                write_text(where, csv)
            if a.out is not None:
                write_text(a.out, text)
        except OSError as e:
            raise ExportError(f"--out={a.out}: cannot write ({e.strerror or e})") from None
    except (ExportError, ValueError, KeyError) as e:  # a registry's KeyError/ValueError is one line too
        print(f"harness.export: {str(e).strip(chr(39))}", file=sys.stderr)
        return 2
    if a.out is None:
        sys.stdout.write(text)
        sys.stdout.flush()  # the script before the lines on stderr about it
    else:
        print(f"harness.export: wrote {a.out}", file=sys.stderr)
    if csv is not None:
        print(f"harness.export: wrote the schedule's CSV to {where}", file=sys.stderr)
    for line in script.cannot:
        print(f"harness.export: {CANNOT}{line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
