"""Scratch directories: made by the harness, and removed only if they are still the one it made.

Nothing is deleted on the strength of a name or a prefix (a user's `hydra.run.dir` may start
with any prefix the harness uses). A scratch directory is made by tempfile.mkdtemp (a fresh
name, mode 0700, nobody's before) and remembered by identity: its path, device and inode.
`remove` deletes it only while that path is still that directory (not a link, not a directory
someone put in its place); shutil.rmtree follows no link inside it.
"""

from __future__ import annotations

import os
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


class Scratch:
    """A directory made now (tempfile.mkdtemp with `prefix`, in `dir` or the system's temporary
    directory), removed by `remove` only if it is still the same directory."""

    def __init__(self, prefix: str, dir: str | Path | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
        self.identity = identity(self.path)

    def owns(self, path: str | Path | None = None) -> bool:
        """Whether `path` (its own path by default) is this directory: a directory, no link,
        with the device and inode it was made with."""
        return identity(self.path if path is None else path) == self.identity

    def remove(self, path: str | Path | None = None) -> bool:
        """Deletes the directory (found at `path` where it was renamed there) with everything in
        it, if it is still this one; True if it did."""
        return remove_dir(self.path if path is None else path, self.identity)

    def __enter__(self) -> "Scratch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
