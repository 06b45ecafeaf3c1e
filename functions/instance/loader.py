"""Loading user function code the way Pulsar's Python instance does: `className` is module.Class
(or module.function), the module coming from the uploaded `py` file or from an allowed installed package.

The entry-point rule (what `className` may name), so a request cannot turn a library function into a
function (`className: os.system` would run every message as a shell command):

- its module is the uploaded file (the module part of className must be the file's name), or, with no
  upload, a module under one of the worker's allowed installed packages (`INSTALLED_MODULES`, plus the
  worker's `--function-module` list);
- the attribute is *defined in* that module (its `__module__` is the module: an imported name is refused);
- and it is a class deriving `pulsar.Function` (called as process(input, context)) or a plain Python
  function (called as f(input)); builtins, other classes and other callables are refused.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import pulsar

from pulsar_autoscale.errors import ConfigError

INSTALLED_MODULES = ("pulsar_autoscale.functions.examples",)


class FunctionLoadError(ConfigError):
    """The function's code could not be imported or has no usable entry point."""


def load_callable(
    class_name: str, py_file: str | None, installed_modules: Sequence[str] = INSTALLED_MODULES
) -> Callable[[Any, Any], Any]:
    """Return process(input, context) for the entry point `class_name` names (rule in the module docstring)."""
    module_name, _, attr = class_name.rpartition(".")
    if not module_name:
        raise FunctionLoadError(f"className {class_name!r} must be module.Class (e.g. exclaim.Exclaim)")
    if not py_file and not any(module_name == p or module_name.startswith(p + ".") for p in installed_modules):
        raise FunctionLoadError(
            f"className {class_name!r}: without uploaded code (the multipart `data` part) the module must be "
            f"under an allowed installed package ({', '.join(installed_modules)})"
        )
    module = import_module(module_name, py_file)
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise FunctionLoadError(f"className {class_name!r}: module {module_name!r} has no attribute {attr!r}") from None
    if getattr(target, "__module__", None) != module.__name__:
        raise FunctionLoadError(
            f"className {class_name!r}: {attr!r} is not defined in {module_name!r} (an entry "
            "point must be a class or function defined in the function's own module)"
        )
    if isinstance(target, type):
        if not issubclass(target, pulsar.Function):
            raise FunctionLoadError(f"className {class_name!r} is a class that does not derive pulsar.Function")
        try:
            obj = target()
        except Exception as exc:
            raise FunctionLoadError(f"className {class_name!r}: constructor raised {type(exc).__name__}: {exc}") from exc
        return obj.process
    if inspect.isfunction(target):

        def call(value: Any, _ctx: Any, _f: Callable[[Any], Any] = target) -> Any:
            return _f(value)

        return call
    raise FunctionLoadError(f"className {class_name!r} is neither a pulsar.Function class nor a plain function")


def import_module(module_name: str, py_file: str | None):
    """The function's module from its uploaded file, or an installed one."""
    if py_file:
        path = Path(py_file)
        if path.suffix != ".py" or not path.is_file():
            raise FunctionLoadError(f"py file {path.name} is not a .py file that exists")
        if path.stem != module_name.split(".")[0]:
            # Pulsar imports the file under its own name; className's module part must match it.
            raise FunctionLoadError(f"className module {module_name!r} does not match py file name {path.name!r}")
        unique = f"_pa_fn_{abs(hash(str(path.resolve())))}_{path.stem}"
        spec = importlib.util.spec_from_file_location(unique, path)
        assert spec is not None and spec.loader is not None  # a .py file's: it has a source file loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:  # sys.exit() at import is a failed import, not an exit
            sys.modules.pop(unique, None)
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            raise FunctionLoadError(
                f"py file {path.name} raised on import: {type(exc).__name__}: {exc} (line {tb.lineno})"
            ) from exc
        return module
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise FunctionLoadError(f"cannot import module {module_name!r} for className: {exc}") from exc
    except Exception as exc:
        raise FunctionLoadError(f"module {module_name!r} raised on import: {type(exc).__name__}: {exc}") from exc


BUILTIN_SERDES = {
    "serde.IdentitySerDe": "IdentitySerDe",
    "IdentitySerDe": "IdentitySerDe",
    "serde.PickleSerDe": "PickleSerDe",
    "PickleSerDe": "PickleSerDe",
}


def load_serde(class_name: str | None, py_file: str | None = None, installed_modules: Sequence[str] = INSTALLED_MODULES):
    """A serde object (serialize/deserialize) as Pulsar's Python instance makes one: Pulsar's own by short
    name, else a class with serialize() and deserialize() from the function's uploaded file or an allowed
    installed package (the entry-point rule above, for serdes)."""
    from pulsar.functions import serde

    if not class_name or class_name in BUILTIN_SERDES:
        return getattr(serde, BUILTIN_SERDES[class_name or "IdentitySerDe"])()  # a key: checked just above
    module_name, _, attr = class_name.rpartition(".")
    if not module_name:
        raise FunctionLoadError(f"serde class {class_name!r} must be module.Class")
    own_file = py_file if py_file and Path(py_file).stem == module_name.split(".")[0] else None
    if not own_file and not any(module_name == p or module_name.startswith(p + ".") for p in installed_modules):
        raise FunctionLoadError(
            f"serde class {class_name!r}: its module must be the uploaded file or under an "
            f"allowed installed package ({', '.join(installed_modules)})"
        )
    target = getattr(import_module(module_name, own_file), attr, None)
    if (
        not inspect.isclass(target)
        or not callable(getattr(target, "serialize", None))
        or not callable(getattr(target, "deserialize", None))
    ):
        raise FunctionLoadError(f"serde class {class_name!r} is not a class with serialize() and deserialize()")
    try:
        return target()
    except Exception as exc:
        raise FunctionLoadError(f"serde class {class_name!r}: constructor raised {type(exc).__name__}: {exc}") from exc
