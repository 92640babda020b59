"""running.json: which harness process is running a job (and its workers), and whether that is
still so. A job killed with SIGKILL leaves the file behind; a reader tells a live run from such a
leftover by the owner's pid AND its start time (a pid is reused; the pair is not), and on
Linux the boot it started in.

    {"pid": 4242, "started": 123456789, "boot": "<boot id>", "worker_pids": [...]}

`started` is the process's start time in clock ticks since boot (/proc/<pid>/stat field 22);
null where /proc does not say (then only the pid is compared).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.records.safe_io import FileRefused, read_text

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None where /proc does not say or
    there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # after "pid (comm) ": comm may hold spaces and ")"
    try:
        return int(fields[19])  # field 22 of the whole line: state is field 3, fields[0] here
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    try:
        with open(BOOT_ID) as f:
            return f.read(64).strip() or None
    except OSError:
        return None


def stamp(worker_pids: list[int], pid: int | None = None) -> dict:
    """What running.json says for this process (or `pid`) running `worker_pids`."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "started": start_ticks(pid), "boot": boot_id(), "worker_pids": list(worker_pids)}


def alive(pid: int, started: int | None, boot: str | None) -> tuple[bool, str]:
    """(whether the process running.json names still runs, and why not where it does not)."""
    if boot is not None and (now := boot_id()) is not None and now != boot:
        return False, f"pid {pid} ran before this machine rebooted"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, f"its harness (pid {pid}) is gone"
    except PermissionError:
        pass  # another user's process: it exists
    except OSError as e:
        return False, f"pid {pid}: {e.strerror}"
    if started is not None and (now_started := start_ticks(pid)) is not None and now_started != started:
        return False, f"pid {pid} is another process now (it started at tick {now_started}, the run's at {started})"
    return True, ""


def state(job_dir: str | Path) -> str | None:
    """What a job directory's running.json says, checked: None where there is none, else one
    line: `running (pid N)` while its owner lives, `stale: ...` where the owner is gone (killed
    before it could remove the file), `unreadable: ...`."""
    path = Path(job_dir) / "running.json"
    if not os.path.lexists(path):
        return None
    try:
        data = json.loads(read_text(path, "running.json", "result"))
        pid, started, boot = data["pid"], data.get("started"), data.get("boot")
        if isinstance(pid, bool) or not isinstance(pid, int) or pid < 1:
            raise ValueError(f"pid={pid!r}")
    except (FileRefused, OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        return f"unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    ok, why = alive(pid, started if isinstance(started, int) else None, boot if isinstance(boot, str) else None)
    return f"running (pid {pid})" if ok else f"stale: {why}"
