"""Every file the harness writes, written one way: whole or not at all, and never through a link.

`write_atomic(path, writer)` (and `write_text`, `write_bytes`, `write_json_atomic`) writes into a
fresh temporary file in the target's own directory, created with O_CREAT|O_EXCL|O_NOFOLLOW (a
name nobody had: a link planted there is not followed, a file there is not opened), then
flushed, fsync'd and renamed over the target. A reader, or a crash, sees the old file or the
new one, never half of one; a writer that raises leaves the old file and no temporary behind.
Rename replaces a link rather than writing through it, but a target that exists and is not a
regular file (a symlink, a FIFO, a directory, a device) is refused before anything is written
(`UnsafeTarget`, one line): it was put there by someone else, and what it points to is theirs.
`check_target` is that check alone, for files another program writes (Hydra's multirun.yaml and
.hydra/) and for files appended in place (sweep.log) or locked in place (.harness.lock), which
open with `open_in_place` (O_NOFOLLOW|O_NONBLOCK: a link is refused, a FIFO never blocks).

Imports nothing of the harness but jsonsafe (the bottom of the import graph, beside safe_io).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Callable

from harness.records.jsonsafe import strict

_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafeTarget(OSError):
    """A file the harness would write is there already and is not a regular file; str() is one
    line naming the path, what is there and what is allowed. An OSError, so that every writer's
    existing handling of a failed write says it (strerror is the reason alone)."""

    def __init__(self, path: str | Path, what: str) -> None:
        reason = f"{what} is there, not replaced (allowed: a regular file or nothing)"
        super().__init__(reason)
        self.strerror, self.filename = reason, str(path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def kind_of(mode: int) -> str | None:
    """What a file of this st_mode is, in a few words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((k for test, k in _KINDS if test(mode)), f"mode {stat.filemode(mode)}")


def check_target(path: str | Path) -> None:
    """UnsafeTarget if `path` exists and is not a regular file (lstat: a link is not followed,
    nothing is opened, so a FIFO never blocks); nothing there, or a regular file, passes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if (what := kind_of(st.st_mode)) is not None:
        raise UnsafeTarget(path, what)


def check_dir(path: str | Path) -> None:
    """UnsafeTarget if `path` exists and is not a real directory (a symlink to one included):
    a directory the harness names itself (a sweep's job) and writes into."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        what = kind_of(st.st_mode) or "a regular file"
        raise UnsafeTarget(path, what if what != "a symlink" else "a symlink (to a directory or not)")


def open_in_place(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """os.open for a file used where it is (appended to, locked), never through a link and never
    blocking on a FIFO; UnsafeTarget when what is there (or what the open met) is not a regular file."""
    check_target(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC, mode)
    except OSError as e:
        if e.errno == getattr(os, "ELOOP", 40):  # a link swapped in after the check
            raise UnsafeTarget(path, "a symlink") from None
        raise
    st = os.fstat(fd)
    if (what := kind_of(st.st_mode)) is not None:
        os.close(fd)
        raise UnsafeTarget(path, what)
    os.set_blocking(fd, True)
    return fd


def write_atomic(path: str | Path, write: Callable[[IO], object], binary: bool = False) -> None:
    """`write(f)` into a fresh temporary file beside `path`, flushed and fsync'd, then renamed
    over `path` (the module's doc). Text is UTF-8, newlines as written. UnsafeTarget, before
    anything is written, when `path` exists and is not a regular file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_target(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)  # the usual permissions: 0666 less the umask
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text))


def write_bytes(path: str | Path, data: bytes) -> None:
    write_atomic(path, lambda f: f.write(data), binary=True)


def write_json_atomic(path: str | Path, data: object, indent: int | None = 1) -> None:
    """Strict JSON through write_atomic: NaN and Infinity are not JSON, so a non-finite number
    is written as null, and a record (a dict) lists why under `nulls`."""
    reasons: list[str] = []
    data = strict(data, reasons)
    if reasons and isinstance(data, dict):
        data["nulls"] = reasons
    write_atomic(path, lambda f: json.dump(data, f, indent=indent, default=str, allow_nan=False))
