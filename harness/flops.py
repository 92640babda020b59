"""FLOPs per step, achieved TFLOP/s per device, MFU and HFU of a plan at a step time.

Model FLOPs: 3 x the forward FLOPs of every layer on one microbatch (a backward does twice its
forward's), x microbatches x dp: what the model needs, whatever the schedule. Hardware FLOPs
add what checkpointing runs again: every stage's forward once more inside its backward.
Forward FLOPs are the model's closed form (Model.fwd_flops: tests/test_flops.py holds it
against torch's FLOP counter), or the profile's when the times are the profile's (compute=
emulated or executor=sim with `profile=`: the profile describes the model under study).

MFU = achieved model FLOP/s per device / the device's dense peak in the run's dtype
(harness/devices.py); HFU the same with hardware FLOPs. The device is the one that ran
(torch's name for it), the cluster's `gpu` for executor=sim; MFU is n/a, with the reason,
on CPU, for a device the table does not list, and under compute=emulated (its times are
modeled, not a device's).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.devices import Device, lookup
from harness.model.profile_data import load_profile
from harness.plan import Plan


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
                      else f"{device_name!r} is not in harness/devices.py")
    return dev, None


@dataclass(frozen=True)
class Utilization:
    tflops_per_device: float  # model FLOPs
    hardware_tflops_per_device: float
    peak_tflops_per_device: float | None
    mfu: float | None
    hfu: float | None
    device: str | None  # the table's name for it
    note: str | None  # why MFU is n/a


def utilization(flops: StepFlops, step_s: float, devices: int, device: Device | None, dtype: str,
                note: str | None = None) -> Utilization:
    model, hardware = flops.model / step_s / devices, flops.hardware / step_s / devices
    peak = device.peak_flops(dtype) if device is not None else None
    return Utilization(model / 1e12, hardware / 1e12, None if peak is None else peak / 1e12,
                       None if peak is None else model / peak, None if peak is None else hardware / peak,
                       None if device is None else device.name, note)
