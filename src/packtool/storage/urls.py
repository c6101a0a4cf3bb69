"""URLs: what one is, the filesystem that serves it, and what a store's failures mean to the user.

A *URL* is ``scheme://...`` with a scheme of two characters or more (``s3://bucket/key``,
``gs://bucket/key``, ``az://container/key``, ``hf://datasets/...``): it is served by fsspec's filesystem for
that scheme, never taken for a local path (``file:///abs/path`` is the local path ``/abs/path``). Anything
else is a local path (``C:\\data`` included).

Credentials and endpoints come the way each filesystem takes them (for S3: the standard ``AWS_*``
variables, ``AWS_ENDPOINT_URL``, profiles, instance roles), plus the storage options the user gives
(``--storage-options JSON``, ``PackedDataset(storage_options=...)``), as ``datasets`` takes
``storage_options``: ``configure`` sets them for this process and those it starts.

A scheme that no installed filesystem serves is a ``ConfigError`` naming the extra to install. A store's
failure becomes one line (``store_error``): unreachable endpoint, no or wrong credentials, access denied,
a missing bucket or key.

>>> is_url("s3://bucket/key"), is_url("data/train.jsonl"), is_url("C:\\\\data"), is_url("hf:name")
(True, False, False, False)
>>> local_path("file:///tmp/x.jsonl")
'/tmp/x.jsonl'
"""

from __future__ import annotations

import copy
import json
import os
import re
from typing import Any

from packtool.errors import ConfigError, InputError, PacktoolError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
ENV_OPTIONS = "PACKTOOL_STORAGE_OPTIONS"  # the storage options as JSON, for the processes a run starts

# scheme -> (the package that serves it, packtool's extra that installs it)
EXTRAS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
}

# S3's retries and timeouts, bounded so that an unreachable endpoint is named within a minute (botocore's
# own defaults retry a connection for minutes); a user's --storage-options config_kwargs replace them
S3_DEFAULTS = {
    "config_kwargs": {
        "connect_timeout": 10,
        "read_timeout": 25,
        "retries": {"max_attempts": 2, "mode": "standard"},
    }
}


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://``, a scheme of 2 characters or more), not a local path."""
    return isinstance(path, str) and _URL.match(path) is not None and not path.startswith("file://")


def scheme(url: str) -> str:
    """``s3`` for ``s3://bucket/key``."""
    m = _URL.match(url)
    return m.group(1).lower() if m else ""


def local_path(path: str | os.PathLike) -> str:
    """A local path as a string: ``file://`` taken off (``file:///a`` is ``/a``)."""
    path = os.fspath(path)
    return path[len("file://") :] if path.startswith("file://") else path


def join(base: str, *names: str) -> str:
    """``base/name/...`` for a URL or a local path (no ``os.path`` rules on a URL).

    >>> join("s3://b/out", "packs-000000.parquet"), join("s3://b/out/", "a", "b")
    ('s3://b/out/packs-000000.parquet', 's3://b/out/a/b')
    """
    if not is_url(base):
        return os.path.join(base, *names)
    return "/".join([base.rstrip("/"), *(n.strip("/") for n in names)])


def parent(url: str) -> str:
    """The folder a URL's object is in (``s3://b/out`` -> ``s3://b``)."""
    head, _, _ = url.rstrip("/").rpartition("/")
    return head if not head.endswith(":/") else url


def basename(url: str) -> str:
    return url.rstrip("/").rpartition("/")[2]


_OPTIONS: dict[str, Any] = {}


def configure(options: dict | str | None) -> None:
    """Use ``options`` (a dict, or its JSON) for every filesystem this process and those it starts open:
    keys that every filesystem takes, or per scheme (``{"s3": {...}, "gs": {...}}``). ``None`` keeps what
    is set (the ``PACKTOOL_STORAGE_OPTIONS`` variable, in a process a run started)."""
    if options is None:
        return
    parsed = parse_options(options)
    _OPTIONS.clear()
    _OPTIONS.update(parsed)
    os.environ[ENV_OPTIONS] = json.dumps(parsed)


def parse_options(options: dict | str) -> dict:
    """``--storage-options``' JSON as a dict; ``ConfigError`` for anything else."""
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError as e:
            raise ConfigError(f"--storage-options: not JSON ({e})") from None
    if not isinstance(options, dict):
        raise ConfigError("--storage-options: must be a JSON object, e.g. '{\"anon\": false}'")
    return options


def options_for(url_scheme: str) -> dict:
    """The storage options a filesystem of ``url_scheme`` is opened with: the defaults (``S3_DEFAULTS``),
    then the user's, shared keys first, then that scheme's own."""
    given = _OPTIONS or parse_options(os.environ.get(ENV_OPTIONS) or "{}")
    shared = {k: v for k, v in given.items() if k not in EXTRAS or not isinstance(v, dict)}
    # listings are not cached: a file is stat'ed again to tell whether it changed while a run read it
    # a copy: botocore rewrites the retries dict it is given
    out = {"use_listings_cache": False, **copy.deepcopy(S3_DEFAULTS if url_scheme in ("s3", "s3a") else {})}
    out.update(shared)
    out.update(given.get(url_scheme, {}) if isinstance(given.get(url_scheme), dict) else {})
    return out


def filesystem(url: str) -> tuple[Any, str]:
    """``(fsspec filesystem, path inside it)`` for ``url``. ``ConfigError`` naming the extra to install
    when no filesystem for its scheme is installed, or when none exists at all."""
    import fsspec  # (datasets' dependency, so always there) ~90 ms to import: a command with a URL pays

    s = scheme(url)
    try:
        cls = fsspec.get_filesystem_class(s)
    except ImportError:
        package, extra = EXTRAS.get(s, (None, None))
        need = f"{package} (pip install 'packtool[{extra}]')" if package else "its fsspec filesystem"
        raise ConfigError(f"{url}: reading or writing {s}:// needs {need}") from None
    except ValueError:
        raise ConfigError(
            f"{url}: no filesystem serves {s}:// (known: s3://, gs://, az:// and fsspec's others; a local "
            "path has no scheme)"
        ) from None
    fs = cls(**options_for(s))
    return fs, cls._strip_protocol(url)


def store_error(e: BaseException, url: str, doing: str = "read") -> PacktoolError:
    """The one-line error for exception ``e`` met when ``doing`` (read, write, list, remove) ``url``:
    ``ConfigError`` (exit 2) for what the user's set-up decides (endpoint, credentials, permissions, a
    missing bucket), ``InputError`` (exit 3) for a missing object or a damaged transfer."""
    if isinstance(e, PacktoolError):
        return e
    text = " ".join(str(e).split())[:300]
    name = type(e).__name__
    names = {c.__name__ for c in type(e).__mro__}
    if names & {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionError", "ClientConnectorError"}:
        return ConfigError(
            f"{url}: cannot reach the object store ({text}); check the endpoint (AWS_ENDPOINT_URL, "
            "--storage-options) and the network"
        )
    if names & {"ReadTimeoutError", "TimeoutError", "ServerTimeoutError"}:
        return ConfigError(f"{url}: the object store did not answer in time ({text})")
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        return ConfigError(
            f"{url}: no credentials for the object store ({name}): set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE) or an instance role, or pass --storage-options"
        )
    if isinstance(e, PermissionError) or "AccessDenied" in text or "InvalidAccessKeyId" in text:
        if "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
            return ConfigError(f"{url}: the store does not know these credentials ({text})")
        return ConfigError(
            f"{url}: access denied for {doing} ({text}): the credentials are not valid, or not allowed to "
            f"{doing} there"
        )
    if isinstance(e, FileNotFoundError) or "NoSuchBucket" in text or "NoSuchKey" in text:
        if "NoSuchBucket" in text or "bucket" in text.lower() and "not exist" in text.lower():
            return ConfigError(f"{url}: no such bucket")
        return InputError("no such file or object", source=url)
    return InputError(f"cannot {doing}: {name}: {text}", source=url)
