"""No worker outlives the harness that started it, however that harness dies (SIGKILL, the
OOM killer, a closed terminal): each forked process asks the kernel to SIGKILL it when its
parent dies (Linux's PR_SET_PDEATHSIG). The forkserver dies with the main process, a rank
with the forkserver (or, under run.start_method=spawn, with the main process), so the chain
leaves nothing behind within moments; the resource tracker then exits on its own."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies; exit now if the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not allowed here: the parent's cleanup (launch.py) still ends the workers
    if os.getppid() != parent or parent == 1:  # orphaned before the request took effect
        os._exit(1)
