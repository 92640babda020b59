"""The default sweeper (`hydra/sweeper: harness`, registered by hydra_plugins/harness_sweeper):
a sweep's points as Hydra's basic sweeper makes them (the product of every key's values), plus
two things. Built on Hydra's public plugin API (hydra.plugins.sweeper.Sweeper, hydra.core).

1. Every point is checked before the first job runs: composed, typed (`to_config`) and planned
   (`plan.make_plan`, which raises ConfigError in one line). A sweep with points that cannot
   run lists them, one line each (the point's swept overrides and why), runs nothing and exits
   2; with `run.skip_invalid=true` it lists them as skipped and runs the others (job numbers stay
   the points' own, so `<n>_...` means the same point with or without skipping).
2. Each point's config is composed cheaply. Hydra composes a job's config from scratch
   (defaults list, every YAML file, the merge: ~0.1 s) and the basic sweeper does it twice per
   job (once to check the batch, once to launch it). Points that differ from one already
   composed only in plain `key=value` overrides (not a config group, not `+`/`~`, not
   `hydra.*`) are that config, copied, with those values set as Hydra sets them (OmegaConf.update);
   the rest are composed by Hydra. Both give the same config (tests/test_cli.py compares them).

Imported by Hydra's plugin scan at every start (tab completion included): heavy imports
(torch, the planner) happen inside `sweep`.
"""

from __future__ import annotations

import copy
import functools
import gc
import itertools
import os
import pickle
import re
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.plugins.sweeper import Sweeper as HydraSweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from harness.frontend import signals
from harness.frontend.hydra_compat import BASIC_LAUNCHER_LOGGER, runs_jobs_here, untested_hydra

_POINT_IDS: dict[tuple[str, int], str] = {}  # (sweep dir, job number) -> its point's identity, for jobs in this process
FULL_ERRORS_ENV = "HARNESS_FULL_ERRORS"  # "1": this run shows whole errors (set by harness.frontend.cli)
# <sweep dir>/sweep.json: the points planned, launched and skipped (and why), what resume kept and ran again
from harness.records.disk_full import disk_full  # noqa: E402
from harness.records.locks import SWEEP_RECORD  # noqa: E402


class FastComposer:
    """A config loader whose `load_sweep_config` reuses configs it composed before (see the
    module's doc); every other member is the wrapped loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._parser = OverridesParser.create()
        self._templates: dict[tuple, tuple[bytes | DictConfig, list[Override]]] = {}
        self._kept: dict[tuple, DictConfig] = {}
        self._groups = set(loader.list_groups(""))  # top-level config groups: `model=gpt` is no value
        self.composed = self.copied = 0  # how many of each (tests, timing)

    KEEP = 256  # checked configs kept for launch; a larger sweep composes the rest again (cheaply)

    def __getattr__(self, name: str) -> Any:
        if name == "_loader":  # unpickling (a launcher sending it to a job): not set yet, no recursion
            raise AttributeError(name)
        return getattr(self._loader, name)

    def keep(self, overrides: Sequence[str], cfg: DictConfig) -> None:
        """`cfg` is what `load_sweep_config` returns next for these overrides (once)."""
        if len(self._kept) < self.KEEP:
            self._kept[tuple(overrides)] = cfg

    def _plain(self, o: Override) -> bool:
        """A value override that changes nothing but the value it sets."""
        return (o.type == OverrideType.CHANGE and o.package is None and not o.is_hydra_override()
                and not o.is_sweep_override() and "/" not in o.key_or_group and o.key_or_group not in self._groups)

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: Sequence[str]) -> DictConfig:
        overrides = list(sweep_overrides)
        kept = self._kept.pop(tuple(overrides), None)
        if kept is not None:
            return kept
        parsed = self._parser.parse_overrides(overrides)
        shape = (id(master_config),) + tuple(("v", o.key_or_group) if self._plain(o) else ("s", o.input_line)
                                             for o in parsed)
        hit = self._templates.get(shape)
        if hit is not None:
            base, base_parsed = hit
            changed = [o for o, b in zip(parsed, base_parsed) if o.input_line != b.input_line]
            keys = [o.key_or_group for o in parsed]
            if all(keys.count(o.key_or_group) == 1 for o in changed):
                return self._copy(master_config, base, parsed, changed)
        cfg = self._loader.load_sweep_config(master_config, overrides)
        self.composed += 1
        self._templates[shape] = (snapshot(cfg), parsed)
        return cfg

    def _copy(self, master: DictConfig, base: bytes | DictConfig, parsed: list[Override],
              changed: list[Override]) -> DictConfig:
        cfg = from_snapshot(base)
        for o in changed:  # as composition sets a plain value
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        app = [o for o in parsed if not o.is_hydra_override()]
        with open_dict(cfg.hydra), read_write(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in app]
            od = cfg.hydra.job.config.override_dirname
            cfg.hydra.job.override_dirname = override_dirname(app, od.exclude_keys, od.item_sep, od.kv_sep)
        OmegaConf.copy_cache(from_config=master, to_config=cfg)
        self.copied += 1
        return cfg


def snapshot(cfg: DictConfig) -> bytes | DictConfig:
    """A snapshot of `cfg` to make copies from: pickled (a copy is then one `pickle.loads`, ~6x
    faster than OmegaConf's node-by-node deepcopy: ~0.6 ms against ~4 ms a sweep point), or a
    deep copy where something in it does not pickle."""
    try:
        return pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return copy.deepcopy(cfg)


def from_snapshot(snap: bytes | DictConfig) -> DictConfig:
    """A fresh, independent copy of a `snapshot`."""
    return pickle.loads(snap) if isinstance(snap, bytes) else copy.deepcopy(snap)


def override_dirname(overrides: list[Override], exclude_keys: Sequence[str], item_sep: str, kv_sep: str) -> str:
    """hydra.job.override_dirname as Hydra makes it: the overrides sorted, joined, `=` as kv_sep."""
    lines = sorted(str(o.input_line) for o in overrides if o.key_or_group not in exclude_keys)
    return item_sep.join(lines).replace("=", kv_sep)


def expand(parsed: list[Override]) -> list[list[str]]:
    """Every point of a sweep, as Hydra's basic sweeper makes them: the product of each key's
    values (`a=1,2 b=range(3)`), keys in the order they first appear, the last given winning."""
    from harness.config import ConfigError

    values: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise ConfigError(f"{o.input_line}: not a list of values (allowed: key=a,b, choice(a,b), range(1,4))")
        values[key] = ([f"{key}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else
                       [f"{key}={o.get_value_element_as_str()}"])
    return [list(p) for p in itertools.product(*values.values())]


def shown(point: Sequence[str], varying: set[int]) -> str:
    """The point as its swept overrides (all of them when nothing varies)."""
    picked = [o for i, o in enumerate(point) if i in varying] or list(point)
    return " ".join(picked) or "defaults"


class Sweeper(HydraSweeper):
    """See the module's doc. Hydra instantiates it as hydra_plugins.harness_sweeper.HarnessSweeper,
    with hydra.sweeper's keys (harness/conf/hydra/sweeper/harness.yaml, as the basic sweeper's)."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        self.max_batch_size = max_batch_size  # jobs handed to a launcher at once (those in this process: 1)
        self.params = params or {}  # a preset's swept keys (hydra.sweeper.params), before the command line's
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self._hydra_set = False
        self.job_dirs: dict[int, Path] = {}  # point -> its job directory (checked points)
        self.hashes: dict[int, str] = {}  # point -> its identity (harness/records/identity.py point_hash; checked points)
        self.asked: dict[int, tuple[dict, dict]] = {}  # run.resume=true: point -> (planned config, provenance)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.composer = FastComposer(hydra_context.config_loader)
        self.hydra_context = HydraContext(config_loader=self.composer,  # type: ignore[arg-type]
                                          callbacks=hydra_context.callbacks)
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=self.hydra_context,
                                                                task_function=task_function, config=config)

    def problem(self, index: int, point: Sequence[str], cuda: Callable[[], int]) -> str | None:
        """Why this point cannot run (one line), or None. What the schema alone refuses is
        refused before torch is imported (`cuda` and the plan import it)."""
        from hydra.core.hydra_config import HydraConfig

        from harness.frontend.compose import to_config
        from harness.frontend.errors import hydra_problem
        from harness.config import ConfigError, check_values
        from harness.planning.early import check_early

        try:
            cfg = self.composer.load_sweep_config(self.config, list(point))
            with open_dict(cfg):
                cfg.hydra.job.num = cfg.hydra.job.id = index
            if not self._hydra_set:  # what ${hydra:...} reads while checking (the first point's; each job sets its own)
                HydraConfig.instance().set_config(copy.deepcopy(cfg))
                self._hydra_set = True
            from harness.runtime.cluster import job_dir, point_resources

            # a SLURM point plans with the GPUs and the ranks per node its allocation gives, not the login node's
            r = point_resources(cfg)
            c = to_config(cfg, cwd=cfg.hydra.runtime.cwd)
            check_values(c)
            check_early(c)  # what needs no model built, its shape at most: still before torch
            from harness.planning.plan import make_plan

            cuda_devices = cuda()
            if r is None:
                plan = make_plan(c, cuda_devices)
            else:
                plan = make_plan(c, r.nodes * r.gpus_per_node or cuda_devices,
                                 ranks_here=r.tasks_per_node if r.nodes > 1 or r.tasks_per_node > 1 else None)
            self.job_dirs[index] = job_dir(cfg)
            from harness.records.identity import point_hash, provenance

            self.hashes[index] = point_hash(plan.config)  # the resolved point: pp=02 is pp=2, a default is a default
            if c.run.resume:  # what resume compares a point's earlier record with (harness/job.py resume_why_not)
                from dataclasses import asdict

                self.asked[index] = (asdict(plan.config), provenance(plan.config, self.hashes[index]))
            self.composer.keep(point, cfg)  # launched as checked, not composed again
        except ConfigError as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 - composition (Hydra, OmegaConf) or planning: one line either way
            if os.environ.get(FULL_ERRORS_ENV) == "1":  # run.debug=true or HYDRA_FULL_ERROR=1: the whole error
                raise
            return hydra_problem(e, list(point))
        return None

    def sweep(self, arguments: list[str]) -> Any:
        try:
            return self._sweep(arguments)
        finally:
            gc.unfreeze()  # frozen while planning and running (_sweep, _run): collectable again

    def _sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        if problem := untested_hydra():
            print(f"harness: error: {problem}", file=sys.stderr, flush=True)
            sys.exit(2)
        from harness.config import ConfigError

        params = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        parsed = OverridesParser.create(config_loader=self.hydra_context.config_loader).parse_overrides(params)
        try:
            points = expand(parsed)
        except ConfigError as e:
            print(f"harness: error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        one_repeats(points)
        points = repeated(points, OmegaConf.select(self.config, "run.repeats", default=1))
        varying = {i for i in range(len(points[0]) if points else 0) if len({p[i] for p in points}) > 1}

        cuda = functools.cache(cuda_devices)  # imports torch: only once a point passes the schema
        if len(points) >= 100:
            print(f"[harness] planning {len(points)} sweep points before the first job", flush=True)
        bad, planned = [], False
        for i, p in enumerate(points):
            if (why := self.problem(i, p, cuda)) is not None:
                bad.append((i, p, why))
            elif not planned:  # what planning a first point imported (torch, the planner) is no garbage:
                gc.freeze()  # the collector's full passes over the other points skip it (~0.17 s each here)
                planned = True
        skip = bool(OmegaConf.select(self.config, "run.skip_invalid", default=False))
        if bad and not skip:
            for _, p, why in bad:
                print(f"harness: error: [{shown(p, varying)}] {why}", file=sys.stderr)
            rest = len(points) - len(bad)
            print(f"harness: error: {len(bad)} of {len(points)} sweep points cannot run; nothing ran"
                  + (f" (run.skip_invalid=true runs the other {rest})" if rest else ""), file=sys.stderr, flush=True)
            sys.exit(2)
        skipped = [f"[{shown(p, varying)}] {why}" for _, p, why in bad]
        for line in skipped:
            print(f"harness: skipped: {line}", file=sys.stderr)
        if bad:
            print(f"harness: skipping {len(bad)} of {len(points)} sweep points that cannot run (run.skip_invalid=true)",
                  file=sys.stderr, flush=True)

        from harness.job import rerun_statuses
        from harness.records.locks import Busy, DirLock

        try:
            rerun = rerun_statuses(OmegaConf.select(self.config, "run.rerun", default=None))
        except ConfigError as e:
            print(f"harness: error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        launch = {i: d for i, d in self.job_dirs.items() if i not in {j for j, _, _ in bad}}
        if why := job_dirs_problem(sweep_dir, launch, points, varying, self.config):
            print(f"harness: error: {why}; nothing written", file=sys.stderr, flush=True)
            sys.exit(2)
        try:  # every point is checked: now the directory is this sweep's (harness.records.locks.SweepLock checked it)
            lock = DirLock(sweep_dir).acquire()
        except Busy as e:
            print(f"harness: error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        except OSError as e:
            print(f"harness: error: hydra.sweep.dir={sweep_dir}: cannot create it ({e.strerror})", file=sys.stderr,
                  flush=True)
            sys.exit(2)
        try:
            return self._run(points, bad, varying, skipped, sweep_dir, rerun)
        finally:
            lock.release()

    def _summary(self) -> Any:
        """The sweep's SweepSummary callback (harness/frontend/callbacks.py), told what only this process knows."""
        for cb in getattr(getattr(self.hydra_context, "callbacks", None), "callbacks", []):
            if hasattr(cb, "note"):
                return cb
        return None

    def _note(self, **notes: Any) -> None:
        if (summary := self._summary()) is not None:
            summary.note(**notes)

    def _resume(self, points: list[Sequence[str]], ids: list[str | None], launch: list[int], varying: set[int],
                sweep_dir: Path, rerun: frozenset[str]) -> tuple[set[int], dict]:
        """run.resume=true: the points whose record stands, not launched; said one line each, and
        why the others with a record run again. A point's records are found by its identity
        (harness/records/identity.py: its resolved config, whatever its job number or how its
        overrides were written); of them, the newest made from what is asked now (the same
        content_hash: code and input files) is the one judged, else the newest (whose
        difference is then said: harness/job.py resume_why_not)."""
        from harness.job import resume_why_not
        from harness.records.identity import point_of, started_at
        from harness.report.load import scan
        from harness.records.result import RecordError, read

        found: dict[str, list[tuple[float, str, Any, Path]]] = {}
        for path in scan(sweep_dir).records:
            try:
                r = read(path)
            except RecordError:
                continue
            point = point_of({"config": r.config, "provenance": r.provenance}, path.parent)
            if point is not None:
                found.setdefault(point, []).append((started_at({"provenance": r.provenance}, path), str(path), r,
                                                    path.parent))
        kept, said = set(), {"kept": [], "rerun": []}
        for i in launch:
            if i not in self.asked:  # a point that says run.resume=false itself
                continue
            config, asked = self.asked[i]
            records = sorted(found.get(ids[i] or "", []), key=lambda t: t[:2], reverse=True)
            same = [t for t in records if (t[2].provenance or {}).get("identity") == asked["identity"]]
            _, _, stored, where = (same or records or [(0.0, "", None, self.job_dirs.get(i, sweep_dir))])[0]
            why = resume_why_not(stored, where, config, asked, rerun)
            if why is None:
                kept.add(i)
                said["kept"].append(where.name)
                print(f"harness: [{shown(points[i], varying)}] {stored.status} in an earlier run ({where.name}), "
                      "skipped (run.resume=true)", flush=True)
            elif stored is not None:
                said["rerun"].append([self.job_dirs[i].name, why])
                print(f"harness: [{shown(points[i], varying)}] running it again ({where.name}): {why}", flush=True)
        return kept, said

    def _run(self, points: list[Sequence[str]], bad: list, varying: set[int], skipped: list[str], sweep_dir: Path,
             rerun: frozenset[str]) -> Any:
        from harness.records.atomic import write_json_atomic, write_text
        from harness.records.identity import point_ids

        ids = point_ids([self.hashes.get(i) for i in range(len(points))])
        _POINT_IDS.update({(os.path.abspath(sweep_dir), i): pid for i, pid in enumerate(ids) if pid is not None})
        left_out = {i for i, _, _ in bad}
        resumed: dict = {}
        if OmegaConf.select(self.config, "run.resume", default=False):
            kept, resumed = self._resume(points, ids, [i for i in range(len(points)) if i not in left_out], varying,
                                         sweep_dir, rerun)
            left_out |= kept
        if why := others_records({i: d for i, d in self.job_dirs.items() if i not in left_out}, points, varying,
                                      self.hashes):
            print(f"harness: error: {why}; nothing run", file=sys.stderr, flush=True)
            sys.exit(2)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # what the progress and summary callbacks read (and a user may: which points were left out, why)
        # jobs: each job directory's point, this sweep's and earlier runs' into it (a directory without a
        # record is superseded by a newer record of its point: harness/report/load.py)
        jobs = {**_earlier_jobs(sweep_dir), **{self.job_dirs[i].name: ids[i] for i in range(len(points))
                                               if i not in left_out and i in self.job_dirs and ids[i]}}
        record = {"points": len(points), "launched": len(points) - len(left_out), "skipped": skipped,
                  **({"resume": resumed} if resumed else {}), "point_ids": ids, "jobs": jobs}
        try:
            write_text(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))  # OmegaConf.save's text, atomically
            write_json_atomic(sweep_dir / SWEEP_RECORD, record)
        except OSError as e:  # a full disk: the first job will say so, and the sweep stops there
            print(f"harness: warning: {sweep_dir}: {e.strerror}", file=sys.stderr, flush=True)
        self._note(resume=resumed)
        here = runs_jobs_here(self.launcher)
        locked: list[list[str]] = []
        if not here:  # jobs elsewhere take their own lock; one another harness holds now is left to it
            from harness.records.locks import holder

            for i in range(len(points)):
                if i not in left_out and i in self.job_dirs and (pid := holder(self.job_dirs[i])) is not None:
                    locked.append([self.job_dirs[i].name, f"being written by another harness, pid {pid}"])
                    left_out.add(i)
        # the interpreter's heap so far (torch, Hydra, the plans) is not garbage while the jobs run:
        # the collector's full passes (~0.15 s over it) then skip it; unfrozen when the sweep ends
        gc.freeze()
        try:
            return self._launch(points, segments(points, left_out, 1 if here else self.max_batch_size), varying,
                                here, locked)
        finally:
            self._note(locked=locked)

    def _launch(self, points: list[Sequence[str]], order: list[tuple[int, list]], varying: set[int], here: bool,
                locked: list[list[str]]) -> list:
        """Launches `order`'s segments one after another; the launcher's results, a list per
        segment. A job this process runs (`here`) holds its directory's lock for its whole run;
        a locked directory's job is skipped and listed in `locked`. A full disk, met by the
        launch or reported by a job, stops the sweep there and says how many points were not run."""
        from harness.runtime.launch import RankPool, sharing

        returns = []
        left = sum(len(seg) for _, seg in order)  # after the segment at hand
        # jobs in this process share their rank processes (ended before the summary)
        with sharing(RankPool() if here else None), _one_launch_line(left if here else None):
            for start, segment in order:
                left -= len(segment)
                lock = None
                signals.check()  # a signal during the last job, even one whose raise was lost, stops here
                try:
                    if here:  # the job's directory is this sweep's from before Hydra writes there to the job's end
                        lock, why = _job_lock(self.job_dirs.get(start))
                        if why is not None:
                            locked.append([self.job_dirs[start].name, why])
                            print(f"harness: [{shown(points[start], varying)}] not run: {why}", file=sys.stderr,
                                  flush=True)
                            continue
                    results = self.launcher.launch(segment, initial_job_idx=start)
                except OSError as e:
                    if not disk_full(e):
                        raise
                    self._stopped(start, points, e, left)
                    break
                finally:
                    if lock is not None:
                        lock.release()
                returns.append(results)
                if self._disk_full(results, start, locked, left):
                    break
        return returns

    def _disk_full(self, results: list, start: int, locked: list[list[str]], left: int) -> bool:
        """Reads a segment's job results: a job that found its directory locked joins `locked`;
        the first that ran out of disk is noted and said, and True stops the sweep."""
        full = None
        for k, r in enumerate(results):
            value = r.return_value  # a job's exception (run.debug=true) ends the sweep, as Hydra's sweeper does
            if isinstance(value, dict) and value.get("status") == "locked":
                locked.append([self._job_name(start + k), str(value.get("error"))])
            if isinstance(value, dict) and value.get("disk_full") and full is None:
                full = (start + k, str(value.get("error")))
        if full is None:
            return False
        self._note(disk_full={"job": self._job_name(full[0]), "error": full[1], "not_run": left})
        print(f"harness: error: {self._job_name(full[0])}: {full[1]}; the sweep stops here, {left} "
              "point(s) not run", file=sys.stderr, flush=True)
        return True

    def _job_name(self, i: int) -> str:
        return self.job_dirs[i].name if i in self.job_dirs else str(i)

    def _stopped(self, i: int, points: list[Sequence[str]], e: OSError, left: int) -> None:
        """Hydra's own writes for job i (.hydra/, app.log) found the disk full: the job's record
        where space allows, and the sweep stops."""
        from harness.records.atomic import write_json_atomic
        from harness.records.disk_full import disk_full_error
        from harness.records.record import RESULT
        from harness.records.result import Result

        error = disk_full_error(e)
        try:
            from dataclasses import asdict

            from harness.frontend.compose import to_config

            cfg = self.composer.load_sweep_config(self.config, list(points[i]))
            write_json_atomic(self.job_dirs[i] / RESULT,
                              Result("failed", error, asdict(to_config(cfg, cwd=cfg.hydra.runtime.cwd))).to_json())
        except Exception:  # noqa: BLE001 - no space for it either: the summary names the job all the same
            pass
        self._note(disk_full={"job": self._job_name(i), "error": error, "not_run": left})
        print(f"harness: error: {self._job_name(i)}: {error}; the sweep stops here, {left} point(s) not run",
              file=sys.stderr, flush=True)


def point_id(sweep_dir: Path, num: int) -> str | None:
    """A sweep job's identity (harness/records/identity.py point_ids) as its sweeper named it: from
    this process, else from <sweep dir>/sweep.json (a job run elsewhere); None where neither
    says (the job's own config then names it: identity.point_hash)."""
    if (found := _POINT_IDS.get((os.path.abspath(sweep_dir), num))) is not None:
        return found
    try:
        import json

        from harness.records.safe_io import read_text

        ids = json.loads(read_text(Path(sweep_dir) / SWEEP_RECORD, SWEEP_RECORD, "result")).get("point_ids")
        if isinstance(ids, list) and 0 <= num < len(ids) and isinstance(ids[num], str):
            return ids[num]
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _earlier_jobs(sweep_dir: Path) -> dict[str, str]:
    """sweep.json's `jobs` as an earlier run into this sweep directory left it ({} if none)."""
    import json

    from harness.records.safe_io import FileRefused, read_bytes

    try:
        jobs = json.loads(read_bytes(sweep_dir / SWEEP_RECORD, SWEEP_RECORD, "result")).get("jobs")
    except (FileRefused, ValueError, AttributeError):
        return {}
    if not isinstance(jobs, dict):
        return {}
    return {k: v for k, v in jobs.items() if isinstance(k, str) and isinstance(v, str) and (sweep_dir / k).is_dir()}


_OWN_SUBDIR = ("allowed: a relative path inside hydra.sweep.dir, without '..', different for every point, "
               "as the default ${hydra.job.num}_${harness.dirname:${hydra.job.override_dirname}}")


def job_dirs_problem(sweep_dir: Path, dirs: dict[int, Path], points: list[Sequence[str]], varying: set[int],
                     config: DictConfig) -> str | None:
    """Why these job directories (hydra.sweep.subdir expanded for every point to launch) cannot
    hold the sweep's records, in one line, or None: every job needs a directory of its own,
    inside the sweep's directory (not the sweep's directory itself: a subdir of '' or '.', nor
    out of it: an absolute path or '..'), a real directory where one is there already (not a
    link), with no link or FIFO where the job's files go (locks.unsafe_files)."""
    from harness.records.locks import run_files, unsafe_files

    raw = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir")  # as written, for the message
    seen: dict[str, int] = {}
    for i, d in sorted(dirs.items()):
        top, job = Path(os.path.abspath(sweep_dir)), Path(os.path.abspath(d))  # abspath: '..' folded away
        if not Path(d).is_relative_to(sweep_dir) or ".." in Path(d).relative_to(sweep_dir).parts or job == top:
            where = "is the sweep's directory itself" if job == top else "leaves the sweep's directory"
            return f"hydra.sweep.subdir={raw}: [{shown(points[i], varying)}] gets {d}, which {where} ({_OWN_SUBDIR})"
        key = os.path.normcase(str(job))
        if key in seen:
            return (f"hydra.sweep.subdir={raw}: [{shown(points[seen[key]], varying)}] and [{shown(points[i], varying)}] "
                    f"get the same job directory {job.relative_to(top)} ({_OWN_SUBDIR})")
        seen[key] = i
        for above in reversed(job.relative_to(top).parents[:-1]):  # the folders on the way (subdir a/b: a)
            if why := unsafe_files(top / above, (), own=True):
                return f"hydra.sweep.subdir={raw}: {why}"
        if why := unsafe_files(job, run_files(config), own=True):
            return f"[{shown(points[i], varying)}] {why}"
    return None


def others_records(dirs: dict[int, Path], points: list[Sequence[str]], varying: set[int],
                   hashes: dict[int, str]) -> str | None:
    """Why the points about to run would replace another point's record, or None: a job directory
    named by its number alone (hydra.sweep.subdir=${hydra.job.num}) held a different point in an
    earlier sweep whose values came in another order. Which point a directory holds is what
    identity.point_of says (its record's identity, computed from the stored config for a record
    of an older schema; for a directory without a record, what sweep.json says it was), compared
    with the identity of the point about to run (`hashes`); where only Hydra's overrides name it
    (a record from before provenance), with that point's overrides. A record of the same point
    is replaced, as a rerun's is. Reads only regular files (result.read, identity.point_of)."""
    from harness.records.identity import is_point_hash, overrides_point, point_key, point_of, repeat_suffix
    from harness.records.record import RESULT
    from harness.records.result import RecordError, read

    def base(point: str) -> str:  # ' #2': a point repeated with other run control alone (identity.point_ids)
        return point[:len(point) - len(repeat_suffix(point))]

    clashes = []
    for i, d in sorted(dirs.items()):
        if not d.is_dir():
            continue
        record: dict = {}
        if (d / RESULT).exists():
            try:
                r = read(d / RESULT)
                record = {"config": r.config, "provenance": r.provenance}
            except RecordError:
                pass
        theirs = point_of(record, d)
        mine = hashes.get(i) if theirs is not None and is_point_hash(theirs) else point_key(list(points[i]))
        if theirs is not None and mine is not None and base(theirs) != base(mine):
            clashes.append((i, d, overrides_point(d) or theirs))
    if not clashes:
        return None
    i, d, theirs = clashes[0]
    return (f"[{shown(points[i], varying)}] would write into {d}, which holds the record of another point ({theirs})"
            f"{f', and {len(clashes) - 1} more like it' if len(clashes) > 1 else ''}: hydra.sweep.subdir names jobs "
            "by their number alone and the values came in another order (allowed: a subdir that names the point, as "
            "the default ${hydra.job.num}_${harness.dirname:${hydra.job.override_dirname}}, or another hydra.sweep.dir)")



def _job_lock(directory: Path | None) -> tuple[Any, str | None]:
    """(the job directory's lock, taken; None) or (None, why another harness has it)."""
    from harness.records.locks import Busy, DirLock

    if directory is None:
        return None, None
    try:
        return DirLock(directory).acquire(), None
    except Busy as e:
        return None, str(e)


class _one_launch_line:
    """While jobs are launched one at a time (each under its directory's lock), Hydra's basic
    launcher says "Launching 1 jobs locally" before each: said once for all of them instead."""

    LOGGER = BASIC_LAUNCHER_LOGGER

    def __init__(self, jobs: int | None) -> None:
        self.jobs = jobs

    def filter(self, record: Any) -> bool:
        return not str(record.msg).startswith("Launching ")

    def __enter__(self) -> "_one_launch_line":
        import logging

        if self.jobs is not None:
            logger = logging.getLogger(self.LOGGER)
            if self.jobs:
                logger.info(f"Launching {self.jobs} jobs locally")
            logger.addFilter(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        import logging

        logging.getLogger(self.LOGGER).removeFilter(self)


def one_repeats(points: list[Sequence[str]], keys: tuple[str, ...] = ("repeats", "run.repeats")) -> None:
    """A sweep has one `run.repeats` (it says how often every point runs): `run.repeats=1,2` would make
    it a point's key, each job seeing its own and the sweep one, so it ran once, silently.
    Exit 2 in one line where the points carry more than one value of it."""
    values: dict[str, list[str]] = {}
    for p in points:
        for o in p:
            key, _, value = str(o).partition("=")
            if key.lstrip("+~") in keys and value not in values.setdefault(key.lstrip("+~"), []):
                values[key.lstrip("+~")].append(value)
    for key, seen in values.items():
        if len(seen) > 1:
            print(f"harness: error: {key}={','.join(seen)}: one value per sweep (allowed: a single {key}=N, which runs "
                  f"every point N times as repeat=0..N-1; to sweep the label, repeat=0,1,2)", file=sys.stderr,
                  flush=True)
            sys.exit(2)


def repeated(points: list[Sequence[str]], repeats: Any) -> list[Sequence[str]]:
    """Every point `repeats` times as repeat=0..repeats-1, the repeats outermost: each point's
    repeats are spread over the sweep, so a machine that drifts (load, heat) moves all points
    alike instead of biasing the ones that happened to run late. Bad values exit 2 in one line."""
    if repeats == 1 or not points:
        return points
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        print(f"harness: error: run.repeats={repeats!r}: must be an integer >= 1", file=sys.stderr, flush=True)
        sys.exit(2)
    if any(o.split("=", 1)[0].lstrip("+~") == "repeat" for o in points[0]):
        print(f"harness: error: run.repeats={repeats} with repeat swept too: run.repeats makes repeat=0..{repeats - 1} "
              "(allowed: one or the other)", file=sys.stderr, flush=True)
        sys.exit(2)
    return [[*p, f"repeat={r}"] for r in range(repeats) for p in points]


def segments(points: list[Sequence[str]], skipped: set[int], max_batch: int | None) -> list[tuple[int, list]]:
    """(first job number, points) for each run of consecutive points to launch: skipped points
    keep their numbers, and batches are at most max_batch long (None or -1: no limit)."""
    out: list[tuple[int, list]] = []
    for i, p in enumerate(points):
        if i in skipped:
            continue
        last = out[-1] if out else None
        if last and last[0] + len(last[1]) == i and (max_batch in (None, -1) or len(last[1]) < max_batch):
            last[1].append(p)
        else:
            out.append((i, [p]))
    return out


def cuda_devices() -> int:
    """GPUs here, as a job plans with them (torch.cuda.device_count(): NVML, no CUDA context)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
