"""The command line: every bad input is one line, `harness: error: <key>=<value>: <what is
allowed>`, exit 2, before any process or allocation; a sweep plans every point first; Hydra's
own features (tab completion, --config-dir presets, interpolations, quoted values) work;
relative paths are the user's; long sweeps get short job directories.

Every case but one runs `harness.frontend.cli.main()` in this process (a subprocess costs ~4 s); the
last runs the installed `harness` script from another directory. `microbatches=1000000000`
is refused in milliseconds: were the cap checked after building the schedule, that case
alone would take minutes and gigabytes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.frontend import cli
from harness.config import job_dirname, schema_keys
from harness.records.jsonsafe import strict
from harness.report.runs import job_id

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["wandb.mode=disabled", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled", "hydra.output_subdir=null"]


def harness(monkeypatch, capsys, *args: str, argv0: str = "harness") -> tuple[int, str, str]:
    """`harness ARGS` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", [argv0, *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def write_profile(path: Path, layers: int = 8, **bad: object) -> str:
    """A per-layer profile for the default mlp, with `bad` set in layer 0's entry at B=4."""
    entry = {"fwd_s": 1e-3, "bwd_s": 2e-3, "fwd_flops": 1e6}
    rows = [{"index": i, "kind": "linear", "params": 100, "by_microbatch": {"4": dict(entry, **(bad if i == 0 else {}))}}
            for i in range(layers)]
    path.write_text(json.dumps({"layers": rows}))  # json writes NaN / Infinity, as a sloppy profiler would
    return path.name


@pytest.fixture
def files(tmp_path):
    (tmp_path / "random.csv").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "idle_rank.csv").write_text("0F0,1F0,1B0,0B0\n\n")
    for name, bad in [("nan.json", {"fwd_s": float("nan")}), ("negative.json", {"fwd_s": -1.0})]:
        write_profile(tmp_path / name, **bad)
    return tmp_path


BAD = [
    # the schema (struct mode): unknown keys with a did-you-mean, types, Hydra's own errors
    (["ppp=2"], "ppp=2: unknown key (did you mean pp?)"),
    (["+typo=1"], "typo=1: unknown key"),
    (["+model.hiden=3"], "model.hiden=3: unknown key (did you mean model.hidden?)"),
    (["+model.dropout=0.1"], "model.dropout=0.1: unknown key (every key is listed in harness/config.py)"),  # no hf arch
    (["+model.head=2"], "model.head=2: unknown key (model=mlp has no key like it; model.heads is model=gpt's, model=hf's)"),
    (["model=gpt", "+model.head=2"], "model.head=2: unknown key (did you mean model.heads?)"),
    (["+schedule.foo=1"], "schedule.foo=1: unknown key (every key is listed"),  # not "did you mean schedule?"
    # ~key: a key or group the schema always sets, refused (it would run the default); not a key at all, unknown
    (["~pp"], "~pp: pp always has a value (the schema's default: pp=4): set it instead (pp=<value>)"),
    (["~pp=4"], "~pp=4: pp always has a value"),
    (["model=gpt", "~model.heads"], "~model.heads: model.heads always has a value (the schema's default: model.heads=4)"),
    (["~model.hidden"], "~model.hidden: model.hidden always has a value (the schema's default: model.hidden=256)"),
    (["~run"], "~run: run is a section the schema always has: set its keys instead (run.max_processes=<value>)"),
    (["~model"], "~model: model always has an option (the schema's default: model=mlp): choose another instead"),
    (["~schedule"], "~schedule: schedule always has an option (the schema's default: schedule=1f1b)"),
    (["~ppp"], "~ppp: unknown key (did you mean pp?)"),
    (["pp=abc"], "pp=abc: must be an integer"),
    (["pp=[1,2]"], "pp=[1,2]: must be an integer"),
    (["checkpointing=maybe"], "checkpointing=maybe: must be true or false"),
    (["model=custom", "model.kwargs=3"], "model.kwargs=3: must be a dict"),
    (["model.kwargs=3"], "model.kwargs=3: not a key of model=mlp (it is model=custom's)"),
    (["model.heads=2"], "model.heads=2: not a key of model=mlp (it is model=gpt's, model=hf's)"),
    (["model.name=gpt"], "model.name=gpt: set the option with model=gpt (its keys come with it)"),
    (["cluster=nope"], "cluster=nope: unknown (allowed: dgx_a100_80gb, dgx_h100, h200_8nodes, h200_node, here)"),
    (["cluster.nodes=2"], "cluster.nodes=2: no cluster to set it on (choose one first: cluster=<preset>"),
    (["cluster=h200_node", "cluster.nodes=0"], "cluster.nodes=0: must be an integer >= 1"),
    (["wandb=3"], "wandb=3: is a group of keys, not a value (set one of them: mode, project, entity)"),
    (["schedule=nope"], "schedule=nope: unknown (allowed: 1f1b, csv, dualpipev, gpipe, interleaved_1f1b, zb_1p, zb_2p, zb_auto, zb_h1, zb_h2, zbv)"),
    (["experiment=nope"], "experiment=nope: unknown (allowed: auto_schedule, balance, bubble,"),
    (["+scenario=nope"], "+scenario=nope: unknown (allowed: cpu_real, h200_emulated)"),
    (["hydra/launcher=nope"], "hydra/launcher=nope: unknown (allowed: basic, slurm,"),
    (["pp=[1,2"], "pp=[1,2: not an override Hydra can parse"),
    (["pp=2,4"], "pp=2,4: several values need -m to sweep them (one list: pp=[2,4]; one string: pp='2,4')"),
    (["+pp=3"], "+pp=3: pp is already set: drop the + to change it"),
    (["hydra.job.chdirr=true"], "hydra.job.chdirr=true: unknown Hydra key"),
    (["microbatches=${nope}"], "microbatches=${nope}: no key nope to interpolate"),
    (["hydra.run.dir=/proc/x"], "hydra.run.dir=/proc/x: cannot create it"),
    # values the schema takes but no run can use
    (["pp=0"], "pp=0: must be an integer >= 1"),
    (["microbatches=0"], "microbatches=0: must be an integer >= 1"),
    (["microbatch_size=-1"], "microbatch_size=-1: must be an integer >= 1"),
    (["pp=12"], "pp=12: 12 stages, more than the model's 8 layers"),
    (["schedule=dualpipev", "microbatches=2"], "microbatches=2: dualpipev needs at least 2 * pp = 8"),
    (["microbatches=1000000000"], "microbatches=1000000000: pp=4 x 1 chunks x 1000000000 microbatches x 3 = "
                                  "12,000,000,000 schedule actions, more than 1,000,000 (allowed: microbatches <= 83333)"),
    (["microbatch_size=1000000000"], "microbatch_size=1000000000: the activations of this machine's"),
    (["model.hidden=1000000000"], "model.hidden=1000000000: the activations of this machine's"),
    (["model=gpt", "model.seq=1000000000"], "model.seq=1000000000: the activations of this machine's"),
    (["model.layers=100000000", "pp=2"], "model.layers=100000000: 100,000,000 layers, more than 65,536"),
    (["lr=nan"], "lr=nan: must be a finite number"),
    (["run.timeout_s=nan"], "run.timeout_s=nan: must be a finite number"),
    (["run.timeout_s=1e-9"], "run.timeout_s=1e-09: must be at least 1 s"),
    (["cost.fwd_ms_per_layer=nan"], "cost.fwd_ms_per_layer=nan: must be a finite number"),
    (["cost.bwd_over_fwd=-1"], "cost.bwd_over_fwd=-1.0: must be >= 0"),
    (["comm.latency_s=inf"], "comm.latency_s=inf: must be a finite number"),
    (["comm.bandwidth_Bps=-1"], "comm.bandwidth_Bps=-1.0: must be >= 0"),
    (["seed=1e20"], "seed=1e20: must be an integer"),
    (["seed=100000000000000000000"], "seed=100000000000000000000: must be an integer in 0..9223344366820"),
    (["run.fault=raise@rank9,step2"], "run.fault=raise@rank9,step2: rank or step outside this run"),  # unquoted, as the README
    # run control moved into run.*: the old key says where it went
    (["timeout_s=60"], "timeout_s=60: timeout_s moved to run.timeout_s (write run.timeout_s=60)"),
    (["fault=raise@rank1,step2"], "fault='raise@rank1,step2': fault moved to run.fault"),
    # files that are not what they claim
    (["schedule=csv", "schedule.csv_path=random.csv"], "random.csv: schedule CSV: not UTF-8 text (byte 128 is 0x80)"),
    (["schedule=csv", "schedule.csv_path=idle_rank.csv", "pp=2", "microbatches=1"],
     "idle_rank.csv: schedule CSV row 2 (rank 1): no actions"),
    (["partition=profile", "profile=nan.json"], "nan.json: layer 0, microbatch size 4: fwd_s=nan (allowed: a finite"),
    (["partition=profile", "profile=negative.json"], "negative.json: layer 0, microbatch size 4: fwd_s=-1.0"),
]


@pytest.mark.grid  # 40 cases, Hydra composing each (~0.4 s): every other one in make test, all in make test-all
@pytest.mark.parametrize("args,expected", [pytest.param(*case, id=" ".join(case[0]), marks=[pytest.mark.slow] * (i % 2))
                                           for i, case in enumerate(BAD)])
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, files, args, expected):
    monkeypatch.chdir(files)
    code, out, err = harness(monkeypatch, capsys, *args, *QUIET, "executor=native")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("harness: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in err and "harness: records" not in out
    assert not list(files.rglob("trace.json"))  # no worker ran


def test_debug_shows_the_full_error(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="Error merging override pp=abc"):
        harness(monkeypatch, capsys, "pp=abc", "run.debug=true")
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(Exception, match="Could not override 'ppp'"):
        harness(monkeypatch, capsys, "ppp=2")
    assert os.environ["HYDRA_FULL_ERROR"] == "1"  # restored as it was


def test_every_schema_key_is_typed():
    keys = schema_keys()
    assert {"pp", "run.skip_invalid", "model.hidden", "cost.time_scale", "wandb.mode"} <= set(keys)


# --- sweeps: every point planned before the first job ------------------------------------

SIM = ["executor=sim", "steps=1", "warmup_steps=0", *QUIET]


def test_a_sweep_with_a_bad_point_runs_nothing_and_lists_it(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, err = harness(monkeypatch, capsys, "-m", "pp=2,9", "microbatches=1,2", *SIM,
                             f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("harness: ")]
    assert lines == [
        "harness: error: [pp=9 microbatches=1] pp=9: 9 stages, more than the model's 8 layers (allowed: pp x chunks "
        "per rank <= 8, or raise model.layers)",
        "harness: error: [pp=9 microbatches=2] pp=9: 9 stages, more than the model's 8 layers (allowed: pp x chunks "
        "per rank <= 8, or raise model.layers)",
        "harness: error: 2 of 4 sweep points cannot run; nothing ran (run.skip_invalid=true runs the other 2)"]
    assert not list((tmp_path / "sweep").rglob("result.json")) and "[harness] job" not in out


def test_skip_invalid_runs_the_rest_and_lists_what_it_skipped(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    code, out, err = harness(monkeypatch, capsys, "-m", "pp=9,2", "microbatches=1,2", "run.skip_invalid=true", *SIM,
                             f"hydra.sweep.dir={sweep}")
    assert code == 0, err
    assert "harness: skipped: [pp=9 microbatches=1] pp=9: 9 stages" in err
    assert "harness: skipping 2 of 4 sweep points that cannot run (run.skip_invalid=true)" in err
    records = {p.parent.name: json.loads(p.read_text()) for p in sweep.rglob("result.json")}
    assert sorted(job_id(d) for d in records) == ["2", "3"]  # the points' own numbers
    assert all(r["status"] == "ok" for r in records.values())
    assert "job 1/2 " in out and "2 ok, 2 skipped" in out


def test_a_composition_error_in_one_point_is_listed(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, _, err = harness(monkeypatch, capsys, "-m", "schedule=gpipe,nope", "pp=abc,2", *SIM,
                           f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert code == 2
    assert "harness: error: [schedule=gpipe pp=abc] pp=abc: must be an integer" in err
    assert "harness: error: [schedule=nope pp=2] schedule=nope: unknown (allowed: 1f1b," in err
    assert "3 of 4 sweep points cannot run" in err


def test_copied_configs_equal_composed_ones():
    """The sweeper's shortcut (a composed config, copied, with only values changed) gives
    Hydra's own composition, job directory name and overrides included."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from harness.frontend.compose import register
    from harness.frontend.sweeper import FastComposer

    register()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="harness.conf", version_base="1.3"):
        loader = GlobalHydra.instance().hydra.config_loader
        master = loader.load_configuration("config", ["hydra.sweep.dir=/tmp/x", "executor=sim"], RunMode.MULTIRUN)
        fast = FastComposer(loader)
        points = [["schedule=gpipe", f"microbatches={m}", f"pp={p}", "cost.time_scale=2.0"]
                  for p, m in ((2, 1), (4, "${pp}"), (4, 3))] + [["schedule=1f1b", "microbatches=5", "pp=2",
                                                                   "cost.time_scale=2.0"]]
        for point in points:
            ours, hydras = fast.load_sweep_config(master, point), loader.load_sweep_config(master, point)
            assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(hydras), point
            for node in (lambda c: c, lambda c: c.hydra, lambda c: c.model):  # the same flags, copied or composed
                assert (OmegaConf.is_struct(node(ours)), OmegaConf.is_readonly(node(ours))) == \
                       (OmegaConf.is_struct(node(hydras)), OmegaConf.is_readonly(node(hydras))), point
            ours.pp = 99  # a job's config is its own: the next copy does not see it
        assert (fast.composed, fast.copied) == (2, 2)


# --- Hydra's own: completion, presets, interpolation, quoting ------------------------------

def test_tab_completion(monkeypatch, capsys, tmp_path):
    """The install script binds every way the README runs the harness, and a query under any
    python completes as under `harness`: no internal schema_* options among a group's."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = harness(monkeypatch, capsys, "-sc", "install=bash", argv0=str(ROOT / "harness" / "__main__.py"))
    bound = out.strip().splitlines()[-1].split("-F hydra_bash_completion ")[1].split()
    assert code == 0 and {"python", "python3", "python3.11", "python3.13", "harness"} <= set(bound)
    assert 'helper="${words[0]} -m harness"' in out and '"${words[0]##*/}" =~ ^python[0-9.]*$' in out
    assert harness(monkeypatch, capsys, "-sc", "install=zsh", argv0="/x/bin/harness")[1] == out  # zsh: through bashcompinit
    code, out, _ = harness(monkeypatch, capsys, "-sc", "uninstall=bash")
    assert code == 0 and "unset hydra_bash_completion" in out and "complete -r python python3 " in out
    for line, expected in [("python -m harness schedule=g", ["schedule=gpipe"]),
                           (".venv/bin/python -m harness schedule=g", ["schedule=gpipe"]),
                           ("/usr/bin/python3.12 -m harness model.hid", ["model.hidden="]),
                           ("harness model.hid", ["model.hidden="]),
                           ("harness model=", [f"model={m}" for m in ("custom", "gpt", "gpt2_small", "hf", "mlp")])]:
        monkeypatch.setenv("COMP_LINE", line)
        code, out, _ = harness(monkeypatch, capsys, "-sc", "query=bash")
        assert code == 0 and out.split() == expected, line
    monkeypatch.setenv("COMP_LINE", "harness schedule=")
    assert not [o for o in harness(monkeypatch, capsys, "-sc", "query=bash")[1].split() if "schema" in o]


@pytest.mark.subprocess
def test_tab_completion_in_bash(tmp_path):
    """The installed script in a real bash, as the shell calls it on <TAB> (each query a fresh
    interpreter: ~1 s): `.venv/bin/python -m harness`, `python3.11 -m harness` and the `harness`
    console script complete; another module run with -m gets nothing from it."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    bin_dir, venv = tmp_path / "bin", tmp_path / ".venv" / "bin"
    for path in (bin_dir / "python", bin_dir / "python3.11", venv / "python"):  # this interpreter under those names
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        path.chmod(0o755)
    (bin_dir / "harness").write_text(f"#!{sys.executable}\nimport sys\nfrom harness.frontend.cli import main\n"
                                     "sys.exit(main())\n")  # what pip writes for the console script
    (bin_dir / "harness").chmod(0o755)
    lines = [".venv/bin/python -m harness schedule=g", "python3.11 -m harness model.hid", "harness schedule=zb_h",
             "python -m other schedule=g"]
    script = ['eval "$(python -m harness -sc install=bash)"']
    for line in lines:
        script += [f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}; words=($COMP_LINE); '
                   "COMP_CWORD=$(( ${#words[@]} - 1 )); COMPREPLY=(); hydra_bash_completion; "
                   'echo "[${COMPREPLY[*]}]"']
    script += ["complete -p python3.11 harness"]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([bash, "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout.splitlines()
    assert out[:4] == ["[schedule=gpipe]", "[model.hidden=]", "[schedule=zb_h1 schedule=zb_h2]", "[]"], p.stdout
    assert out[4:] == [f"complete -o default -o nospace -F hydra_bash_completion {n}" for n in ("python3.11", "harness")]


def test_internal_options_are_in_no_listing(monkeypatch, capsys, tmp_path):
    """The options' dataclasses (harness_schema_<group>_<option>) are no options: --help lists
    none, and a glob sweep over a group takes its YAML options only, while the options still
    type their keys."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from harness.frontend.compose import compose_config, register

    monkeypatch.chdir(tmp_path)
    code, out, _ = harness(monkeypatch, capsys, "--help")
    assert code == 0 and "schedule: 1f1b, csv, dualpipev," in out and "schema" not in out.partition("== Config ==")[0]
    register()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="harness.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        parser = OverridesParser.create(config_loader=loader)
        for group in ("schedule", "model", "partition", "optimizer"):
            options = list(parser.parse_overrides([f"{group}=glob(*)"])[0].sweep_string_iterator())
            assert options and not [o for o in options if "schema" in o], options
    GlobalHydra.instance().clear()
    assert type(compose_config(["model=gpt"]).model).__name__ == "GPTConfig"
    code, _, err = harness(monkeypatch, capsys, "schedule=zb_auto", "schedule.memory_limit=abc", *QUIET)
    assert code == 2 and "schedule.memory_limit=abc: must be" in err, err


def test_a_glob_sweep_runs_the_options_only(monkeypatch, capsys, tmp_path):
    """`schedule=glob(*zb_auto)` was zb_auto and its dataclass's entry, schema_zb_auto: one point now."""
    monkeypatch.chdir(tmp_path)
    code, out, err = harness(monkeypatch, capsys, "-m", "schedule=glob(*zb_auto)", *SIM, "pp=2", "microbatches=2",
                             f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert code == 0, err
    records = [json.loads(p.read_text()) for p in (tmp_path / "sweep").rglob("result.json")]
    assert [r["config"]["schedule"]["name"] for r in records] == ["zb_auto"]


def test_deleting_what_may_go(monkeypatch, capsys, tmp_path):
    """~ stays for what may go: an optional group's choice; a required one is refused by the
    tools' composition too."""
    from harness.config import ConfigError
    from harness.frontend.compose import compose_config

    assert compose_config(["cluster=h200_node", "~cluster"]).cluster is None
    assert compose_config(["experiment=dp", "~experiment"]).pp == 4
    with pytest.raises(ConfigError, match=r"^~microbatches: microbatches always has a value"):
        compose_config(["~microbatches"])


@pytest.mark.grid  # ~600 misspellings, each checked against the schema (~3 ms idle)
def test_suggestions_are_keys_of_the_chosen_option():
    """Every "did you mean X?" names a key the config has with the option chosen, for typos of
    every key (a letter dropped, two swapped): a group's under each of its options,
    the others under the defaults."""
    from harness.config import OPTIONS, keys_of, unknown_key

    every = sorted(schema_keys())
    cases = [(None, None, [k for k in every if k.partition(".")[0] not in OPTIONS])]
    cases += [(g, o, [k for k in every if k.startswith(f"{g}.")]) for g, options in OPTIONS.items() for o in options]
    checked = 0
    for group, option, keys in cases:
        real = keys_of({group: option} if group else None)
        for key in keys:
            section, _, leaf = key.rpartition(".")
            for typo in {leaf[:-1], leaf[1:2] + leaf[:1] + leaf[2:]} - {leaf, ""}:
                wrong = f"{section}.{typo}" if section else typo
                if wrong not in real:
                    near = re.search(r"did you mean (\S+)\?", unknown_key(wrong, 1, option))
                    assert near is None or near.group(1) in real, (wrong, option, near.group(1))
                    checked += 1
    assert checked > 300


def test_config_dir_presets_interpolation_and_quotes(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "model").mkdir()
    (tmp_path / "mine" / "experiment" / "mine.yaml").write_text("# @package _global_\nexecutor: sim\npp: 2\n")
    (tmp_path / "mine" / "model" / "tiny.yaml").write_text("# @package model\nname: mlp\nlayers: 4\nhidden: 16\n")
    code, out, err = harness(monkeypatch, capsys, "--config-dir", "mine", "experiment=mine", "model=tiny",
                             "microbatches=${pp}", "wandb.project='my study, v2'", "steps=1", *QUIET,
                             f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0, err
    c = json.loads((tmp_path / "run" / "result.json").read_text())["config"]
    assert (c["executor"], c["pp"], c["microbatches"], c["model"]["layers"], c["wandb"]["project"]) == \
        ("sim", 2, 2, 4, "my study, v2")
    code, _, err = harness(monkeypatch, capsys, "--config-dir", "mine", "experiment=other", *QUIET)
    assert code == 2 and "experiment=other: unknown (allowed: auto_schedule, balance, bubble, checkpointing, dp, memory, mine," in err


def test_relative_paths_are_the_users_also_under_chdir(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "examples" / "my_model.py", tmp_path / "my_model.py")
    (tmp_path / "s.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    write_profile(tmp_path / "p.json", layers=6)
    code, _, err = harness(monkeypatch, capsys, "model=custom", "model.target=my_model.py:build", "schedule=csv",
                           "schedule.csv_path=s.csv", "profile=p.json", "partition=profile", "pp=2",
                           "microbatches=2", "executor=sim", "steps=1", "hydra.job.chdir=true", *QUIET,
                           f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0, err
    c = json.loads((tmp_path / "run" / "result.json").read_text())["config"]
    assert c["model"]["target"] == f"{tmp_path}/my_model.py:build"
    assert (c["schedule"]["csv_path"], c["profile"]) == (str(tmp_path / "s.csv"), str(tmp_path / "p.json"))
    assert Path.cwd() == tmp_path


def test_long_sweeps_get_short_job_directories(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    many = [f"cost.{k}={v}" for k, v in [("fwd_ms_per_layer", 1.5), ("bwd_over_fwd", 2.5), ("fixed_fraction", 0.25),
                                         ("weight_grad_share", 0.4), ("time_scale", 1.0), ("at_microbatch_size", 4)]]
    many += ["comm.latency_s=0.0002", "comm.bandwidth_Bps=1000000000", "seed=3", "lr=0.02", "checkpoint_every=0",
             "model.hidden=32", "wandb.project=" + "p" * 120, "microbatch_size=4"]
    code, _, err = harness(monkeypatch, capsys, "-m", "microbatches=1,2", "pp=2", *many, *SIM,
                           f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert code == 0, err
    jobs = sorted(p.parent.name for p in (tmp_path / "sweep").rglob("result.json"))
    assert len(jobs) == 2 and all(len(j.encode()) <= 110 for j in jobs)
    assert [job_id(j) for j in jobs] == ["0", "1"]


def test_job_dirname():
    assert job_dirname("microbatches=2,pp=4") == "microbatches=2,pp=4"
    assert job_dirname("profile=data/x.json") == "profile=data-x.json"  # one directory per job
    long = ",".join(f"key{i}=value{i}" for i in range(40))
    short = job_dirname(long)
    assert len(short.encode()) <= 100 and short.startswith("key0=value0,key1=value1")
    assert short != job_dirname(long + ",x=1")  # the hash keeps points apart


def test_quote_fault():
    assert cli.quote_fault("run.fault=raise@rank1,step2") == "run.fault='raise@rank1,step2'"
    assert cli.quote_fault("run.fault=raise@rank1,step0,kill@rank0,step0,null") == \
        "run.fault='raise@rank1,step0','kill@rank0,step0',null"
    assert cli.quote_fault("run.fault='raise@rank1,step2'") == "run.fault='raise@rank1,step2'"
    assert cli.quote_fault("pp=2,4") == "pp=2,4"


def test_strict_json_has_no_nan_or_infinity():
    reasons: list[str] = []
    obj = {"a": float("nan"), "b": [1.0, float("inf"), {"c": -float("inf")}], "d": (2, "x"), "e": None}
    out = strict(obj, reasons)
    assert out == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, "x"], "e": None}
    assert json.dumps(out, allow_nan=False)
    assert reasons == ["a: nan written as null (not a finite number)", "b[1]: inf written as null (not a finite number)",
                       "b[2].c: -inf written as null (not a finite number)"]


# --- the real command, installed, run elsewhere (one subprocess) --------------------------------

@pytest.mark.subprocess
def test_the_console_script_runs_elsewhere_with_relative_paths(tmp_path):
    """`harness` from a directory outside the checkout: the config package, the sweeper
    plugin and a relative profile are found; the record holds the absolute path."""
    script = Path(sys.executable).parent / "harness"
    if not script.exists():
        pytest.skip("no harness console script in this environment (pip install -e .)")
    write_profile(tmp_path / "p.json")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    p = subprocess.run([str(script), "-m", "executor=sim", "partition=profile", "profile=p.json", "pp=2",
                        "microbatches=2", "steps=1", "hydra.job.chdir=true", *QUIET, "hydra.sweep.dir=sweep"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    records = [json.loads(r.read_text()) for r in (tmp_path / "sweep").rglob("result.json")]
    assert [(r["status"], r["config"]["profile"]) for r in records] == [("ok", str(tmp_path / "p.json"))]


@pytest.mark.subprocess
def test_a_refusal_never_imports_torch(tmp_path):
    """`python -m harness pp=0 hydra.run.dir=.` in a fresh interpreter refuses in one line, exit 2, without
    importing torch (what keeps --help and a refusal under a second; how fast is make bench's:
    tests/bench/test_bench_cli.py, which also runs --help and tab completion)."""
    from tests.bench.test_bench_cli import CASES, run

    args, code = CASES["refusal"]
    p = run(args, tmp_path)
    assert p.returncode == code and p.stderr.startswith("harness: error: "), p.stderr[-2000:]
    assert "TORCH False" in p.stderr, p.stderr[-2000:]


SHAPE_REFUSALS = {  # refusals that need only the model's shape (harness/planning/early.py)
    "mlp": (["pp=16", "model=mlp", "model.layers=8"], "pp=16: 16 stages, more than the model's 8 layers"),
    "gpt": (["pp=16", "model=gpt", "model.layers=8"], "pp=16: 16 stages, more than the model's 10 layers"),
    "interleaved": (["pp=4", "model.layers=6", "schedule=interleaved_1f1b", "virtual_stages=2", "microbatches=4"],
                    "pp=4: 8 stages, more than the model's 6 layers"),
    "explicit": (["pp=2", "partition=explicit", "partition.layers_per_stage=[3,3]"],
                 "partition.layers_per_stage=[3, 3]: entries must be >= 1 and sum to the model's 8 layers"),
}


@pytest.mark.subprocess
@pytest.mark.parametrize("case", list(SHAPE_REFUSALS))
def test_a_refusal_from_the_models_shape_never_imports_torch(tmp_path, case):
    """A refusal that planning makes once the model is built (more stages than layers, an explicit
    partition that does not add up), where the layer count follows from the config: one line,
    exit 2, in a fresh interpreter that never imports torch, and nothing written."""
    from tests.bench.test_bench_cli import run

    args, expected = SHAPE_REFUSALS[case]
    p = run([*args, "hydra.run.dir=out", "wandb.mode=disabled"], tmp_path)
    lines = [line for line in p.stderr.splitlines() if not line.startswith("TORCH ")]
    assert p.returncode == 2 and len(lines) == 1 and p.stdout == "", p.stderr
    assert lines[0].startswith(f"harness: error: {expected}"), p.stderr
    assert "TORCH False" in p.stderr, p.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
def test_a_sweep_refused_for_its_models_shape_never_imports_torch(tmp_path):
    """A sweep whose every point has more stages than layers: listed, exit 2, no torch, nothing written."""
    from tests.bench.test_bench_cli import run

    p = run(["-m", "pp=9,16", "model.layers=8", "hydra.sweep.dir=sweep", "wandb.mode=disabled"], tmp_path)
    assert p.returncode == 2, p.stderr
    assert "pp=9: 9 stages, more than the model's 8 layers" in p.stderr, p.stderr
    assert "TORCH False" in p.stderr, p.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_make_sweeps_job_directory_override_parses(tmp_path, run_harness):
    """The `hydra.sweep.subdir=` make sweep passes its later parts (Makefile SUBDIR), as the
    shell hands it over: Hydra's grammar takes a nested interpolation only when quoted."""
    text = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    (subdir,) = re.findall(r"^SUBDIR = '(.*)'$", text, flags=re.M)
    arg = subdir.replace("$(1)", "ckpt").replace("$$", "$")
    r = run_harness("-m", "executor=sim", "pp=2", "microbatches=2,4", "wandb.mode=disabled",
                    f"hydra.sweep.dir={tmp_path}/s", arg, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(d.name.split("_")[0] for d in (tmp_path / "s").iterdir() if d.is_dir()) == ["ckpt0", "ckpt1"]
