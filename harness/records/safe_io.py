"""Reading a file that a user or a record names: a regular file only, never more than a cap.

Every path the harness reads from a config key (`profile=`, `schedule.csv_path=`,
`model.target=path/file.py:fn`), a command-line argument (harness.advise, harness.export,
harness.report) or a record (a job's trace.json and gantt.png) goes through here, so that a
device (/dev/zero never ends), a FIFO (opening one blocks until a writer comes), a directory,
or a symlink to any of them, is refused without reading it, and a regular file is read up to
its kind's cap and no further (a sparse 8 GB file is refused by its size, before a byte is
read). Imports nothing of the harness (the bottom of the import graph, beside config.py).

A refusal is FileRefused, one line: "<key>=<path>: <why> (allowed: a regular file up to N MiB)".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MiB = 2**20

# Bytes a file of each kind may have, with room over anything the harness writes or reads sensibly.
CAPS: dict[str, int] = {
    # a per-layer profile JSON: ~150 bytes per layer and microbatch size (the committed GPT-2 profile,
    # 14 layers x 3 sizes, is 14 KB): 64 MiB is ~100,000 layers at 4 sizes
    "profile": 64 * MiB,
    # a schedule CSV holds at most config.MAX_ACTIONS (1,000,000) cells of a few bytes ("31F4095,")
    "schedule_csv": 16 * MiB,
    # a custom model's source file: examples/my_model.py is 4 KB
    "model": 4 * MiB,
    # trace.json is written with at most trace_json.MAX_TRACE_EVENTS (200,000) events, plus step slices and
    # flows: ~70 MB at most (131,072 events with their flows measured 44 MiB)
    "trace": 256 * MiB,
    # gantt.png: a figure of a bounded size, flat colour (tens of KB to a few MB)
    "gantt": 64 * MiB,
    # result.json (harness.records.result.read's own cap) and advice.json (a few KB per point)
    "result": 64 * MiB,
    "advice": 64 * MiB,
}

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class FileRefused(ValueError):
    """A file that is not read; str() is one line naming the key, the path, why and what is
    allowed; `reason` the same without "<key>=<path>: " (for a caller that names the key itself)."""

    def __init__(self, key: str, path: str | Path, reason: str):
        super().__init__(f"{key}={path}: {reason}")
        self.key, self.path, self.reason = key, str(path), reason


def allowed(kind: str) -> str:
    cap = CAPS[kind]
    size = f"{cap // MiB} MiB" if cap % MiB == 0 else f"{cap:,} bytes"
    return f"allowed: a regular file up to {size}"


def _refuse(key: str, path: str | Path, why: str, kind: str) -> FileRefused:
    return FileRefused(key, path, f"{why} ({allowed(kind)})")


def _what(mode: int) -> str:
    return next((k for test, k in _KINDS if test(mode)), f"mode {stat.filemode(mode)}")


def _regular(st: os.stat_result, key: str, path: str | Path, kind: str, link: bool) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(key, path, f"not a regular file ({'a symlink to ' if link else ''}{_what(st.st_mode)})", kind)
    if st.st_size > CAPS[kind]:
        raise _refuse(key, path, f"{st.st_size:,} bytes, more than {CAPS[kind]:,}", kind)


def check(path: str | Path, key: str, kind: str) -> os.stat_result:
    """The file's stat (symlinks followed) if it is a regular file within its kind's cap; else
    FileRefused. Opens nothing (a FIFO is never opened, so never blocks)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _refuse(key, path, "no such file", kind) from None
    except OSError as e:
        raise _refuse(key, path, f"cannot read it ({e.strerror or type(e).__name__})", kind) from None
    _regular(st, key, path, kind, os.path.islink(path))
    return st


def read_bytes(path: str | Path, key: str, kind: str) -> bytes:
    """The file's bytes, read at most up to its kind's cap + 1: a regular file only (checked
    before opening, and again on the open descriptor: a FIFO swapped in between opens without
    blocking, O_NONBLOCK, and is refused unread). FileRefused otherwise."""
    check(path, key, kind)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _refuse(key, path, f"cannot read it ({e.strerror or type(e).__name__})", kind) from None
    try:
        with os.fdopen(fd, "rb") as f:
            _regular(os.fstat(f.fileno()), key, path, kind, os.path.islink(path))
            raw = f.read(CAPS[kind] + 1)
    except OSError as e:
        raise _refuse(key, path, f"cannot read it ({e.strerror or type(e).__name__})", kind) from None
    if len(raw) > CAPS[kind]:  # it grew since the stat
        raise _refuse(key, path, f"more than {CAPS[kind]:,} bytes", kind)
    return raw


def read_text(path: str | Path, key: str, kind: str) -> str:
    """read_bytes decoded as UTF-8 (a byte order mark, which some editors write, is dropped);
    FileRefused naming the first byte that is not UTF-8."""
    raw = read_bytes(path, key, kind)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FileRefused(key, path, f"not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x}) (allowed: UTF-8 "
                                     "text, with a byte order mark or without)") from None


def copy(src: str | Path, dst: str | Path, key: str, kind: str) -> None:
    """src's bytes (read_bytes: a regular file within its cap) written to dst atomically
    (harness/records/atomic.py: never through a link at dst)."""
    from harness.records.atomic import write_bytes

    write_bytes(dst, read_bytes(src, key, kind))
