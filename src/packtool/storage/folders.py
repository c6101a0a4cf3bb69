"""A folder in an object store (a prefix), written: objects put whole, fetched, listed and removed; and the
run lock that works across machines.

A store has no rename: an object is written by one PUT, whole or not at all, so a file is put whole by
uploading it (never appended to), and what marks a set of objects complete is one more object written
last (an output's ``manifest.json``; a chunk's ``meta.json``).

The lock (``StoreLock``) is an object created only if none exists (a conditional PUT, ``If-None-Match: *``),
holding who holds it (host, pid, a token) and until when (its lease, renewed by a thread while the run
goes on). A second run finds it and is refused, naming the holder; a lock whose holder is dead (its lease
ran out, or its pid is gone on this host) is named and taken over.

>>> folder = StoreFolder("s3://bucket/out")
>>> folder.url_of("packs-000000.parquet")
's3://bucket/out/packs-000000.parquet'
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError
from packtool.storage.files import Stat, remote_stat
from packtool.storage.urls import filesystem, store_error

JSON_LIMIT = 64 << 20  # bytes a JSON object of packtool's own (a run's state, a record) may hold at most


class StoreFolder:
    """The prefix ``url`` of a store, as a folder of objects named relative to it."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._fs, self._root = None, None

    def __repr__(self) -> str:
        return f"StoreFolder({self.url!r})"

    def __reduce__(self):  # the filesystem is opened again where the folder is unpickled
        return StoreFolder, (self.url,)

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs, root = filesystem(self.url)
            self._root = root.rstrip("/")
        return self._fs

    def _path(self, name: str) -> str:
        self.fs  # noqa: B018 - opens the filesystem, which sets the root
        return f"{self._root}/{name}" if name else self._root

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}" if name else self.url

    def child(self, name: str) -> StoreFolder:
        return StoreFolder(self.url_of(name))

    def _call(self, doing: str, name: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except FileNotFoundError:
            raise
        except FileExistsError:
            raise
        except Exception as e:
            raise store_error(e, self.url_of(name), doing) from None

    def stat(self, name: str) -> Stat | None:
        """The object ``name``'s ``Stat``, None when there is none."""
        try:
            return remote_stat(self._call("read", name, self.fs.info, self._path(name)))
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        st = self.stat(name)
        return st is not None and st.is_file

    def read_bytes(self, name: str, limit: int = JSON_LIMIT) -> bytes | None:
        """The object ``name`` (at most ``limit`` bytes, else ``ConfigError``), None when there is none."""
        try:  # one ranged GET (no HEAD first: what changes meanwhile is read whole, as it is then)
            data = self._call("read", name, self.fs.cat_file, self._path(name), start=0, end=limit + 1)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise ConfigError(
                f"{self.url_of(name)}: larger than {limit:,} bytes: not an object packtool wrote"
            )
        return data

    def read_json(self, name: str) -> Any:
        """The JSON object ``name``; None when there is none or it does not parse (a damaged one)."""
        data = self.read_bytes(name)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def put_bytes(self, name: str, data: bytes, *, create: bool = False) -> None:
        """Write the object ``name`` whole; with ``create``, only if it does not exist (``FileExistsError``
        when it does: a conditional PUT)."""
        mode = "create" if create else "overwrite"
        self._call("write", name, self.fs.pipe_file, self._path(name), data, mode=mode)

    def put_json(self, name: str, value: Any) -> None:
        self.put_bytes(name, (json.dumps(value, indent=1) + "\n").encode())

    def put_file(self, local: str | Path, name: str) -> None:
        """Upload the local file ``local`` as the object ``name`` (multipart for a large one, still one
        object that exists only once whole)."""
        self._call("write", name, self.fs.put_file, os.fspath(local), self._path(name))

    def get_file(self, name: str, local: str | Path) -> None:
        """Download the object ``name`` to ``local``, whole or not at all (a temporary file beside it,
        renamed into place); ``FileNotFoundError`` when there is none."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f"{local.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        try:
            self._call("read", name, self.fs.get_file, self._path(name), os.fspath(tmp))
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> dict[str, Stat]:
        """Every object under ``prefix`` (relative to this folder), by name relative to this folder."""
        base = self._path(prefix).rstrip("/")
        try:
            found = self._call("list", prefix, self.fs.find, base, detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for path, info in found.items():
            if info.get("type") == "directory" or path.endswith("/"):
                continue
            out[path[len(self._root) + 1 :]] = remote_stat(info)
        return out

    def remove(self, names: list[str]) -> None:
        """Remove the objects ``names`` (those that exist)."""
        paths = [self._path(n) for n in names]
        for i in range(0, len(paths), 1000):  # S3 deletes up to 1,000 keys a request
            try:
                self._call("remove", names[0], self.fs.rm, paths[i : i + 1000])
            except FileNotFoundError:
                pass

    def remove_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix`` (relative to this folder)."""
        names = list(self.list(prefix))
        if names:
            self.remove(names)


LEASE_SECONDS = 120.0  # how long a lock holds without being renewed
RENEW_SECONDS = 30.0  # how often the holder renews it


@dataclass
class LockHolder:
    """What a lock object says: who holds it and until when (seconds since the epoch)."""

    host: str
    pid: int
    token: str
    started: float
    expires: float

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host}, since {since}"

    def dead(self, now: float) -> str | None:
        """Why the holder is known dead (its lease ran out, or its pid is gone on this host), else None."""
        if now > self.expires:
            return f"its lease ran out {now - self.expires:.0f} s ago"
        if self.host == socket.gethostname() and not _pid_alive(self.pid):
            return f"pid {self.pid} is not running on this host"
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class StoreLock:
    """The run lock of an output in a store: the object ``name`` of ``folder``, held while a run writes.

    ``acquire(take_over=...)`` creates it (refused, ``ConfigError`` naming the holder, while a live run
    holds it); a dead holder's lock is taken over (``taken_over`` says whose). While held, a thread renews
    the lease every ``RENEW_SECONDS``; ``release`` removes it."""

    def __init__(self, folder: StoreFolder, name: str, what: str) -> None:
        self.folder, self.name, self.what = folder, name, what
        self.token = uuid.uuid4().hex
        self.taken_over: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # another job took the lock over while this one held it
        self.failed: str | None = None  # the last renewal that failed (the store did not answer)

    def _holder(self, started: float) -> LockHolder:
        """This run as the holder, since ``started``, its lease running ``LEASE_SECONDS`` from now."""
        return LockHolder(socket.gethostname(), os.getpid(), self.token, started, time.time() + LEASE_SECONDS)

    def _read(self) -> LockHolder | None:
        data = self.folder.read_json(self.name)
        try:
            return LockHolder(**data) if isinstance(data, dict) else None
        except TypeError:
            return None

    def acquire(self, take_over: bool = False) -> StoreLock:
        """Take the lock. ``take_over``: also take a lock whose holder is alive as far as can be told (the
        user says it is dead: a run killed on another machine, whose lease has not run out yet)."""
        for _ in range(3):
            now = time.time()
            body = json.dumps(self._holder(now).__dict__).encode()
            try:
                self.folder.put_bytes(self.name, body, create=True)
                break
            except FileExistsError:
                holder = self._read()
                if holder is None:  # a damaged lock object: no holder to name
                    why = "its lock object is not packtool's"
                else:
                    why = holder.dead(now)
                if why is None and not take_over:
                    raise ConfigError(
                        f"{self.what}: another packtool job ({holder.describe()}) is writing it (lock "
                        f"{self.folder.url_of(self.name)}, lease until "
                        f"{time.strftime('%H:%M:%S', time.localtime(holder.expires))}); wait for it to "
                        "finish, or pass --overwrite if that job is dead"
                    ) from None
                who = holder.describe() if holder is not None else "unknown"
                self.taken_over = f"{who}: {why or 'taken over by --overwrite'}"
                self.folder.remove([self.name])
        else:
            raise ConfigError(f"{self.what}: could not take the lock {self.folder.url_of(self.name)}")
        self._thread = threading.Thread(target=self._renew, name="packtool-lock", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                holder = self._read()
                if holder is None or holder.token != self.token:
                    self.lost = "another job took the lock over"
                    return
                self.folder.put_bytes(self.name, json.dumps(self._holder(holder.started).__dict__).encode())
            except Exception as e:  # a store that does not answer for a while: try again next time
                self.failed = str(e)

    def check(self) -> None:
        """``ConfigError`` if the lock was taken over by another job while this one held it."""
        if self.lost is not None:
            raise ConfigError(f"{self.what}: {self.lost} while this run wrote it; nothing was committed")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            holder = self._read()
            if holder is not None and holder.token == self.token:
                self.folder.remove([self.name])
