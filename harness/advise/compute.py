"""What an advice's compute times rest on (advice.json's `compute`): measured or derived, from
which profile, and the share of the GPU's dense peak each layer kind is priced at, forward and
backward, at the recommended point's microbatch size."""

from __future__ import annotations

import statistics

from harness.planning.devices import lookup
from harness.model.profile_data import load_profile, read_profile

from .problem import shown
from .search import Prediction, Problem


def compute_summary(p: Problem, best: Prediction | None) -> dict:
    c = p.config
    gpu = c.cluster.gpu if c.cluster is not None else ""
    device = lookup(gpu)
    if not c.profile:
        return {"source": "modeled", "profile": None, "device": gpu or None, "efficiency": {},
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
                by_kind.setdefault(lc.kind, []).append((lc.fwd_flops / (lc.fwd_s * peak),
                                                        2 * lc.fwd_flops / (lc.bwd_s * peak)))
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
    out = {"source": "derived" if derived else "measured", "profile": shown(c.profile), "device": gpu or None,
           "microbatch_size": b, "efficiency": efficiency, "note": note}
    if device is None:
        out["efficiency_note"] = f"cluster.gpu={gpu!r}: not in harness/planning/devices.py: no peak to divide by"
    if derived and "compute_model" in derivation:
        cm = derivation["compute_model"]
        out["fit"] = {"source": derivation.get("source"), "sustained": cm.get("sustained"),
                      "sustained_source": cm.get("sustained_source"),
                      "worst_leave_one_out": (derivation.get("leave_one_out") or {}).get("worst_whole_model")}
    return out
