"""Per-layer profiles: the JSON that `python -m harness.profile` writes and
../shared/data/gpt2_h200_profile.json holds (DESIGN.md sec. 6):

{"device", "torch", "dtype", "model": {...}, "layers": [{"index", "kind", "params",
 "by_microbatch": {"<B>": {"fwd_s", "bwd_s", "fwd_flops", ["activation_bytes"]}}}]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class ProfileError(ValueError):
    """A profile that cannot be used; str() is one line."""


@dataclass(frozen=True)
class LayerCost:
    kind: str
    params: int
    fwd_s: float
    bwd_s: float
    fwd_flops: float


def load_profile(path: str | Path, microbatch_size: int, num_layers: int) -> list[LayerCost]:
    """Per-layer costs at `microbatch_size`; ProfileError naming what is wrong."""
    key = f"profile={path}"
    try:
        data = json.loads(Path(path).read_text())
        layers = data["layers"]
        if not isinstance(layers, list):
            raise TypeError("'layers' is not a list")
    except FileNotFoundError:
        raise ProfileError(f"{key}: no such file") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ProfileError(f"{key}: not a profile JSON ({type(e).__name__}: {e}); "
                           "write one with `python -m harness.profile`") from None
    if len(layers) != num_layers:
        raise ProfileError(f"{key}: {len(layers)} layers, the model has {num_layers} "
                           "(set model.layers to match, or profile this model)")
    out = []
    for i, layer in enumerate(layers):
        try:
            by = layer["by_microbatch"]
            if str(microbatch_size) not in by:
                raise ProfileError(f"{key}: no timings at microbatch_size={microbatch_size} "
                                   f"(allowed: {', '.join(sorted(by, key=int))})")
            t = by[str(microbatch_size)]
            out.append(LayerCost(layer["kind"], int(layer["params"]), float(t["fwd_s"]), float(t["bwd_s"]),
                                 float(t.get("fwd_flops", 0.0))))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ProfileError):
                raise
            raise ProfileError(f"{key}: layer {i} is malformed ({type(e).__name__}: {e})") from None
    return out
