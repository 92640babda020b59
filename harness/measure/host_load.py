"""The host's load over a run, from /proc: what else used the CPUs while the run's workers ran.

A record made on a busy machine measures contention as well as the schedule; `env.oversubscribed`
counts only the run's own ranks. Sampled at the start and end of the execution (harness/job.py):
the CPU time of every CPU of the host (/proc/stat: user, nice, system, irq, softirq and steal,
all but idle and iowait) less the CPU time of this process and its descendants (/proc/<pid>/stat:
utime, stime and the reaped children's cutime and cstime, so a worker that exited still counts
as the run's) is the CPU time of other processes; over the window's wall time it is how many
cores they kept busy on average. The load average (/proc/loadavg via os.getloadavg) at both ends
is recorded beside it: its 1-minute figure also counts the run's own ranks and lags the window.

The rule (`BUSY_CORES`): a host is busy where other processes kept more than half a core busy on
average over the run. Two busy loops beside a run on 2 cores keep 1-2 cores busy; a quiet
desktop's background stays under 0.1. Linux only: elsewhere nothing is sampled (null).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness.records.result import HostLoad

BUSY_CORES = 0.5  # other processes' average cores over the run above which the host was busy
RULE = f"busy: other processes kept more than {BUSY_CORES} core busy on average over the run"
SOURCE = "/proc/stat (all CPUs) less /proc/<pid>/stat of this process and its descendants; os.getloadavg"
PROC = Path("/proc")


@dataclass(frozen=True)
class CpuSample:
    """The host's and this process tree's CPU seconds since boot, at a monotonic time."""
    at_s: float  # time.monotonic()
    host_busy_s: float  # every CPU's non-idle time (/proc/stat)
    own_s: float  # this process and its descendants (their reaped children included)
    load_avg: tuple[float, float, float]  # 1, 5 and 15 minutes


def _tick_s() -> float:
    return 1.0 / os.sysconf("SC_CLK_TCK")


def _host_busy_s(proc: Path) -> float:
    """Non-idle CPU seconds of all CPUs since boot: the first (`cpu `) line of /proc/stat."""
    with open(proc / "stat", encoding="ascii") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) * _tick_s()  # guest time is inside user


def _stat(proc: Path, pid: str) -> tuple[int, float] | None:
    """(parent pid, utime + stime + cutime + cstime in seconds) of a process; None if it is gone."""
    try:
        text = (proc / pid / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()  # the name may hold spaces and parentheses
    return int(rest[1]), sum(int(v) for v in rest[11:15]) * _tick_s()


def _descendants(root: int, proc: Path) -> list[int] | None:
    """`root` and its live descendants from the kernel's lists of each thread's children
    (/proc/<pid>/task/<tid>/children): a few files for a run's tree, where a scan reads every
    process of the host (~2.5 ms a sample on a busy host). None where the kernel has no such
    lists (CONFIG_PROC_CHILDREN)."""
    if not (proc / str(root) / "task" / str(root) / "children").exists():
        return None
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = list((proc / str(pid) / "task").iterdir())
        except OSError:  # gone meanwhile
            continue
        for task in tasks:
            try:
                todo += [int(c) for c in (task / "children").read_text(encoding="ascii").split()]
            except OSError:  # the thread ended meanwhile
                pass
    return found


def _scanned(root: int, proc: Path) -> list[int]:
    """`root` and its live descendants from every process's parent (/proc/<pid>/stat)."""
    parents = {int(p.name): s[0] for p in proc.iterdir() if p.name.isdigit() and (s := _stat(proc, p.name)) is not None}
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _tree_cpu_s(root: int, proc: Path) -> float:
    """CPU seconds of `root` and every live descendant, each with its reaped children's."""
    pids = _descendants(root, proc)
    pids = _scanned(root, proc) if pids is None else pids
    return sum(s[1] for pid in pids if (s := _stat(proc, str(pid))) is not None)


def sample(root: int | None = None, proc: Path = PROC) -> CpuSample | None:
    """The CPU counters now, `root`'s tree (this process by default) as the run's; None where
    /proc cannot be read (not Linux)."""
    try:
        host = _host_busy_s(proc)
        own = _tree_cpu_s(os.getpid() if root is None else root, proc)
        load = os.getloadavg()
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(time.monotonic(), host, own, (load[0], load[1], load[2]))


def host_load(start: CpuSample | None, end: CpuSample | None, cores: int | None = None) -> HostLoad | None:
    """What the host's other processes used between two samples, and whether that makes it busy
    (RULE); None without both samples or over no time. Tick-sampled counters (10 ms) can put
    the other processes' share a little below 0: it is kept at 0."""
    if start is None or end is None or end.at_s <= start.at_s:
        return None
    wall = end.at_s - start.at_s
    own = max(end.own_s - start.own_s, 0.0)
    other = max(end.host_busy_s - start.host_busy_s - own, 0.0)
    return HostLoad(source=SOURCE, rule=RULE, wall_s=wall, cores=cores or os.cpu_count() or 1,
                    load_avg_start=list(start.load_avg), load_avg_end=list(end.load_avg),
                    own_cpu_s=own, other_cpu_s=other, other_cores=other / wall, busy=other / wall > BUSY_CORES)
