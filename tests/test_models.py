"""The model protocol and registry: every registered model through the pipeline against its
single-process reference (dist), a model of one's own from outside the package
(examples/my_model.py, by file path and by module on PYTHONPATH), and one line for each way a
model cannot be built."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.config import ConfigError, ModelConfig
from harness.config import model_config as kind_config
from harness.job import run_job
from harness.model import MEMBERS, MODELS, SHAPES, Model, ModelError, get_model, num_layers, register
from harness.measure.reference import reference_losses

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_model.py"

# small sizes of every registered model: a model added to the registry without an entry here
# fails test_every_registered_model_is_in_the_matrix
SMALL: dict[str, dict] = {
    "mlp": {"model.layers": 4, "model.hidden": 32},
    "gpt": {"model.layers": 2, "model.hidden": 32, "model.heads": 4, "model.seq": 16, "model.vocab": 128},
    "hf": {"model.arch": "llama", "model.layers": 2, "model.hidden": 32, "model.heads": 4, "model.kv_heads": 2,
           "model.seq": 16, "model.vocab": 128},
    # by file path: found by every rank whatever sys.path the worker processes started with
    "custom": {"model.target": f"{EXAMPLE}:build", "model.layers": 2, "model.hidden": 32},
}


def model_config(name: str, **overrides) -> ModelConfig:
    cfg = kind_config(name)
    for key, value in {**SMALL[name], **overrides}.items():
        setattr(cfg, key.removeprefix("model."), value)
    return cfg


def test_every_registered_model_is_in_the_matrix():
    assert set(SMALL) == set(MODELS)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_model_provides_the_protocol(name):
    model = get_model(model_config(name))
    assert isinstance(model, Model)
    n = model.num_layers
    assert n == get_model(kind_config(name, **{k.removeprefix("model."): v for k, v in SMALL[name].items()})).num_layers
    b = 2
    net = model.build_layers(0, n, seed=0)
    again = model.build_layers(n - 1, n, seed=0)  # layer i is the same whatever the split
    for p, q in zip(net[n - 1].parameters(), again.parameters()):
        assert torch.equal(p, q)
    x, y = model.batch(0, 0, 2 * b)
    shape, dtype = model.input_shape(0, b)
    assert tuple(x[:b].shape) == shape and x.dtype == dtype
    h = net[0](x[:b])
    assert tuple(h.shape) == model.activation_shape(b)
    if n > 2:
        assert model.input_shape(1, b) == (model.activation_shape(b), torch.float32)
    loss = model.loss(net[1:](h), y[:b])
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(model.fwd_flops(i, b) >= 0 for i in range(n)) and isinstance(model.kind(0), str)


# model=hf at these sizes is tests/test_hf_model.py's job too (the same run, held to transformers' own
# training and to this reference): make test runs it there, make test-all here as well
DIST_CASES = [pytest.param(name, schedule, marks=[pytest.mark.slow] if name == "hf" else [])
              for name in sorted(SMALL) for schedule in ("1f1b", "zb_h1")]


@pytest.mark.dist
@pytest.mark.parametrize("name,schedule", DIST_CASES)
def test_model_through_the_pipeline_matches_single_process(tmp_path, config, name, schedule):
    c = config(pp=2, microbatches=4, microbatch_size=2, steps=2, verify_grads=True,
               **{"schedule.name": schedule, "model.name": name, **SMALL[name]})
    result = run_job(c, tmp_path, "test", f"{name}-{schedule}")
    assert result.status == "ok", result.error
    assert result.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    assert result.metrics.grad_check.max_rel_diff < 1e-5, result.metrics.grad_check
    if schedule == "zb_h1":  # the backward really was split into I and W
        assert result.metrics.mean_op_s.get("I") and result.metrics.mean_op_s.get("W")


@pytest.mark.dist
@pytest.mark.parametrize("how", ["in-process", pytest.param("subprocess", marks=[pytest.mark.slow,
                                                                                 pytest.mark.subprocess])])
def test_readme_command_runs_the_example_from_pythonpath(tmp_path, monkeypatch, run_harness, harness_process, how):
    """The command in the README, as a user types it: the module found on PYTHONPATH (in this
    process: PYTHONPATH and the sys.path entry an interpreter makes of it; the ranks fork
    with this process's sys.path)."""
    args = ["model=custom", "model.target=my_model:build", "pp=2", "steps=1", "microbatches=4",
            "+model.kwargs.classes=4", "wandb.mode=disabled", f"hydra.run.dir={tmp_path}"]
    if how == "subprocess":
        run = harness_process(*args, cwd=ROOT, env={**os.environ, "PYTHONPATH": "examples"}, timeout=300)
    else:
        monkeypatch.setenv("PYTHONPATH", "examples")
        monkeypatch.syspath_prepend(str(ROOT / "examples"))
        monkeypatch.delitem(sys.modules, "my_model", raising=False)
        try:
            run = run_harness(*args, cwd=ROOT)
        finally:
            sys.modules.pop("my_model", None)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "harness: 1f1b pp=2 M=4" in run.stdout + run.stderr


# -- one line for each way a model cannot be built ---------------------------------------------
def _factory_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "user_model.py"
    path.write_text(textwrap.dedent(body))
    return f"{path}:build"


@pytest.mark.parametrize("name", ["mlp", "gpt", "hf"])
def test_the_layer_count_from_the_config_is_the_built_models(name):
    """model.shapes' count, which refusals use before torch (harness/planning/early.py), equals the
    built model's over a grid of sizes; custom has none (only its factory knows)."""
    assert name in SHAPES
    for layers in (1, 2, 3, 8, 31, 2**16):
        for hidden in (8, 32):
            cfg = model_config(name, **{"model.layers": layers, "model.hidden": hidden})
            assert num_layers(cfg) == get_model(cfg).num_layers, (name, layers, hidden)


def test_a_model_without_a_shape_is_counted_once_built(monkeypatch):
    """custom, and a model registered without `layers`, have no count before they are built:
    None, and the planning checks wait for the built model."""
    assert num_layers(model_config("custom")) is None
    monkeypatch.setitem(MODELS, "mine", MODELS["mlp"])
    monkeypatch.setitem(SHAPES, "mine", SHAPES["mlp"])
    register("mine", MODELS["mlp"])  # registered again without a shape: the old one is gone
    assert "mine" not in SHAPES and num_layers(ModelConfig(name="mine")) is None


def test_unknown_model_is_one_line():
    with pytest.raises(ModelError, match=r"^model=resnet: unknown \(allowed: mlp, gpt, hf, custom\)$"):
        get_model(kind_config("resnet"))


def test_model_error_is_a_config_error_and_a_value_error():
    assert issubclass(ModelError, ConfigError) and issubclass(ModelError, ValueError)


@pytest.mark.parametrize("target,message", [
    (None, r"^model\.target=null: model=custom needs model\.target=<module>:<factory>"),
    ("my_model", r"^model\.target=my_model: not module:function"),
    ("no_such_module_xyz:build", r"^model\.target=no_such_module_xyz:build: cannot import 'no_such_module_xyz' "
                                 r"\(ModuleNotFoundError"),
    (f"{EXAMPLE}:nope", r"^model\.target=.*my_model\.py:nope: .* has no attribute 'nope'$"),
    ("/no/such/file.py:build", r"^model\.target=/no/such/file\.py:build: no such file"),
    ("torch:nn", r"^model\.target=torch:nn: torch\.nn is a module, not callable"),
])
def test_custom_target_that_cannot_be_had_is_one_line(target, message):
    with pytest.raises(ModelError, match=message) as e:
        get_model(kind_config("custom", target=target))
    assert "\n" not in str(e.value)


def test_custom_factory_returning_a_non_model_names_the_missing_member(tmp_path):
    target = _factory_file(tmp_path, """
        import torch
        class Half:
            num_layers = 2
            def build_layer(self, i): return torch.nn.Linear(4, 4)
            def build_layers(self, start, end, seed): return torch.nn.Sequential()
            def batch(self, seed, step, samples): return torch.zeros(samples, 4), torch.zeros(samples, 4)
            def loss(self, output, target): return (output - target).pow(2).mean()
            def activation_shape(self, b): return (b, 4)
            def kind(self, i): return "linear"
            def input_shape(self, i, b): return (b, 4), torch.float32
        def build(cfg):
            return Half()
        """)
    with pytest.raises(ModelError, match=r"^model\.target=.*:build: returned a Half without `fwd_flops` "
                                         r"\(a model provides num_layers, build_layer"):
        get_model(kind_config("custom", target=target))


def test_custom_layerstack_leaving_a_member_unwritten_names_it(tmp_path):
    target = _factory_file(tmp_path, """
        import torch
        from harness.model.stack import LayerStack
        class Partial(LayerStack):
            def build_layer(self, i): return torch.nn.Linear(4, 4)
        def build(cfg):
            return Partial(cfg)
        """)
    with pytest.raises(ModelError, match=r"returned a Partial without `batch`"):
        get_model(kind_config("custom", target=target))


@pytest.mark.parametrize("body,message", [
    ("def build(cfg):\n    return 3\n", r"returned a int without `num_layers`"),
    ("def build(cfg):\n    raise RuntimeError('boom')\n", r"the factory raised RuntimeError: boom$"),
    ("raise ImportError('broken')\n", r"importing .*user_model\.py raised ImportError: broken$"),
])
def test_custom_factory_failures_are_one_line(tmp_path, body, message):
    with pytest.raises(ModelError, match=message) as e:
        get_model(kind_config("custom", target=_factory_file(tmp_path, body)))
    assert "\n" not in str(e.value)


def test_custom_kwargs_reach_the_factory_and_unknown_ones_are_refused():
    cfg = kind_config("custom", target=f"{EXAMPLE}:build", layers=2, hidden=16, kwargs={"classes": 3})
    model = get_model(cfg)
    assert model.build_layers(3, 4, seed=0)[0][1].out_features == 3
    cfg.kwargs = {"classes": 3, "depth": 9}
    with pytest.raises(ModelError, match=r"^model\.kwargs=\{classes:3, depth:9\}: .* takes \(cfg, features, "
                                         r"classes\)"):
        get_model(cfg)


def test_custom_module_target_resolves_from_the_current_directory(monkeypatch):
    """`model.target=my_model:build` run from examples/, with the directory not on sys.path."""
    monkeypatch.chdir(ROOT / "examples")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(ROOT / "examples"))])
    monkeypatch.delitem(sys.modules, "my_model", raising=False)
    model = get_model(kind_config("custom", target="my_model:build", layers=3, hidden=8))
    assert model.num_layers == 5 and get_model(kind_config("custom", target="my_model:build", layers=3)).num_layers == 5
    sys.modules.pop("my_model", None)


def test_custom_model_refused_before_any_worker(config):
    """A bad target is a ConfigError from planning (what the CLI prints as one line)."""
    from harness.planning.plan import make_plan

    with pytest.raises(ConfigError, match=r"^model\.target=no_such_module_xyz:build: cannot import"):
        make_plan(config(pp=2, **{"model.name": "custom", "model.target": "no_such_module_xyz:build"}))


def test_protocol_members_are_what_the_callers_use():
    assert MEMBERS == ("num_layers", "build_layer", "build_layers", "batch", "loss", "activation_shape", "kind",
                       "input_shape", "fwd_flops")
