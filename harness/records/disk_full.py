"""A write that found no space (ENOSPC, or the user's quota: EDQUOT): how to tell, and how a
job's record says it. The job (harness/job.py) fails with what record space allows; the
sweeper (harness/frontend/sweeper.py) stops the sweep and names the job. Imports nothing of
the harness."""

from __future__ import annotations

import errno
from pathlib import Path

DISK_FULL = "disk full"  # how a job's error begins when a write found no space


def disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_error(e: OSError) -> str:
    """The job's error: `disk full: <strerror> writing <file> (<path>)`."""
    where = f" writing {Path(e.filename).name}" if e.filename else ""
    return f"{DISK_FULL}: {e.strerror or 'no space left on device'}{where} ({e.filename or 'a record'})"
