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

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from harness.config import MAX_DIM
from harness.records.safe_io import FileRefused, check, read_text


MAX_LAYER_S = 86_400  # a layer's measured forward or backward: no measurement takes a day
MAX_LAYER_FLOPS = 1e21  # a layer's forward FLOPs per microbatch: a day at 10 PFLOP/s
MAX_LAYER_BYTES = 2**50  # a layer's saved activations per microbatch: a PiB, far past any device
MAX_LAYER_PARAMS = 2**40  # a layer's parameters: a trillion
# what each measured figure may be: (low, low allowed, high, unit); a time of 0 was not measured
FIGURES = {"fwd_s": (0.0, False, MAX_LAYER_S, "seconds"), "bwd_s": (0.0, False, MAX_LAYER_S, "seconds"),
           "fwd_flops": (0.0, True, MAX_LAYER_FLOPS, "FLOPs"),
           "activation_bytes": (0.0, True, MAX_LAYER_BYTES, "bytes")}


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
    near = sizes[-1] if b > sizes[-1] else sizes[0]  # the measured size an extrapolation starts from

    def at(k: str) -> float:
        linear = (1 - t) * float(by[str(lo)].get(k, 0.0)) + t * float(by[str(hi)].get(k, 0.0))
        if not extrapolated:
            return max(0.0, linear)
        # a slope of noise (GPT-2's embedding: 90 us at B=4, 73 at B=8) extrapolated far would reach 0 s
        # or less: never below the nearest measured size's time (above), or its share per sample (below)
        floor = float(by[str(near)].get(k, 0.0)) * (1.0 if b > near else b / near)
        return max(floor, linear)

    return {k: at(k) for k in ("fwd_s", "bwd_s", "fwd_flops")}, extrapolated


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
        if int(size) > MAX_DIM:
            raise ProfileError(f"{key}: layer {i}: microbatch size {size} (allowed: 1..{MAX_DIM:,})")
        for name, (low, closed, high, unit) in FIGURES.items():
            if name not in m:
                continue
            v = m[name]
            number = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
            if not number or not (v >= low if closed else v > low) or v > high:
                # NaN and inf (JSON allows them), true, 1e30, a negative time or one of 0 (not measured)
                raise ProfileError(f"{key}: layer {i}, microbatch size {size}: {name}={v!r} (allowed: a finite "
                                   f"number of {unit} {'>=' if closed else '>'} {low:g}, at most {high:,.0f})")


def _check_params(value: object, key: str, i: int) -> int:
    """A layer's parameter count: an integer in 0..MAX_LAYER_PARAMS (not true, 1.5, NaN or 1e30;
    a whole float such as 1e9, as a hand-written profile may say, is taken)."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or not 0 <= value <= MAX_LAYER_PARAMS:  # type: ignore[operator]
        raise ProfileError(f"{key}: layer {i}: params={value!r} (allowed: an integer in 0..{MAX_LAYER_PARAMS:,})")
    return int(value)  # type: ignore[arg-type]


def read_profile(path: str | Path) -> dict:
    """The profile JSON (parsed once per file version: a sweep's jobs and the planner's points
    read it many times); ProfileError naming what is wrong. Only a regular file of at most
    safe_io's profile cap is read (a FIFO or /dev/zero is refused unread)."""
    key = f"profile={path}"
    try:
        st = check(path, "profile", "profile")
        data = _parsed(str(path), st.st_mtime_ns, st.st_size)
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        if not isinstance(data.get("layers"), list):
            raise TypeError("'layers' is not a list")
    except FileRefused as e:
        raise ProfileError(str(e)) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise ProfileError(f"{key}: not a profile JSON ({type(e).__name__}: {_first_line(e)}); "
                           "write one with `python -m harness.profile`") from None
    return data


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or ["(no message)"])[0][:200]


@functools.lru_cache(maxsize=16)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    return json.loads(read_text(path, "profile", "profile"))


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


def expand(data: dict, kinds: tuple[str, ...] | int, path: str | Path) -> list[dict]:
    """The profile's layers for a model of `kinds` layers (or that many, not expanded): its own
    when it has as many, else (a one-block profile: embedding, one block, head) each model
    layer takes the first profile layer of its kind."""
    layers = data["layers"]
    n = kinds if isinstance(kinds, int) else len(kinds)
    if len(layers) == n:
        return layers
    by_kind: dict[str, dict] = {}
    for lay in layers:
        if isinstance(lay, dict) and "kind" in lay:
            by_kind.setdefault(str(lay["kind"]), lay)
    missing = sorted(set(kinds) - set(by_kind)) if not isinstance(kinds, int) else ["?"]
    if missing:
        raise ProfileError(f"profile={path}: {len(layers)} layers, the model has {n} "
                           + (f"and no profile layer of kind {', '.join(missing)} to expand from " if by_kind and
                              not isinstance(kinds, int) else "")
                           + "(set model.layers to match, or profile this model)")
    # each model layer takes its kind's profile layer as it is (measured or derived, as that says)
    return [{**by_kind[k], "index": i} for i, k in enumerate(kinds)]


def load_profile(path: str | Path, microbatch_size: int, kinds: tuple[str, ...] | int,
                 notes: list[str] | None = None) -> list[LayerCost]:
    """Per-layer costs at `microbatch_size` for a model whose layers are of `kinds` (or that
    many layers, not expanded); ProfileError naming what is wrong. A profile with fewer layers
    (one block) is expanded by kind (`expand`); sizes it did not measure are interpolated, or
    extrapolated with a line in `notes`. Computed once per file version, size and model (a
    sweep's jobs and the planner's points ask again and again)."""
    try:
        st = check(path, "profile", "profile")
    except FileRefused as e:
        raise ProfileError(str(e)) from None
    layers, said = _load(str(path), st.st_mtime_ns, st.st_size, microbatch_size, kinds)
    if notes is not None:
        notes.extend(said)
    return list(layers)


@functools.lru_cache(maxsize=256)
def _load(path: str, mtime_ns: int, size: int, microbatch_size: int,
          kinds: tuple[str, ...] | int) -> tuple[tuple[LayerCost, ...], tuple[str, ...]]:
    key = f"profile={path}"
    notes: list[str] = []
    layers = expand(read_profile(path), kinds, path)
    out, extrapolated = [], False
    for i, layer in enumerate(layers):
        try:
            by = layer["by_microbatch"]
            if not by:
                raise ValueError("no microbatch sizes")
            _check_times(by, key, i)
            params = _check_params(layer["params"], key, i)
            if not isinstance(layer["kind"], str):
                raise ProfileError(f"{key}: layer {i}: kind={layer['kind']!r} (allowed: a string, e.g. \"block\")")
            t, ext = _at(by, microbatch_size)
            extrapolated |= ext
            out.append(LayerCost(layer["kind"], params, float(t["fwd_s"]), float(t["bwd_s"]),
                                 float(t.get("fwd_flops", 0.0))))
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{key}: layer {i} is malformed ({type(e).__name__}: {e})") from None
    if extrapolated:
        sizes = ", ".join(sorted(layers[0]["by_microbatch"], key=int))
        notes.append(f"{key}: microbatch_size={microbatch_size} is outside the measured sizes ({sizes}): "
                     "its times are extrapolated linearly")
    given = len(read_profile(path)["layers"])
    if given != len(layers):
        notes.append(f"{key}: its {given} layers expanded by kind to the model's {len(layers)} (each layer takes the "
                     "times of the profile's first layer of its kind)")
    else:
        note = _expansion_note(layers)
        if note:
            notes.append(f"{key}: {note}")
    if any(isinstance(lay, dict) and lay.get("derived") for lay in layers):
        notes.append(f"{key}: its times are derived, not measured (the profile's \"derivation\" says how)")
    return tuple(out), tuple(notes)


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
