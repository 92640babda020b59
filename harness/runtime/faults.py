"""Test-only fault injection: `fault=KIND@rankR,stepS` with KIND raise | kill | hang | noaccum.

raise: the rank raises RuntimeError at the start of step S. kill: it SIGKILLs itself.
hang: it sleeps forever (the job's timeout_s must end it). noaccum: in step S the rank
drops the gradients accumulated before each backward, so only the last microbatch's
survive (verify_grads must catch it). For tests of failure handling; never set in a study.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

_FAULT = re.compile(r"^(raise|kill|hang|noaccum)@rank(\d+),step(\d+)$")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int


def parse_fault(text: str | None) -> Fault | None:
    """None for no fault; ValueError with the allowed form otherwise."""
    if not text:
        return None
    m = _FAULT.match(text)
    if not m:
        raise ValueError(f"fault={text}: expected KIND@rankR,stepS with KIND raise|kill|hang|noaccum, e.g. raise@rank1,step2")
    return Fault(m.group(1), int(m.group(2)), int(m.group(3)))


def maybe_inject(fault: Fault | None, rank: int, step: int) -> None:
    if fault is None or fault.rank != rank or fault.step != step or fault.kind == "noaccum":
        return
    if fault.kind == "raise":
        raise RuntimeError(f"injected fault at rank {rank}, step {step}")
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang
        time.sleep(3600)
