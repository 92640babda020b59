"""One writer per run or sweep directory, and only where a run may write.

- A second harness writing into the same directory (two sweeps, two `run.resume=true` runs, a run
  into a sweep's job, a run into a directory below one being written) is refused in one line
  instead of mixing its records with the first's, before it writes anything. An advisory flock
  on `.harness.lock`, held while the run, the sweep or the sweep's job lasts and released by
  the kernel when its process dies, however it dies (no stale locks after a kill -9). A
  process may take a lock it holds again (a sweep's job under the lock the sweeper took for
  it): `_HELD` counts.
- `unsafe_dir` refuses a run or sweep directory that is empty, the file system's root, the
  current directory, the home directory, a directory holding the harness's source (the
  repository and above) or one inside it (the package, a directory git tracks files in).
- `sweep_of` says when a directory is a sweep's (or one of its jobs'): a single run there is
  refused (the sweep owns its records; `-m ... run.resume=true` reruns a job).
- `unsafe_files` refuses a directory where a file the harness (or Hydra for it) writes is there
  already and is not a regular file (a symlink, a FIFO: harness/records/atomic.py), before anything
  is written: the lock file itself is opened without following a link or blocking on a FIFO.
"""

from __future__ import annotations

import fcntl
import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.records.atomic import UnsafeTarget, check_dir, check_target, open_in_place

LOCK = ".harness.lock"
SWEEP_RECORD = "sweep.json"  # harness.frontend.sweeper's record of a sweep (the same name; sweeper imports it from here)
# what is written into a sweep's directory (multirun.yaml by Hydra's sweeper or harness's, sweep.log by the jobs)
SWEEP_FILES = (LOCK, "multirun.yaml", SWEEP_RECORD, "sweep.log")
# what a run or a sweep's job writes into its directory (and Hydra: run_files); a link or a FIFO at any
# of them is refused before Hydra or the harness writes there
RUN_FILES = (LOCK, "result.json", "trace.json", "gantt.png", "running.json")
_HELD: dict[str, list[int]] = {}  # lock file (real path) -> [fd, times taken] by this process


class Busy(RuntimeError):
    """The directory is another harness's; str() is one line."""


def _busy(directory: Path, holder: str) -> Busy:
    return Busy(f"{directory} is being written by another harness (pid {holder}); wait for it, "
                "or choose another hydra.run.dir / hydra.sweep.dir")


class DirLock:
    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK
        self.fd: int | None = None
        self.key: str | None = None

    def acquire(self) -> "DirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(self.path)
        if key in _HELD:  # this process holds it already (the sweeper, for this job)
            _HELD[key][1] += 1
            self.fd, self.key = _HELD[key][0], key
            return self
        fd = open_in_place(self.path, os.O_RDWR | os.O_CREAT)  # a link or a FIFO there: UnsafeTarget
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise _busy(self.path.parent, holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        _HELD[key] = [fd, 1]
        self.fd, self.key = fd, key
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        held = _HELD.get(self.key or "")
        if held is not None and held[0] == self.fd:
            held[1] -= 1
            if held[1] == 0:
                del _HELD[self.key]
                os.close(self.fd)  # closing drops the flock; the file stays (unlinking it would race)
        self.fd = None

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def holder(directory: Path) -> str | None:
    """The pid of another harness writing `directory` now, or None (nobody, or this process).
    Creates nothing: a directory without a lock file is nobody's."""
    path = Path(directory) / LOCK
    try:
        if os.path.realpath(path) in _HELD:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode(errors="replace").strip() or "?"
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def check_free(directory: Path) -> None:
    """Busy if another harness writes `directory` or a directory above it (a sweep writing its
    jobs, a run writing its directory)."""
    d = Path(os.path.abspath(directory))
    for p in (d, *d.parents):
        if (pid := holder(p)) is not None:
            raise _busy(p, pid)


def sweep_of(directory: Path) -> Path | None:
    """The sweep directory `directory` is, or is a job of (it or its parent holds sweep.json)."""
    d = Path(os.path.abspath(directory))
    for p in (d, d.parent):
        if (p / SWEEP_RECORD).is_file():
            return p
    return None


@functools.lru_cache(maxsize=1)
def _source() -> tuple[Path, Path | None]:
    """(the harness package, the repository holding it or None where it is installed elsewhere)."""
    package = Path(__file__).resolve().parents[1]
    repo = package.parent
    return package, repo if (repo / "pyproject.toml").is_file() or (repo / ".git").exists() else None


@functools.lru_cache(maxsize=64)
def _tracked(repo: Path, top: str) -> bool:
    """Whether git tracks files under repo/top (without git: whether top is one of the source folders)."""
    try:
        p = subprocess.run(["git", "ls-files", "--", top], cwd=repo, capture_output=True, text=True, timeout=10)
        if p.returncode == 0:
            return bool(p.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return top in ("harness", "hydra_plugins", "tests", "examples", "data", "docs", "reports")


def unsafe_dir(path: str | None, cwd: str | None = None) -> str | None:
    """Why a harness must not write its records into directory `path` (relative to `cwd`), in
    a few words, or None."""
    if path is None or not str(path).strip():
        return "empty: a run needs a directory of its own"
    cwd = cwd or os.getcwd()
    d = Path(os.path.realpath(os.path.join(cwd, os.path.expanduser(str(path)))))
    if d == Path(d.anchor):
        return "the file system's root"
    if d == Path(os.path.realpath(cwd)):
        return "the current directory: a run needs a directory of its own"
    if d == Path(os.path.realpath(Path.home())):
        return "the home directory"
    package, repo = _source()
    for root in (package, repo):
        if root is not None and (d == root or root.is_relative_to(d)):
            return f"it holds the harness's source ({root})"
    if d.is_relative_to(package):
        return f"inside the harness's source ({package})"
    if repo is not None and d.is_relative_to(repo) and _tracked(repo, d.relative_to(repo).parts[0]):
        return f"inside the repository's source ({repo / d.relative_to(repo).parts[0]}: tracked by git)"
    return None


def run_files(config: DictConfig) -> tuple[str, ...]:
    """RUN_FILES, and what Hydra writes into a job's directory: its config files under
    hydra.output_subdir (.hydra/; none when null) and the job's log (<job name>.log)."""
    sub = OmegaConf.select(config, "hydra.output_subdir", default=".hydra")
    hydra = () if sub is None else tuple(f"{sub}/{n}" for n in ("config.yaml", "hydra.yaml", "overrides.yaml"))
    return (*RUN_FILES, *hydra, f"{OmegaConf.select(config, 'hydra.job.name', default='app')}.log")


def unsafe_files(directory: str | Path, names: tuple[str, ...], own: bool = False) -> str | None:
    """Why the harness must not write `names` into `directory` (one line), or None: one of them
    (or a folder on its way, .hydra/) is there and is not a regular file; with `own` (a directory
    the harness names itself: a sweep's job), `directory` is a symlink or not a directory."""
    d = Path(directory)
    try:
        if own:
            check_dir(d)
        for name in names:
            if "/" in name:
                check_dir(d / name.rsplit("/", 1)[0])
            check_target(d / name)
    except UnsafeTarget as e:
        return str(e)
    return None


def _refuse(message: str) -> None:
    print(f"harness: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class SweepLock(Callback):
    """A sweep's directory: refused before anything is written if it is no place for records
    (`unsafe_dir`), a single run's, or being written by another harness. harness's sweeper
    takes the lock itself once every point is checked (an invalid sweep writes nothing) and
    holds it until its last job ends; under another sweeper it is held from here to the end."""

    def __init__(self) -> None:
        self.lock: DirLock | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        where = OmegaConf.select(config, "hydra.sweep.dir", default=None)
        if why := unsafe_dir(where, OmegaConf.select(config, "hydra.runtime.cwd", default=None)):
            _refuse(f"hydra.sweep.dir={where or ''}: {why}; nothing written")
        directory = Path(str(where))
        if why := unsafe_files(directory, SWEEP_FILES):
            _refuse(f"hydra.sweep.dir={where}: {why}; nothing written")
        if (directory / "result.json").exists():
            _refuse(f"hydra.sweep.dir={where}: a single run's directory (it holds result.json); nothing written")
        try:
            check_free(directory)
        except Busy as e:
            _refuse(str(e))
        target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
        if target.startswith("hydra_plugins.harness_sweeper"):
            return  # the sweeper locks it once its points are checked
        try:
            self.lock = DirLock(directory).acquire()
        except Busy as e:
            _refuse(str(e))
        except OSError as e:
            _refuse(f"hydra.sweep.dir={where}: cannot create it ({e.strerror})")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None
