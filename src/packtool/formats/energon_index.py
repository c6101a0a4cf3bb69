"""Megatron-Energon's key index of a webdataset output: ``.nv-meta/index.sqlite`` and ``index.uuid``.

``energon prepare`` writes them; Energon needs them for access by key (``WebdatasetFileStore``, auxiliary
datasets, joins). packtool writes them at the end of a run when ``megatron-energon`` is installed, through
Energon's own ``SqliteIndexWriter`` (its schema and indexes are Energon's, not repeated here), from the tar
headers as ``energon prepare`` reads them: one ``IndexSample`` per pack (its key, its index in the shard,
its byte range) and one ``IndexSamplePart`` per member. Without Energon nothing is written, and the rest
of the output (``.info.json``, ``split.yaml``, the ``.tar.idx`` files) still loads for training.

``index.uuid`` (which Energon's joins read to tell index versions apart) is derived from the run_id, so the
output stays the same bytes for the same run.
"""

from __future__ import annotations

import tarfile
import uuid
from pathlib import Path

ENERGON_DIR = ".nv-meta"
SQLITE_INDEX = f"{ENERGON_DIR}/index.sqlite"
INDEX_UUID = f"{ENERGON_DIR}/index.uuid"
BATCH_ROWS = 4096  # rows handed to the writer at once (Energon's INDEX_BATCH_SIZE)


def index_uuid(run_id: str) -> str:
    """The ``index.uuid`` of a run: the same for the same packs."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"packtool:{run_id}"))


def write_sqlite_index(directory: str | Path, shard_paths: list[str], run_id: str) -> list[str]:
    """Write ``.nv-meta/index.sqlite`` and ``index.uuid`` for the shards (relative paths, in manifest
    order) with Energon's own writer; return their relative names, or ``[]`` without Energon installed."""
    try:  # the energon extra is optional: without it, no key index (training loads without one)
        from megatron.energon.epathlib import EPath
        from megatron.energon.flavors.webdataset.config import skip_meta_re, split_name_re
        from megatron.energon.flavors.webdataset.indexing import SqliteIndexWriter
        from megatron.energon.flavors.webdataset.prepare import IndexSample, IndexSamplePart
    except ImportError:
        return []
    directory = Path(directory)
    path = directory / SQLITE_INDEX
    path.unlink(missing_ok=True)
    writer = SqliteIndexWriter(EPath(path))
    try:
        for shard_id, name in enumerate(shard_paths):
            samples, parts = [], []
            for key, index, start, end, members in _tar_samples(
                directory / name, split_name_re, skip_meta_re
            ):
                samples.append(
                    IndexSample(
                        tar_file_id=shard_id, sample_key=key, sample_index=index,
                        byte_offset=start, byte_size=end - start,
                    )
                )  # fmt: skip
                parts += [
                    IndexSamplePart(
                        tar_file_id=shard_id, sample_index=index, part_name=part,
                        content_byte_offset=offset, content_byte_size=size,
                    )
                    for part, offset, size in members
                ]  # fmt: skip
                if len(parts) >= BATCH_ROWS:
                    writer.append_samples(samples)
                    writer.append_parts(parts)
                    samples, parts = [], []
            writer.append_samples(samples)
            writer.append_parts(parts)
    finally:
        writer.close()
    (directory / INDEX_UUID).write_text(index_uuid(run_id))
    return [SQLITE_INDEX, INDEX_UUID]


def _tar_samples(path: Path, split_name_re, skip_meta_re):
    """``(key, index in shard, first header offset, end offset, [(part, data offset, size)])`` per sample,
    read from the tar headers as ``energon prepare`` reads them (a sample ends where the next begins)."""
    with tarfile.open(path, "r:") as tar:
        current = None
        index = 0
        for member in tar:
            if not member.isreg() or skip_meta_re.match(member.name):
                continue
            match = split_name_re.match(member.name)
            if match is None:
                continue
            base, part = match.group(1), match.group(2)
            if current is None or current[0] != base:
                if current is not None:
                    yield current[0], index - 1, current[1], member.offset, current[2]
                current = (base, member.offset, [])
                index += 1
            current[2].append((part, member.offset_data, member.size))
        if current is not None:
            yield current[0], index - 1, current[1], tar.offset, current[2]
