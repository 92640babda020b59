"""The host's load over a run (harness/measure/host_load.py): the busy rule on synthetic samples,
then the /proc measurement itself with busy loops beside it (other processes) and inside it
(a descendant: the run's own), and (slow) a record made beside two busy loops flagged busy."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from harness.measure.host_load import BUSY_CORES, CpuSample, host_load, sample
from harness.records.result import busy_phrase


def _at(t: float, host: float, own: float, load: float = 1.0) -> CpuSample:
    return CpuSample(at_s=t, host_busy_s=host, own_s=own, load_avg=(load, load, load))


def test_busy_is_other_processes_over_half_a_core_on_average():
    # a run that kept 2 cores busy itself on a quiet host: the host's time is its own
    quiet = host_load(_at(10, 100, 5), _at(12, 104.2, 9), cores=2)
    assert quiet.other_cpu_s == pytest.approx(0.2) and quiet.other_cores == pytest.approx(0.1) and not quiet.busy
    # two busy loops beside a run that mostly sleeps: ~2 cores of others
    loops = host_load(_at(0, 0, 0, 0.5), _at(2, 4.1, 0.3, 2.5), cores=2)
    assert loops.other_cores == pytest.approx(1.9) and loops.busy
    assert loops.load_avg_start == [0.5] * 3 and loops.load_avg_end == [2.5] * 3
    assert "1.9 of 2 cores" in busy_phrase(loops) and "0.5 -> 2.5" in busy_phrase(loops)
    # the threshold itself: at it, not busy; a tick over, busy
    assert not host_load(_at(0, 0, 0), _at(1, BUSY_CORES, 0)).busy
    assert host_load(_at(0, 0, 0), _at(1, BUSY_CORES + 0.01, 0)).busy
    # tick rounding may put the others a little under 0: kept at 0; no window, no figure
    assert host_load(_at(0, 1.0, 0), _at(1, 1.0, 0.02)).other_cpu_s == 0
    assert host_load(None, _at(1, 1, 0)) is None and host_load(_at(1, 1, 0), _at(1, 2, 0)) is None


@contextlib.contextmanager
def _busy_loops(n: int, detached: bool) -> Iterator[list[int]]:
    """n `yes > /dev/null` loops: detached (a shell that exits at once starts them, so they are no
    descendants of this process: other processes) or as this process's children (the run's own).
    Killed by pid afterwards."""
    if detached:
        out = subprocess.run(["sh", "-c", f"for i in $(seq {n}); do yes >/dev/null 2>&1 </dev/null & echo $!; done"],
                             capture_output=True, text=True, check=True, timeout=10).stdout
        pids, children = [int(p) for p in out.split()], []
    else:
        children = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]
        pids = [p.pid for p in children]
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in children:
            p.wait(timeout=10)


def _cpu_s(pid: int) -> float:
    """A process's own utime + stime (/proc/<pid>/stat fields 14 and 15), in seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_busy_loops_beside_are_others_and_a_child_is_the_runs_own():
    """Two loops beside: their CPU time is the others' (and, on 2 cores, the host is busy); a loop
    this process started: its CPU time is the run's own. Each loop's time read from its own
    /proc/<pid>/stat is what the figures must account for, to a few 10 ms ticks."""
    tick = 3 / os.sysconf("SC_CLK_TCK")
    with _busy_loops(2, detached=True) as pids:
        assert all(int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) != os.getpid() for p in pids)
        before, start = [_cpu_s(p) for p in pids], sample()
        time.sleep(0.5)
        beside, used = host_load(start, sample()), sum(_cpu_s(p) for p in pids) - sum(before)
    assert used > 0 and beside.other_cpu_s >= used - 2 * tick and beside.own_cpu_s < 0.2, (used, beside)
    assert beside.busy, beside  # 2 loops on 2 cores: about a core each when nothing else runs
    with _busy_loops(1, detached=False) as (pid,):
        before, start = _cpu_s(pid), sample()
        time.sleep(0.5)
        inside, used = host_load(start, sample()), _cpu_s(pid) - before
    assert used > 0 and inside.own_cpu_s >= used - tick, (used, inside)  # the child's time is the run's


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_the_kernels_children_lists_find_the_tree_a_scan_finds(tmp_path):
    """The run's tree as the kernel's children lists give it (a few files) is the one a scan of
    every process's parent gives: a child, its child, and a child started from another thread;
    without the lists (a kernel built without them) the scan is used."""
    import threading

    from harness.measure.host_load import PROC, _descendants, _scanned, _tree_cpu_s

    kids = [subprocess.Popen(["sh", "-c", "sleep 30 & wait"])]
    started = threading.Thread(target=lambda: kids.append(subprocess.Popen(["sleep", "30"])))
    started.start()
    started.join()
    try:
        deadline = time.monotonic() + 5
        while len(_scanned(os.getpid(), PROC)) < 4 and time.monotonic() < deadline:  # sh's sleep forked
            time.sleep(0.01)
        walked = _descendants(os.getpid(), PROC)
        if walked is None:
            pytest.skip("this kernel has no /proc/<pid>/task/<tid>/children")
        assert sorted(walked) == sorted(_scanned(os.getpid(), PROC)) and len(walked) >= 4
        (tmp_path / str(os.getpid()) / "task").mkdir(parents=True)  # a /proc without the lists
        assert _descendants(os.getpid(), tmp_path) is None and _tree_cpu_s(os.getpid(), tmp_path) == 0.0
    finally:
        for k in kids:
            k.kill()
            k.wait(timeout=10)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_record_made_beside_two_busy_loops_is_flagged_busy(tmp_path, config):
    import json

    from harness.job import run_job

    c = config(pp=2, microbatches=2, steps=2, compute="emulated", **{"cost.fwd_ms_per_layer": 5.0})
    with _busy_loops(2, detached=True):
        result = run_job(c, tmp_path, "test", "busy")
    assert result.status == "ok", result.error
    h = json.loads((tmp_path / "result.json").read_text())["env"]["host_load"]
    assert h["busy"] and h["other_cores"] > BUSY_CORES and h["wall_s"] > 0, h
    assert "busy host: other processes kept" in result.headline()
