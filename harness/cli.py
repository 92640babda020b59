"""`python -m harness`: checks config-group choices (schedule=, model=, ...) up front so an
unknown one is a single line, then hands over to Hydra."""

from __future__ import annotations

import re
import sys
from importlib import resources

GROUPS = ("schedule", "model", "partition", "experiment", "scenario")
_OVERRIDE = re.compile(r"^\+?(?P<group>[a-z_]+)=(?P<value>[^()\[\]{}]*)$")


def group_options(group: str) -> list[str]:
    folder = resources.files("conf") / group
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def check_groups(argv: list[str]) -> str | None:
    """The first unknown group choice in `argv`, as one line, or None."""
    for arg in argv:
        m = _OVERRIDE.match(arg)
        if not m or m["group"] not in GROUPS:
            continue
        options = group_options(m["group"])
        for value in m["value"].split(","):
            if value.strip() not in options:
                return f"{m['group']}={value.strip()}: unknown (allowed: {', '.join(options)})"
    return None


def main() -> None:
    problem = check_groups(sys.argv[1:])
    if problem:
        print(f"harness: error: {problem}", file=sys.stderr)
        sys.exit(2)
    from harness.app import main as hydra_main

    hydra_main()
