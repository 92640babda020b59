"""FLOPs per step, achieved TFLOP/s per device, MFU and HFU of a plan at a step time.

The convention is the field's (CONVENTION = "megatron"): model FLOPs = 3 x the forward FLOPs
of every layer on one microbatch (a backward does twice its forward's), x microbatches x dp,
with causal attention's WHOLE s^2 term, as Megatron-LM (Narayanan et al., SC21, appendix:
96 B s l h^2 (1 + s/6h + V/16lh) with recompute, i.e. a block's forward 24 B s h^2 + 4 B s^2 h),
PaLM (Chowdhery et al. 2022, appendix B: 6N + 12 L H Q T FLOPs per token) and torchtitan count
it: a block's QK^T and AV are 4 B s^2 d forward, although a causal kernel computes half. So an
MFU here compares with a published one without conversion. Hardware FLOPs add what
checkpointing runs again (every stage's forward once more inside its backward): MFU excludes
recompute, HFU includes it (SC21 Table 1's TFLOP/s per GPU are HFU's numerator).

`model_causal` keeps the harness's older count (the causal half of the s^2 term: what the
kernels execute; Model.fwd_flops, which tests/test_flops.py holds against torch's FLOP counter).
Forward FLOPs are the model's closed form, or the profile's when the times are the profile's
(compute=emulated or executor=sim with `profile=`: the profile describes the model under study;
a profile's fwd_flops are Model.fwd_flops's, the causal half, and get the same correction).

MFU = achieved model FLOP/s per device / the device's dense peak in the run's dtype
(harness/planning/devices.py); HFU the same with hardware FLOPs. The device is the one that ran
(torch's name for it), the cluster's `gpu` for executor=sim; MFU is n/a, with the reason,
on CPU, for a device the table does not list, and under compute=emulated (its times are
modeled, not a device's).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.planning.devices import Device, lookup
from harness.model.profile_data import load_profile
from harness.planning.plan import Plan
from harness.records.result import Flops


CONVENTION = "megatron"  # causal attention's whole s^2 term (Megatron-LM, PaLM appendix B, torchtitan)


@dataclass(frozen=True)
class StepFlops:
    model: float  # per step, all devices, in CONVENTION
    hardware: float  # model + recompute
    source: str
    model_causal: float = 0.0  # the causal half of attention's s^2 term (what a causal kernel runs)


def uncounted_attention_flops(model: object, i: int, microbatch_size: int) -> float:
    """What Model.fwd_flops leaves out of layer i's forward against the whole-s^2 convention:
    its causal half again, 2 B s^2 d for a token model's block (QK^T and AV over every head,
    heads x head_dim = d); 0 for other layers and models without a sequence."""
    cfg = getattr(model, "cfg", None)
    seq, hidden = getattr(cfg, "seq", None), getattr(cfg, "hidden", None)
    if not seq or not hidden or model.kind(i) != "block":
        return 0.0
    return 2.0 * microbatch_size * seq ** 2 * hidden


def step_flops(plan: Plan) -> StepFlops:
    c = plan.config
    m, b = plan.model.model, c.microbatch_size
    if c.profile and (plan.simulated or c.compute == "emulated"):
        causal = sum(lc.fwd_flops for lc in load_profile(c.profile, b, plan.model.kinds))
        source = f"profile={c.profile} (fwd_flops per layer)"
    else:
        causal = sum(m.fwd_flops(i, b) for i in range(plan.model.num_layers))
        source = "closed form (Model.fwd_flops)"
    fwd = causal + sum(uncounted_attention_flops(m, i, b) for i in range(plan.model.num_layers))
    per_microbatch = c.microbatches * c.dp
    model = 3 * fwd * per_microbatch
    return StepFlops(model, model + (fwd * per_microbatch if c.checkpointing else 0.0),
                     f"{source}, causal attention's whole s^2 term ({CONVENTION})", 3 * causal * per_microbatch)


def device_of(plan: Plan, device_name: str | None) -> tuple[Device | None, str | None]:
    """The table's device whose peak MFU divides by, or None and why not."""
    c = plan.config
    if plan.simulated:
        gpu = c.cluster.gpu if c.cluster is not None else ""
        if not gpu:
            return None, "executor=sim: no cluster.gpu named"
        device_name = gpu
    elif c.compute == "emulated":
        return None, "compute=emulated: its times are modeled, not a device's"
    dev = lookup(device_name)
    if dev is None:
        return None, ("cpu: no peak FLOP/s listed" if plan.device == "cpu" and not plan.simulated
                      else f"{device_name!r} is not in harness/planning/devices.py")
    return dev, None


def flops_of(plan: Plan, step_s: float, device_name: str | None = None) -> Flops:
    """The plan's FLOPs at `step_s` a step, per device over its pp x dp, against the device that
    ran it (`device_name`, torch's; executor=sim: the cluster's gpu)."""
    f = step_flops(plan)
    device, why = device_of(plan, device_name)
    devices = plan.world
    model, hardware = f.model / step_s / devices, f.hardware / step_s / devices
    peak = device.peak_flops(plan.config.dtype) if device is not None else None
    return Flops(model_per_step=f.model, hardware_per_step=f.hardware, tflops_per_device=model / 1e12,
                 hardware_tflops_per_device=hardware / 1e12, peak_tflops_per_device=None if peak is None else peak / 1e12,
                 mfu=None if peak is None else model / peak, hfu=None if peak is None else hardware / peak,
                 device=None if device is None else device.name, source=f.source, note=why,
                 convention=CONVENTION, model_per_step_causal=f.model_causal)
