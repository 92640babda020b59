"""FLOPs per step, achieved TFLOP/s per device, MFU and HFU of a plan at a step time.

Model FLOPs: 3 x the forward FLOPs of every layer on one microbatch (a backward does twice its
forward's), x microbatches x dp: what the model needs, whatever the schedule. Hardware FLOPs
add what checkpointing runs again: every stage's forward once more inside its backward.
Forward FLOPs are the model's closed form (Model.fwd_flops: tests/test_flops.py holds it
against torch's FLOP counter), or the profile's when the times are the profile's (compute=
emulated or executor=sim with `profile=`: the profile describes the model under study).

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


@dataclass(frozen=True)
class StepFlops:
    model: float  # per step, all devices
    hardware: float  # model + recompute
    source: str


def step_flops(plan: Plan) -> StepFlops:
    c = plan.config
    if c.profile and (plan.simulated or c.compute == "emulated"):
        fwd = sum(lc.fwd_flops for lc in load_profile(c.profile, c.microbatch_size, plan.model.kinds))
        source = f"profile={c.profile} (fwd_flops per layer)"
    else:
        fwd = sum(plan.model.model.fwd_flops(i, c.microbatch_size) for i in range(plan.model.num_layers))
        source = "closed form (Model.fwd_flops)"
    per_microbatch = c.microbatches * c.dp
    model = 3 * fwd * per_microbatch
    return StepFlops(model, model + (fwd * per_microbatch if c.checkpointing else 0.0), source)


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
                 device=None if device is None else device.name, source=f.source, note=why)
