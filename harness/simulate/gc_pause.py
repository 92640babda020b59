"""The cyclic garbage collector paused for a block (reference counting still frees everything).

A job's main process builds hundreds of thousands of small objects (a big schedule's actions,
its compiled rows, the trace's events) that all live until the job's records are written: each
of the collector's passes walks them and finds nothing, up to a third of a simulated job's time.
What cycles the block leaves (a matplotlib figure) are collected when the collector resumes."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
