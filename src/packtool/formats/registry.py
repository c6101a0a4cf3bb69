"""Shard formats: one module per format, each implementing the roles of ``formats.base`` (``ShardWriter``,
``ShardReader``, ``ShardChecker``), and this registry of ``ShardFormat`` entries, one of each role.

``get_format(name)`` is the only place that maps a format name (the manifest's ``shard_format``, the
``--format`` option) to its implementation. Adding a format is one module and one entry below.
"""

from __future__ import annotations

from packtool.errors import InputError
from packtool.formats.base import ShardChecker, ShardFormat, ShardMeta, ShardReader, ShardWriter, UnitReader
from packtool.formats.parquet import ParquetReader, ParquetWriter
from packtool.formats.parquet_check import ParquetChecker
from packtool.formats.webdataset import TarReader, TarWriter
from packtool.formats.webdataset_check import TarChecker

FORMATS: dict[str, ShardFormat] = {
    f.name: f
    for f in (
        ShardFormat("parquet", writer=ParquetWriter(), reader=ParquetReader(), checker=ParquetChecker()),
        ShardFormat("webdataset", writer=TarWriter(), reader=TarReader(), checker=TarChecker()),
    )
}


def get_format(name: str) -> ShardFormat:
    """The format named ``name``; ``InputError`` for a name this packtool does not know."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):  # (TypeError: a manifest's list or dict where the name goes)
        raise InputError(
            f"shard format {name!r} is not known to this packtool (known: {', '.join(FORMATS)})"
        ) from None


__all__ = [
    "FORMATS",
    "ShardChecker",
    "ShardFormat",
    "ShardMeta",
    "ShardReader",
    "ShardWriter",
    "UnitReader",
    "get_format",
]
