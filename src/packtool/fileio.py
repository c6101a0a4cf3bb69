"""Files written whole or not at all, and their content hashes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    return file_digests(path)[0]


def file_digests(path: str | Path) -> tuple[str, int]:
    """Hex sha256 and CRC-32 of a file's bytes, in one pass of 1 MiB blocks. The sha256 is for ``verify``
    and the record; the CRC-32 (about 4x faster to check) is what readers check at read time."""
    h, crc = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            crc = zlib.crc32(block, crc)
    return h.hexdigest(), crc


@contextmanager
def written_whole(path: str | Path, *, fsync: bool = True) -> Iterator[Path]:
    """A temporary path beside ``path`` (``NAME.tmp-PID``) for the block to write; when the block ends
    without error it is fsynced (a file, with ``fsync``) and renamed onto ``path``, and when it raises it is
    removed: ``path`` never holds half a file. The one way packtool writes a file in place (shards, their
    indexes, manifests, the chunk list); a killed run's leftovers match ``*.tmp*`` (``pipeline.output``).

    >>> import tempfile
    >>> with written_whole(Path(tempfile.mkdtemp()) / "a.txt") as tmp:
    ...     _ = tmp.write_text("whole")
    >>> tmp.exists(), tmp.with_name("a.txt").read_text()
    (False, 'whole')
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        if fsync and tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path``, whole or not at all (``written_whole``)."""
    with written_whole(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
