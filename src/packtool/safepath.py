"""Paths an output directory names, confined to it: what every reader opens goes through ``output_file``.

An output directory is untrusted input (a download, a shared folder): its manifest may name any path,
and any file in it may be a symlink, a FIFO or a device. A reader opens only *regular files inside the
directory*: the name is relative with no ``..`` part, the path resolved (symlinks followed) stays inside
the resolved directory, and what it leads to is a regular file (a FIFO would block the reader, a device
such as ``/dev/zero`` never ends).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "packs-000000.tar").write_bytes(b"")
>>> output_file_problem(d, "packs-000000.tar") is None
True
>>> output_file_problem(d, "../../etc/passwd")
'names a path outside the output directory (a .. part)'
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from packtool.errors import InputError
from packtool.storage import outputs
from packtool.storage.files import file_kind


def _resolve(directory: str | Path, name: object) -> tuple[str | None, str | None]:
    """``(real path, None)`` of ``name`` inside output ``directory`` when it may be opened, else ``(None,
    why)`` (``output_file_problem``)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        return None, f"names no usable path ({name!r})"
    parts = PurePosixPath(name).parts
    if PurePosixPath(name).is_absolute() or Path(name).is_absolute():
        return None, "names an absolute path, outside the output directory"
    if ".." in parts or any(".." in Path(p).parts for p in name.split("\\")):
        return None, "names a path outside the output directory (a .. part)"
    root = os.path.realpath(directory)
    real = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, real]) != root or real == root:
        return None, "is a symlink leading outside the output directory"
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        if not outputs.fetch(root, name):  # an output in a store: fetched into its local view, if there
            return None, "missing"
        mode = os.stat(real).st_mode
    except OSError as e:
        return None, f"cannot be opened ({e.strerror})"
    if not stat.S_ISREG(mode):
        return None, f"is {file_kind(mode)}, not a regular file"
    outputs.used(root, name)
    return real, None


def output_file_size(directory: str | Path, name: object) -> tuple[str | None, int | None]:
    """``(problem, size)`` of ``name`` inside output ``directory`` without reading it: what
    ``output_file_problem`` finds, else its size in bytes (one ``stat``; for an output in a store whose
    file is not in the local view yet, the store's listing: nothing is downloaded)."""
    if isinstance(name, str) and (found := outputs.listed_size(directory, name)) is not None:
        return found
    real, problem = _resolve(directory, name)
    return (problem, None) if problem is not None else (None, os.stat(real).st_size)


def output_file_problem(directory: str | Path, name: object) -> str | None:
    """Why ``name`` (as the manifest gives it) may not be opened inside output ``directory``, or None
    (one ``realpath`` and one ``stat``). ``missing`` when it does not exist."""
    return _resolve(directory, name)[1]


# opening never blocks: a FIFO put in a file's place after it was checked is seen on the open file
_OPEN_FLAGS = (
    os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)


def open_output_file(directory: str | Path, name: object) -> BinaryIO:
    """``directory / name`` open for reading (binary), checked as it is opened: what
    ``output_file_problem`` checks, then the open file itself is a regular file. A reader that opens a file
    long after the output was checked (a loader's worker, mid-epoch) so never blocks on a FIFO or reads a
    device put in its place meanwhile. ``InputError`` naming the path otherwise.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.tar").write_bytes(b"x")
    >>> with open_output_file(d, "a.tar") as f:
    ...     f.read()
    b'x'
    """
    path = Path(directory) / str(name)
    real, problem = _resolve(directory, name)
    if problem is None:
        try:  # the real path, its last part not a link: a link put there meanwhile is refused
            fd = os.open(real, _OPEN_FLAGS)
        except FileNotFoundError:
            problem = "missing"
        except OSError as e:
            problem = f"cannot be opened ({e.strerror})"
    if problem is not None:
        raise InputError(f"{path}: {problem}; run packtool verify")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise InputError(f"{path}: is {file_kind(mode)}, not a regular file; run packtool verify")
    return os.fdopen(fd, "rb")


def output_file(directory: str | Path, name: object) -> Path:
    """``directory / name`` when ``output_file_problem`` finds nothing; else ``InputError`` naming it."""
    problem = output_file_problem(directory, name)
    if problem is not None:
        raise InputError(f"{Path(directory) / str(name)}: {problem}; run packtool verify")
    return Path(directory) / str(name)
