"""User code named on the command line: ``module:callable`` or ``path/to/file.py:callable``.

One rule decides whether a string is a plugin spec (``is_plugin_spec``) and one function loads it
(``load_plugin``): ``--tokenizer`` (an encoder), ``--strategy`` (a packing policy) and the config all use
these. A dotted module is resolved by ``pkgutil.resolve_name``; a file path is imported from that file.

Example::

    >>> is_plugin_spec("my_encoders:encode"), is_plugin_spec("data/tokenizer.json")
    (True, False)
    >>> load_plugin("json:dumps")([1])
    '[1]'
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import pkgutil
import sys
import types
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError


def is_plugin_spec(spec: str | None) -> bool:
    """``module:callable`` or ``file.py:callable``: a colon with a name after it, and not a path that exists
    (a Windows drive such as ``C:\\data`` is a path)."""
    if not spec or ":" not in spec or Path(spec).exists():
        return False
    module, _, name = spec.rpartition(":")
    return bool(module) and name.isidentifier()


def load_plugin(spec: str, what: str = "plugin") -> Any:
    """The object named by ``spec``; ``ConfigError`` (one line, naming ``what`` and the spec) if it cannot
    be loaded. ``what`` says which option named it, e.g. ``tokenizer`` or ``strategy``."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what} {spec}: not of the form module:callable")
    if _names_a_file(module_name):
        module = _import_file(Path(module_name), spec, what)
    else:
        module = _import_module(module_name, spec, what)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what} {spec}: module {module_name} has no attribute {attr}") from None


def plugin_file(spec: str) -> Path | None:
    """The source file of the module ``spec`` names (loaded by ``load_plugin`` first), or None where it has
    none (a built-in module): what a run's identity hashes, so that an edited encoder is a new run.

    >>> plugin_file("json:dumps").name
    '__init__.py'
    """
    module_name = spec.rpartition(":")[0]
    if _names_a_file(module_name):
        return Path(module_name).resolve()
    try:
        module = pkgutil.resolve_name(module_name)
    except Exception:  # load_plugin said why, or will
        return None
    if not isinstance(module, types.ModuleType):  # ``pkg.mod.Class:method``: the class's module
        module = inspect.getmodule(module)
    path = getattr(module, "__file__", None)
    return Path(path) if path and Path(path).is_file() else None


def _names_a_file(module_name: str) -> bool:
    return module_name.endswith(".py") or "/" in module_name or "\\" in module_name


def _import_module(name: str, spec: str, what: str) -> Any:
    try:
        return pkgutil.resolve_name(name)
    except ModuleNotFoundError as e:
        hint = ""
        if e.name == name.split(".")[0] and Path(name.replace(".", "/") + ".py").is_file():
            # a file in the working directory is not on the import path: say how to name it
            path = f"./{name.replace('.', '/')}.py"
            hint = f"; {path} is in the working directory: name it {path}:{spec.rpartition(':')[2]}"
        raise ConfigError(f"{what} {spec}: cannot import {name}: {type(e).__name__}: {e}{hint}") from None
    except Exception as e:  # the module raised while importing
        raise ConfigError(f"{what} {spec}: cannot import {name}: {type(e).__name__}: {e}") from None


def _import_file(path: Path, spec: str, what: str) -> Any:
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"{what} {spec}: no such file {path}")
    # one module per file, whatever the spec's spelling: a class's instances and a worker's re-import agree
    name = f"packtool_user_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"{what} {spec}: cannot import {path.name}: {type(e).__name__}: {e}") from None
    return module
