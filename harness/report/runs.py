"""Reading run records for figures: which runs are ok, what each run is (its sweep
dimensions), which dimensions a set of runs varies, and short names for runs."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from harness.schedules.registry import SCHEDULES


def ok(runs: Iterable[dict]) -> list[dict]:
    return [r for r in runs if r["status"] == "ok"]


def schedule_label(c: dict) -> str:
    """The schedule as its entry names it (a generated one with the key that says which), and its v."""
    name = c["schedule"]["name"]
    if name in SCHEDULES:
        name = SCHEDULES[name].name_in_report(c["schedule"])
    return f"{name} v={c['virtual_stages']}" if c.get("virtual_stages", 1) > 1 else name


def _model(c: dict) -> str:
    m = c.get("model") or {}
    return f"{m.get('name')} L{m.get('layers')} h{m.get('hidden')}"


def _profile(c: dict) -> str | None:
    return Path(c["profile"]).stem if c.get("profile") else None


# The dimensions a sweep can vary, as short names; a figure's series are labelled by those
# its runs vary (and that are not its x axis), so runs that differ are never drawn as one line.
DIMS: dict[str, Callable[[dict], object]] = {
    "schedule": schedule_label,
    "pp": lambda c: c["pp"],
    "dp": lambda c: c.get("dp", 1),
    "M": lambda c: c["microbatches"],
    "B": lambda c: c["microbatch_size"],
    "partition": lambda c: (c.get("partition") or {}).get("name"),
    "checkpointing": lambda c: bool(c.get("checkpointing")),
    "model": _model,
    "profile": _profile,
    "compute": lambda c: c["compute"],
    "device": lambda c: c.get("device"),
    "executor": lambda c: c["executor"],
    "fwd_ms_per_layer": lambda c: (c.get("cost") or {}).get("fwd_ms_per_layer"),
}
SCENARIO = ("model", "profile", "compute")  # what a partition comparison holds fixed


MODE = ("compute", "device", "executor")  # how the times were made: a figure never joins runs that differ here


def dim(run: dict, name: str) -> object:
    if name == "device":  # where it ran (the record's env), else what it asked for
        return (run.get("env") or {}).get("device") or run["config"].get("device")
    return DIMS[name](run["config"])


def mode(run: dict) -> str:
    """`compute=real device=cpu executor=native`: the runs a trend or a front may join."""
    return " ".join(f"{d}={dim(run, d)}" for d in MODE)


def by_mode(runs: Iterable[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        out[mode(r)].append(r)
    return dict(out)


def varying(runs: list[dict]) -> list[str]:
    """The dimensions over which the runs take more than one value, in DIMS order."""
    return [d for d in DIMS if len({repr(dim(r, d)) for r in runs}) > 1]


def label(run: dict, dims: Iterable[str]) -> str:
    return " ".join(str(dim(run, d)) if d == "schedule" else f"{d}={dim(run, d)}" for d in dims)


def series(runs: list[dict], x: str, always: tuple[str, ...] = ()) -> dict[str, list[dict]]:
    """Runs grouped into the lines of a plot against dimension x: one line per combination of
    the other dimensions the runs vary (and of `always`), sorted by x."""
    vary = varying(runs)
    dims = [d for d in DIMS if d != x and (d in always or d in vary)]
    out: dict[str, list[dict]] = defaultdict(list)
    for r in sorted(runs, key=lambda r: dim(r, x)):
        out[label(r, dims) or "all runs"].append(r)
    return dict(out)


def run_id(run: dict) -> str:
    """The job's id in its sweep directory: what precedes the first "_" (`12_pp=4,...` -> `12`;
    make sweep's later parts use `ckpt0_...`, `dp1_...`), else the directory's name."""
    head = run["_dir"].split("_", 1)[0]
    return head if re.fullmatch(r"[a-z]*\d+", head) else run["_dir"]


def run_ids(runs: Iterable[dict]) -> str:
    """`0-7, 9, other`: the runs a figure holds, consecutive job numbers as ranges."""
    ids = [run_id(r) for r in runs]
    nums, names = sorted(int(i) for i in ids if i.isdigit()), sorted(i for i in ids if not i.isdigit())
    spans: list[str] = []
    for n in nums:
        if spans and n == int(spans[-1].split("-")[-1]) + 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{n}"
        else:
            spans.append(str(n))
    return ", ".join(spans + names) or "none"


def setting(r: dict) -> tuple:
    """What else sets a bubble besides schedule, N and M: runs differing in these are not
    points of one curve."""
    c = r["config"]
    return (mode(r), c["partition"]["name"], c.get("profile"), c.get("dp", 1),
            c.get("checkpointing", False), c["model"]["name"], c["microbatch_size"])
