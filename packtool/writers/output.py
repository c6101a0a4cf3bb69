"""The output directory, written atomically.

A run works in ``<output>.partial/`` (its scratch space in ``_work/``, guarded by a lock so that a second
job on the same output is refused) and renames it to ``<output>`` only when every shard and the manifest
are whole. An interrupted run therefore never leaves a directory that looks complete. With
``overwrite`` an existing output is replaced only at that final rename.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from packtool.errors import ConfigError

MANIFEST = "manifest.json"


class OutputDir:
    def __init__(self, output: str | Path, overwrite: bool = False) -> None:
        self.final = Path(output)
        self.partial = self.final.with_name(self.final.name + ".partial")
        self.work = self.partial / "_work"
        self.overwrite = overwrite
        self._lock_fd: int | None = None

    def open(self) -> OutputDir:
        """Check the destination, take the lock and create a fresh ``.partial`` directory."""
        if self.final.exists() and not self.overwrite:
            raise ConfigError(f"{self.final}: output directory exists; pass --overwrite to replace it")
        if self.final.exists() and not self.final.is_dir():
            raise ConfigError(f"{self.final}: exists and is not a directory")
        parent = self.final.parent if str(self.final.parent) else Path(".")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"{parent}: cannot create the output's parent directory: {e.strerror}"
            ) from None
        if not os.access(parent, os.W_OK):
            raise ConfigError(f"{parent}: not writable")
        lock_path = self.final.with_name(self.final.name + ".lock")
        self._lock_fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise ConfigError(
                f"{self.final}: another packtool job is writing this output directory "
                f"(lock {lock_path} is held)"
            ) from None
        shutil.rmtree(self.partial, ignore_errors=True)
        self.work.mkdir(parents=True)
        return self

    def path(self, name: str) -> Path:
        return self.partial / name

    def commit(self, manifest: dict) -> None:
        """Write the manifest last, drop the scratch space, and move the whole directory into place."""
        shutil.rmtree(self.work, ignore_errors=True)
        write_json_atomic(self.partial / MANIFEST, manifest)
        old = None
        if self.final.exists():
            old = self.final.with_name(f"{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
        os.replace(self.partial, self.final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.close()

    def close(self) -> None:
        if self._lock_fd is not None:
            lock_path = self.final.with_name(self.final.name + ".lock")
            try:
                os.unlink(lock_path)
            except OSError:
                pass
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def abort(self) -> None:
        """Remove the partial directory after a failure (nothing that looks complete is left)."""
        shutil.rmtree(self.partial, ignore_errors=True)
        self.close()


def write_json_atomic(path: str | Path, data: dict) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
