"""model=custom: your own model, from a file outside this package.

    PYTHONPATH=examples python -m harness model=custom model.target=my_model:build pp=2

`model.target` names a factory, "module:function" (the module imported as Python would,
from the current directory or PYTHONPATH; "pkg.mod:function" for a package) or
"path/to/file.py:function" (loaded from that file, relative to the current directory). It is
called as `function(cfg, **model.kwargs)`: `cfg` is the ModelConfig (model.layers,
model.hidden, ... are yours to read), `model.kwargs` any further keyword arguments
(`+model.kwargs.depth=3`, or `+model.kwargs={depth:3,width:64}`). It returns an object with
every member of the Model protocol (protocol.py); examples/my_model.py is a complete one.

Every rank calls the factory itself (each builds only its stage's layers), so it must be
importable there too: a module on PYTHONPATH, or a file path, works in every process.
Anything that goes wrong (no target, an import that fails, a missing attribute, a factory
that raises or returns something that is not a model) is one line naming model.target.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import sys
import zlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from harness.model.protocol import ModelError, check_model
from harness.records.safe_io import FileRefused, read_bytes

if TYPE_CHECKING:
    from harness.config import ModelConfig
    from harness.model.protocol import Model

HOW = "allowed: module:function, importable from the current directory or PYTHONPATH, or path/to/file.py:function"


def _from_file(path: str, where: str) -> ModuleType:
    file = Path(path).expanduser().resolve()
    name = f"harness_custom_{file.stem}_{zlib.crc32(str(file).encode()):08x}"  # the same in every process
    if name in sys.modules:
        return sys.modules[name]
    try:  # a regular file of a source file's size, read once (a FIFO or /dev/zero is refused unread)
        source = read_bytes(Path(path).expanduser(), "model.target", "model")
    except FileRefused as e:
        raise ModelError(f"{where}: {e.reason}") from None
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so classes defined there pickle and re-import by name
    try:
        exec(compile(source, str(file), "exec", dont_inherit=True), module.__dict__)  # what exec_module does
    except Exception as e:
        del sys.modules[name]
        raise ModelError(f"{where}: importing {file} raised {type(e).__name__}: {_line(e)}") from None
    return module


def _from_path(module: str, where: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        # the current directory, as `python -m` puts it first: also for pytest, a notebook, a worker
        if e.name == module.split(".")[0] and cwd not in sys.path and "" not in sys.path:
            sys.path.append(cwd)
            return _from_path(module, where)
        raise ModelError(f"{where}: cannot import {module!r} ({type(e).__name__}: {_line(e)}; {HOW})") from None
    except Exception as e:
        raise ModelError(f"{where}: importing {module!r} raised {type(e).__name__}: {_line(e)}") from None


def _line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else "(no message)"


def resolve(target: str | None) -> object:
    """The factory `target` names; ModelError (one line) when it cannot be had."""
    where = f"model.target={'null' if target is None else target}"
    if not target:
        raise ModelError(f"{where}: model=custom needs model.target=<module>:<factory> (e.g. my_model:build; {HOW})")
    module, sep, attr = target.rpartition(":")
    if not sep or not module or not attr:
        raise ModelError(f"{where}: not module:function ({HOW})")
    if module.endswith(".py") or "/" in module or os.sep in module:
        mod = _from_file(module, where)
    else:
        mod = _from_path(module, where)
    try:
        factory = getattr(mod, attr)
    except AttributeError:
        raise ModelError(f"{where}: {module} has no attribute {attr!r}") from None
    if not callable(factory):
        raise ModelError(f"{where}: {module}.{attr} is a {type(factory).__name__}, not callable "
                         "(allowed: a function or class taking the ModelConfig)")
    return factory


def _check_kwargs(factory: object, cfg: ModelConfig, kwargs: dict) -> None:
    """ModelError naming model.kwargs when the factory's signature cannot take them."""
    try:
        sig = inspect.signature(factory)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature: the call will tell
        return
    try:
        sig.bind(cfg, **kwargs)
    except TypeError as e:
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        allowed = [p.name for p in list(sig.parameters.values())[1:] if p.kind in named]
        shown = "{" + ", ".join(f"{k}:{v}" for k, v in kwargs.items()) + "}"
        raise ModelError(f"model.kwargs={shown}: {cfg.target} takes (cfg{', ' if allowed else ''}"
                         f"{', '.join(allowed)}) ({e})") from None


def build_custom(cfg: ModelConfig) -> Model:
    """`model.target`'s factory called with the config and `model.kwargs`, checked."""
    factory = resolve(cfg.target)
    kwargs = dict(cfg.kwargs or {})
    _check_kwargs(factory, cfg, kwargs)
    where = f"model.target={cfg.target}"
    try:
        model = factory(cfg, **kwargs)  # type: ignore[operator]
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"{where}: the factory raised {type(e).__name__}: {_line(e)}") from None
    return check_returns(check_model(model, where), where)


MAX_LAYERS = 2**20  # a custom model's num_layers: every plan lists its layers (kinds, costs, partitions)


def _shape(x: object) -> bool:
    return isinstance(x, (tuple, list, torch.Size)) and len(x) > 0 and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in x)


def _show(x: object) -> str:
    text = repr(x)
    return (text if len(text) <= 60 else text[:57] + "...") + f" (a {type(x).__name__})"


def check_returns(model: Model, where: str) -> Model:
    """What the protocol's members return, checked on its first, second and last layer at a
    microbatch of one sample (cheap: no layer is run, the batch is one sample, layers are built
    on the meta device): kind a str, activation_shape and input_shape's shape tuples of
    integers >= 1, input_shape's dtype a torch.dtype, fwd_flops a finite number >= 0, batch two
    tensors of one row, build_layer and build_layers modules. ModelError (one line) naming the
    member, what it returned and what is allowed, before any worker calls it."""
    n = model.num_layers
    if n > MAX_LAYERS:
        raise ModelError(f"{where}: num_layers={n:,} (allowed: 1..{MAX_LAYERS:,})")

    def call(member: str, *args: object) -> object:
        try:
            return getattr(model, member)(*args)
        except Exception as e:  # noqa: BLE001 - the user's code: one line naming it
            raise ModelError(f"{where}: {member}{args} raised {type(e).__name__}: {_line(e)}") from None

    def wrong(member: str, args: tuple, got: object, allowed: str) -> ModelError:
        return ModelError(f"{where}: {member}{args} returned {_show(got)} (allowed: {allowed}; "
                          "harness/model/protocol.py)")

    shape = call("activation_shape", 1)
    if not _shape(shape):
        raise wrong("activation_shape", (1,), shape, "a tuple of integers >= 1, the tensor between stages")
    for i in sorted({0, min(1, n - 1), n - 1}):
        kind = call("kind", i)
        if not isinstance(kind, str) or not kind:
            raise wrong("kind", (i,), kind, "a non-empty str, e.g. 'block'")
        got = call("input_shape", i, 1)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and _shape(got[0])
                and isinstance(got[1], torch.dtype)):
            raise wrong("input_shape", (i, 1), got, "(shape, dtype): a tuple of integers >= 1 and a torch.dtype")
        flops = call("fwd_flops", i, 1)
        if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not math.isfinite(flops) or flops < 0:
            raise wrong("fwd_flops", (i, 1), flops, "a finite number >= 0")
        with torch.device("meta"):
            layer = call("build_layer", i)
        if not isinstance(layer, torch.nn.Module):
            raise wrong("build_layer", (i,), layer, "a torch.nn.Module")
    with torch.device("meta"):
        stage = call("build_layers", 0, 1, 0)
    if not isinstance(stage, torch.nn.Module):
        raise wrong("build_layers", (0, 1, 0), stage, "a torch.nn.Module (nn.Sequential of the layers)")
    data = call("batch", 0, 0, 1)
    if not (isinstance(data, (tuple, list)) and len(data) == 2
            and all(isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == 1 for t in data)):
        raise wrong("batch", (0, 0, 1), data, "(inputs, targets): two tensors of one row each")
    return model
