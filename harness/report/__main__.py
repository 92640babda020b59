"""`python -m harness.report [SWEEP_DIR] [--runs runs] [--out reports] [--copy-as NAME]`: the
newest sweep under runs/ by default, into reports/<sweep name>/."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

from harness.frontend.args import OneLineParser
from harness.records.atomic import UnsafeTarget
from harness.records.outputs import out_problem
from harness.records.record import RESULT
from harness.report.build import build_report, shown_path
from harness.report.load import load_sweep, newest_sweep, status_of
from harness.records.safe_io import read_text

NAME = re.compile(r"[A-Za-z0-9._-]+")


class Refused(Exception):
    """A command line that would write outside the report's own folders; str() is one line."""


MARKER = ".harness-copy.json"  # in a --copy-as folder: {"written_by", "source", "files": [what it wrote]}


def copy_target(out: Path, name: str, report: Path) -> Path:
    """<out>/NAME for --copy-as, where NAME is a plain folder name and what is there now (if
    anything) is an earlier copy: a folder holding --copy-as's MARKER, the only folder the copy
    may write into (and only what its marker lists may it delete)."""
    if not NAME.fullmatch(name) or name in (".", ".."):
        raise Refused(f"--copy-as {name!r}: not a plain folder name (letters, digits, '-', '_', '.'; "
                      "not '.' or '..'); the copy goes to <--out>/NAME only")
    target = out / name
    if target.resolve() == report.resolve():
        raise Refused(f"--copy-as {name}: {target} is the report itself")
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise Refused(f"--copy-as {name}: {target} exists and is not a folder; not replaced")
    if target.is_dir() and not (target / MARKER).is_file():
        raise Refused(f"--copy-as {name}: {target} exists and was not written by --copy-as (no {MARKER} listing "
                      "what it wrote); not replaced")
    return target


def _files(folder: Path) -> list[str]:
    """Every file under folder (links not followed), as relative POSIX paths, sorted."""
    out = []
    for d, dirs, files in os.walk(folder):
        dirs.sort()
        out += [(Path(d) / f).relative_to(folder).as_posix() for f in files]
    return sorted(out)


def _entries(folder: Path) -> tuple[list[str], list[str]]:
    """(every entry under folder that is not a directory: files, links of any kind, FIFOs;
    every directory, empty ones included), relative POSIX paths, sorted; no link followed."""
    leaves, dirs = [], []
    for d, subdirs, files in os.walk(folder):  # a link to a directory is listed in subdirs, not entered
        here = Path(d)
        for name in subdirs:
            rel = (here / name).relative_to(folder).as_posix()
            (leaves if (here / name).is_symlink() else dirs).append(rel)
        leaves += [(here / f).relative_to(folder).as_posix() for f in files]
    return sorted(leaves), sorted(dirs)


def _written(target: Path) -> list[str]:
    """What the marker says --copy-as wrote into target: plain relative paths inside it only."""
    try:
        data = json.loads(read_text(target / MARKER, "--copy-as", "result"))
        files = data["files"]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ValueError("files: not a list of paths")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refused(f"--copy-as {target.name}: {target / MARKER} unreadable ({type(e).__name__}: {e}); "
                      "not replaced") from None
    return [f for f in files if f and not Path(f).is_absolute() and ".." not in Path(f).parts and f != MARKER]


def _through_link(target: Path, f: str) -> bool:
    """Whether target/f's folders below target include a link (a path that leads elsewhere)."""
    p = target
    for part in Path(f).parts[:-1]:
        p = p / part
        if p.is_symlink():
            return True
    return False


def _copy_file(src: Path, dst: Path) -> None:
    """One file of the report into the new copy (a test injects a full disk here)."""
    shutil.copy2(src, dst, follow_symlinks=False)


def _carry(src: Path, dst: Path) -> None:
    """A file of the user's in the old copy, into the new one as it is: hard-linked (no byte
    written), a link recreated as a link, else copied."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        _copy_file(src, dst)


def replace_copy(report: Path, target: Path) -> list[str]:
    """The report copied into target, replacing what an earlier copy wrote there (its marker's
    list) and nothing else; returns the files kept (not written by --copy-as). Refused (one
    line) where the copy would overwrite a file the harness did not write.

    The new copy is written beside the old one, into a fresh directory in the same parent (the
    report's files, the user's files the old copy held, then the marker), and swapped in by
    renames: the old copy to a fresh name, the new one to target; the old one is then removed
    by its identity (records/scratch.py). A failure at any byte before the swap (a full disk)
    leaves the old copy and its marker as they were, and no temporary directory behind."""
    new = _files(report)
    existed = os.path.lexists(target)
    old = set(_written(target)) if existed else set()
    leaves, dirs = _entries(target) if existed else ([], [])
    kept = [f for f in leaves if f not in old and f != MARKER]
    clash = [f for f in new if _through_link(target, f) or f not in old and (
        (target / f).exists() or (target / f).is_symlink())]
    if clash:
        raise Refused(f"--copy-as {target.name}: {target / clash[0]} was not written by --copy-as and the copy would "
                      f"replace it ({len(clash)} such file(s)); not replaced")
    from harness.records.atomic import write_json_atomic
    from harness.records.scratch import Scratch, identity, remove_dir

    fresh = Scratch(prefix=f".{target.name}.new-", dir=target.parent)
    try:
        os.chmod(fresh.path, stat.S_IMODE(os.stat(target if existed else report).st_mode))  # not mkdtemp's 0700
        for d in dirs:
            if not any(f.startswith(d + "/") for f in old):  # the user's folders (empty ones too)
                (fresh.path / d).mkdir(parents=True, exist_ok=True)
        for f in new:
            (fresh.path / f).parent.mkdir(parents=True, exist_ok=True)
            _copy_file(report / f, fresh.path / f)
        for f in kept:
            (fresh.path / f).parent.mkdir(parents=True, exist_ok=True)
            _carry(target / f, fresh.path / f)
        write_json_atomic(fresh.path / MARKER, {"written_by": "python -m harness.report --copy-as",
                                                "source": shown_path(report), "files": new})
        fresh.unmark()  # the copy holds what the report and the user put there, nothing of the scratch's
        if not existed:
            os.rename(fresh.path, target)
            return kept
        before = identity(target)
        aside = Scratch(prefix=f".{target.name}.old-", dir=target.parent)  # a directory to rename over
        try:
            aside.unmark()  # empty: rename replaces only an empty directory
            os.rename(target, aside.path)
        except BaseException:
            aside.remove()
            raise
        try:
            os.rename(fresh.path, target)
        except BaseException:
            os.rename(aside.path, target)  # the old copy back where it was
            raise
    except BaseException:
        fresh.remove()
        raise
    remove_dir(aside.path, before)  # the old copy, which this process moved there, and nothing else
    return kept


SWEEP_ALLOWED = "allowed: a sweep or run directory python -m harness wrote, with result.json files"
LOOK = 2_000  # entries sweep_problem looks at: enough to meet a job directory, never a walk of a whole disk


def sweep_problem(path: Path) -> str | None:
    """Why `path` is no sweep to report (one line), or None: it must be a directory (a link to
    one is fine) holding result.json, Hydra's .hydra/ or a sweep's files, itself or in a
    directory within two levels below it. Looks at most LOOK entries (so `/` or `/usr` is
    refused in milliseconds, never walked) and opens no file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"sweep={path}: no such directory ({SWEEP_ALLOWED})"
    except OSError as e:
        return f"sweep={path}: cannot read it ({e.strerror or type(e).__name__}) ({SWEEP_ALLOWED})"
    if not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a directory"
        return f"sweep={path}: not a directory ({kind}) ({SWEEP_ALLOWED})"
    if not path.resolve().name:
        return f"sweep={path}: the file system's root is no sweep ({SWEEP_ALLOWED})"
    marks = {RESULT, ".hydra", "sweep.json", "multirun.yaml"}
    seen, level = 0, [Path(path)]
    for _ in range(3):  # the directory, its children, their children
        below = []
        for d in level:
            try:
                with os.scandir(d) as entries:
                    for e in entries:
                        seen += 1
                        if e.name in marks or e.name.startswith("multirun.") and e.name.endswith(".yaml"):
                            return None
                        if e.is_dir(follow_symlinks=False):
                            below.append(Path(e.path))
                        if seen >= LOOK:
                            break
            except OSError:
                continue
            if seen >= LOOK:
                break
        level = below
    return (f"sweep={path}: not a sweep (no {RESULT}, .hydra/ or sweep.json in it or two levels below"
            f"{', of the first ' + format(LOOK, ',') + ' entries' if seen >= LOOK else ''}) ({SWEEP_ALLOWED})")


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m harness.report", description=__doc__,
                       allowed="python -m harness.report [SWEEP_DIR] [--runs DIR] [--out DIR] [--copy-as NAME]")
    ap.add_argument("sweep", nargs="?", type=Path, help="sweep directory (default: newest under --runs)")
    ap.add_argument("--runs", type=Path, default=Path("runs"), help="where Hydra writes runs")
    ap.add_argument("--out", type=Path, default=Path("reports"), help="reports/<sweep name>/ goes here")
    ap.add_argument("--copy-as", metavar="NAME",
                    help=f"also copy the report to <--out>/NAME/ (a plain folder name), replacing what an earlier "
                         f"copy wrote there (listed in its {MARKER}) and nothing else (make sweep: example)")
    args = ap.parse_args(argv)
    try:
        path = args.sweep or newest_sweep(args.runs)
        if why := sweep_problem(path):
            raise Refused(why)
        if why := out_problem(args.out, f"--out={args.out}", "dir"):
            raise Refused(why)
        report = args.out / path.resolve().name
        copy = None if args.copy_as is None else copy_target(args.out, args.copy_as, report)
        try:  # where the report goes, made now: a --out that cannot hold it is said before any work
            report.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise Refused(f"--out={args.out}: cannot create {report} ({e.strerror or type(e).__name__}) (allowed: "
                          "a directory this user can write, or one that can be created)") from None
    except (FileNotFoundError, Refused) as e:
        print(f"harness.report: error: {e}", file=sys.stderr)
        return 2
    sweep = load_sweep(path)
    try:
        index = build_report(sweep, report)
    except UnsafeTarget as e:  # a link or a FIFO where the report writes (runs.csv, index.md, a figure): not followed
        print(f"harness.report: error: --out={args.out}: {e}", file=sys.stderr)
        return 2
    if copy is not None:
        try:
            copy = copy_target(args.out, args.copy_as, report)  # again: the report took a while
            kept = replace_copy(index.parent, copy)  # what an earlier copy wrote is replaced, nothing else
            if kept:
                print(f"harness.report: --copy-as {args.copy_as}: kept {len(kept)} file(s) it did not write: "
                      f"{', '.join(kept[:5])}{' ...' if len(kept) > 5 else ''}")
        except Refused as e:
            print(f"harness.report: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:  # the old copy and its marker stand (replace_copy)
            print(f"harness.report: error: --copy-as {args.copy_as}: {type(e).__name__}: {e}; the earlier copy is "
                  "unchanged", file=sys.stderr)
            return 1
    missing = sum(status_of(why) == "missing" for _, why in sweep.corrupt)
    older = f", {len(sweep.superseded)} superseded" if sweep.superseded else ""
    print(f"harness.report: {len(sweep.runs)} runs ({len(sweep.corrupt) - missing} corrupt, {missing} missing{older}) "
          f"-> {index} and {index.with_suffix('.html').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
