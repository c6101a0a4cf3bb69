"""An output in an object store (``--output s3://bucket/out``), written without renames and resumable from
any machine.

A store has no rename, so an output there is complete when its ``manifest.json`` exists, and that object is
written last; every reader refuses a prefix without one. While a run works:

* its scratch lives under ``<output>/.partial/`` (or ``--scratch URL``): ``_work/run.json`` (the run's
  identity), the encoded chunks (each one's ``meta.json`` uploaded last), the chunk list, a record per
  finished shard (``_work/shards/``), and ``lock.json``, the run lock (``storage.folders.StoreLock``:
  another run is refused while it is held; a dead run's is named and taken over);
* every machine keeps a local copy of what it wrote or read in ``staging`` and the scratch's local folder
  (``storage.scratch``), under the system's temporary directory;
* each shard is uploaded to its final name as soon as it is written (a large shard as a multipart upload:
  one object, there only once whole), then its record.

``commit`` uploads the dataset's index files, its card and errors log, then the manifest, and removes the
scratch and the lock. A run stopped (Ctrl-C, SIGKILL, a lost machine) keeps its scratch and shards; the same
command, on any machine, resumes from them and writes the same bytes. A run that fails on an error removes
what it wrote. ``--overwrite`` replaces a packtool output: its manifest is removed when the new run starts
writing shards (from then on the old output is no longer complete), and at ``commit`` the objects its
manifest listed that the new one does not; an object that no packtool manifest lists is never removed, and
a prefix holding objects but no manifest (nor a run's scratch) is refused.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packtool.errors import ConfigError
from packtool.formats.card import CARD
from packtool.formats.registry import get_format
from packtool.manifest import ERRORS_LOG, MANIFEST, Manifest
from packtool.storage.folders import StoreFolder, StoreLock
from packtool.storage.scratch import Scratch, staging_base

RUN_FILE = "run.json"  # in the scratch: the identity of the run that works there
OLD_FILES = "old-output.json"  # in the scratch: what the output replaced by --overwrite listed
LOCK = "lock.json"  # beside the scratch's _work/


class StoreOutput:
    """The output prefix ``url`` of a store, written by one run at a time (module docstring)."""

    def __init__(self, url: str, overwrite: bool = False, scratch: str | None = None) -> None:
        self.final = url.rstrip("/")
        self.folder = StoreFolder(self.final)
        self.overwrite = overwrite
        partial = (
            f"{scratch.rstrip('/')}/{staging_base(self.final)[-16:]}" if scratch else f"{self.final}/.partial"
        )
        self.partial = StoreFolder(partial)
        base = staging_base(self.final)
        self.staging = Path(base) / "output"
        self.scratch = Scratch(f"{base}/work", remote=f"{partial}/_work")
        self.kept_in = partial
        self.shard_url: str | None = self.final
        self.lock = StoreLock(self.partial, LOCK, self.final)

    @property
    def taken_over(self) -> str | None:
        """Whose lock this run took over (a dead run's), if it did."""
        return self.lock.taken_over

    def open(self) -> StoreOutput:
        """Check the destination (``ConfigError`` for an output there without ``--overwrite``, or a prefix
        holding objects that are no packtool output) and take the lock."""
        if self.folder.exists(MANIFEST):
            if not self.overwrite:
                raise ConfigError(f"{self.final}: output exists; pass --overwrite to replace it")
        else:
            partial = (
                self.partial.url[len(self.final) + 1 :] if self.partial.url.startswith(self.final) else None
            )
            held = [n for n in self.folder.list() if partial is None or not n.startswith(partial + "/")]
            if held and not self.partial.exists(f"_work/{RUN_FILE}"):
                raise ConfigError(
                    f"{self.final}: holds {len(held):,} object(s) ({held[0]}, ...) and no {MANIFEST}: not "
                    "a packtool output; --overwrite replaces only those: remove them yourself or choose "
                    "another --output"
                )
        self.lock.acquire(take_over=self.overwrite)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        return self

    def begin(self, identity: dict) -> dict | None:
        """Resume the scratch if a run of the same ``identity`` left it, else remove it (and the shards that
        run uploaded) and start afresh; as ``OutputDir.begin``."""
        previous = self.scratch.folder.read_json(RUN_FILE) if self._has_scratch() else None
        if previous is not None and previous == json.loads(json.dumps(identity)):
            return {"resumed": True}
        if previous is not None or self._has_scratch():
            self._remove_attempt()
        self.scratch.clear_local()
        self.scratch.local.mkdir(parents=True, exist_ok=True)
        self.scratch.path(RUN_FILE).write_text(json.dumps(identity))
        self.scratch.publish(RUN_FILE)
        return None if previous is None else {"resumed": False}

    def _has_scratch(self) -> bool:
        return bool(self.scratch.folder.list())

    def _attempt_shards(self) -> list[str]:
        """The shards an attempt of a run uploaded, from its records."""
        names = []
        for record in self.scratch.folder.list("shards"):
            entry = self.scratch.folder.read_json(record)
            if isinstance(entry, dict) and isinstance(entry.get("path"), str) and "/" not in entry["path"]:
                names.append(entry["path"])
        return names

    def _remove_attempt(self) -> None:
        """Remove what an attempt of a run left: its shards (as its records name them) and its scratch."""
        self.folder.remove(self._attempt_shards())
        self.scratch.folder.remove(list(self.scratch.folder.list()))

    @contextmanager
    def fetch_shard(self, name: str) -> Iterator[Path]:
        """A local copy of the uploaded shard ``name`` while the block runs (``formats.base.FetchShard``)."""
        local = Path(staging_base(self.final)) / "fetched" / name
        self.folder.get_file(name, local)
        try:
            yield local
        finally:
            local.unlink(missing_ok=True)

    def has_shard(self, name: str, size: int) -> bool:
        st = self.folder.stat(name)
        return st is not None and st.size == size

    def before_write(self) -> None:
        """With ``--overwrite``: the old output's manifest goes before a shard of the new run replaces one of
        its shards (from here on it is no longer a complete output); what it listed is kept in the scratch,
        for ``commit`` to remove what the new output does not list."""
        data = self.folder.read_bytes(MANIFEST)
        if data is None:
            return
        try:
            old = Manifest.from_dict(json.loads(data))
            reader = get_format(old.shard_format).reader
            shards = [name for s in old.shards for name in (s.path, *reader.index_files(s))]
            names = [MANIFEST, *shards, *(old.index_files or []), ERRORS_LOG, CARD]
        except Exception:  # not a manifest packtool reads: only the manifest itself is known to be packtool's
            names = [MANIFEST]
        names = [
            n for n in names if isinstance(n, str) and ".." not in n.split("/") and not n.startswith("/")
        ]
        self.scratch.path(OLD_FILES).write_text(json.dumps(names))
        self.scratch.publish(OLD_FILES)
        self.folder.remove([MANIFEST])

    def commit(self, manifest: Manifest) -> None:
        """Upload the files written in ``staging`` (the dataset's index files, card, errors log), then the
        manifest, last; remove what an output replaced by ``--overwrite`` listed and the new one does not,
        the scratch and the lock."""
        self.lock.check()
        for path in sorted(p for p in self.staging.rglob("*") if p.is_file() and ".tmp" not in p.name):
            name = path.relative_to(self.staging).as_posix()
            if name != MANIFEST:
                self.folder.put_file(path, name)
        manifest.save(self.staging)
        self.folder.put_file(self.staging / MANIFEST, MANIFEST)
        try:
            old = json.loads(self.scratch.fetch(OLD_FILES, fresh=True).read_text())
        except (FileNotFoundError, ValueError):
            old = []
        new = {MANIFEST, *(s.path for s in manifest.shards), *(manifest.index_files or [])}
        new |= {p.relative_to(self.staging).as_posix() for p in self.staging.rglob("*") if p.is_file()}
        self.folder.remove([n for n in old if n not in new])
        self.scratch.folder.remove(list(self.scratch.folder.list()))
        self.close()

    def close(self) -> None:
        self.lock.release()
        shutil.rmtree(staging_base(self.final), ignore_errors=True)  # this machine's copies

    def abort(self, keep: bool = False) -> None:
        """Release the lock after a failure; unless ``keep`` (to resume), remove what the run wrote: the
        shards it uploaded and its scratch. Nothing that looks complete is left: the manifest is written
        only by ``commit``."""
        if not keep:
            try:
                self._remove_attempt()
            except Exception:  # the store failing too: the lock still goes, the error said stays the first
                pass
        self.close()
