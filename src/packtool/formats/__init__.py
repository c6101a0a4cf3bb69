"""Shard formats: one module per format, each a ``ShardFormat`` (``formats.base``), and this registry.

``get_format(name)`` is the only place that maps a format name (the manifest's ``shard_format``, the
``--format`` option) to its implementation. Adding a format is one module and one line below.
"""

from __future__ import annotations

from packtool.errors import InputError
from packtool.formats.base import ShardFormat, ShardMeta, UnitReader
from packtool.formats.parquet import ParquetFormat
from packtool.formats.webdataset import WebDatasetFormat

FORMATS: dict[str, ShardFormat] = {f.name: f for f in (ParquetFormat(), WebDatasetFormat())}


def get_format(name: str) -> ShardFormat:
    """The format named ``name``; ``InputError`` for a name this packtool does not know."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):  # (TypeError: a manifest's list or dict where the name goes)
        raise InputError(
            f"shard format {name!r} is not known to this packtool (known: {', '.join(FORMATS)})"
        ) from None


__all__ = ["FORMATS", "ShardFormat", "ShardMeta", "UnitReader", "get_format"]
