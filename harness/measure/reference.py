"""Single-process full-batch reference: the same model, seed, data, precision and optimizer as
a pipeline run, with no pipeline. Every schedule must reproduce its losses and gradients."""

from __future__ import annotations

import torch

from harness.config import Config
from harness.model.built import BuiltModel, built_model
from harness.runtime.optimizer import Optimizer
from harness.runtime.precision import Precision


def reference_losses(c: Config, built: BuiltModel | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses of every step (warm-up included) and the last step's gradients (fp32) by
    parameter name ("layer.param") of one process running the whole global batch. `built`:
    the config's model, when the caller has built it (a job's plan has)."""
    torch.set_num_threads(1)
    built = built or built_model(c.model)
    model, precision = built.model, Precision(c.dtype)
    net = built.build_stage(0, model.num_layers, c.seed, precision.dtype)
    opt = Optimizer(list(net.parameters()), c.lr, c.optimizer, precision)
    losses, grads = [], {}
    for step in range(c.warmup_steps + c.steps):
        x, y = model.batch(c.seed, step, c.dp * c.microbatches * c.microbatch_size)  # the global batch
        loss = model.loss(net(precision.cast(x)).float(), y)
        (loss * precision.loss_scale).backward()
        losses.append(loss.item())
        grads = {n: p.grad.float() / precision.loss_scale for n, p in net.named_parameters()}
        opt.step()
        opt.zero_grad()
    return losses, grads
