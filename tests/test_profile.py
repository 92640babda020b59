"""The profiler (harness/profile.py) and profiles of any model (harness/model/profile_data.py).

Fast, CPU only, in-process (harness.profile.main(argv)): the profiler writes the schema of
data/gpt2_h200_profile.json (its keys at every level, per layer and per microbatch size) for
mlp, gpt, hf (llama, gpt2) and a custom model, in fp32 and bf16; parameters and FLOPs are the
model's; the block expansion (--blocks 1) runs the embedding, one block and the head of a
scaled-down Llama-70B shape and writes every block, which load_profile reads and a small
stand-in GPT of the same layer count plans (partition=profile, params) and replays
(compute=emulated, executor=sim); --estimate scales a layer from a measured one by FLOPs; a
profile with NaN or negative times is still refused in one line."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import harness.profile as profiler  # noqa: E402
from harness.config import ConfigError, model_config  # noqa: E402
from harness.job import run_job  # noqa: E402
from harness.model import get_model  # noqa: E402
from harness.model.profile_data import ProfileError, load_profile  # noqa: E402
from harness.model.built import BuiltModel  # noqa: E402
from harness.planning.plan import make_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
H200 = json.loads((ROOT / "data" / "gpt2_h200_profile.json").read_text())
FAST = ["--microbatch-sizes", "1", "2", "--warmup", "0", "--repeats", "1", "--compare"]

TINY = {
    "mlp": {"name": "mlp", "layers": 3, "hidden": 16},
    "gpt": {"name": "gpt", "layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 64},
    "llama": {"name": "hf", "arch": "llama", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 48,
              "seq": 8, "vocab": 64},
    "gpt2": {"name": "hf", "arch": "gpt2", "layers": 2, "hidden": 32, "heads": 4, "seq": 8, "vocab": 64},
    "custom": {"name": "custom", "target": f"{ROOT / 'examples' / 'my_model.py'}:build", "layers": 2, "hidden": 16},
}
# Llama-70B's shape scaled down: 8 query heads per KV head, ffn 3.5 x hidden, a vocab 16 x hidden
LLAMA_SCALED = {"name": "hf", "arch": "llama", "layers": 6, "hidden": 64, "heads": 8, "kv_heads": 1, "ffn": 224,
                "seq": 16, "vocab": 1024}
# the stand-in that replays it: a tiny GPT with as many blocks
STAND_IN = {"model.name": "gpt", "model.layers": 6, "model.hidden": 16, "model.heads": 2, "model.seq": 8,
            "model.vocab": 64}


def overrides(model: dict) -> list[str]:
    return [f"model={model['name']}"] + [f"model.{k}={v}" for k, v in model.items() if k != "name"]


def run_profiler(out: Path, model: dict, *extra: str) -> dict:
    assert profiler.main([*overrides(model), *extra, *FAST, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def kind_of(value: object) -> str:
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def assert_same_schema(prof: dict, ref: dict = H200) -> None:
    """Every key the reference has, at every level, with a value of the same kind; and the
    same keys in every layer and every microbatch size of `prof`."""
    def covers(ours: dict, theirs: dict, where: str) -> None:
        missing = set(theirs) - set(ours)
        assert not missing, f"{where}: missing {sorted(missing)}"
        for k in theirs:
            if where == "model" and ours[k] is None and k not in ours["config"]:
                continue  # a key this model kind does not have (an mlp's vocab): null
            assert kind_of(ours[k]) == kind_of(theirs[k]), f"{where}.{k}: {ours[k]!r} vs {theirs[k]!r}"

    covers(prof, ref, "top")
    covers(prof["model"], ref["model"], "model")
    assert len({frozenset(lay) for lay in prof["layers"]}) == 1, "layers with different keys"
    assert len({frozenset(lay["by_microbatch"]) for lay in prof["layers"]}) == 1, "layers with different sizes"
    assert len({frozenset(v) for lay in prof["layers"] for v in lay["by_microbatch"].values()}) == 1
    for lay in prof["layers"]:
        covers(lay, ref["layers"][1], f"layer {lay['index']}")
        for b, v in lay["by_microbatch"].items():
            covers(v, ref["layers"][1]["by_microbatch"]["1"], f"layer {lay['index']} B={b}")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(TINY))
def test_the_profiler_writes_the_h200_schema_for_every_model(tmp_path, name, dtype):
    prof = run_profiler(tmp_path / "p.json", TINY[name], f"dtype={dtype}")
    assert_same_schema(prof)
    model = get_model(model_config(**TINY[name]))
    n = model.num_layers
    assert prof["dtype"] == {"fp32": "torch.float32", "bf16": "torch.bfloat16"}[dtype]
    assert (prof["device"], prof["torch"]) == ("cpu", torch.__version__)
    assert prof["model"]["config"]["name"] == TINY[name]["name"] and prof["model"]["num_layers"] == n
    assert [lay["index"] for lay in prof["layers"]] == list(range(n))
    assert [lay["kind"] for lay in prof["layers"]] == [model.kind(i) for i in range(n)]
    assert [lay["params"] for lay in prof["layers"]] == BuiltModel(model_config(**TINY[name])).layer_params  # the model's
    for lay in prof["layers"]:
        assert lay["measured"] and lay["copied_from"] is None and lay["estimated_from"] is None
        assert sorted(lay["by_microbatch"], key=int) == ["1", "2"]
        for b, v in lay["by_microbatch"].items():
            assert v["fwd_flops"] == model.fwd_flops(lay["index"], int(b))
            assert all(math.isfinite(v[k]) and v[k] > 0 for k in ("fwd_s", "bwd_s"))
    notes: list[str] = []
    assert len(load_profile(tmp_path / "p.json", 2, n, notes)) == n and not notes


def test_bf16_layers_save_half_the_bytes_of_fp32(tmp_path):
    """The layers really run in the dtype: an mlp layer saves its input and GELU's, in dtype."""
    saved = {d: run_profiler(tmp_path / f"{d}.json", TINY["mlp"], f"dtype={d}")["layers"][1]["by_microbatch"]["2"]
             ["activation_bytes"] for d in ("fp32", "bf16")}
    assert saved["bf16"] * 2 == saved["fp32"] > 0


def spy_on_measured(monkeypatch) -> list[int]:
    """The indices of the layers the profiler runs, in order."""
    ran: list[int] = []
    measure = profiler.measure_layer

    def spy(model, i, *args, **kwargs):
        ran.append(i)
        return measure(model, i, *args, **kwargs)

    monkeypatch.setattr(profiler, "measure_layer", spy)
    return ran


def test_one_block_expands_to_the_whole_model_and_a_stand_in_replays_it(tmp_path, monkeypatch, config):
    ran = spy_on_measured(monkeypatch)
    out = tmp_path / "llama.json"
    prof = run_profiler(out, LLAMA_SCALED, "dtype=bf16", "--blocks", "1")
    model = get_model(model_config(**LLAMA_SCALED))
    n = model.num_layers
    assert ran == [0, 1, n - 1]  # the embedding, ONE block, the head
    assert_same_schema(prof)
    layers = prof["layers"]
    llama = BuiltModel(model_config(**LLAMA_SCALED)).layer_params
    assert len(layers) == n == 8 and [lay["params"] for lay in layers] == llama
    assert [lay["measured"] for lay in layers] == [True, True] + [False] * 5 + [True]
    assert [lay["copied_from"] for lay in layers] == [None, None] + [1] * 5 + [None]
    measurement = prof["measurement"]
    assert (measurement["measured_layers"], measurement["copied_layers"]) == ([0, 1, 7], [2, 3, 4, 5, 6])
    for lay in layers[2:-1]:
        assert lay["by_microbatch"] == layers[1]["by_microbatch"]  # times, FLOPs and bytes: the same block

    notes: list[str] = []
    costs = load_profile(out, 1, n, notes)
    assert [c.kind for c in costs] == ["embed"] + ["block"] * 6 + ["head"]
    assert notes == [f"profile={out}: 5 of 8 layers copied from measured layer(s) 1 "
                     "(python -m harness.profile --blocks/--estimate)"]

    # replay: a tiny GPT with as many layers, planned and emulated from the Llama's profile
    times = [c.fwd_s + c.bwd_s for c in costs]
    c = config(profile=str(out), compute="emulated", pp=4, microbatches=4, microbatch_size=1,
               **{**STAND_IN, "partition.name": "profile"})
    plan = make_plan(c)
    assert plan.partition.layer_costs == pytest.approx(times)
    assert sum(plan.emulated_cost.fwd_s) == pytest.approx(sum(x.fwd_s for x in costs))
    assert any("copied from measured layer" in note for note in plan.notes)
    by_params = make_plan(config(profile=str(out), pp=4, **{**STAND_IN, "partition.name": "params"}))
    assert by_params.partition.layer_costs == [float(p) for p in llama]  # the Llama's, not the stand-in's
    result = run_job(config(profile=str(out), executor="sim", pp=4, microbatches=4, microbatch_size=1,
                            **{**STAND_IN, "partition.name": "profile"}), tmp_path / "job", "test", "replay")
    assert result.status == "ok", result.error


def test_estimate_scales_a_layer_from_a_measured_block_by_flops(tmp_path, monkeypatch):
    ran = spy_on_measured(monkeypatch)
    prof = run_profiler(tmp_path / "e.json", LLAMA_SCALED, "--blocks", "1", "--estimate", "head")
    assert ran == [0, 1]
    assert_same_schema(prof)
    head, block = prof["layers"][-1], prof["layers"][1]
    assert (head["measured"], head["copied_from"], head["estimated_from"]) == (False, None, 1)
    for b, v in head["by_microbatch"].items():
        ratio = v["fwd_flops"] / block["by_microbatch"][b]["fwd_flops"]
        assert v["fwd_s"] == pytest.approx(block["by_microbatch"][b]["fwd_s"] * ratio)
        assert v["bwd_s"] == pytest.approx(block["by_microbatch"][b]["bwd_s"] * ratio)
    measured = run_profiler(tmp_path / "m.json", LLAMA_SCALED, "--blocks", "1")["layers"][-1]
    assert [v["activation_bytes"] for v in head["by_microbatch"].values()] == \
        [v["activation_bytes"] for v in measured["by_microbatch"].values()]  # fake-tensor trace = real one
    notes: list[str] = []
    load_profile(tmp_path / "e.json", 1, 8, notes)
    assert "layer(s) 7 estimated from a measured layer's times by FLOPs" in notes[0]


@pytest.fixture(scope="module")
def expanded(tmp_path_factory) -> dict:
    return run_profiler(tmp_path_factory.mktemp("expanded") / "p.json", LLAMA_SCALED, "--blocks", "1")


@pytest.mark.parametrize("field,value,shown", [("fwd_s", float("nan"), "fwd_s=nan"),
                                               ("bwd_s", -1.0, "bwd_s=-1.0"),
                                               ("fwd_s", float("inf"), "fwd_s=inf")])
def test_a_bad_expanded_profile_is_refused_in_one_line(tmp_path, config, expanded, field, value, shown):
    prof = json.loads(json.dumps(expanded))
    prof["layers"][3]["by_microbatch"]["1"][field] = value  # a copied block
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(prof))  # json writes NaN / Infinity, as a sloppy profiler would
    with pytest.raises(ProfileError) as e:
        load_profile(bad, 1, 8)
    assert "\n" not in str(e.value) and f"layer 3, microbatch size 1: {shown}" in str(e.value)
    with pytest.raises(ConfigError) as e:
        make_plan(config(profile=str(bad), compute="emulated", pp=2, **{**STAND_IN, "partition.name": "profile"}))
    assert "\n" not in str(e.value) and shown in str(e.value)


@pytest.mark.parametrize("args,message", [
    (["dtype=fp8"], "dtype=fp8: unknown (allowed: fp32, bf16, fp16)"),
    (["--blocks", "0"], "--blocks 0: must be >= 1"),
    (["--estimate", "nope"], "--estimate nope: no such layer kind in this model (allowed: linear)"),
    (["--estimate", "linear"], "--estimate linear: needs a measured layer with FLOPs"),
    (["model.bogus=1"], "model.bogus"),
    (["model.hidden=1000000"], "layer 0 (linear): 1,000,001,000,000 parameters need"),  # refused before it runs
])
def test_bad_profiler_options_in_one_line(tmp_path, capsys, args, message):
    threads = torch.get_num_threads()
    assert profiler.main(["model.layers=2", "model.hidden=8", *args, *FAST, "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("harness.profile: error: ") and "\n" not in err and message in err, err
    assert not (tmp_path / "p.json").exists() and torch.get_num_threads() == threads


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where there is no CUDA device")
def test_device_cuda_without_a_gpu_is_refused(tmp_path, capsys):
    assert profiler.main(["device=cuda", *FAST, "--out", str(tmp_path / "p.json")]) == 2
    assert "device=cuda: no CUDA device here" in capsys.readouterr().err
