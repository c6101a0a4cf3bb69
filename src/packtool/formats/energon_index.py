"""Megatron-Energon's key index of a webdataset output: ``.nv-meta/index.sqlite`` and ``index.uuid``.

``energon prepare`` writes them; Energon needs them for access by key (``WebdatasetFileStore``, auxiliary
datasets, joins). packtool writes them at the end of a run, from the tar headers as ``energon prepare``
reads them: one ``samples`` row per pack (its key, its index in the shard, its byte range) and one
``sample_parts`` row per member, in the tables and indexes of Energon's ``SqliteIndexWriter`` (megatron-
energon 7.4; ``SCHEMA`` and ``INDEXES`` below). They are written with ``sqlite3`` rather than through
Energon's writer because importing ``megatron.energon`` imports torch: 1.6 s of every ``pack --format
webdataset``, which took a demo pack from 1.9 s to 4.9 s. ``tests/interop/test_energon_prepared.py``
holds them to what the installed Energon writes: the same schema and rows as ``energon prepare``'s.

``index.uuid`` (which Energon's joins read to tell index versions apart) is derived from the run_id, so the
output stays the same bytes for the same run.
"""

from __future__ import annotations

import re
import sqlite3
import tarfile
import uuid
from contextlib import nullcontext
from pathlib import Path

from packtool.formats.base import FetchShard

ENERGON_DIR = ".nv-meta"
SQLITE_INDEX = f"{ENERGON_DIR}/index.sqlite"
INDEX_UUID = f"{ENERGON_DIR}/index.uuid"
BATCH_ROWS = 4096  # rows inserted at once (Energon's INDEX_BATCH_SIZE)
# how energon prepare cuts a member name into the sample's key and the part (megatron.energon.flavors.
# webdataset.config's split_name_re and skip_meta_re)
SPLIT_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
SKIP_META = re.compile(r"__[^/]*__($|/)")
# Energon's SqliteIndexWriter's tables, then the indexes it creates once the rows are in
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS samples (
                    tar_file_id INTEGER NOT NULL,
                    sample_key TEXT NOT NULL UNIQUE,
                    sample_index INTEGER NOT NULL,
                    byte_offset INTEGER,
                    byte_size INTEGER
                )""",
    """CREATE TABLE IF NOT EXISTS sample_parts (
                    tar_file_id INTEGER,
                    sample_index INTEGER,
                    part_name TEXT,
                    content_byte_offset INTEGER,
                    content_byte_size INTEGER
                )""",
)
INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, "
    "content_byte_offset)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_full ON sample_parts(tar_file_id, sample_index, part_name, "
    "content_byte_offset, content_byte_size)",
)


def index_uuid(run_id: str) -> str:
    """The ``index.uuid`` of a run: the same for the same packs."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"packtool:{run_id}"))


def write_sqlite_index(
    directory: str | Path, shard_paths: list[str], run_id: str, fetch_shard: FetchShard = None
) -> list[str]:
    """Write ``.nv-meta/index.sqlite`` and ``index.uuid`` for the shards (relative paths, in manifest
    order); return their relative names. The shards are read in ``directory``, or where ``fetch_shard``
    puts each (a shard already uploaded to a store: ``formats.base.FetchShard``)."""
    directory = Path(directory)
    path = directory / SQLITE_INDEX
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    try:
        for statement in SCHEMA:
            db.execute(statement)
        for shard_id, name in enumerate(shard_paths):
            samples, parts = [], []
            with fetch_shard(name) if fetch_shard else nullcontext(directory / name) as path:
                for key, index, start, end, members in _tar_samples(path):
                    samples.append((shard_id, key, index, start, end - start))
                    parts += [(shard_id, index, part, offset, size) for part, offset, size in members]
                    if len(parts) >= BATCH_ROWS:
                        _insert(db, samples, parts)
                        samples, parts = [], []
            _insert(db, samples, parts)
        for statement in INDEXES:
            db.execute(statement)
        db.commit()
    finally:
        db.close()
    (directory / INDEX_UUID).write_text(index_uuid(run_id))
    return [SQLITE_INDEX, INDEX_UUID]


def _insert(db: sqlite3.Connection, samples: list[tuple], parts: list[tuple]) -> None:
    db.executemany(
        "INSERT INTO samples (tar_file_id, sample_key, sample_index, byte_offset, byte_size) "
        "VALUES (?, ?, ?, ?, ?)",
        samples,
    )
    db.executemany(
        "INSERT INTO sample_parts (tar_file_id, sample_index, part_name, content_byte_offset, "
        "content_byte_size) VALUES (?, ?, ?, ?, ?)",
        parts,
    )


def _tar_samples(path: Path):
    """``(key, index in shard, first header offset, end offset, [(part, data offset, size)])`` per sample,
    read from the tar headers as ``energon prepare`` reads them (a sample ends where the next begins)."""
    with tarfile.open(path, "r:") as tar:
        current = None
        index = 0
        for member in tar:
            if not member.isreg() or SKIP_META.match(member.name):
                continue
            match = SPLIT_NAME.match(member.name)
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
