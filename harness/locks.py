"""One writer per run or sweep directory: a second harness writing into the same directory
(two sweeps, two `resume=true` runs, a run into a sweep's job) is refused in one line
instead of mixing its records with the first's. An advisory flock on `.harness.lock`, held
while the run or sweep lasts and released by the kernel when its process dies, however it
dies (no stale locks after a kill -9)."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

LOCK = ".harness.lock"


class Busy(RuntimeError):
    """The directory is another harness's; str() is one line."""


class DirLock:
    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK
        self.fd: int | None = None

    def acquire(self) -> "DirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise Busy(f"{self.path.parent} is being written by another harness (pid {holder}); wait for it, "
                       "or choose another hydra.run.dir / hydra.sweep.dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays (unlinking it would race)
            self.fd = None

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class SweepLock(Callback):
    """Holds the sweep directory's lock from the sweep's start to its end."""

    def __init__(self) -> None:
        self.lock: DirLock | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.lock = DirLock(Path(config.hydra.sweep.dir)).acquire()
        except Busy as e:
            print(f"harness: error: {e}", file=sys.stderr)
            sys.exit(2)
        except OSError as e:
            print(f"harness: error: hydra.sweep.dir={config.hydra.sweep.dir}: cannot create it ({e.strerror})",
                  file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()
