"""Test-only fault injection: `run.fault=KIND@rankR,stepS` with KIND raise | kill | hang | noaccum,
or `run.fault=term@PHASE` (start, plan, launch, records, end) / `run.fault=enospc@records`.

raise: the rank raises RuntimeError at the start of step S. kill: it SIGKILLs itself.
hang: it sleeps forever (the job's timeout_s must end it). noaccum: in step S the rank
drops the gradients accumulated before each backward, so only the last microbatch's
survive (verify_grads must catch it). term@PHASE: the main process sends itself SIGTERM at a
phase boundary of the job (`maybe_interrupt`), so tests can interrupt at each moment without
racing a clock. enospc@records:
writing result.json fails as on a full disk (OSError ENOSPC), after trace.json and the Gantt
were written. For tests of failure handling; never set in a study.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from dataclasses import dataclass

_FAULT = re.compile(r"^(raise|kill|hang|noaccum)@rank(\d+),step(\d+)$")
_MAIN_FAULT = re.compile(r"^(term@(?:start|plan|launch|records|end)|enospc@records)$")
_FORMS = ("KIND@rankR,stepS with KIND raise|kill|hang|noaccum (e.g. raise@rank1,step2), or term@PHASE with PHASE "
          "start|plan|launch|records|end, or enospc@records")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None  # a worker fault's rank and step; None for the main process's
    step: int | None = None
    where: str | None = None  # term: launch | records; enospc: records


def parse_fault(text: str | None) -> Fault | None:
    """None for no fault; ValueError with the allowed form otherwise."""
    if not text:
        return None
    if m := _MAIN_FAULT.match(text):
        kind, _, where = m.group(1).partition("@")
        return Fault(kind, where=where)
    m = _FAULT.match(text)
    if not m:
        raise ValueError(f"run.fault={text}: expected {_FORMS}")
    return Fault(m.group(1), int(m.group(2)), int(m.group(3)))


def maybe_interrupt(fault: Fault | None, where: str) -> None:
    """The main process's test hook: SIGTERM to itself at `where`, a phase boundary of a job:
    start (before it plans), plan (planned), launch (its first worker started), records
    (between trace.json and result.json), end (its records written)."""
    if fault is not None and fault.kind == "term" and fault.where == where:
        os.kill(os.getpid(), signal.SIGTERM)


def maybe_fail_write(fault: Fault | None, where: str, path: object) -> None:
    """The main process's test hook: the write of `path` at `where` fails as on a full disk."""
    if fault is not None and fault.kind == "enospc" and fault.where == where:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected: run.fault=enospc@{where})", str(path))


def maybe_inject(fault: Fault | None, rank: int, step: int) -> None:
    if fault is None or fault.rank != rank or fault.step != step or fault.kind in ("noaccum", "term", "enospc"):
        return
    if fault.kind == "raise":
        raise RuntimeError(f"injected fault at rank {rank}, step {step}")
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang
        time.sleep(3600)
