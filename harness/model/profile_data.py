"""Per-layer profiles: the JSON that `python -m harness.profile` writes and
../shared/data/gpt2_h200_profile.json holds (DESIGN.md sec. 6):

{"device", "torch", "dtype", "model": {...}, "layers": [{"index", "kind", "params",
 "by_microbatch": {"<B>": {"fwd_s", "bwd_s", "fwd_flops", ["activation_bytes"]}}}]}

Any model's profile drives the partitioners and compute=emulated of any stand-in model with
the same number of layers. Keys beyond these are ignored, but for two the profiler writes
when it expands one measured block to the whole model (harness/profile.py --blocks,
--estimate): a layer's "copied_from" (its times are another layer's) and "estimated_from"
(scaled from another layer's by FLOPs); load_profile says in `notes` how many layers were
not measured themselves, so a run's record says its replay came from an expansion.
"""

from __future__ import annotations

import json
import math
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


def _at(by: dict, b: int) -> tuple[dict, bool]:
    """Timings at microbatch size b: measured, else linear between the nearest measured sizes
    (a layer's time is a fixed part plus a part per sample), else extrapolated from the two
    nearest (or, with one size, in proportion to b). Returns them and whether extrapolated."""
    sizes = sorted(int(k) for k in by)
    if str(b) in by:
        return by[str(b)], False
    below, above = [s for s in sizes if s < b], [s for s in sizes if s > b]
    if below and above:
        lo, hi = below[-1], above[0]
        extrapolated = False
    elif len(sizes) >= 2:
        lo, hi = (sizes[-2], sizes[-1]) if not above else (sizes[0], sizes[1])
        extrapolated = True
    else:
        only = by[str(sizes[0])]
        return {k: float(only.get(k, 0.0)) * b / sizes[0] for k in ("fwd_s", "bwd_s", "fwd_flops")}, True
    t = (b - lo) / (hi - lo)
    return {k: max(0.0, (1 - t) * float(by[str(lo)].get(k, 0.0)) + t * float(by[str(hi)].get(k, 0.0)))
            for k in ("fwd_s", "bwd_s", "fwd_flops")}, extrapolated


def _check_times(by: dict, key: str, i: int) -> None:
    """Every measured time and FLOP count finite and >= 0, every size a positive integer
    (JSON allows NaN and Infinity; a negative time would make a sleep or a partition absurd)."""
    if not isinstance(by, dict):
        raise TypeError(f"'by_microbatch' is a {type(by).__name__}, not an object")
    for size, m in by.items():
        if not isinstance(m, dict):
            raise TypeError(f"'by_microbatch'[{size!r}] is a {type(m).__name__}, not an object")
        if not str(size).isdigit() or int(size) < 1:
            raise ProfileError(f"{key}: layer {i}: microbatch size {size!r} (allowed: a positive integer)")
        for name in ("fwd_s", "bwd_s", "fwd_flops", "activation_bytes"):
            if name not in m:
                continue
            v = m[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ProfileError(f"{key}: layer {i}, microbatch size {size}: {name}={v!r} (allowed: a finite "
                                   "number >= 0)")


def load_profile(path: str | Path, microbatch_size: int, num_layers: int,
                 notes: list[str] | None = None) -> list[LayerCost]:
    """Per-layer costs at `microbatch_size`; ProfileError naming what is wrong. Sizes the
    profile did not measure are interpolated, or extrapolated with a line in `notes`."""
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
    out, extrapolated = [], False
    for i, layer in enumerate(layers):
        try:
            by = layer["by_microbatch"]
            if not by:
                raise ValueError("no microbatch sizes")
            _check_times(by, key, i)
            if int(layer["params"]) < 0:
                raise ProfileError(f"{key}: layer {i}: params={layer['params']!r} (allowed: an integer >= 0)")
            t, ext = _at(by, microbatch_size)
            extrapolated |= ext
            out.append(LayerCost(layer["kind"], int(layer["params"]), float(t["fwd_s"]), float(t["bwd_s"]),
                                 float(t.get("fwd_flops", 0.0))))
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{key}: layer {i} is malformed ({type(e).__name__}: {e})") from None
    if extrapolated and notes is not None:
        sizes = ", ".join(sorted(layers[0]["by_microbatch"], key=int))
        notes.append(f"{key}: microbatch_size={microbatch_size} is outside the measured sizes ({sizes}): "
                     "its times are extrapolated linearly")
    if notes is not None:
        note = _expansion_note(layers)
        if note:
            notes.append(f"{key}: {note}")
    return out


def _expansion_note(layers: list) -> str | None:
    """What of the profile was not measured layer by layer (copied from a measured layer of
    the same kind and size, or estimated from one by FLOPs); None when every layer was."""
    def marked(field: str) -> list[tuple[int, object]]:
        return [(i, lay.get(field)) for i, lay in enumerate(layers)
                if isinstance(lay, dict) and isinstance(lay.get(field), int) and not isinstance(lay.get(field), bool)]

    copied, estimated = marked("copied_from"), marked("estimated_from")
    if not copied and not estimated:
        return None
    parts = []
    if copied:
        sources = sorted({s for _, s in copied})  # type: ignore[type-var]
        parts.append(f"{len(copied)} of {len(layers)} layers copied from measured layer(s) "
                     f"{', '.join(map(str, sources))}")
    if estimated:
        parts.append(f"layer(s) {', '.join(str(i) for i, _ in estimated)} estimated from a measured layer's "
                     "times by FLOPs")
    return "; ".join(parts) + " (python -m harness.profile --blocks/--estimate)"
