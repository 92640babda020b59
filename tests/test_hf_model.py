"""model=hf computes exactly what transformers' own model computes.

Fast, in-process: for every arch, the stack of pipeline layers (embedding, blocks, head) and
transformers' *ForCausalLM holding the same weights (mapped by name) give the same logits,
loss and gradients; the I/W split of the blocks' linears gives the same gradients as a full
backward. dist: the pipeline (gpipe, 1f1b, zb_h1) trains to the same losses as the HF model
trained on the same batches by SGD, and its gradients equal the HF model's. Built from config
classes only: nothing is downloaded (HF_HUB_OFFLINE is set here to make sure)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from harness.config import ConfigError, ModelConfig, model_config  # noqa: E402
from harness.job import run_job  # noqa: E402
from harness.model import ModelError, get_model  # noqa: E402
from harness.model.hf import ARCHS, HFModel  # noqa: E402
from harness.model.split_linear import SplitLinear, WeightGradStore, attach_store  # noqa: E402
from harness.measure.reference import reference_losses  # noqa: E402

TINY = {"layers": 2, "hidden": 32, "heads": 4, "seq": 16, "vocab": 128}
KV = {"gpt2": None, "llama": 2, "mistral": 2, "qwen2": 1}  # grouped-query attention where the arch has it


def tiny(arch: str, **overrides) -> ModelConfig:
    return model_config("hf", arch=arch, **{**TINY, "kv_heads": KV[arch], **overrides})


def hf_loss(hf: nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """transformers' own forward and its own causal-LM loss (targets are the next tokens)."""
    logits = hf(input_ids=ids).logits
    return hf.loss_function(logits=logits, labels=None, vocab_size=hf.config.vocab_size, shift_labels=targets)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_stack_of_layers_is_the_hf_model(arch):
    torch.manual_seed(0)
    model = get_model(tiny(arch))
    assert isinstance(model, HFModel) and model.num_layers == TINY["layers"] + 2
    net = model.build_layers(0, model.num_layers, seed=3)
    hf = model.to_hf(net)
    assert type(hf).__name__ == ARCHS[arch].causal_lm and not hf.config.tie_word_embeddings
    ids, targets = model.batch(seed=3, step=0, samples=3)
    out = net(ids)
    loss = model.loss(out, targets)
    loss.backward()
    expected = hf_loss(hf, ids, targets)
    expected.backward()
    assert torch.allclose(out, hf(input_ids=ids).logits, rtol=1e-5, atol=1e-6)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    grads = model.to_hf_tensors({n: p.grad for n, p in net.named_parameters()})
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}
    assert set(grads) == set(hf_grads)  # every parameter mapped, none left over
    assert max(rel(grads[n], hf_grads[n]) for n in grads) < 1e-5


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_blocks_defer_their_weight_gradients_and_I_plus_W_is_a_full_backward(arch):
    model = get_model(tiny(arch))
    net = model.build_layers(0, model.num_layers, seed=0)
    plain = [m for m in net.modules() if (isinstance(m, nn.Linear) and not isinstance(m, SplitLinear))
             or type(m).__name__ == "Conv1D"]
    assert not plain, plain  # every linear is a SplitLinear
    ids, targets = model.batch(0, 0, 2)
    model.loss(net(ids), targets).backward()
    full = {n: p.grad.clone() for n, p in net.named_parameters()}
    net.zero_grad(set_to_none=True)
    store = WeightGradStore()
    attach_store(net, store)
    loss = model.loss(net(ids), targets)
    with store.defer("mb"):  # I
        loss.backward()
    deferred = {n for n, p in net.named_parameters() if p.grad is None}
    linear_weights = {f"{n}.weight" for n, m in net.named_modules() if isinstance(m, SplitLinear)}
    assert linear_weights <= deferred and len(deferred) < len(full)  # norms, embeddings: in I
    store.run("mb")  # W
    assert all(torch.equal(full[n], p.grad) for n, p in net.named_parameters())


def test_layers_are_built_without_transformers_model_download(monkeypatch):
    """No hub access: building and mapping use config classes only."""
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    model = get_model(tiny("llama"))
    model.to_hf(model.build_layers(0, model.num_layers, seed=0))


def test_flops_and_params_follow_the_shape():
    gqa, mha = get_model(tiny("llama")), get_model(tiny("llama", kv_heads=None))
    assert gqa.fwd_flops(1, 2) < mha.fwd_flops(1, 2)  # fewer key/value heads, fewer FLOPs
    assert gqa.fwd_flops(0, 2) == 0 and gqa.fwd_flops(3, 2) == 2 * 2 * 16 * 32 * 128
    kinds = [gqa.kind(i) for i in range(gqa.num_layers)]
    assert kinds == ["embed", "block", "block", "head"]
    assert gqa.input_shape(0, 2) == ((2, 16), torch.int64) and gqa.activation_shape(2) == (2, 16, 32)


@pytest.mark.parametrize("overrides,message", [
    ({"arch": "bert"}, r"^model\.arch=bert: unknown \(allowed: gpt2, llama, mistral, qwen2\)$"),
    ({"heads": 3}, r"^model\.heads=3: must divide model\.hidden=32$"),
    ({"kv_heads": 3}, r"^model\.kv_heads=3: must divide model\.heads=4"),
    ({"kv_heads": 0}, r"^model\.kv_heads=0: must divide model\.heads=4"),
    ({"arch": "gpt2", "kv_heads": 2}, r"^model\.kv_heads=2: gpt2 has no grouped-query attention"),
    ({"hidden": 24, "heads": 8}, r"^model\.heads=8: llama's rotary embedding needs an even head width"),
    ({"vocab": 0}, r"^model\.vocab=0: must be an integer >= 1$"),
    ({"attention": "flash"}, r"^model\.attention=flash: unknown \(allowed: sdpa, eager\)$"),
])
def test_bad_hf_config_is_one_line(overrides, message):
    cfg = tiny("llama")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    with pytest.raises(ModelError, match=message) as e:
        get_model(cfg)
    assert isinstance(e.value, ConfigError) and "\n" not in str(e.value)


def test_bad_hf_config_is_refused_before_any_worker(config):
    from harness.planning.plan import make_plan

    with pytest.raises(ConfigError, match=r"^model\.arch=bert: unknown"):
        make_plan(config(pp=2, **{"model.name": "hf", "model.arch": "bert"}))


# -- dist: the pipeline against transformers' own training ------------------------------------
def hf_training(c) -> tuple[list[float], dict[str, torch.Tensor], HFModel]:
    """transformers' model, from the pipeline's initial weights, trained as the harness's
    reference is (SGD on every step's global batch): losses and the last step's gradients."""
    torch.set_num_threads(1)
    model = get_model(c.model)
    hf = model.to_hf(model.build_layers(0, model.num_layers, seed=c.seed))
    opt = torch.optim.SGD(hf.parameters(), lr=c.lr)
    losses, grads = [], {}
    for step in range(c.warmup_steps + c.steps):
        ids, targets = model.batch(c.seed, step, c.microbatches * c.microbatch_size)
        loss = hf_loss(hf, ids, targets)
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.clone() for n, p in hf.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads, model


HF_DIST = [("llama", "gpipe"), ("llama", "1f1b"), ("llama", "zb_h1"), ("gpt2", "zb_h1")]


@pytest.mark.dist
@pytest.mark.parametrize("arch,schedule", HF_DIST)
def test_pipeline_trains_exactly_as_the_hf_model(tmp_path, config, arch, schedule):
    model_keys = {f"model.{k}": v for k, v in {**TINY, "arch": arch, "kv_heads": KV[arch]}.items()}
    c = config(pp=2, microbatches=4, microbatch_size=2, steps=2, verify_grads=True,
               **{"schedule.name": schedule, "model.name": "hf", **model_keys})
    result = run_job(c, tmp_path, "test", f"hf-{arch}-{schedule}")
    assert result.status == "ok", result.error
    hf_losses, hf_grads, model = hf_training(c)
    # the harness scales each microbatch loss by 1/M and sums: the mean loss of the batch
    assert result.metrics.losses == pytest.approx(hf_losses, rel=1e-5)
    # the pipeline's gradients equal the single-process stack's (verify_grads), which equal HF's
    assert result.metrics.grad_check.max_rel_diff < 1e-5, result.metrics.grad_check
    ref_losses, ref = reference_losses(c)
    assert result.metrics.losses == pytest.approx(ref_losses, rel=1e-5)  # and the single-process reference's
    ref_grads = model.to_hf_tensors(ref)
    assert set(ref_grads) == set(hf_grads)
    assert max(rel(ref_grads[n], hf_grads[n]) for n in hf_grads) < 1e-5
    if schedule == "zb_h1":  # I and W ran, and still the same losses
        assert result.metrics.mean_op_s.get("I") and result.metrics.mean_op_s.get("W")
