"""Local copies of what a library can only load from local disk: a tokenizer or a processor named by URL.

``local_copy(url)`` downloads an object (a ``tokenizer.json``) or every object under a prefix (a model
directory) into packtool's cache (``$PACKTOOL_CACHE``, else ``~/.cache/packtool``), once per version: a
copy is reused while the store's stamps (size and ETag) are those it was made from, and made again when
they change. Each machine of a cluster makes its own, so a Ray worker on a node that shares no filesystem
with the driver loads the same tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import filelock

from packtool.errors import ConfigError
from packtool.storage.files import is_dir, list_prefix, stat
from packtool.storage.folders import StoreFolder
from packtool.storage.urls import basename, parent

MAX_COPY_FILES = 10_000  # a model directory holds tens of files; a prefix of more is not one
MAX_COPY_BYTES = 64 << 30  # nor of more bytes than the largest models' weights


def cache_root() -> Path:
    """Where packtool keeps local copies: ``$PACKTOOL_CACHE``, else ``~/.cache/packtool``."""
    return Path(os.environ.get("PACKTOOL_CACHE") or Path.home() / ".cache" / "packtool")


def local_copy(url: str, what: str = "file") -> Path:
    """A local copy of the object or prefix ``url`` (``what`` names it in errors: ``tokenizer``, ...):
    the file's path, or the folder holding the prefix's objects. ``ConfigError`` when there is nothing at
    ``url`` or it is larger than a model directory can be. Processes of one machine making the same copy
    at once take turns (a lock file beside it)."""
    url = url.rstrip("/")
    folder = cache_root() / "remote" / hashlib.sha256(url.encode()).hexdigest()[:24]
    prefix = is_dir(url)
    if prefix:
        listing = list_prefix(url)
        names = {f[len(url) + 1 :]: listing.stats[f] for f in listing.files}
    else:
        try:
            names = {basename(url): stat(url)}
        except FileNotFoundError:
            raise ConfigError(f"{what} {url}: no such object or prefix") from None
    if len(names) > MAX_COPY_FILES or sum(s.size for s in names.values()) > MAX_COPY_BYTES:
        raise ConfigError(f"{what} {url}: {len(names):,} objects, more than a model directory holds")
    stamps = {name: list(st.stamp) for name, st in sorted(names.items())}
    target = folder / "files"
    found = target if prefix else target / basename(url)
    folder.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(folder / "copy.lock"):
        try:
            if json.loads((folder / "stamps.json").read_text()) == stamps:
                return found
        except (OSError, ValueError):
            pass
        shutil.rmtree(target, ignore_errors=True)
        source = StoreFolder(url if prefix else parent(url))
        for name in names:
            source.get_file(name, target / name)
        (folder / "stamps.json").write_text(json.dumps(stamps))
    return found
