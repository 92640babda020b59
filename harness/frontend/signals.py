"""Ctrl-C and SIGTERM, honoured at every moment of a run or a sweep.

Python raises KeyboardInterrupt where the main thread happens to be when a signal arrives; if
that is a weakref callback or a __del__ (the first milliseconds of a job create and drop many),
the interpreter prints "Exception ignored in: ..." and goes on, and a sweep would run its
remaining jobs. So the handler also remembers the signal, and `check` raises it again at every
phase boundary (a job's start and end, before each launch, the end of the command): a signal
swallowed once is honoured at the next boundary."""

from __future__ import annotations

import signal

_received: list[int] = []


def _handler(signum: int, frame: object) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def install() -> None:
    """This process's handlers for SIGINT and SIGTERM (a scheduler's kill ends a job like
    Ctrl-C: recorded `interrupted`, workers killed, finished jobs' records kept); forgets any
    signal seen before (a second command in one process, as the tests run them)."""
    _received.clear()
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


def ensure() -> None:
    """The handlers installed, keeping what was seen (a job inside a command that installed them)."""
    if signal.getsignal(signal.SIGTERM) is not _handler:
        install()


def check() -> None:
    """KeyboardInterrupt if a signal arrived, even one whose first raise was swallowed."""
    if _received:
        raise KeyboardInterrupt
