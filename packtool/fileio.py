"""Files written whole or not at all, and their content hashes."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
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


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path``: to ``NAME.tmp-PID``, fsynced, then renamed into place."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through ``NAME.tmp-PID`` and a rename: never half a file under ``path``."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
