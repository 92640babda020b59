"""Scratch directories: made by the harness, and removed only if they are still the one it made.

Nothing is deleted on the strength of a name or a prefix (a user's `hydra.run.dir` may start
with any prefix the harness uses). A scratch directory is made by tempfile.mkdtemp (a fresh
name, mode 0700, nobody's before) and remembered by identity: its device and inode, and a
marker file inside it holding a random token this process wrote (an inode number is reused
as soon as a directory is deleted: the token is what no other directory has). `remove`
deletes it only while its path is still that directory (not a link, not a directory someone
put in its place); shutil.rmtree follows no link inside it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path


def identity(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of the directory at `path` (a link not followed), or None where there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def remove_dir(path: str | Path, ident: tuple[int, int] | None) -> bool:
    """Deletes the directory at `path` with everything in it if it is the directory `ident`
    names (identity()); True if it did. A link, or another directory put in its place, stays."""
    if ident is None or identity(path) != ident:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


MARK = ".harness-scratch"  # in a scratch directory: the token that says it is this process's


def _token(path: Path) -> str | None:
    """The token in path/MARK: a regular file (no link followed, no FIFO opened), else None."""
    try:
        fd = os.open(path / MARK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        return os.read(fd, 64).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


class Scratch:
    """A directory made now (tempfile.mkdtemp with `prefix`, in `dir` or the system's temporary
    directory), removed by `remove` only if it is still the same directory (the module's doc)."""

    def __init__(self, prefix: str, dir: str | Path | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
        self.identity = identity(self.path)
        self.token: str | None = secrets.token_hex(16)
        fd = os.open(self.path / MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, self.token.encode())
        finally:
            os.close(fd)

    def unmark(self) -> None:
        """Its marker removed (a directory about to become something else: --copy-as's new copy);
        from now on it is known by its device and inode alone."""
        (self.path / MARK).unlink()
        self.token = None

    def owns(self, path: str | Path | None = None) -> bool:
        """Whether `path` (its own path by default) is this directory: a directory, no link,
        with the device and inode it was made with, and its token."""
        where = self.path if path is None else Path(path)
        return identity(where) == self.identity and (self.token is None or _token(where) == self.token)

    def remove(self, path: str | Path | None = None) -> bool:
        """Deletes the directory (found at `path` where it was renamed there) with everything in
        it, if it is still this one; True if it did."""
        where = self.path if path is None else Path(path)
        if not self.owns(where):
            return False
        shutil.rmtree(where, ignore_errors=True)
        return True

    def __enter__(self) -> "Scratch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
