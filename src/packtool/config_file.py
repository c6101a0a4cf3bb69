"""``--config FILE``: a YAML file of option keys, read safely into a flat mapping.

Keys are the options' names (dashes accepted for underscores: ``packed-sequence-size``); relative paths
in the file are relative to the file's folder (``resolve_paths``). Every problem is a ``ConfigError``
(exit 2) naming the file, and the line where YAML knows it: a missing or unreadable file, bytes that are
not UTF-8 text, bad YAML (indentation included), YAML aliases (refused: nested ones expand
exponentially), a top level that is not a mapping, an unknown key (with the nearest known one), a value of
the wrong type.

Example::

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "job.yaml"
    >>> _ = path.write_text("packed-sequence-size: 4096\\nstrategy: bfd\\n")
    >>> load_config_file(path)
    {'packed_sequence_size': 4096, 'strategy': 'bfd'}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError
from packtool.options import SPECS, PackOptions, closest
from packtool.packing.options import STRATEGIES
from packtool.plugins import is_plugin_spec
from packtool.storage.files import open_read
from packtool.storage.urls import is_url, join, parent

MAX_CONFIG_BYTES = 1 << 20  # a config file is a few hundred bytes; a larger one is not a config


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The file's keys and values (checked as ``PackOptions.from_dict`` checks them), paths resolved."""
    path = path if is_url(str(path)) else Path(path)  # a URL is read from its store, never as a path
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys to values")
    values = {str(k).replace("-", "_"): v for k, v in data.items()}
    for name in values:
        if name not in SPECS:
            raise ConfigError(f"{path}: unknown key {name!r}{closest(name, SPECS)}")
    # types and ranges, naming the file; options against each other once the flags are in (cli.pack)
    PackOptions.from_dict(values, origin=str(path), given=set(), check=False)
    return resolve_paths(values, parent(path) if is_url(str(path)) else path.parent)


def read_yaml(path: str | Path, kind: str = "config") -> Any:
    """The one YAML document of the file at ``path`` as plain data (``yaml.SafeLoader``: no tag builds an
    object, no code runs), read safely: at most ``MAX_CONFIG_BYTES``, UTF-8, no aliases. Every problem is a
    ``ConfigError`` naming the file (and the line where YAML knows it); ``kind`` is what the file should be
    (``config``, ``mixture``), for the messages."""
    import yaml  # imported when a config file is read: yaml costs ~20 ms of every other start-up

    path = path if is_url(str(path)) else Path(path)  # a URL is read from its store, never as a path
    try:
        with open_read(path, block_size=MAX_CONFIG_BYTES + 1) as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {kind} file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the {kind} file ({e.strerror or e})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: over {MAX_CONFIG_BYTES:,} bytes: not a packtool {kind} file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a YAML {kind} file (not UTF-8 text at byte {e.start})") from None
    loader = yaml.SafeLoader(text)
    try:
        return _load_without_aliases(loader, yaml, kind)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    finally:
        loader.dispose()


def _load_without_aliases(loader: Any, yaml: Any, kind: str = "config") -> Any:
    """The one document of ``loader``; a YAML alias (``*name``) is an error at its line: a config needs
    none, and nested ones expand to billions of nodes from a few hundred bytes."""
    compose = loader.compose_node

    def compose_node(parent: Any, index: Any) -> Any:
        if loader.check_event(yaml.AliasEvent):
            event = loader.peek_event()
            raise yaml.MarkedYAMLError(
                problem=f"YAML aliases (*name) are not allowed in a packtool {kind}",
                problem_mark=event.start_mark,
            )
        return compose(parent, index)

    loader.compose_node = compose_node
    return loader.get_single_data()


def resolve_paths(values: dict[str, Any], base: Path | str) -> dict[str, Any]:
    """``values`` with the relative paths of a config file made relative to ``base`` (the file's folder),
    so that a config file means the same files from any working directory. A URL is left as it is; in a
    config file that is itself in a store, a relative path is relative to its folder there.

    Paths are the ``inputs`` (not ``hf:`` names), ``output``, ``chat_template``, and ``tokenizer`` or
    ``strategy`` when they are a path (a ``.py`` file of a ``file.py:callable`` spec; not a dotted module).

    >>> got = resolve_paths({"inputs": ["../data/a.jsonl", "hf:org/name"], "output": "/abs/out",
    ...                      "strategy": "bfd", "tokenizer": "enc.py:encode"}, Path("configs"))
    >>> got["inputs"], got["output"], got["strategy"], got["tokenizer"]
    (['data/a.jsonl', 'hf:org/name'], '/abs/out', 'bfd', 'configs/enc.py:encode')
    """

    def rel(p: str) -> str:
        if is_url(p) or os.path.isabs(p):
            return p
        return join(str(base), p) if is_url(str(base)) else os.path.normpath(os.path.join(base, p))

    def spec_or_path(p: str, named: tuple[str, ...] = ()) -> str:
        if p in named:
            return p
        if is_plugin_spec(p):
            module, _, name = p.rpartition(":")
            file_like = module.endswith(".py") or "/" in module or "\\" in module
            return f"{rel(module)}:{name}" if file_like else p
        return rel(p)

    out = dict(values)
    for k, v in values.items():
        if k == "inputs":
            items = [v] if isinstance(v, str) else v
            out[k] = [i if i.startswith("hf:") else rel(i) for i in items]
        elif not isinstance(v, str):
            continue
        elif k in ("output", "chat_template"):
            out[k] = rel(v)
        elif k == "tokenizer":
            out[k] = spec_or_path(v)
        elif k == "strategy":
            out[k] = spec_or_path(v, STRATEGIES)
    return out
