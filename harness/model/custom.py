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
import os
import sys
import zlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from harness.model.protocol import ModelError, check_model

if TYPE_CHECKING:
    from harness.config import ModelConfig
    from harness.model.protocol import Model

HOW = "allowed: module:function, importable from the current directory or PYTHONPATH, or path/to/file.py:function"


def _from_file(path: str, where: str) -> ModuleType:
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ModelError(f"{where}: no such file {file} ({HOW})")
    name = f"harness_custom_{file.stem}_{zlib.crc32(str(file).encode()):08x}"  # the same in every process
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so classes defined there pickle and re-import by name
    try:
        spec.loader.exec_module(module)
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
    return check_model(model, where)
