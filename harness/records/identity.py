"""What a point is, and what its record was made from (result.json's `provenance`): what
run.resume=true and the report match records by.

A point's identity is derived from the schema, not listed by hand: its resolved config (after
Hydra's defaults, type conversion and planning: `pp=02` is pp=2, an explicit default is the
default, global_batch has set microbatch_size) without the run-control sections
(harness/config.py RUN_SECTIONS: run.*, wandb.*), hashed (`point_hash`). What a record was made
from adds the content the point reads (`content_hash`): the sha256 of every input file
(`input_files`: the profile, a CSV schedule, the record a generated schedule's costs come from,
a custom model's module and the modules of the user's tree it imports) and the harness's own
code (`code_version`: commit, uncommitted diff, untracked files).

Torch-free and cheap (a sweep hashes every point before its first job); git is asked once per
process.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from harness.config import RUN_SECTIONS, upgrade_config
from harness.records.jsonsafe import strict
from harness.records.safe_io import CAPS, FileRefused, read_bytes

HARNESS = Path(__file__).resolve().parents[1]  # the harness package
_REPEAT = re.compile(r" #\d+$")  # point_ids' suffix of a second, third, ... point of one identity
_HASH = re.compile(r"[0-9a-f]{64}( #\d+)?")


# -- the point: its resolved config, run control left out ---------------------------------------

def _canonical(value: Any) -> Any:
    """JSON-able and one spelling per value: keys sorted (by json.dumps), a float that is a
    whole number as that int (a Config built in code may hold lr=1 where Hydra's holds 1.0)."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def identity_config(config: Any) -> dict:
    """A Config (or a record's config dict, of any schema version) as the point it is: its
    resolved values without the run-control sections, in one canonical JSON form."""
    d = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else upgrade_config(dict(config or {}))
    return _canonical(strict({k: v for k, v in d.items() if k not in RUN_SECTIONS}))


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def point_hash(config: Any) -> str:
    """sha256 of `identity_config`: the same for every spelling of one point."""
    return _digest(identity_config(config))


def point_ids(points: list[str | None]) -> list[str | None]:
    """Each sweep point's identity in its sweep (`points`: their point_hash, in sweep order;
    None for a point that cannot run): where several share one (they differ in run control
    alone: `run.fault=null,term@launch,null`), ` #2`, ` #3`, ... on the second and later."""
    seen: Counter = Counter()
    out: list[str | None] = []
    for p in points:
        if p is None:
            out.append(None)
            continue
        seen[p] += 1
        out.append(p if seen[p] == 1 else f"{p} #{seen[p]}")
    return out


def repeat_suffix(point: str | None) -> str:
    """` #2` of `point_ids`' `<hash> #2` (or of an older record's overrides `pp=2 #2`); '' if none."""
    m = _REPEAT.search(point or "")
    return m.group(0) if m else ""


def is_point_hash(point: str) -> bool:
    """Whether `point` is a point_hash (point_ids' suffix allowed), not a name from overrides."""
    return _HASH.fullmatch(point) is not None


def point_key(overrides: "list[str] | tuple[str, ...]") -> str:
    """A point as the overrides it was written with, run control left out, sorted: how a point
    that cannot be planned (no resolved config) is named, and how records from before the
    identity hash named theirs."""
    kept = [str(o).lstrip("+") for o in overrides
            if str(o).split("=", 1)[0].lstrip("+~").split(".", 1)[0] not in (*RUN_SECTIONS, "hydra")]
    return " ".join(sorted(kept))


# -- what it read: the harness's code and every input file ---------------------------------------

@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """{commit, dirty, diff_sha256, untracked_sha256}: the harness's commit (full), whether its
    code (harness/, hydra_plugins/) differs from it, a hash of the tracked files' difference and
    one of the untracked files (not ignored) there, names and bytes. Asked once per process: the
    code that runs is what was imported. Nulls where git cannot say (an installed copy)."""
    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", *args], capture_output=True, text=True, cwd=HARNESS, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return p.stdout if p.returncode == 0 else None

    commit = (git("rev-parse", "HEAD") or "").strip() or None
    if commit is None:
        return {"commit": None, "dirty": None, "diff_sha256": None, "untracked_sha256": None}
    diff = git("diff", "HEAD", "--no-ext-diff", "--", ".", "../hydra_plugins")
    untracked = _untracked_sha256(git("ls-files", "--others", "--exclude-standard", "-z", "--", ".",
                                      "../hydra_plugins"))
    dirty = None if diff is None else bool(diff) or untracked is not None
    return {"commit": commit, "dirty": dirty,
            "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
            "untracked_sha256": untracked}


def _untracked_sha256(listing: str | None) -> str | None:
    """One sha256 over the untracked files git lists (NUL-separated, relative to the package):
    each one's name and bytes, in name order; None for none."""
    names = sorted(n for n in (listing or "").split("\0") if n)
    if not names:
        return None
    h = hashlib.sha256()
    for name in names:
        path = HARNESS / name
        h.update(name.encode() + b"\0")
        try:
            st = os.lstat(path)
            h.update(path.read_bytes() if stat.S_ISREG(st.st_mode) else stat.filemode(st.st_mode).encode())
        except OSError as e:
            h.update(f"unreadable: {e.strerror}".encode())
        h.update(b"\0")
    return h.hexdigest()


def _outside_user_tree(path: Path) -> bool:
    """Python's own library, an installed package, or the harness itself: not the user's code."""
    parts = set(path.parts)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    roots = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return any(path.is_relative_to(r) for r in (*roots, HARNESS, HARNESS.parent / "hydra_plugins"))


def _find(name: str, search: list[str]) -> Path | None:
    """The source file Python would import for module `name` from `search` (a package's
    __init__.py), found without importing anything; None if it is no source file of the
    user's tree (a package outside it is not looked into: `torch.nn` stops at `torch`)."""
    spec, path, parts = None, search, name.split(".")
    for i in range(len(parts)):
        try:
            spec = PathFinder.find_spec(".".join(parts[:i + 1]), path)
        except (ImportError, ValueError, AttributeError):
            return None
        if spec is None:
            return None
        where = spec.origin if spec.origin not in (None, "namespace") else next(iter(spec.submodule_search_locations
                                                                                    or []), None)
        if where is None or _outside_user_tree(Path(where).resolve()):
            return None
        path = list(spec.submodule_search_locations or [])
        if i < len(parts) - 1 and not path:
            return None
    origin = getattr(spec, "origin", None)
    return Path(origin).resolve() if origin and origin.endswith(".py") and os.path.isfile(origin) else None


def _statements(body: list[ast.stmt]) -> Any:
    """Every statement, nested ones included (a function's lazy import too), without walking
    into expressions: a module's imports are statements."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def _imported_names(source: bytes, file: Path, search: list[str]) -> list[tuple[str, str, list[str]]]:
    """(the module as written, its name from where to look, where to look) for each module an
    import statement of a source file names: absolute ones on `search`, relative ones
    (`.helpers`) from their package's directory."""
    try:
        tree = ast.parse(source, str(file))
    except (SyntaxError, ValueError):
        return []
    out: list[tuple[str, str, list[str]]] = []
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            out += [(a.name, a.name, search) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = file.parent
                for _ in range(node.level - 1):
                    base = base.parent
                where, dots = [str(base)], "." * node.level
                if node.module:
                    out.append((dots + node.module, node.module, where))
                # `from . import helpers`, `from .pkg import sub`: the names may be modules too
                prefix = f"{node.module}." if node.module else ""
                out += [(dots + prefix + a.name, prefix + a.name, where) for a in node.names if a.name != "*"]
            elif node.module:
                out.append((node.module, node.module, search))
                out += [(f"{node.module}.{a.name}",) * 2 + (search,) for a in node.names if a.name != "*"]
    return out


@functools.lru_cache(maxsize=1024)
def _imports_of(file: Path, mtime_ns: int, size: int, search: tuple[str, ...]) -> tuple[tuple[str, Path], ...]:
    """(the module as written, its file) for each module of the user's tree `file` imports;
    asked again only when the file changed (a sweep asks for every point)."""
    try:
        source = read_bytes(file, "model.target", "model")
    except FileRefused:
        return ()
    out = []
    for shown, name, where in _imported_names(source, file, [*search, str(file.parent)]):
        if (found := _find(name, where)) is not None:
            out.append((shown, found))
    return tuple(out)


MAX_USER_MODULES = 256  # source files followed from a custom model's module: a whole project, not a crawl


def user_modules(entry: Path) -> dict[str, Path]:
    """{module name: file} of every module of the user's tree that `entry` (a custom model's
    module) imports, directly or through another such module: found in their source (import
    statements, resolved as Python would, nothing imported), so the sweeper checking a point,
    its job in another process and a later resume list the same files. Python's library,
    installed packages and the harness are not followed."""
    search = tuple(os.getcwd() if p == "" else p for p in sys.path) + (os.getcwd(),)
    out: dict[str, Path] = {}
    todo, seen = [entry.resolve()], {entry.resolve()}
    while todo and len(seen) <= MAX_USER_MODULES:
        file = todo.pop()
        try:
            st = os.stat(file)
        except OSError:
            continue
        for shown, found in _imports_of(file, st.st_mtime_ns, st.st_size, search):
            if found not in seen:
                seen.add(found)
                out[shown] = found
                todo.append(found)
    return out


def input_files(config: Any) -> dict[str, str]:
    """key -> path of every file a run with this Config reads beside the harness: the profile,
    a CSV schedule, a custom model's source file and the modules of the user's tree it imports
    (`model.target:<module>`), the records a generated schedule's costs come from."""
    out: dict[str, str] = {}
    if getattr(config, "profile", None):
        out["profile"] = str(config.profile)
    from harness.schedules.registry import SCHEDULES  # the schedules' package: imported when a point is

    entry = SCHEDULES.get(config.schedule.name)
    if entry is not None:  # the files its entry names (a CSV schedule's, the run a generated one's costs come from)
        out.update(entry.files(config.schedule))
    target = getattr(config.model, "target", None)
    if config.model.name == "custom" and target:
        module = target.rpartition(":")[0]
        entry: str | None = None
        if module.endswith(".py") or "/" in module or os.sep in module:
            entry = str(Path(module).expanduser().resolve())
        else:
            search = [os.getcwd() if p == "" else p for p in sys.path] + [os.getcwd()]
            found = _find(module, search)
            entry = str(found) if found is not None else None
        if entry is not None:
            out["model.target"] = entry
            for name, path in sorted(user_modules(Path(entry)).items()):
                out[f"model.target:{name}"] = str(path)
    return out


_KINDS = {"profile": "profile", "schedule.csv_path": "schedule_csv", "schedule.costs": "result"}  # safe_io.CAPS


def _sha256(key: str, path: str) -> str | None:
    """The file's sha256, read as safe_io reads it (a regular file within its kind's cap: a
    FIFO never blocks this); None where it cannot be read."""
    try:
        kind = _KINDS.get(key) or ("model" if key.startswith("model.") else "")
        if kind not in CAPS:  # a file a registered schedule names: the largest cap there is
            kind = max(CAPS, key=CAPS.__getitem__)
        return hashlib.sha256(read_bytes(path, key, kind)).hexdigest()
    except FileRefused:
        return None


def content_hash(point: str | None, code: dict | None, files: dict | None) -> str:
    """sha256 of what a record was made from: its point (point_hash, without a repeat suffix),
    the code (commit, diff, untracked files) and each input file's sha256, by key."""
    code = code or {}
    return _digest({"point": _REPEAT.sub("", point or ""),
                    "code": {k: code.get(k) for k in ("commit", "diff_sha256", "untracked_sha256")},
                    "files": {k: (v or {}).get("sha256") for k, v in sorted((files or {}).items())}})


def provenance(config: Any, point: str | None = None, started: float | None = None) -> dict:
    """result.json's `provenance`: `point` (point_hash of the config, with point_ids' ` #n` where
    its sweep has several of it: what resume and the report match records by), `identity`
    (content_hash: what resume compares), the code (`code_version`), each file it reads ({key:
    {path, sha256}}: `input_files`) and when it started (ISO 8601, UTC)."""
    point = point or point_hash(config)
    code = dict(code_version())
    files = {k: {"path": p, "sha256": _sha256(k, p)} for k, p in input_files(config).items()}
    return {"point": point, "identity": content_hash(point, code, files), "code": code, "files": files,
            "started_at": _iso(time.time() if started is None else started)}


def upgrade_provenance(prov: dict | None, config: dict) -> dict | None:
    """An older record's provenance (schema < 6: `point` its overrides) with `point` and
    `identity` computed from its stored config, as a new record's are: resume after an upgrade
    reruns only what changed."""
    if not isinstance(prov, dict) or not isinstance(config, dict):
        return prov
    old = prov.get("point") if isinstance(prov.get("point"), str) else None
    point = point_hash(config) + repeat_suffix(old)
    code = prov.get("code") if isinstance(prov.get("code"), dict) else {}
    files = prov.get("files") if isinstance(prov.get("files"), dict) else {}
    return {**prov, "point": point, "identity": content_hash(point, code, files)}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="microseconds")


# -- a record's point, wherever it came from ------------------------------------------------------

def point_of(record: dict, run_dir: Path) -> str | None:
    """A record's point: its provenance's (a record of schema < 6 has it computed from its
    stored config on reading). A record without provenance (from before it, or refused before
    its config was planned) is named by its job's overrides (.hydra/overrides.yaml, as such
    records always were); a job directory without a record by what its sweep's sweep.json says
    the job was (`jobs`), else by its overrides. None where nothing says."""
    prov = record.get("provenance")
    if isinstance(prov, dict) and isinstance(prov.get("point"), str):
        return prov["point"]
    if "config" in record:
        return overrides_point(Path(run_dir))
    return _job_point(Path(run_dir)) or overrides_point(Path(run_dir))


def overrides_point(run_dir: Path) -> str | None:
    """A job directory's point as its Hydra overrides name it (`point_key` of .hydra/overrides.yaml)."""
    path = run_dir / ".hydra" / "overrides.yaml"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) or os.stat(path).st_size > 2**20:
            return None
        import yaml

        overrides = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - unreadable, or not YAML: no point known
        return None
    return point_key(overrides) if isinstance(overrides, list) else None


def _job_point(run_dir: Path) -> str | None:
    from harness.records.locks import SWEEP_RECORD

    try:
        data = json.loads(read_bytes(run_dir.parent / SWEEP_RECORD, SWEEP_RECORD, "result"))
    except (FileRefused, ValueError):
        return None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    point = jobs.get(run_dir.name) if isinstance(jobs, dict) else None
    return point if isinstance(point, str) else None


def started_at(record: dict, path: Path) -> float:
    """When a record's job started (provenance), else its file's modification time; 0 unknown."""
    prov = record.get("provenance")
    if isinstance(prov, dict) and isinstance(prov.get("started_at"), str):
        try:
            return datetime.fromisoformat(prov["started_at"]).timestamp()
        except ValueError:
            pass
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
