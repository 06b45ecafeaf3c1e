"""Loading user function code the way Pulsar's Python instance does: `className` is module.Class
(or module.function), the module coming from the uploaded `py` file or from installed packages."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import pulsar

from pulsar_autoscale.errors import ConfigError


class FunctionLoadError(ConfigError):
    """The function's code could not be imported or has no usable entry point."""


def load_callable(class_name: str, py_file: str | None) -> Callable[[Any, Any], Any]:
    """Return process(input, context) for a pulsar.Function class, a class with process(input), or a plain callable."""
    module_name, _, attr = class_name.rpartition(".")
    if not module_name:
        raise FunctionLoadError(f"className {class_name!r} must be module.Class (e.g. exclaim.Exclaim)")
    module = _import(module_name, py_file)
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise FunctionLoadError(f"className {class_name!r}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, type):
        try:
            obj = target()
        except Exception as exc:
            raise FunctionLoadError(f"className {class_name!r}: constructor raised {type(exc).__name__}: {exc}") from exc
        if isinstance(obj, pulsar.Function):
            return obj.process
        if callable(getattr(obj, "process", None)):
            return lambda value, _ctx, _p=obj.process: _p(value)
        raise FunctionLoadError(f"className {class_name!r} has no process() method")
    if callable(target):
        return lambda value, _ctx, _f=target: _f(value)
    raise FunctionLoadError(f"className {class_name!r} is not a class or a callable")


def _import(module_name: str, py_file: str | None):
    if py_file:
        path = Path(py_file)
        if not path.is_file():
            raise FunctionLoadError(f"py file {py_file} does not exist")
        if path.stem != module_name.split(".")[0]:
            # Pulsar imports the file under its own name; className's module part must match it.
            raise FunctionLoadError(f"className module {module_name!r} does not match py file name {path.name!r}")
        unique = f"_pa_fn_{abs(hash(str(path.resolve())))}_{path.stem}"
        spec = importlib.util.spec_from_file_location(unique, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(unique, None)
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            raise FunctionLoadError(
                f"py file {path.name} raised on import: {type(exc).__name__}: {exc} (line {tb.lineno})") from exc
        return module
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise FunctionLoadError(f"cannot import module {module_name!r} for className: {exc}") from exc
    except Exception as exc:
        raise FunctionLoadError(f"module {module_name!r} raised on import: {type(exc).__name__}: {exc}") from exc
