"""Per-layer costs of the model under study at any microbatch size, and its stages.

A profile (harness.profile's JSON) gives each layer's forward and backward seconds at its
measured microbatch sizes; load_profile interpolates between them (harness/model/profile_data.py).
A profile with fewer layers than the model (a one-block profile: embedding, ONE block, head) is
expanded by kind: every layer of the model takes the times of the profile's layer of the same
kind, marked copied, as `harness.profile --blocks` writes it. Without a profile the costs are
cost.* (fwd_ms_per_layer with its fixed and per-sample parts), as compute=emulated holds them.

Stages are what partition=profile makes (min_max on each layer's forward + backward seconds
at the point's B), or equal layer counts (partition=uniform) without a profile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from harness.config import Config
from harness.model.partition import min_max, uniform
from harness.model.profile_data import ProfileError, load_profile

from .cluster import AdviseError


@dataclass(frozen=True)
class StageTimes:
    bounds: tuple[tuple[int, int], ...]
    fwd: tuple[float, ...]
    bwd: tuple[float, ...]


def profile_model(data: dict) -> dict | None:
    """The model a profile describes, as model.* keys, when it says: harness.profile's
    "model"."config", or GPT-2-style keys (vocab, seq, d_model, heads, blocks) for model=gpt."""
    m = data.get("model") or {}
    if isinstance(m.get("config"), dict):
        return dict(m["config"])
    if all(k in m for k in ("vocab", "seq", "d_model", "heads", "blocks")):
        return {"name": "gpt", "layers": int(m["blocks"]), "hidden": int(m["d_model"]), "heads": int(m["heads"]),
                "seq": int(m["seq"]), "vocab": int(m["vocab"])}
    return None


def expand(data: dict, kinds: list[str], path: str) -> dict:
    """A profile of len(kinds) layers: the profile's own when it has as many, else each model
    layer gets the first profile layer of its kind (marked "measured": false, "copied_from")."""
    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        raise AdviseError(f"profile={path}: no layers (write one with python -m harness.profile)")
    if len(layers) == len(kinds):
        return data
    by_kind: dict[str, dict] = {}
    for lay in layers:
        if isinstance(lay, dict) and "kind" in lay:
            by_kind.setdefault(str(lay["kind"]), lay)
    missing = sorted(set(kinds) - set(by_kind))
    if missing:
        raise AdviseError(f"profile={path}: {len(layers)} layers of kinds {', '.join(sorted(by_kind))}, the model has "
                          f"{len(kinds)} with kinds {', '.join(sorted(set(kinds)))}; no layer of kind "
                          f"{', '.join(missing)} to expand from (profile the model with --blocks 1)")
    out = []
    for i, k in enumerate(kinds):
        src = by_kind[k]
        lay = {key: val for key, val in src.items() if key not in ("index", "measured", "copied_from")}
        lay.update(index=i, measured=False, copied_from=int(src.get("index", layers.index(src))))
        out.append(lay)
    expanded = {key: val for key, val in data.items() if key != "layers"}
    expanded["layers"] = out
    expanded["expanded_from"] = {"path": str(path), "layers": len(layers),
                                 "rule": "each model layer takes the times of the profile's first layer of its kind"}
    return expanded


class LayerCosts:
    """Forward and backward seconds of every layer at a microbatch size (cached per size),
    x cost.time_scale, and the point's stages."""

    def __init__(self, c: Config, num_layers: int, profile: dict | None, profile_path: str | None):
        self.c, self.num_layers = c, num_layers
        self.profile, self.path = profile, profile_path
        self.notes: list[str] = []
        self._at = lru_cache(maxsize=None)(self._compute)
        self._stages = lru_cache(maxsize=None)(self._partition)

    @property
    def partition_name(self) -> str:
        return "profile" if self.profile is not None else "uniform"

    def _compute(self, b: int) -> tuple[tuple[float, ...], tuple[float, ...], tuple[int, ...]]:
        k = self.c.cost.time_scale
        if self.profile is not None:
            try:
                layers = load_profile(self.path, b, self.num_layers, self.notes)
            except ProfileError as e:
                raise AdviseError(str(e)) from None
            return (tuple(k * lc.fwd_s for lc in layers), tuple(k * lc.bwd_s for lc in layers),
                    tuple(lc.params for lc in layers))
        cc = self.c.cost
        per = cc.fwd_ms_per_layer / 1e3 * (cc.fixed_fraction + (1 - cc.fixed_fraction) * b / cc.at_microbatch_size)
        return (k * per,) * self.num_layers, (k * per * cc.bwd_over_fwd,) * self.num_layers, ()

    def at(self, b: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        f, bw, _ = self._at(b)
        return f, bw

    def _partition(self, b: int, stages: int) -> StageTimes:
        f, bw = self.at(b)
        if self.profile is not None:
            bounds = min_max([x + y for x, y in zip(f, bw)], stages)
        else:
            bounds = uniform(self.num_layers, stages)
        return StageTimes(tuple(bounds), tuple(sum(f[a:e]) for a, e in bounds),
                          tuple(sum(bw[a:e]) for a, e in bounds))

    def stages(self, b: int, stages: int) -> StageTimes:
        return self._stages(b, stages)


def read_profile(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise AdviseError(f"profile={path}: no such file") from None
    except (OSError, ValueError) as e:
        raise AdviseError(f"profile={path}: not a profile JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        raise AdviseError(f"profile={path}: not a profile JSON (no 'layers' list)")
    return data
