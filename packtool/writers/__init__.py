"""Writers: plan + encoded chunks -> shards, manifest and index files, all written atomically."""

from packtool.errors import PacktoolError
from packtool.writers.chunks import ChunkStore, write_chunk
from packtool.writers.output import MANIFEST, OutputDir
from packtool.writers.packs import PackArrays, build_pack_arrays
from packtool.writers.parquet import write_parquet_shard
from packtool.writers.webdataset import read_tar_packs, write_tar_shard


def read_shard_packs(fmt: str, path, n: int, with_sample_index: bool = False):
    """Packs of one shard of a format other than Parquet (``read_packs`` calls this)."""
    if fmt == "webdataset":
        return read_tar_packs(path, n, with_sample_index)
    raise PacktoolError(f"{path}: unknown shard format {fmt!r}")


__all__ = [
    "MANIFEST",
    "ChunkStore",
    "OutputDir",
    "PackArrays",
    "build_pack_arrays",
    "write_chunk",
    "read_shard_packs",
    "read_tar_packs",
    "write_parquet_shard",
    "write_tar_shard",
]
