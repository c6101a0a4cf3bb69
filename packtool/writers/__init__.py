"""Writers: plan + encoded chunks -> shards, manifest and index files, all written atomically."""

from packtool.writers.chunks import ChunkStore, write_chunk
from packtool.writers.output import MANIFEST, OutputDir
from packtool.writers.packs import PackArrays, build_pack_arrays
from packtool.writers.parquet import write_parquet_shard

__all__ = [
    "MANIFEST",
    "ChunkStore",
    "OutputDir",
    "PackArrays",
    "build_pack_arrays",
    "write_chunk",
    "write_parquet_shard",
]
