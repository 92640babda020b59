"""Bad input found adversarially (issue 28, the input half): every entry point refuses it in ONE
line naming the key (or flag), the value and what is allowed, before any worker starts or
anything is allocated; exit 2 from the CLIs; nothing written.

Cheap by design: the checks are called directly (validate, the CLIs' main(argv)), no worker
runs. What must not read a device, block on a FIFO or read a sparse file is proven by design
(the file is refused by its type or size, or read at most cap + 1 bytes), with only loose
wall-clock bounds (the machine may be loaded).
"""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from harness.records import safe_io
from harness.planning.checks import validate
from harness.config import MAX_STEPS, MAX_WORLD, Config, ConfigError, model_config, set_keys
from harness.records.safe_io import CAPS, MiB, FileRefused

# a refusal's own CPU seconds (its thread's: a busy machine stretches wall time, not these): well
# under one here; reading the 8 GiB file or building a huge plan would take more
SLOW_S = 1.0  # seen: at most 0.14


def bounded(fn, *args, timeout: float = 30.0):
    """fn(*args) in a thread: a regression that blocks (a FIFO opened for reading) fails the
    test instead of hanging it. Returns (value or the exception raised, the thread's CPU seconds)."""
    out: dict = {}

    def run() -> None:
        t0 = time.thread_time()
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["value"] = e
        out["s"] = time.thread_time() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} blocked for {timeout} s"
    return out["value"], out["s"]


def one_line(e: object, *expected: str) -> str:
    text = str(e)
    assert isinstance(e, Exception), f"not refused: {e!r}"
    assert "\n" not in text and "Traceback" not in text, text
    for x in expected:
        assert x in text, text
    return text


def small(**keys) -> Config:
    """A small job, as the tests' `config` fixture makes it."""
    c = Config()
    c.wandb.mode, c.compute = "disabled", "real"
    c.model.layers, c.model.hidden = 8, 32
    c.steps, c.warmup_steps = 3, 1
    return set_keys(c, **keys)


# -- files that are not what they claim: devices, FIFOs, directories, links to them, sparse giants ----
def _bad_files(tmp_path: Path, kind: str) -> dict[str, tuple[Path, str]]:
    """name -> (path, what the refusal says)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "to_fifo").symlink_to(fifo)
    (tmp_path / "to_zero").symlink_to("/dev/zero")
    (tmp_path / "dir").mkdir()
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:  # no disk used: a hole of cap + 1 bytes
        f.truncate(CAPS[kind] + 1)
    return {"device": (Path("/dev/zero"), "not a regular file (a character device)"),
            "fifo": (fifo, "not a regular file (a FIFO)"),
            "link to a fifo": (tmp_path / "to_fifo", "not a regular file (a symlink to a FIFO)"),
            "link to a device": (tmp_path / "to_zero", "not a regular file (a symlink to a character device)"),
            "directory": (tmp_path / "dir", "not a regular file (a directory)"),
            "sparse giant": (sparse, f"{CAPS[kind] + 1:,} bytes, more than {CAPS[kind]:,}"),
            "missing": (tmp_path / "nope", "no such file")}


BAD = ["device", "fifo", "link to a fifo", "link to a device", "directory", "sparse giant", "missing"]


@pytest.mark.parametrize("what", BAD)
@pytest.mark.parametrize("key", ["profile", "schedule.csv_path", "model.target"])
def test_a_file_key_that_names_no_regular_file_is_one_line(tmp_path, key, what):
    kind = {"profile": "profile", "schedule.csv_path": "schedule_csv", "model.target": "model"}[key]
    path, said = _bad_files(tmp_path, kind)[what]
    keys = {"profile": {"partition.name": "profile", "profile": str(path)},
            "schedule.csv_path": {"schedule.name": "csv", "schedule.csv_path": str(path), "pp": 2},
            "model.target": {"model.name": "custom", "model.target": f"{path}:build"}}[key]
    tracemalloc.start()
    try:
        err, s = bounded(validate, small(**keys))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = one_line(err, f"{key}=", said)
    assert isinstance(err, ConfigError)
    if what != "missing":
        assert f"(allowed: a regular file up to {CAPS[kind] // MiB} MiB)" in text
    assert s < SLOW_S and peak < 16 * MiB  # nothing of the file was read


@pytest.mark.parametrize("what", BAD)
def test_safe_io_opens_no_device_or_fifo_and_reads_at_most_cap_plus_one(tmp_path, monkeypatch, what):
    path, said = _bad_files(tmp_path, "schedule_csv")[what]
    opened = []
    real_open = os.open
    monkeypatch.setattr(safe_io.os, "open", lambda p, *a, **k: opened.append(p) or real_open(p, *a, **k))
    err, _ = bounded(safe_io.read_bytes, path, "schedule.csv_path", "schedule_csv")
    assert isinstance(err, FileRefused) and said in str(err) and opened == []  # refused by stat, never opened


def test_a_file_that_grows_past_its_cap_is_read_only_to_cap_plus_one(tmp_path, monkeypatch):
    """A regular file within the cap at stat, past it when read (it grew): refused after
    reading cap + 1 bytes, never the rest."""
    f = tmp_path / "grows"
    f.write_bytes(b"x" * 4096)
    monkeypatch.setitem(CAPS, "schedule_csv", 100)
    monkeypatch.setattr(safe_io, "_regular", lambda *a: None)  # the stat and fstat saw it small
    reads = []
    real_fdopen = os.fdopen

    def fdopen(fd, mode):
        f = real_fdopen(fd, mode)
        read = f.read
        f.read = lambda n=-1: reads.append(n) or read(n)  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(safe_io.os, "fdopen", fdopen)
    with pytest.raises(FileRefused, match="more than 100 bytes"):
        safe_io.read_bytes(f, "schedule.csv_path", "schedule_csv")
    assert reads == [101]


def test_the_caps_have_room_over_what_the_harness_writes():
    from harness.measure.trace_json import MAX_TRACE_EVENTS

    # 131,072 events with their flows were 44 MiB (~355 bytes each): 1 KB an event is room
    assert CAPS["trace"] >= MAX_TRACE_EVENTS * 1000
    assert CAPS["result"] == 64 * MiB  # harness.records.result.read's own
    assert CAPS["schedule_csv"] >= 1_000_000 * 12  # MAX_ACTIONS cells of "31F4095,"


def test_the_report_never_copies_or_reads_a_trace_or_gantt_that_is_no_regular_file(tmp_path):
    """A record whose trace.json is a sparse 8 GB file and whose gantt.png links to /dev/zero:
    the gallery says why, reads neither, copies nothing."""
    from harness.report.gallery import gallery
    from tests.test_report import fake

    run = fake(0)
    job = tmp_path / "sweep" / run.dir
    job.mkdir(parents=True)
    with open(job / "trace.json", "wb") as f:
        f.truncate(8 * 2**30)
    (job / "gantt.png").symlink_to("/dev/zero")
    (entry,), s = bounded(gallery, [run], tmp_path / "sweep", tmp_path / "out")
    said = " ".join(entry.missing)
    assert "trace.json=" in said and f"{8 * 2**30:,} bytes, more than {CAPS['trace']:,}" in said
    assert "gantt.png=" in said and "a symlink to a character device" in said
    assert entry.measured is None and not list((tmp_path / "out").glob("*measured*")) and s < SLOW_S


# -- schedule CSVs -------------------------------------------------------------------------------------
def test_a_csv_with_a_byte_order_mark_is_read(tmp_path):
    from harness.schedules.csv_io import read_csv

    f = tmp_path / "bom.csv"
    f.write_bytes(b"\xef\xbb\xbf0F0,0B0\n1F0,1B0\n")
    assert [str(a) for a in read_csv(f)[0]] == ["0F0", "0B0"]
    validate(small(**{"schedule.name": "csv", "schedule.csv_path": str(f), "pp": 2, "microbatches": 1}))


@pytest.mark.parametrize("text,pp,said", [
    ("0F0,0B0\n99F0,99B0\n", 2, "row 2 (rank 1), action 1: 99F0 names stage 99, and no action names stage 1"),
    ("0F0,0B0,1F0,1B0\n", 4, "schedule CSV: 1 rows (ranks), pp=4 (allowed: one row per rank)"),
    ("", 2, "schedule CSV: empty"),
    ("0F0,zz\n", 1, "schedule CSV row 1 (rank 0), column 2: 'zz' is not a compute action"),
])
def test_a_csv_that_is_no_schedule_names_what_is_wrong(tmp_path, text, pp, said):
    f = tmp_path / "s.csv"
    f.write_text(text)
    err, s = bounded(validate, small(**{"schedule.name": "csv", "schedule.csv_path": str(f), "pp": pp,
                                        "microbatches": 1}))
    one_line(err, f"schedule.csv_path={f}: ", said)
    assert s < SLOW_S


def test_a_csv_of_more_cells_than_actions_is_refused_before_a_cell_is_parsed(tmp_path, monkeypatch):
    from harness.schedules import csv_io

    f = tmp_path / "wide.csv"
    f.write_text(",".join(["0F0"] * 1_000_001) + "\n")  # 4 MB: within the size cap, past MAX_ACTIONS
    monkeypatch.setattr(csv_io, "from_csv", lambda text: pytest.fail("parsed"))
    err, s = bounded(validate, small(**{"schedule.name": "csv", "schedule.csv_path": str(f), "pp": 1}))
    one_line(err, "1,000,001 cells, more than 1,000,000 schedule actions")
    assert s < SLOW_S


# -- numbers bounded before anything is allocated -------------------------------------------------------
NUMBERS = [
    ({"steps": 10**9, "executor": "sim"}, "steps=1000000000: warmup_steps + steps = 1,000,000,001, more than 100,000"),
    ({"warmup_steps": 10**9}, "warmup_steps=1000000000: warmup_steps + steps = 1,000,000,003"),
    ({"steps": 50_000}, "steps=50000: 50,001 steps x 64 actions a step = 3,200,064 timed actions, more than 2,000,000"),
    ({"dp": 10**11}, f"dp=100000000000: pp x dp = 400,000,000,000 ranks, more than {MAX_WORLD:,} (allowed: dp <= "),
    ({"dp": 10**11, "executor": "sim"}, "dp=100000000000: pp x dp"),
    ({"pp": 10**23}, "pp=100000000000000000000000: pp x dp = 100,000,000,000,000,000,000,000 ranks"),
    ({"pp": 65536, "model.layers": 2**16}, "pp=65536: pp=65536 x 1 chunks x 8 microbatches x 3 = 1,572,864 schedule "
                                          "actions, more than 1,000,000 (allowed: pp <= 41666)"),
    ({"microbatch_size": 2**40, "executor": "sim"}, "microbatch_size=1099511627776: more than 2,147,483,647"),
    ({"global_batch": 10**20, "executor": "sim"}, "global_batch=100000000000000000000: sets microbatch_size"),
    ({"model.hidden": 2**40, "executor": "sim"}, "model.hidden=1099511627776: more than 2,147,483,647"),
    ({"model.layers": 10**5, "executor": "sim"}, "model.layers=100000: 100,000 layers, more than 65,536"),
    ({"run.timeout_s": 1e300}, "run.timeout_s=1e+300: more than 604,800 s"),
    ({"cost.time_scale": 1e300}, "cost.time_scale=1e+300: more than 1e+06"),
    ({"cost.time_scale": 1e6, "cost.fwd_ms_per_layer": 1e7}, "cost.fwd_ms_per_layer=10000000.0: the modeled step is "
                                                           "at least"),
    ({"cost.time_scale": 1e4, "steps": 1000}, "steps=1000: 1,001 steps of a modeled step of at least"),
    ({"comm.bandwidth_Bps": 1e300}, "comm.bandwidth_Bps=1e+300: outside 1..1e+15"),
    ({"comm.latency_s": 1e9}, "comm.latency_s=1000000000.0: more than 60 s"),
    ({"executor": "sim", "cost.fwd_ms_per_layer": 0.0, "pp": 1},
     "cost.fwd_ms_per_layer=0.0: executor=sim's step is the modeled compute, and it is 0 s"),
    ({"executor": "sim", "verify_grads": True}, "verify_grads=true: executor=sim computes no gradients"),
    ({"executor": "sim", "run.fault": "term@launch"}, "run.fault=term@launch: executor=sim starts no worker, so there is no "
                                                  "launch to interrupt (allowed with executor=sim: term@start, term@plan, term@records, term@end)"),
    ({"run.repeats": 10**9}, "run.repeats=1000000000: more than 1,000"),
    ({"memory_budget_gib": 1e300}, "memory_budget_gib=1e+300: more than 16,384"),
]


@pytest.mark.parametrize("keys,said", NUMBERS, ids=[" ".join(f"{k}={v}" for k, v in k.items()) for k, _ in NUMBERS])
def test_a_number_past_what_the_harness_can_hold_is_one_line_before_anything_is_built(keys, said):
    tracemalloc.start()
    try:
        err, s = bounded(validate, small(**keys))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_line(err, said)
    assert isinstance(err, ConfigError) and s < SLOW_S and peak < 200 * MiB


def test_a_cluster_too_large_to_list_is_one_line():
    from harness.config import check_cluster
    from harness.frontend.compose import compose_config

    c = compose_config(["cluster=h200_node", "cluster.nodes=1000000000", "executor=sim"])
    with pytest.raises(ConfigError) as e:
        check_cluster(c.cluster)
    one_line(e.value, "cluster.nodes=1000000000: cluster.nodes x cluster.gpus_per_node = 8,000,000,000 GPUs, more "
                      "than 65,536 (allowed: cluster.nodes <= 8,192 here")
    slow = compose_config(["cluster=h200_node", "cluster.memory_bandwidth_Bps=1e-300", "executor=sim"])
    one_line(bounded(validate, slow)[0], "cluster.memory_bandwidth_Bps=1e-300: the modeled step is at least")


def test_activations_are_counted_by_the_memory_theory_not_only_between_stages(monkeypatch):
    """A machine of 1 GiB (patched): at B=100,000 the tensors between stages (4 ranks x 8 x
    B x 32 fp32: 0.4 GiB) fit, GPipe's activations (every rank all 8 microbatches of every
    layer's saved tensors, traced at B=1 and 2) do not; the bound is traced, not allocated."""
    from harness.planning import checks

    monkeypatch.setattr(checks, "machine_bytes", lambda device, gpus: 2**30)
    tracemalloc.start()
    try:
        err, s = bounded(validate, small(**{"schedule.name": "gpipe", "microbatch_size": 100_000}))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_line(err, "microbatch_size=100000: this machine's 4 ranks need at least", "activations held for backward",
             "the memory theory's")
    assert s < SLOW_S and peak < 200 * MiB
    validate(small(**{"schedule.name": "gpipe", "microbatch_size": 1000}))


def test_a_dp_that_multiplies_the_weights_past_the_machine_names_dp(monkeypatch):
    from harness.planning import checks

    monkeypatch.setattr(checks, "machine_bytes", lambda device, gpus: 2**20)  # 1 MiB: one replica of 8 x 32 x 32
    err, _ = bounded(validate, small(dp=64, pp=1, **{"run.max_processes": 1000}, **{"model.hidden": 64}))
    one_line(err, "dp=64: ")


# -- a custom model whose members return the wrong things --------------------------------------------
GOOD = """
import torch
class M:
    num_layers = 3
    def build_layer(self, i): return torch.nn.Linear(4, 4)
    def build_layers(self, start, end, seed): return torch.nn.Sequential(*[self.build_layer(i) for i in range(start, end)])
    def batch(self, seed, step, samples): return torch.zeros(samples, 4), torch.zeros(samples, 4)
    def loss(self, output, target): return (output - target).pow(2).mean()
    def activation_shape(self, b): return (b, 4)
    def kind(self, i): return "linear"
    def input_shape(self, i, b): return (b, 4), torch.float32
    def fwd_flops(self, i, b): return 32.0 * b
"""


@pytest.mark.parametrize("member,body,said", [
    ("activation_shape", "def activation_shape(self, b): return 'abc'", "activation_shape(1,) returned 'abc' (a str)"),
    ("input_shape", "def input_shape(self, i, b): return (b, 4)", "input_shape(0, 1) returned (1, 4) (a tuple)"),
    ("kind", "def kind(self, i): return 3", "kind(0,) returned 3 (a int)"),
    ("fwd_flops", "def fwd_flops(self, i, b): return float('nan')", "fwd_flops(0, 1) returned nan (a float)"),
    ("batch", "def batch(self, seed, step, samples): return torch.zeros(samples, 4)", "batch(0, 0, 1) returned"),
    ("build_layer", "def build_layer(self, i): return 'linear'", "build_layer(0,) returned 'linear' (a str)"),
    ("num_layers", "num_layers = 10**9", "num_layers=1,000,000,000 (allowed: 1..1,048,576)"),
    ("kind", "def kind(self, i): raise KeyError(i)", "kind(0,) raised KeyError: 0"),
])
def test_a_custom_model_returning_the_wrong_types_is_one_line_before_any_worker(tmp_path, member, body, said):
    lines = [line for line in GOOD.splitlines() if not line.strip().startswith(
        (f"def {member}(", f"{member} ="))]
    f = tmp_path / f"bad_{member}_{abs(hash(body))}.py"
    f.write_text("\n".join(lines) + f"\n    {body}\ndef build(cfg):\n    return M()\n")
    err, s = bounded(validate, small(**{"model.name": "custom", "model.target": f"{f}:build", "pp": 1}))
    one_line(err, f"model.target={f}:build: ", said)
    assert isinstance(err, ConfigError) and s < SLOW_S


def test_a_good_custom_model_passes_the_member_checks(tmp_path):
    f = tmp_path / "good_model.py"
    f.write_text(GOOD + "def build(cfg):\n    return M()\n")
    validate(small(**{"model.name": "custom", "model.target": f"{f}:build", "pp": 1}))


# -- the other entry points: one line on stderr, exit 2, nothing written ------------------------------
def _raise(value: object) -> object:
    """bounded()'s value, its exception (argparse's SystemExit) raised here."""
    if isinstance(value, BaseException):
        raise value
    return value


def _one_line_exit_2(capsys, run, *said: str) -> str:
    try:
        code = run()
    except SystemExit as e:  # argparse's errors exit
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and "Traceback" not in err, err
    for x in said:
        assert x in err, err
    return err


ADVISE = [
    (["--pp", "0"], "--pp 0: pipeline ranks (allowed: integers 1..65,536)"),
    (["--microbatch-sizes", "0"], "--microbatch-sizes 0"),
    (["--gpus", "0"], "--gpus 0"),
    (["--top", "-1"], "--top -1"),
    (["--workers", "0"], "--workers 0"),
    (["--virtual-stages", "0"], "--virtual-stages 0"),
    (["--dp", "0"], "--dp 0"),
    (["--max-microbatches", "0"], "--max-microbatches 0"),
    (["--global-batch", "100000000000000000000"], "--global-batch 100000000000000000000: samples per step"),
    (["--global-batch", "1e20"], "argument --global-batch: invalid int value: '1e20'"),
    (["--out", "/proc/x"], "--out /proc/x: cannot create it"),
    (["cluster.nodes=1000000000"], "cluster.nodes=1000000000: cluster.nodes x cluster.gpus_per_node"),
    (["profile=/dev/zero"], "profile=/dev/zero: not a regular file (a character device)"),
    (["--profile", "/dev/zero"], "unrecognized arguments: --profile /dev/zero (allowed: python -m harness.advise "
                                 "key=value"),
    (["microbatch_size=2"], "microbatch_size=2: every point sets B from the global batch"),
]


# each case composes the config (~0.1-0.4 s): the flags' range checks, all alike, every other one in make test
@pytest.mark.parametrize("args,said", [pytest.param(*case, id=" ".join(case[0]),
                                                    marks=[pytest.mark.slow] * (i % 2 and i < 10))
                                       for i, case in enumerate(ADVISE)])
def test_advise_arguments_are_one_line(tmp_path, monkeypatch, capsys, args, said):
    from harness.advise.__main__ import main

    monkeypatch.chdir(tmp_path)
    keys = [a for a in args if "=" in a and not a.startswith("--")]
    flags = [a for a in args if a not in keys]
    argv = ["cluster=h200_node", *keys, *([] if "--global-batch" in args else ["--global-batch", "8"]), *flags]
    _one_line_exit_2(capsys, lambda: _raise(bounded(main, argv)[0]), "harness.advise: error: ", said)
    assert not list(tmp_path.iterdir())  # nothing written (runs/advise/<time> included)


@pytest.mark.subprocess
def test_a_profile_flag_refusal_never_imports_torch(tmp_path):
    """`python -m harness.profile --repeats 0` as a user runs it: one line, exit 2, torch never
    imported (harness/frontend/profile_args.py answers before harness/profile.py's import of it), nothing written."""
    import subprocess
    import sys

    probe = ("import atexit, runpy, sys; atexit.register(lambda: print('TORCH', 'torch' in sys.modules, "
             "file=sys.stderr)); sys.argv = ['harness.profile'] + sys.argv[1:]; "
             "runpy.run_module('harness.profile', run_name='__main__', alter_sys=True)")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", probe, "--repeats", "0"], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "harness.profile: error: --repeats 0: timed runs of each layer (allowed: 1..10,000)", "TORCH False"], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_profile_arguments_are_one_line_and_write_nothing(tmp_path, capsys):
    from harness.profile import main

    small_model = ["model.layers=2", "model.hidden=8", "--warmup", "0", "--repeats", "1"]
    (tmp_path / "existing").mkdir()
    cases = [
        (["--out", "/proc/x/p.json"], "--out /proc/x/p.json: cannot create /proc/x"),
        (["--microbatch-sizes", "1000000000000", "--out", str(tmp_path / "p.json")],
         "--microbatch-sizes 1000000000000: samples per microbatch (allowed: integers 1..2,147,483,647)"),
        (["--microbatch-sizes", "2000000000", "--out", str(tmp_path / "p.json")],
         "--microbatch-sizes 2000000000: a layer's input and output"),
        (["--out", str(tmp_path / "existing")], f"--out {tmp_path / 'existing'}: a directory"),
        (["--repeats", "0", "--out", str(tmp_path / "p.json")], "--repeats 0"),
        (["--microbatch-sizes", "1e12"], "invalid int value: '1e12'"),
    ]
    for args, said in cases:
        _one_line_exit_2(capsys, lambda: main([*small_model, *args]), "harness.profile: error: ", said)
    assert [p.name for p in tmp_path.iterdir()] == ["existing"] and not list((tmp_path / "existing").iterdir())


def test_report_and_export_refuse_what_is_no_sweep_or_record_in_one_line(tmp_path, capsys):
    from harness.export.__main__ import main as export
    from harness.report.__main__ import main as report

    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("hi")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "result.json").symlink_to("/dev/zero")
    out = ["--out", str(tmp_path / "reports")]
    for sweep, said in [(tmp_path / "empty", "not a sweep (no result.json"), (tmp_path / "file", "not a directory"),
                        (tmp_path / "fifo", "not a directory (a FIFO)"), (tmp_path / "nope", "no such directory"),
                        (Path("/usr"), "not a sweep"), (Path("/"), "the file system's root is no sweep")]:
        _one_line_exit_2(capsys, lambda: _raise(bounded(report, [str(sweep), *out])[0]), f"sweep={sweep}: ", said)
    _one_line_exit_2(capsys, lambda: report([str(tmp_path / "run"), "--out", "/proc/x"]), "--out=/proc/x: cannot create")
    _one_line_exit_2(capsys, lambda: report(["--bogus"]), "harness.report: error: unrecognized arguments: --bogus")
    for source, said in [("/dev/zero", "source=/dev/zero: not a regular file (a character device)"),
                         (str(tmp_path / "fifo"), "not a regular file (a FIFO)"),
                         (str(tmp_path / "run"), "unreadable: not a regular file (a character device)"),
                         (str(tmp_path / "empty"), "no result.json in it")]:
        _one_line_exit_2(capsys, lambda: _raise(bounded(export, ["--to", "megatron", source])[0]), said)
    _one_line_exit_2(capsys, lambda: export(["--to", "megatron", str(tmp_path / "run"), "--out", str(tmp_path)]),
                     f"--out={tmp_path}: exists and is not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "fifo", "file", "run"]


def test_the_steps_cap_is_what_result_json_can_keep():
    """MAX_STEPS steps of per-step figures (step time, bubble, loss: ~20 bytes each in JSON)
    stay far inside result.json's read cap."""
    assert 3 * 20 * MAX_STEPS * 10 < CAPS["result"]
    model_config("mlp")  # the schema imports alone
    json.dumps({"steps": MAX_STEPS})


# -- issue 35: bounded work, inputs checked where they enter, one-line failures ---------------------
def test_zb_auto_past_its_generation_bound_is_one_line_before_anything_is_generated(monkeypatch):
    """pp=64, M=5000 (960,000 actions: ~4 min and 2.7 GB generating before): refused by the
    schedule's own check for executor=sim and for real runs alike, nothing generated."""
    from harness.schedules import auto

    monkeypatch.setattr(auto, "greedy", lambda *a: pytest.fail("generated"))
    for executor in ("sim", "native"):
        keys = {"schedule.name": "zb_auto", "pp": 64, "microbatches": 5000, "model.layers": 64, "executor": executor}
        err, s = bounded(validate, small(**keys))
        one_line(err, "microbatches=5000: zb_auto generates for pp=64 x 5000 microbatches x 3 = 960,000 actions, more "
                      f"than {auto.MAX_AUTO_ACTIONS:,} (allowed: microbatches <= 520 here")
        assert isinstance(err, ConfigError) and s < SLOW_S
    with pytest.raises(ValueError, match="pp=100000: zb_auto generates"):  # the function itself, for any caller
        auto.generate(100_000, 1, auto.CostModel.uniform(100_000))
    validate(small(**{"schedule.name": "zb_auto", "pp": 4, "microbatches": 8, "executor": "sim"}))


@pytest.mark.parametrize("args,said", [
    (["--pp", "100000", "--microbatches", "1"], "--pp 100000: zb_auto generates for pp=100000 x 1 microbatches x 3 = "
                                                "300,000 actions, more than 100,000 (allowed: --pp <= 33,333 here"),
    (["--pp", "64", "--microbatches", "5000"], "--microbatches 5000: zb_auto generates"),
    (["--pp", "4", "--microbatches", "8", "--fwd", "1e308"], "--fwd 1e+308: not a possible cost (allowed: a finite "
                                                             "number of seconds in 0..604,800)"),
    (["--pp", "4", "--microbatches", "8", "--igrad", "inf"], "--igrad inf: not a possible cost"),
    (["--pp", "4", "--microbatches", "8", "--wgrad", "nan"], "--wgrad nan: not a possible cost"),
    (["--pp", "4", "--microbatches", "8", "--hop", "-1"], "--hop -1: not a possible cost"),
])
def test_generate_refuses_sizes_past_its_bound_and_impossible_costs_in_one_line(capsys, args, said):
    from harness.schedules.generate import main

    err = _one_line_exit_2(capsys, lambda: _raise(bounded(main, args)[0]), "error: ", said)
    assert "Deadlock" not in err


def test_an_impossible_cost_is_refused_by_the_generator_not_reported_as_a_deadlock():
    from harness.schedules.auto import CostModel, generate

    for x in (1e308, float("inf"), float("nan"), -1.0):
        cost = CostModel((1.0, x), (2.0, 2.0), (1.0, 1.0), (1.0, 1.0))
        with pytest.raises(ValueError) as e:
            generate(2, 4, cost)
        one_line(e.value, f"F cost of stage 1 = {x!r} s: not a possible cost")


@pytest.fixture(scope="module")
def sim_record(tmp_path_factory) -> Path:
    """A run directory of executor=sim (pp=2, zb_h1): a record with measured F, I, W and a hop."""
    from harness.job import run_job

    out = tmp_path_factory.mktemp("costs")
    r = run_job(small(pp=2, executor="sim", **{"schedule.name": "zb_h1"}), out, "test", "costs")
    assert r.status == "ok", r.error
    return out / "result.json"


@pytest.mark.parametrize("edit,said", [
    (lambda m: m["mean_op_s"]["F"].__setitem__(1, float("nan")), "metrics.mean_op_s.F[1]=nan: not a measured cost"),
    (lambda m: m["mean_op_s"]["W"].__setitem__(0, -1.0), "metrics.mean_op_s.W[0]=-1.0: not a measured cost"),
    (lambda m: m["mean_op_s"]["I"].__setitem__(0, 1e308), "metrics.mean_op_s.I[0]=1e+308: not a measured cost"),
    (lambda m: m["mean_op_s"].pop("W"), "metrics.mean_op_s.W is missing (allowed: 2 measured seconds, one per stage)"),
    (lambda m: m.__setitem__("p2p_hop_s", float("inf")), "metrics.p2p_hop_s=inf: not a measured cost"),
])
def test_schedule_costs_from_a_corrupt_record_name_the_key_in_one_line(tmp_path, sim_record, edit, said):
    from harness.planning.plan import make_plan

    data = json.loads(sim_record.read_text())
    edit(data["metrics"])
    (tmp_path / "result.json").write_text(json.dumps(data))  # json writes NaN / Infinity, as an editor may
    before = (tmp_path / "result.json").read_bytes()
    keys = {"schedule.name": "zb_auto", "schedule.costs": str(tmp_path), "pp": 2, "executor": "sim"}
    with pytest.raises(ConfigError) as e:
        make_plan(small(**keys))
    one_line(e.value, f"schedule.costs={tmp_path}: ", said)
    assert "Deadlock" not in str(e.value) and (tmp_path / "result.json").read_bytes() == before
    make_plan(small(**{**keys, "schedule.costs": str(sim_record.parent)}))  # the record as written: generates


def _profile(tmp_path: Path, **bad: object) -> Path:
    layers = [{"index": i, "kind": "linear", "params": 100,
               "by_microbatch": {"4": {"fwd_s": 1e-3, "bwd_s": 2e-3, "fwd_flops": 1e6, "activation_bytes": 512}}}
              for i in range(8)]
    for key, value in bad.items():
        (layers[2] if key == "params" or key == "kind" else layers[2]["by_microbatch"]["4"])[key] = value
    f = tmp_path / "profile.json"
    f.write_text(json.dumps({"layers": layers}))
    return f


@pytest.mark.parametrize("bad,said", [
    ({"fwd_flops": 1e30}, "layer 2, microbatch size 4: fwd_flops=1e+30 (allowed: a finite number of FLOPs >= 0, at "
                          "most 1,000,000,000,000,000,000,000)"),
    ({"activation_bytes": 1e30}, "activation_bytes=1e+30 (allowed: a finite number of bytes >= 0"),
    ({"fwd_s": 1e30}, "fwd_s=1e+30 (allowed: a finite number of seconds > 0, at most 86,400)"),
    ({"fwd_s": 0}, "fwd_s=0 (allowed: a finite number of seconds > 0"),
    ({"bwd_s": True}, "bwd_s=True (allowed: a finite number"),
    ({"fwd_s": float("inf")}, "fwd_s=inf (allowed: a finite number"),
    ({"params": True}, "layer 2: params=True (allowed: an integer in 0..1,099,511,627,776)"),
    ({"params": 1e30}, "layer 2: params=1e+30 (allowed: an integer"),
    ({"params": 1.5}, "layer 2: params=1.5 (allowed: an integer"),
    ({"kind": 7}, "layer 2: kind=7 (allowed: a string"),
])
def test_a_profile_of_impossible_values_is_one_line_naming_the_field(tmp_path, bad, said):
    from harness.model.profile_data import ProfileError, load_profile

    f = _profile(tmp_path, **bad)
    with pytest.raises(ProfileError) as e:
        load_profile(f, 4, 8)
    one_line(e.value, f"profile={f}: ", said)
    err, _ = bounded(validate, small(profile=str(f), **{"partition.name": "profile"}))
    one_line(err, said)
    assert isinstance(err, ConfigError)


def test_a_profile_extrapolated_past_its_sizes_never_prices_a_layer_at_zero():
    """GPT-2's embedding measured 90 us at B=4 and 73 us at B=8: extrapolated to B=64 that slope
    was below 0 s, clamped to 0 (harness.advise --gpus 1 then divided by it). Never below the
    nearest measured size's time."""
    from harness.model.profile_data import load_profile

    for b in (1, 64, 1024):
        layers = load_profile("data/gpt2_h200_profile.json", b, 14)
        assert all(x.fwd_s > 0 and x.bwd_s > 0 for x in layers), b
    assert load_profile("data/gpt2_h200_profile.json", 64, 14)[0].fwd_s == pytest.approx(73e-6, rel=0.02)


@pytest.mark.parametrize("skews,said", [
    ([0.0, float("nan")], "run.clock_skew_s[1]=nan: not a skew (allowed: a finite number of seconds, -86,400..86,400"),
    ([1e300], "run.clock_skew_s[0]=1e+300: not a skew"),
    ([-1e6], "run.clock_skew_s[0]=-1000000.0: not a skew"),
    ([True], "run.clock_skew_s[0]=True: not a skew"),
])
def test_clock_skew_is_finite_and_bounded(skews, said):
    from harness.config import check_values

    with pytest.raises(ConfigError) as e:
        check_values(small(**{"run.clock_skew_s": skews}))
    one_line(e.value, said)
    check_values(small(**{"run.clock_skew_s": [0.0, 0.5, -3600.0]}))


def test_repeats_swept_over_values_is_one_line(capsys):
    from harness.frontend.sweeper import one_repeats

    with pytest.raises(SystemExit) as e:
        one_repeats([["pp=2", "run.repeats=1"], ["pp=2", "run.repeats=2"], ["pp=4", "run.repeats=1"]])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert err.startswith("harness: error: run.repeats=1,2: one value per sweep (allowed: a single run.repeats=N")
    one_repeats([["pp=2", "run.repeats=3"], ["pp=4", "run.repeats=3"]])  # one value: fine
    one_repeats([["pp=2"], ["pp=4"]])


@pytest.mark.parametrize("edit,said", [
    (lambda c: c.__setitem__("pp", 0), "pp=0: pipeline ranks (allowed: integers 1..65,536)"),
    (lambda c: c.__setitem__("dp", 2**40), "dp=1099511627776: data-parallel replicas"),
    (lambda c: c.__setitem__("microbatches", 1.5), "microbatches=1.5: microbatches a step"),
    (lambda c: c.__setitem__("microbatch_size", True), "microbatch_size=True: samples per microbatch"),
    (lambda c: c.__setitem__("cluster", {"name": "x", "gpus_per_node": 0}),
     "cluster.gpus_per_node=0: GPUs a machine has (torchrun's --nproc-per-node) (allowed: integers 1..65,536)"),
    (lambda c: c.__setitem__("cluster", {"name": "x", "gpus_per_node": 2**40}), "cluster.gpus_per_node=1099511627776"),
])
def test_export_refuses_a_record_whose_numbers_cannot_launch(tmp_path, capsys, sim_record, edit, said):
    from harness.export.__main__ import main as export

    data = json.loads(sim_record.read_text())
    edit(data["config"])
    (tmp_path / "result.json").write_text(json.dumps(data))
    out = tmp_path / "train.sh"
    _one_line_exit_2(capsys, lambda: export(["--to", "megatron", str(tmp_path), "--out", str(out)]),
                     "harness.export: ", said)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_out_is_never_the_source_tree_nor_an_existing_record(tmp_path, capsys, sim_record):
    """profile, advise, export and report: an --out inside harness/ (or tests/, ...) or over a
    run's result.json is one line and exit 2, nothing written, the record unchanged."""
    from harness.advise.__main__ import main as advise
    from harness.export.__main__ import main as export
    from harness.profile import main as profile
    from harness.records.outputs import ROOT
    from harness.report.__main__ import main as report

    record = sim_record.read_bytes()
    src = ROOT / "harness" / "bounds_test_out"
    cases = [
        (lambda: profile(["model.layers=2", "model.hidden=8", "--out", str(src / "p.json")]),
         "harness.profile: error: ", f"--out {src / 'p.json'}: inside the harness's source tree ({ROOT / 'harness'})"),
        (lambda: profile(["model.layers=2", "model.hidden=8", "--out", str(sim_record)]),
         "harness.profile: error: ", f"--out {sim_record}: an existing result.json, a record the harness wrote"),
        (lambda: advise(["cluster=h200_node", "--global-batch", "8", "--out", str(src)]),
         "harness.advise: error: ", f"--out {src}: inside the harness's source tree"),
        (lambda: export(["--to", "megatron", str(sim_record.parent), "--out", str(ROOT / "tests" / "x.sh")]),
         "harness.export: ", "inside the harness's source tree"),
        (lambda: export(["--to", "megatron", str(sim_record.parent), "--out", str(sim_record)]),
         "harness.export: ", "an existing result.json"),
        (lambda: report([str(sim_record.parent), "--out", str(ROOT / "harness")]),
         "harness.report: error: ", f"--out={ROOT / 'harness'}: inside the harness's source tree"),
    ]
    for run, prefix, said in cases:
        _one_line_exit_2(capsys, lambda: _raise(bounded(run)[0]), prefix, said)
    assert not src.exists() and not (ROOT / "tests" / "x.sh").exists() and sim_record.read_bytes() == record


def test_an_advise_refused_in_its_search_leaves_no_directory(tmp_path, capsys):
    from harness.advise.__main__ import main as advise

    out = tmp_path / "new" / "advice"
    _one_line_exit_2(capsys, lambda: advise(["cluster=h200_node", "--global-batch", "8", "--pp", "3", "--out",
                                             str(out)]), "harness.advise: error: ", "--pp [3]: none divides")
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # ~14 points predicted (seconds)
def test_advise_on_one_or_two_gpus_answers_and_writes_strict_json(tmp_path, monkeypatch):
    """--gpus 1 and 2 on the GPT-2 profile raised ZeroDivisionError (a layer extrapolated to 0 s);
    advice.json is strict JSON (an infinite figure written as null, listed under `nulls`)."""
    from harness.advise import report as advice_report
    from harness.advise.__main__ import main as advise

    to_json = advice_report.to_json
    monkeypatch.setattr(advice_report, "to_json", lambda *a: {**to_json(*a), "probe": float("inf")})
    for gpus in ("1", "2"):
        out = tmp_path / gpus
        assert advise(["cluster=h200_node", "profile=data/gpt2_h200_profile.json", "dtype=bf16", "--global-batch",
                       "64", "--gpus", gpus, "--out", str(out)]) == 0
        text = (out / "advice.json").read_text()
        doc = json.loads(text, parse_constant=lambda x: pytest.fail(f"{x} in advice.json"))
        assert doc["probe"] is None and "probe: inf written as null (not a finite number)" in doc["nulls"]
        assert doc["compute"]["efficiency"]


def test_a_killed_runs_running_json_is_stale_not_running(tmp_path):
    import subprocess
    import sys

    from harness.records import running

    job = tmp_path / "job"
    job.mkdir()
    (job / "running.json").write_text(json.dumps(running.stamp([])))
    assert running.state(job) == f"running (pid {os.getpid()})"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (job / "running.json").write_text(json.dumps(running.stamp([], pid=os.getpid()) | {"pid": gone.pid}))
    assert running.state(job) == f"stale: its harness (pid {gone.pid}) is gone"
    if running.start_ticks(os.getpid()) is not None:  # /proc: a reused pid is told by its start time
        reused = running.stamp([]) | {"started": running.start_ticks(os.getpid()) - 1}
        (job / "running.json").write_text(json.dumps(reused))
        assert running.state(job).startswith(f"stale: pid {os.getpid()} is another process now")
    (job / "running.json").write_text("{")
    assert running.state(job).startswith("unreadable: ")
    assert running.state(tmp_path) is None


def test_profile_with_a_million_layers_is_one_line(tmp_path, capsys):
    from harness.profile import main as profile

    _one_line_exit_2(capsys, lambda: profile(["model.layers=1000000", "--out", str(tmp_path / "p.json")]),
                     "harness.profile: error: ", "model.layers=1000000: 1,000,000 layers, more than 65,536")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("keys,said", [
    (["schedule.memory_limit=2"], "schedule.memory_limit=2: not a key of schedule=1f1b (it is schedule=zb_auto's): "
                                  "schedule=1f1b has no memory_limit; set schedule=zb_auto to use it"),
    (["schedule=gpipe", "+schedule.memory_limit=2"], "not a key of schedule=gpipe (it is schedule=zb_auto's)"),
])
def test_memory_limit_on_a_schedule_without_one_says_which_have_it(keys, said):
    from harness.frontend.compose import compose_config

    with pytest.raises(ConfigError) as e:
        compose_config(keys)
    text = one_line(e.value, said)
    assert "did you mean" not in text


def test_the_watchdog_names_the_rank_that_stopped(tmp_path):
    """Each rank marks the steps it starts; the one behind the others is named (ranks 0, 2, 3
    started step 2 and waited at its barrier for rank 1, which never did)."""
    from harness.runtime.progress import Mark, Steps, stopped

    steps = Steps(4)
    try:
        for rank, last in ((0, 2), (1, 1), (2, 2), (3, 2)):
            mark = Mark(steps.path, rank)
            for s in range(last + 1):
                mark(s)
            mark.close()
        assert steps.read() == [3, 2, 3, 3]
        assert stopped(steps.read(), [0, 1, 2, 3]) == ("rank 1 stopped: it never started step 2, which the other "
                                                      "ranks started, then waited for it")
        assert "ranks [0, 1] still running, all in step 2: none is behind" in stopped([3, 3], [0, 1])
    finally:
        steps.close()
    assert not os.path.exists(steps.path)
