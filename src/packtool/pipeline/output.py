"""The output directory, written atomically, and resumable: on local disk (``OutputDir``) or in an object
store (``StoreOutput``); ``open_output`` picks the one for ``--output``. Both give the pipeline the same
things: ``staging`` (the local folder its files are written in), ``scratch`` (``storage.scratch.Scratch``),
``kept_in`` (what a message names as holding the kept work), ``shard_url`` and ``has_shard`` (where a
written shard goes, whether an earlier attempt's is there), and ``begin``, ``commit``, ``abort``.

**On local disk.**

A run works in ``<output>.partial/`` (its scratch space in ``_work/``, guarded by a lock ``<output>.lock``
so that a second job on the same output is refused) and renames it to ``<output>`` only when every shard
and the manifest are whole. An interrupted run therefore never leaves a directory that looks complete: no
``manifest.json`` exists until the end. With ``overwrite`` an existing output is replaced only at that
final rename, and only if it is a packtool output (it holds a ``manifest.json``) or empty.

Resuming: ``begin(identity)`` records the run's identity in ``_work/run.json``. A later run with the same
identity (same config minus runtime keys, inputs and tokenizer: see ``packtool.pipeline``) finds the
partial directory and keeps what it holds (finished chunks and shards are skipped by the pipeline); a run
with another identity wipes it and starts afresh. The partial directory is kept when a run is killed or
interrupted, and removed on every error packtool reports (bad input or options, disk full, internal
error): after an error nothing is left behind.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path

import filelock

from packtool.errors import ConfigError
from packtool.fileio import write_json_atomic
from packtool.manifest import MANIFEST, Manifest
from packtool.pipeline.store_output import StoreOutput
from packtool.storage.scratch import Scratch
from packtool.storage.urls import is_url


class OutputDir:
    def __init__(self, output: str | Path, overwrite: bool = False) -> None:
        # an absolute path, so that "." has a name to put ".partial" after; a symbolic link is followed,
        # so that --overwrite replaces what it points to and the link stays
        self.final = Path(os.path.realpath(output) if os.path.islink(output) else os.path.abspath(output))
        if not self.final.name:
            raise ConfigError(f"{output}: cannot be the output directory (the root of the file system)")
        self.partial = self.final.with_name(self.final.name + ".partial")
        self.work = self.partial / "_work"
        self.staging, self.scratch, self.kept_in = self.partial, Scratch(str(self.work)), str(self.partial)
        self.shard_url: str | None = None  # shards stay where they are written: the directory is renamed
        self.fetch_shard = None  # (formats.base.FetchShard) the shards are in staging
        self.taken_over = None  # the lock is released by the system when its holder dies: never taken over
        self.overwrite = overwrite
        self.lock_path = self.final.with_name(self.final.name + ".lock")
        self._lock: filelock.FileLock | None = None

    def open(self) -> OutputDir:
        """Check the destination and take the lock (``ConfigError`` if another job holds it).

        The ``.partial`` directory is left as it is: ``begin`` decides whether to resume it.
        """
        if self.final.exists() and not self.final.is_dir():
            raise ConfigError(f"{self.final}: exists and is not a directory")
        if self.final.exists() and not self.overwrite:
            raise ConfigError(f"{self.final}: output directory exists; pass --overwrite to replace it")
        if self.final.exists() and not (self.final / MANIFEST).exists() and any(self.final.iterdir()):
            # a typo in --output must not delete someone's directory
            raise ConfigError(
                f"{self.final}: not a packtool output (no {MANIFEST}); --overwrite replaces only those: "
                "remove it yourself or choose another --output"
            )
        parent = self.final.parent if str(self.final.parent) else Path(".")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"{parent}: cannot create the output's parent directory: {e.strerror}"
            ) from None
        if not os.access(parent, os.W_OK):
            raise ConfigError(f"{parent}: not writable")
        self._lock = _take_lock(self.lock_path, self.final)
        self._remove_stale_old()
        return self

    def _remove_stale_old(self) -> None:
        """Remove ``<output>.old-<pid>`` copies that a job killed between ``commit``'s two renames left,
        once the output they were replaced by is in place (the lock says no other job is committing)."""
        if not self.final.exists():
            return  # the rename of .partial into place is still to come: the next commit cleans up
        for old in self.final.parent.glob(f"{glob.escape(self.final.name)}.old-*"):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)

    def begin(self, identity: dict) -> dict | None:
        """Resume the partial directory if it was left by a run of the same ``identity``, else wipe it.

        Returns ``None`` when starting afresh with nothing there, else ``{"resumed": bool}`` saying
        whether the partial work is reused (``False``: it belonged to another job and was wiped).
        """
        run_file = self.work / "run.json"
        previous = None
        if self.partial.exists():
            try:
                previous = json.loads(run_file.read_text())
            except (OSError, ValueError):
                previous = {}
        if previous is not None and previous == json.loads(json.dumps(identity)):
            for tmp in [*self.partial.glob("*.tmp*"), *self.work.glob("*.tmp*")]:  # a killed run's
                if tmp.is_dir():  # half-written chunk or shard
                    shutil.rmtree(tmp)
                else:
                    tmp.unlink()
            return {"resumed": True}
        shutil.rmtree(self.partial, ignore_errors=True)
        self.work.mkdir(parents=True)
        write_json_atomic(run_file, identity)
        return None if previous is None else {"resumed": False}

    def path(self, name: str) -> Path:
        return self.partial / name

    def has_shard(self, name: str, size: int) -> bool:
        """Whether an earlier attempt of this run left the shard ``name`` whole (``size`` bytes)."""
        path = self.partial / name
        return path.exists() and path.stat().st_size == size

    def before_write(self) -> None:
        """Nothing to do before the shards are written: an old output is replaced only at ``commit``."""

    def commit(self, manifest: Manifest) -> None:
        """Write the manifest last, drop the scratch space, and move the whole directory into place."""
        shutil.rmtree(self.work, ignore_errors=True)
        for tmp in self.partial.glob("*.tmp*"):
            tmp.unlink()
        manifest.save(self.partial)
        old = None
        if self.final.exists():
            old = self.final.with_name(f"{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
        os.replace(self.partial, self.final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._remove_stale_old()
        self.close()

    def close(self) -> None:
        if self._lock is not None:
            # removed while still held: a job that opened it meanwhile finds it unlinked once it gets the
            # lock, and filelock then tries again on the path (so no lock file is left beside the output)
            try:
                os.unlink(self.lock_path)
            except OSError:
                pass
            self._lock.release()
            self._lock = None

    def abort(self, keep: bool = False) -> None:
        """Release the lock after a failure; remove the partial directory unless ``keep`` (to resume).

        Either way nothing that looks complete is left: the manifest is only written by ``commit``.
        """
        if not keep:
            shutil.rmtree(self.partial, ignore_errors=True)
        self.close()


def _take_lock(lock_path: Path, final: Path) -> filelock.FileLock:
    """Lock ``lock_path`` without waiting (``filelock``), with this process's pid in it for the message a
    second job gets; ``ConfigError`` if another job holds it."""

    def write_pid(fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    lock = filelock.FileLock(lock_path, is_singleton=False, on_acquired=write_pid)
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:
        if not lock_path.is_file():  # filelock says Timeout when it cannot create the file at all
            raise ConfigError(
                f"{final}: cannot create the lock file {lock_path} (its folder is not writable "
                "or is not a place for files)"
            ) from None
        try:
            holder = lock_path.read_text().strip()
        except OSError:
            holder = ""
        who = f"pid {holder}" if holder.isdigit() else "another process"
        raise ConfigError(
            f"{final}: another packtool job ({who}) is writing this output directory; "
            f"wait for it to finish (lock {lock_path})"
        ) from None
    return lock


Output = OutputDir | StoreOutput


def open_output(output: str, overwrite: bool = False, scratch: str | None = None) -> Output:
    """The run's output, opened (checked, locked): ``OutputDir`` for a local path, ``StoreOutput`` for a
    URL (``scratch``: a store prefix for the run's scratch, else ``<output>/.partial/``)."""
    if is_url(output):
        return StoreOutput(output, overwrite=overwrite, scratch=scratch).open()
    if scratch is not None:
        raise ConfigError("--scratch: takes a store prefix for an output in a store (--output s3://...)")
    return OutputDir(output, overwrite=overwrite).open()
