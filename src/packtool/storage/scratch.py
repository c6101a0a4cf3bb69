"""A run's scratch (its encoded chunks, the chunk list, the shards' records, its identity): a folder on local
disk, mirrored to a store when the output is in one.

Workers read and write the scratch on local disk (chunks are memory-mapped). With a ``remote`` prefix, what a
process writes is *published* (uploaded whole, a chunk's ``meta.json`` last) and what it reads and does not
hold is *fetched* (downloaded whole into its local folder): so a run stopped on one machine resumes on
another from the store, and the workers of a Ray cluster whose nodes share no filesystem meet there, each
node with a local folder of its own (``node_key``).

>>> s = Scratch("/tmp/packtool-scratch/x")  # local only: the folder is the scratch
>>> s.path("chunk-000000/meta.json")
PosixPath('/tmp/packtool-scratch/x/chunk-000000/meta.json')
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packtool.storage.folders import StoreFolder

_NODE = ["local"]  # this process's machine, as the engine names it (a Ray node's id); "local" elsewhere


def set_node(key: str) -> None:
    """Name the machine this process runs on (an engine's worker does, on a cluster): a mirrored scratch
    keeps a local folder per machine, so nothing is shared between machines but the store."""
    _NODE[0] = key


def node_key() -> str:
    return _NODE[0]


def staging_base(output_url: str) -> str:
    """The local folder a run writing to the store prefix ``output_url`` keeps its scratch in, on every
    machine: under the system's temporary directory, named after the output."""
    digest = hashlib.sha256(output_url.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "packtool-scratch", digest)


@dataclass(frozen=True)
class Scratch:
    """A run's scratch: the local folder ``base`` (per machine, ``node_key``, when mirrored), and the store
    prefix ``remote`` it is mirrored to (None: local only, and ``base`` is the folder itself)."""

    base: str
    remote: str | None = None

    @property
    def local(self) -> Path:
        return Path(self.base) if self.remote is None else Path(self.base) / node_key()

    @property
    def folder(self) -> StoreFolder:
        assert self.remote is not None
        return StoreFolder(self.remote)

    def path(self, name: str) -> Path:
        """The local path of ``name`` (nothing fetched)."""
        return self.local / name

    def fetch(self, name: str, fresh: bool = False) -> Path:
        """The local path of ``name``, downloaded from the store first when it is not here (or always,
        ``fresh``: a file a run rewrites, such as the chunk list). ``FileNotFoundError`` if it is nowhere."""
        path = self.path(name)
        if self.remote is not None and (fresh or not path.exists()):
            self.folder.get_file(name, path)
        return path

    def publish(self, *names: str) -> None:
        """Upload the local files ``names`` to the store, in that order (no-op when local only)."""
        if self.remote is None:
            return
        for name in names:
            self.folder.put_file(self.path(name), name)

    def publish_dir(self, name: str, last: str) -> None:
        """Upload every file of the local folder ``name``, the file ``last`` after all others (what says
        the folder is whole)."""
        if self.remote is None:
            return
        files = sorted(
            p.relative_to(self.local).as_posix() for p in self.path(name).rglob("*") if p.is_file()
        )
        end = f"{name}/{last}"
        self.publish(*[f for f in files if f != end], *([end] if end in files else []))

    def exists(self, name: str) -> bool:
        if self.path(name).exists():
            return True
        return self.remote is not None and self.folder.exists(name)

    def names(self, prefix: str = "") -> list[str]:
        """The files under ``prefix``: the store's when mirrored (what any machine can fetch), else the
        local folder's; names relative to the scratch, sorted."""
        if self.remote is not None:
            return sorted(self.folder.list(prefix))
        root = self.path(prefix)
        if not root.exists():
            return []
        return sorted(p.relative_to(self.local).as_posix() for p in root.rglob("*") if p.is_file())

    def remove(self, name: str) -> None:
        """Remove the file or folder ``name`` here and in the store."""
        path = self.path(name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:  # a file, or a link put in a folder's place: the link goes, never what it leads to
            path.unlink(missing_ok=True)
        if self.remote is not None:
            self.folder.remove([name])  # an object of that name, then those under it as a folder
            self.folder.remove_prefix(name + "/")

    def clear_local(self) -> None:
        """Remove this machine's local folder (a mirrored scratch's copy; the store keeps its own)."""
        shutil.rmtree(self.local, ignore_errors=True)


def as_scratch(where: Scratch | str | os.PathLike) -> Scratch:
    """``where`` as a ``Scratch``: a local folder's path is a local-only scratch."""
    return where if isinstance(where, Scratch) else Scratch(os.fspath(where))
