"""Which step each forked rank has reached, so that a job the watchdog ends names the rank that
stopped, not every rank: when one rank hangs, the others soon wait on it (at the next step's
barrier, or for its message), so "ranks [0, 1, 2, 3] still running" says nothing.

The launcher makes a file of one int64 per rank (a fresh temporary it removes by identity);
each rank writes, as it starts step s (past the fault hook, before the barrier), s + 1 into its
slot with one pwrite: no lock, no message, nothing inside a timed window.
"""

from __future__ import annotations

import os
import struct
import tempfile

SLOT = struct.Struct("<q")


class Steps:
    """The launcher's side: the file, its reading, its removal."""

    def __init__(self, world: int) -> None:
        fd, self.path = tempfile.mkstemp(prefix="harness-steps-")
        try:
            os.ftruncate(fd, SLOT.size * world)  # zeros: no rank has started a step
            self._id = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        self.world = world

    def read(self) -> list[int]:
        """[rank] the steps it has started (0: none)."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(SLOT.size * self.world)
        except OSError:
            return [0] * self.world
        raw = raw.ljust(SLOT.size * self.world, b"\0")
        return [SLOT.unpack_from(raw, SLOT.size * r)[0] for r in range(self.world)]

    def close(self) -> None:
        """The file removed, if it is still the one made here (its inode)."""
        try:
            if os.lstat(self.path).st_ino == self._id:
                os.unlink(self.path)
        except OSError:
            pass


class Mark:
    """A rank's side: `mark(step)` as it starts a step. A missing file (an external launcher,
    a test calling run_rank) marks nothing."""

    def __init__(self, path: str | None, rank: int) -> None:
        self.fd: int | None = None
        self.at = SLOT.size * rank
        if path:
            try:
                self.fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                self.fd = None

    def __call__(self, step: int) -> None:
        if self.fd is not None:
            try:
                os.pwrite(self.fd, SLOT.pack(step + 1), self.at)
            except OSError:
                pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def stopped(started: list[int], waiting: list[int]) -> str:
    """What the watchdog says of the ranks it ended (`waiting`: those that had not reported),
    given each rank's started steps: the one(s) behind the others, by name."""
    ahead = max(started) if started else 0
    behind = [r for r in waiting if started[r] < ahead]
    if behind:
        low = min(started[r] for r in behind)
        first = [r for r in behind if started[r] == low]
        who = f"rank {first[0]}" if len(first) == 1 else f"ranks {first}"
        return f"{who} stopped: it never started step {low}, which the other ranks started, then waited for it"
    if not ahead:
        return f"ranks {waiting} still running: none started its first step"
    return (f"ranks {waiting} still running, all in step {ahead - 1}: none is behind another (each waits inside the "
            "step, as in a deadlock)")
