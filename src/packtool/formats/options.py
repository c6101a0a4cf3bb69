"""The output stage's options: the directory, the shard format and layout, and each format's own."""

from __future__ import annotations

from typing import Literal

import msgspec

from packtool.option_types import Applies, OptionGroup, option

FORMATS = ("parquet", "webdataset")  # the shard formats of packtool.formats (a test checks they agree)
TAR_COMPRESSIONS = ("none", "gzip")  # of a tar shard's .npy members (packtool.formats.tar.COMPRESSIONS)
LAYOUTS = ("full", "minimal")  # the storage layouts of ``columns`` (packtool.layout)


class ParquetOptions(OptionGroup):
    """``--format parquet``'s own options."""

    section = "output"
    applies = Applies("format", ("parquet",))

    row_group_size: option(int, "Packs per Parquet row group.", gt=0) = 128


class WebDatasetOptions(OptionGroup):
    """``--format webdataset``'s own options."""

    section = "output"
    applies = Applies("format", ("webdataset",))

    shard_max_bytes: option(int | None, "At most this many bytes per .tar shard.", gt=0) = None
    tar_compression: option(
        Literal[TAR_COMPRESSIONS],
        "How each pack's .npy members are stored: none, or gzip (NAME.npy.gz, which webdataset, wids and "
        "Energon decompress: smaller shards, slower to write and read; docs/performance.md).",
    ) = "none"
    energon_index: option(
        bool,
        "Write Megatron-Energon's key index (.nv-meta/index.sqlite): what energon prepare writes, for "
        "access by key.",
    ) = True


class OutputOptions(OptionGroup):
    """Where and how the packs are stored."""

    section = "output"

    output: option(
        str | None, "Output directory (written atomically).", short="o", runtime=True, required=True
    ) = None
    format: option(Literal[FORMATS], "Shard format.") = "parquet"
    columns: option(
        Literal[LAYOUTS],
        "What the shards store: full (every column, as any reader expects) or minimal (input_ids and only "
        "what carries information; packtool's readers rebuild labels and position_ids: docs/formats.md).",
    ) = "full"
    shard_size: option(int, "Packs per shard.", gt=0) = 2048
    parquet: ParquetOptions = msgspec.field(default_factory=ParquetOptions)
    webdataset: WebDatasetOptions = msgspec.field(default_factory=WebDatasetOptions)
