"""The command-line argument parser of every entry point besides `python -m harness` (report,
export, advise, profile, schedules.check): argparse with its usage block and message said as
one line, `<name>: error: <message> (allowed: <usage>)`, exit 2, or raised for the entry point
to say."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


class OneLineParser(argparse.ArgumentParser):
    """`allowed`: the usage said after a bad argument (or a function of argparse's message
    giving it, for a hint on what went wrong); `raises`: an exception class raised with the
    line instead of printing it and exiting (an entry point that says its errors itself)."""

    def __init__(self, *args: Any, allowed: str | Callable[[str], str] | None = None,
                 raises: type[Exception] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.allowed, self.raises = allowed, raises

    def error(self, message: str) -> None:  # type: ignore[override]
        allowed = self.allowed(message) if callable(self.allowed) else self.allowed
        line = f"{message} (allowed: {allowed})" if allowed else message
        if self.raises is not None:
            raise self.raises(line)
        print(f"{self.prog.removeprefix('python -m ')}: error: {line}", file=sys.stderr)
        sys.exit(2)
