"""Benchmark: what `python -m harness` decides before it imports torch. `--help`, a refusal of a
bad value (`pp=0`), a refusal from the model's shape (`pp=16` on 8 layers: harness/planning/early.py)
and one TAB of Hydra's shell completion, each a fresh interpreter as a user
runs it; goal: under 1 second each on 2 cores (it was 4-10 s while the app imported torch before
reading the config). extra_info: whether torch was imported (it must not be)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "help": (["--help"], 0),
    "refusal": (["pp=0", "hydra.run.dir=."], 2),
    "shape_refusal": (["pp=16", "model.layers=8", "hydra.run.dir=."], 2),
    "completion": (["-sc", "query=bash"], 0),
}
# prints whether torch is loaded once the app is done (an atexit hook runs after main)
PROBE = ("import atexit, sys; atexit.register(lambda: print('TORCH', 'torch' in sys.modules, file=sys.stderr)); "
         "sys.argv = ['harness'] + sys.argv[1:]; from harness.frontend.cli import main; main()")


def run(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COMP_LINE": "python -m harness pp", "COMP_POINT": "20"}
    return subprocess.run([sys.executable, "-c", PROBE, *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", list(CASES))
def test_cli_decides_before_torch(benchmark, tmp_path, case):
    args, code = CASES[case]
    p = benchmark.pedantic(run, args=(args, tmp_path), rounds=1 if benchmark.disabled else 3, iterations=1)
    assert p.returncode == code, p.stderr[-2000:]
    assert "TORCH False" in p.stderr, p.stderr[-2000:]
    benchmark.extra_info.update(torch_imported=False)
