"""What an advice's compute times rest on (advice.json's `compute`): measured or derived, from
which profile, the share of the GPU's dense peak each layer kind is priced at, forward and
backward, at the recommended point's microbatch size, and, for a derived profile priced per
operation, each operation class's seconds and price (`operations`, each marked derived or
measured). `flops_convention` names how MFU counts FLOPs (harness/planning/flops.py)."""

from __future__ import annotations

import statistics

from harness.planning.devices import lookup
from harness.planning.flops import CONVENTION
from harness.model.profile_data import load_profile, read_profile

from .problem import shown
from .search import Prediction, Problem


def compute_summary(p: Problem, best: Prediction | None) -> dict:
    c = p.config_of(best.point) if best is not None else p.config  # the profile of its TP rank
    gpu = c.cluster.gpu if c.cluster is not None else ""
    device = lookup(gpu)
    if not c.profile:
        return {"source": "modeled", "profile": None, "device": gpu or None, "efficiency": {},
                "flops_convention": CONVENTION,
                "note": "compute from cost.* (no profile): not a device's times; give profile= to price a GPU"}
    data = read_profile(c.profile)
    derived = bool(data.get("derived"))
    b = best.point.microbatch_size if best is not None else c.microbatch_size
    efficiency: dict[str, dict[str, float]] = {}
    if device is not None:
        peak = device.peak_flops(c.dtype)
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for lc in load_profile(c.profile, b, p.model.kinds):
            if lc.fwd_flops > 0 and lc.fwd_s > 0 and lc.bwd_s > 0:  # a layer of no time has no share of peak
                flops = lc.fwd_flops / c.tp  # a TP rank's share of the layer's (the profile's are the whole layer's)
                by_kind.setdefault(lc.kind, []).append((flops / (lc.fwd_s * peak), 2 * flops / (lc.bwd_s * peak)))
        efficiency = {k: {"fwd": statistics.median([f for f, _ in v]), "bwd": statistics.median([w for _, w in v])}
                      for k, v in by_kind.items()}
    derivation = data.get("derivation") or {}
    if derived:
        note = f"How they were derived: {derivation.get('method', 'see the profile')}."
        fit = derivation.get("leave_one_out")
        if fit:
            note += (f" The compute model predicts each measured microbatch size of {derivation.get('source')} "
                     f"from the others within {fit['worst_whole_model']:.1%} (the whole model's forward and "
                     "backward).")
    else:
        note = f"measured on {data.get('device', '?')} ({data.get('dtype', '?')})"
    out = {"source": "derived" if derived else "measured", "profile": shown(c.profile), "tp": c.tp,
           "device": gpu or None,
           "microbatch_size": b, "efficiency": efficiency, "flops_convention": CONVENTION, "note": note}
    if device is None:
        out["efficiency_note"] = f"cluster.gpu={gpu!r}: not in harness/planning/devices.py: no peak to divide by"
    if derived and "compute_model" in derivation:
        cm = derivation["compute_model"]
        if ops := operation_summary(derivation, b):
            out["operations"] = ops
        out["fit"] = {"source": derivation.get("source"), "sustained": cm.get("sustained"),
                      "sustained_source": cm.get("sustained_source"),
                      "worst_leave_one_out": (derivation.get("leave_one_out") or {}).get("worst_whole_model")}
    return out


def operation_summary(derivation: dict, b: int) -> list[dict]:
    """A derived block's seconds per operation class at microbatch size b (the nearest derived
    size below or at it, else the smallest), with what each class is priced at and whether that
    price is derived; [] for a profile not priced per operation."""
    # the rates at the derived model's own sequence length (older profiles: the source's)
    priced = derivation.get("priced_per_operation") or (derivation.get("compute_model") or {}).get("priced_per_operation")
    by_size = (derivation.get("operations") or {}).get("block") or {}
    if not priced or not by_size:
        return []
    sizes = sorted(by_size, key=int)
    size = max((s for s in sizes if int(s) <= b), key=int, default=sizes[0])
    ops = by_size[size]
    g, a, m = priced["gemm"], priced["attention"], priced["memory"]
    prices = {
        "gemm": (f"roofline: {g['roof_share_of_peak']:.0%} of {g['peak_tflops']:.0f} TFLOP/s, fewer tiles than "
                 f"{g['sms']} SMs idle some, bytes at HBM bandwidth", g["source"], g["derived"]),
        "attention": (f"{a['fwd_tflops']:.0f} / {a['bwd_tflops']:.0f} TFLOP/s forward / backward (causal, "
                      f"s={a['at_seq']})", a["source"], a["derived"]),
        "memory": (f"{m['share_of_bandwidth']:.0%} of {m['bandwidth_Bps'] / 1e12:.2f} TB/s", m["source"], m["derived"]),
    }
    rows = [{"class": cls, "fwd_s": ops["fwd"][cls], "bwd_s": ops["bwd"][cls], "priced_at": at, "source": src,
             "derived": der, "microbatch_size": int(size)} for cls, (at, src, der) in prices.items()]
    rows.append({"class": "launch floor (fitted)", "fwd_s": ops["fwd"]["floor_s"], "bwd_s": ops["bwd"]["floor_s"],
                 "priced_at": "the layer's lower bound (binding only where its operations take less), fitted on "
                              f"the measured {derivation.get('source')}", "source": derivation.get("source"),
                 "derived": False, "microbatch_size": int(size)})
    return rows
