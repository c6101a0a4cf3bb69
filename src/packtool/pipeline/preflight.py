"""What a run checks before its work starts: the writers' memory, the options that would cut an image,
the per-token fields of pretokenized input that are not packed."""

from __future__ import annotations

import os

import pyarrow as pa

from packtool.encoders.registry import PRETOKENIZED_FIELDS
from packtool.errors import ConfigError
from packtool.formats.registry import get_format
from packtool.options import PackOptions
from packtool.pipeline.engines import resolve_num_proc

# bytes a writer holds per token of the packs it builds: the token columns (3 x int32, an int8 mask), the
# encoded table beside them, and the next block gathered while this one is written
WRITE_BYTES_PER_TOKEN = 40


def check_memory(options: PackOptions) -> None:
    """``ConfigError`` before any work when one writer's block of packs (``packed_sequence_size`` times
    the packs written at once: a row group's worth for Parquet, a shard for tar) would not fit in a
    quarter of this machine's memory, with each of ``num_proc`` writers holding one."""
    fmt = get_format(options.output.format)
    block = fmt.writer.block_packs(options.output, options.packing.packed_sequence_size)
    packs = block or options.output.shard_size
    need = (
        packs
        * options.packing.packed_sequence_size
        * WRITE_BYTES_PER_TOKEN
        * resolve_num_proc(options.to_dict())
    )
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not known here: nothing to check against
        return
    if need > memory // 4:
        fewer = "--row-group-size" if fmt.reader.unit_kind else "--shard-size (or --shard-max-bytes)"
        raise ConfigError(
            f"--packed-sequence-size {options.packing.packed_sequence_size:,} with {packs:,} packs written "
            "at once "
            f"needs about {need / 2**30:,.1f} GiB, more than a quarter of this machine's "
            f"{memory / 2**30:,.1f} GiB: lower {fewer} or --num-proc"
        )


def unread_token_fields(schema: pa.Schema) -> list[str]:
    """A warning naming the list fields of pretokenized input that are not packed (per-token columns beside
    ``input_ids`` such as ``token_type_ids``); empty when there are none."""
    unread = [
        f.name
        for f in schema
        if f.name not in PRETOKENIZED_FIELDS and (pa.types.is_list(f.type) or pa.types.is_large_list(f.type))
    ]
    if not unread:
        return []
    return [
        f"field(s) {', '.join(unread)} hold a list per record and are not packed (the packs hold "
        f"{', '.join(PRETOKENIZED_FIELDS[:3])}; attention_mask strips padding)"
    ]


def check_vision_options(options: PackOptions, sample_format: str = "vision") -> None:
    """``ConfigError`` for a packing option that would cut a vision-language sample, and so possibly an
    image: an image is never split across packs nor truncated through (an interleaved document is cut
    by ``--long-samples split`` between its images only), and context-parallel padding is not laid out
    around image spans."""
    packing = options.packing
    if packing.split_across_pack:
        raise ConfigError("--split-across-pack would cut images between packs: not available with images")
    cuts = ("error", "drop", "split") if sample_format == "interleaved" else ("error", "drop")
    if packing.long_samples not in cuts:
        what = "interleaved documents are cut between their images with split" * (len(cuts) == 3)
        raise ConfigError(
            f"--long-samples {packing.long_samples} would cut through images: use error or drop"
            + (f" ({what})" if what else "")
        )
    if packing.cp_size > 1:
        raise ConfigError("--cp-size is not available with images (pack with --cp-size 1)")
    if options.output.webdataset.shard_max_bytes is not None:  # (set only with --format webdataset)
        raise ConfigError(  # the tar shards are cut from the plan alone, which does not know image bytes
            "--shard-max-bytes is not available with images: cut tar shards with --shard-size"
        )
