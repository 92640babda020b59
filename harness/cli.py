"""`python -m harness`: checks config-group choices (schedule=, model=, ...) up front so an
unknown one is a single line, then hands over to Hydra."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import typing
from typing import Any
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


def _fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """Every key of the typed schema, dotted, with its type."""
    out: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            out |= _fields(hint, f"{prefix}{name}.")
        else:
            out[prefix + name] = hint
    return out


def _type_problem(hint: Any, value: str) -> str | None:
    """What is wrong with `value` for a field of type `hint`, or None."""
    args = typing.get_args(hint)
    if value == "null" and type(None) in args:
        return None
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if base is bool and value.lower() not in ("true", "false"):
        return "must be true or false"
    if base is int and not re.fullmatch(r"[+-]?\d+", value):
        return "must be an integer"
    if base is float:
        try:
            float(value)
        except ValueError:
            return "must be a number"
    return None


def check_values(argv: list[str]) -> str | None:
    """The first override naming an unknown key or a value of the wrong type, as one line
    (Hydra would say it in several, with a hint about HYDRA_FULL_ERROR), or None."""
    from harness.config import Config

    fields = _fields(Config)
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or arg.startswith(("-", "+", "~")) or key.startswith("hydra") or "/" in key or key in GROUPS:
            continue
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1)
            return f"{key}={value}: unknown key" + (f" (did you mean {near[0]}?)" if near else
                                                   " (every key is listed in harness/config.py)")
        if value.startswith("[") or "(" in value:  # lists and sweep functions: Hydra checks those
            continue
        for v in value.split(","):
            if problem := _type_problem(fields[key], v.strip()):
                return f"{key}={v.strip()}: {problem}"
    return None


def torchrun_overrides(argv: list[str], env: dict[str, str]) -> tuple[list[str], str | None]:
    """Under torchrun every rank runs this app: rank 0 records the job in Hydra's output
    directory; the others get a scratch directory and no logs. Sweeps are refused there
    (each job would need a fresh world; use the SLURM launcher to spread a sweep)."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return argv, None
    if "-m" in argv or "--multirun" in argv:
        return argv, "-m/--multirun under torchrun: run one job per torchrun (use hydra/launcher=slurm for sweeps)"
    if env["RANK"] == "0":
        return argv, None
    return argv + [f"hydra.run.dir=/tmp/harness-torchrun-{env.get('TORCHELASTIC_RUN_ID', 'run')}-rank{env['RANK']}",
                   "hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"], None


def main() -> None:
    argv, problem = torchrun_overrides(sys.argv[1:], dict(os.environ))
    problem = problem or check_groups(argv) or check_values(argv)
    if problem:
        print(f"harness: error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.argv[1:] = argv
    from harness.app import main as hydra_main

    try:
        hydra_main()
    except KeyboardInterrupt:  # between jobs: nothing was running, every record is complete
        print("harness: interrupted", file=sys.stderr)
        sys.exit(130)
