"""An output directory in an object store, read through a local cache that holds its files as they are
needed, within a byte limit.

``output_dir(url)`` reads the output's ``manifest.json`` from the store (afresh each time: the cache never
says an output is still the one it was) and gives a local folder, its *view*, named after the URL and the
manifest's digest, that holds it. Every reader of an output opens files through ``safepath``, which asks
``fetch(folder, name)`` for a file the view does not hold yet: it is downloaded whole (never more bytes than
the manifest gives the shard, or ``SIDE_FILE_BYTES`` for an index file), then read as a local output's
files are, with the same checks (the run id, each unit's checksum). A shard replaced in the store since the
manifest was read gives other bytes, and those checks refuse it; a shard removed is ``missing``.

The cache (``$PACKTOOL_CACHE/outputs``, else ``~/.cache/packtool/outputs``; ``cache_dir``) keeps the files
read most recently: once a view's files pass ``cache_limit`` bytes (``$PACKTOOL_CACHE_LIMIT``, else
``DEFAULT_CACHE_LIMIT``), the least recently opened shards are removed (a process reading one keeps its open
file). A second pass over a warm cache reads local files only. ``prefetch(folder, names)`` downloads the
next shards in a background thread while the current ones are read.

A view pickles as its URL and settings, and registers itself again where it is unpickled (a DataLoader
worker that was spawned).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import filelock

from packtool.errors import InputError
from packtool.storage.cache import cache_root
from packtool.storage.folders import StoreFolder
from packtool.storage.urls import is_url

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20  # as manifest.MAX_MANIFEST_BYTES: the store's copy is refused past it too
SIDE_FILE_BYTES = 1 << 30  # an output's other files (indexes, the errors log, the card) at most
DEFAULT_CACHE_LIMIT = 64 << 30


@dataclass
class OutputView:
    """The local view of the output at ``url``: the folder ``root`` holding its files as read, at most
    ``cache_limit`` bytes of them."""

    url: str
    root: Path
    cache_limit: int
    sizes: dict[str, int] = field(default_factory=dict)  # what the manifest says each shard holds
    listing: dict[str, int] | None = field(default=None, repr=False)  # the store's files, once listed
    _prefetch: ThreadPoolExecutor | None = field(default=None, repr=False)
    _pending: dict[str, Future] = field(default_factory=dict, repr=False)
    _pid: int = field(default_factory=os.getpid, repr=False)  # whose thread and downloads the two are

    def _own(self) -> None:
        """A process forked from the one that prefetched (a DataLoader worker) has none of its thread:
        it starts its own, and waits for no download begun there."""
        if self._pid != os.getpid():
            self._prefetch, self._pending, self._pid = None, {}, os.getpid()

    def __reduce__(self):
        return _reopen, (self.url, str(self.root), self.cache_limit, self.sizes)

    def fetch(self, name: str) -> bool:
        """Download ``name`` into the view, whole or not at all; False when the store has no such object.
        ``InputError`` for one larger than the manifest says (or ``SIDE_FILE_BYTES``)."""
        self._own()
        pending = self._pending.pop(name, None)
        if pending is not None:  # a prefetch of it: its outcome, rather than a second download
            try:
                pending.result()
            except Exception:
                pass
        return self._download(name)

    def _download(self, name: str) -> bool:
        local = self.root / name
        if local.exists():
            return True
        limit = self.sizes.get(name, SIDE_FILE_BYTES)
        folder = StoreFolder(self.url)
        st = folder.stat(name)
        if st is None or not st.is_file:
            return False
        if st.size > limit:
            raise InputError(
                f"{self.url}/{name}: {st.size:,} bytes in the store, the manifest says {limit:,}; run "
                "packtool verify"
            )
        lock_dir = self.root / ".locks"
        lock_dir.mkdir(exist_ok=True)
        with filelock.FileLock(lock_dir / (_flat(name) + ".lock")):  # one download a machine
            if not local.exists():
                self._make_room(st.size)
                folder.get_file(name, local)
                (lock_dir / (_flat(name) + ".stamp")).write_text(json.dumps(list(st.stamp)))
        return True

    def refresh(self) -> None:
        """List the store once (``listing``), and drop the files held here that the store no longer has as
        they were downloaded (another object put in a shard's place since): they are fetched again."""
        found = StoreFolder(self.url).list()
        self.listing = {n: st.size for n, st in found.items()}
        for path in self.root.rglob("*"):
            name = path.relative_to(self.root).as_posix()
            if not path.is_file() or name == MANIFEST or name.startswith(".locks/"):
                continue
            try:
                held = json.loads((self.root / ".locks" / (_flat(name) + ".stamp")).read_text())
            except (OSError, ValueError):
                held = None
            if name not in found or held != list(found[name].stamp):
                path.unlink(missing_ok=True)

    def prefetch(self, names: list[str]) -> None:
        """Download ``names`` in a background thread (one at a time, in order), those not held yet."""
        self._own()
        if self._prefetch is None:
            self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="packtool-prefetch")
        for name in names:
            if name not in self._pending and not (self.root / name).exists():
                self._pending[name] = self._prefetch.submit(self._fetch_quietly, name)

    def _fetch_quietly(self, name: str) -> None:
        try:
            self._download(name)
        except Exception:  # the reader that needs it fetches it again and says what is wrong
            pass

    def used(self, name: str) -> None:
        """Mark ``name`` as just read (the cache keeps the most recently read files)."""
        try:
            os.utime(self.root / name)
        except OSError:
            pass

    def _make_room(self, size: int) -> None:
        """Remove the least recently read shards until ``size`` more bytes fit in ``cache_limit``."""
        files = [p for p in self.root.rglob("*") if p.is_file() and p.name != MANIFEST]
        files = [p for p in files if ".locks" not in p.relative_to(self.root).parts]
        held = sum(p.stat().st_size for p in files)
        for p in sorted(files, key=lambda p: p.stat().st_mtime):
            if held + size <= self.cache_limit:
                break
            held -= p.stat().st_size
            p.unlink(missing_ok=True)


def _flat(name: str) -> str:
    return name.replace("/", "%")


_VIEWS: dict[str, OutputView] = {}  # this process's views, by their local folder
_LOCK = threading.Lock()


def _reopen(url: str, root: str, cache_limit: int, sizes: dict[str, int]) -> OutputView:
    view = OutputView(url, Path(root), cache_limit, dict(sizes))
    with _LOCK:
        return _VIEWS.setdefault(os.path.realpath(root), view)


def cache_limit_default() -> int:
    given = os.environ.get("PACKTOOL_CACHE_LIMIT")
    return int(given) if given and given.isdigit() else DEFAULT_CACHE_LIMIT


def output_dir(
    path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None
) -> Path:
    """The local folder to read the output ``path`` from: ``path`` itself on local disk; for a URL, its
    view in the cache (``cache_dir``, at most ``cache_limit`` bytes), holding its manifest as the store
    has it now. ``InputError`` when the store has no manifest there (not an output, or an unfinished run)."""
    path = os.fspath(path)
    if not is_url(path):
        return Path(path)
    url = path.rstrip("/")
    data = StoreFolder(url).read_bytes(MANIFEST, limit=MAX_MANIFEST_BYTES)
    if data is None:
        raise InputError(f"{url}: no {MANIFEST} (not packtool output, or an unfinished run)")
    base = Path(cache_dir) if cache_dir is not None else cache_root() / "outputs"
    name = hashlib.sha256(url.encode()).hexdigest()[:16]
    root = base / name / hashlib.sha256(data).hexdigest()[:16]  # another manifest: another view
    root.mkdir(parents=True, exist_ok=True)
    if not (root / MANIFEST).exists():
        tmp = root / f"{MANIFEST}.tmp-{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, root / MANIFEST)
    view = _reopen(url, str(root), cache_limit if cache_limit is not None else cache_limit_default(), {})
    view.sizes.update(_shard_sizes(data))
    view.refresh()
    _forget_old_views(base / name, keep=root)
    return root


def _shard_sizes(data: bytes) -> dict[str, int]:
    """Each shard's bytes as the manifest says (read by the manifest's own parser when the view is read;
    here only what bounds a download, so a manifest that does not parse gives none)."""
    try:
        shards = json.loads(data).get("shards", [])
        return {s["path"]: int(s["bytes"]) for s in shards if isinstance(s.get("path"), str)}
    except (ValueError, TypeError, AttributeError, KeyError):
        return {}


def _forget_old_views(folder: Path, keep: Path) -> None:
    """Remove the views of the same URL's earlier manifests not read for a day (another run's output)."""
    day = time.time() - 86_400
    for other in folder.iterdir():
        if other != keep and other.is_dir() and other.stat().st_mtime < day:
            shutil.rmtree(other, ignore_errors=True)


def view_of(directory: str | os.PathLike) -> OutputView | None:
    """The view whose local folder ``directory`` is, if it is one."""
    return _VIEWS.get(os.path.realpath(directory))


def fetch(directory: str | os.PathLike, name: str) -> bool:
    """For ``safepath``: fetch ``name`` into ``directory`` if it is a view of an output in a store; False
    when it is not one, or the store has no such file."""
    view = view_of(directory)
    return view is not None and view.fetch(name)


def used(directory: str | os.PathLike, name: str) -> None:
    """For ``safepath``: ``name`` of ``directory`` was just opened (a view keeps what was read last)."""
    view = view_of(directory)
    if view is not None:
        view.used(name)


def listed_size(directory: str | os.PathLike, name: str) -> tuple[str | None, int | None] | None:
    """For ``safepath.output_file_size``: ``(None, size)`` of a view's file that is in the store but not
    here yet, ``("missing", None)`` when the store has none; None when ``directory`` is no view or holds
    the file (then it is looked at here). One listing of the store per view, kept for its checks."""
    view = view_of(directory)
    if view is None or (view.root / name).exists():
        return None
    if view.listing is None:
        view.refresh()
    size = view.listing.get(name)
    return ("missing", None) if size is None else (None, size)


def file_names(directory: str | os.PathLike) -> list[str]:
    """The names of the files at the top of output ``directory``: the store's, for a view (what a check
    for stray shards must see), else the folder's."""
    view = view_of(directory)
    if view is not None:
        return sorted(n for n in StoreFolder(view.url).list() if "/" not in n)
    return sorted(p.name for p in Path(directory).iterdir() if p.is_file() or p.is_symlink())


def source_name(directory: str | os.PathLike) -> str:
    """What to call an output in messages: its URL for a view, else the path."""
    view = view_of(directory)
    return view.url if view is not None else os.fspath(directory)
