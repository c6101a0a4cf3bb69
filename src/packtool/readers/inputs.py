"""Readers: raw inputs -> a stream of ``SourceBatch`` (records + where they came from).

``read_inputs(inputs, split=..., text_field=..., input_format=...)`` expands globs and directories, picks
a reader per input, and yields batches in a deterministic order: inputs in the order given, the files
of a glob or a directory sorted (a directory's subdirectories included, in tree order).

Supported inputs, with ``input_format="auto"`` (files known by name):

* ``*.jsonl`` / ``*.json`` / ``*.ndjson``: JSON Lines, or one JSON array of objects;
* ``*.parquet``;
* ``*.tar``: WebDataset shards, a record per sample key and a field per member extension
  (``readers.webdataset``);
* ``*.txt``: one sample per non-blank line;
* those but Parquet and tar compressed (gzip, bz2, zstd, lz4; ``readers.compressed``, told by content);
* a directory: its files and its subdirectories' (hidden ones and symbolic links to directories left
  out), each read by its name; if they are all text files, one sample per file. Files of no known
  format in it (a README, ``copyright``, ``changelog.Debian.gz``) are left out, and ``unread_files``
  says which, for the run to say so;
* a directory written by ``datasets``' ``save_to_disk``;
* ``hf:NAME[:CONFIG]``: ``datasets.load_dataset`` (offline from the local cache).

Globs take ``**`` for any depth of subdirectories. ``input_format`` ``jsonl``, ``parquet`` or ``text``
reads every file as that format, whatever its name (``text``: a file gives one sample per line, a
directory one sample per file, every file of it).
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch, UsedFields
from packtool.readers.compressed import input_format as name_format
from packtool.readers.compressed import is_compressed
from packtool.readers.jsonl import read_jsonl
from packtool.readers.parquet import read_parquet
from packtool.readers.text import read_text_dir, read_text_lines
from packtool.readers.webdataset import read_webdataset
from packtool.safepath import file_kind
from packtool.storage.files import (
    exists,
    file_sizes,
    glob_urls,
    has_glob,
    is_dir,
    list_prefix,
    open_read,
    size,
)
from packtool.storage.files import stat as stat_path
from packtool.storage.urls import is_url, join

__all__ = [
    "SourceBatch",
    "expand_inputs",
    "input_bytes",
    "piece_bytes",
    "read_inputs",
    "record_bytes",
    "unread_files",
]

_FILE_READERS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".txt": "text",
    ".tar": "webdataset",
}
KNOWN = ".jsonl .json .ndjson .parquet .txt .tar"


def _is_hf_disk(path: Path | str) -> bool:
    if is_url(str(path)):
        return exists(join(str(path), "state.json")) or exists(join(str(path), "dataset_dict.json"))
    return (path / "state.json").exists() or (path / "dataset_dict.json").exists()


def expand_inputs(inputs: list[str], input_format: str = "auto") -> list[tuple[str, str, list[str]]]:
    """Resolve inputs to ``(kind, source, files)`` entries, in a deterministic order (``files``: a text
    directory's files, one sample each; else empty). A file is read once per input even where a glob
    matches it and a directory above it (``DIR/**``).

    Raises ``InputError`` for a path that does not exist or has no known format.
    """
    out: list[tuple[str, str, list[str]]] = []
    for spec in inputs:
        if spec.startswith("hf:"):
            out.append(("hf_hub", spec, []))
            continue
        if is_url(spec):
            out += _expand_url(spec, input_format)
            continue
        literal, matches = _matches(spec)
        if not matches:
            raise InputError("no file matches this pattern", source=spec)
        seen: set[str] = set()  # the files this input's entries read so far
        for m in matches:
            if not literal and _unknown_file(Path(m), input_format):  # left out as in a directory
                continue
            for kind, source, files in _expand_path(Path(m), input_format):
                if kind == "text_dir":
                    files = [f for f in files if f not in seen]
                    if not files:
                        continue
                elif source in seen:
                    continue
                seen.update(files or [source])
                out.append((kind, source, files))
        if not seen:
            names = [m for m in matches if _unknown_file(Path(m), input_format)]
            raise InputError(
                f"no file of a known format ({KNOWN}, compressed or not) matches this pattern: it matches "
                f"{_count(names, 'file')} ({_names(names)}); --input-format text reads every file as text",
                source=spec,
            )
    return out


def _expand_url(spec: str, input_format: str) -> list[tuple[str, str, list[str]]]:
    """``expand_inputs`` for a URL: an object, a prefix (a directory: its objects, as a local directory's
    files) or a pattern (``*``, ``**``); objects of no known format a pattern matches are left out."""
    if has_glob(spec):
        matches = glob_urls(spec)
        if not matches:
            raise InputError("no object matches this pattern", source=spec)
        known = [(k, m, []) for m in matches if (k := _reader_of(m, input_format))]
        if not known:
            raise InputError(
                f"no object of a known format ({KNOWN}, compressed or not) matches this pattern: it matches "
                f"{_count(matches, 'object')} ({_names(matches)}); --input-format text reads every file as "
                "text",
                source=spec,
            )
        return known
    try:
        kind = stat_path(spec).kind
    except FileNotFoundError:
        raise InputError("no such file or object (nor a prefix holding any)", source=spec) from None
    if kind == "directory":
        if _is_hf_disk(spec):
            return [("hf_disk", spec.rstrip("/"), [])]
        listing = list_prefix(spec)
        return _dir_entries(spec.rstrip("/"), listing.files, lambda f: f[len(spec.rstrip("/")) + 1 :],
                            input_format)  # fmt: skip
    reader = _reader_of(spec, input_format)
    if not reader:
        raise _unknown_format(spec)
    return [(reader, spec, [])]


def _unknown_format(path: str | Path) -> InputError:
    suffix, codec = name_format(path)
    ext = os.path.splitext(os.fspath(path))[1]
    return InputError(
        f"unknown input format '{ext if codec is None else suffix + ext}' (known: "
        f"{KNOWN}, those but .parquet compressed, a save_to_disk directory, hf:NAME; "
        "--input-format text reads any file as text)",
        source=str(path),
    )


def _matches(spec: str) -> tuple[bool, list[str]]:
    """``(literal, paths)``: ``spec`` itself when it exists or has no glob characters (``data[1].jsonl``
    is a file's name), else its glob's matches, sorted (``**``: any depth of subdirectories)."""
    if not glob.has_magic(spec) or os.path.lexists(spec):
        return True, [spec]
    return False, sorted(glob.glob(spec, recursive=True))


def _unknown_file(path: Path, input_format: str) -> bool:
    """``path`` is a file (or a link to none) that no reader reads by its name."""
    return not path.is_dir() and not _reader_of(path, input_format)


def _plain_name(path: Path) -> None:
    """``InputError`` when ``path``'s name is not UTF-8: the manifest, Arrow and JSON need one."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise InputError("file name is not valid UTF-8: rename it", source=shown) from None


def _missing(path: Path) -> InputError:
    """The error for a path that does not exist: a link that loops or points nowhere, or nothing."""
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python 3.11 reports a loop this way
            return InputError("a symbolic link that loops back on itself", source=str(path))
        except OSError as e:
            if e.errno == errno.ELOOP:
                return InputError("a symbolic link that loops back on itself", source=str(path))
        return InputError(f"a broken symbolic link (to {os.readlink(path)})", source=str(path))
    return InputError("no such file or directory", source=str(path))


def _expand_path(path: Path, input_format: str) -> list[tuple[str, str, list[str]]]:
    _plain_name(path)
    if not path.exists():
        raise _missing(path)
    if path.is_dir():
        return _expand_dir(path, input_format)
    kind = _reader_of(path, input_format)
    if not kind:
        raise _unknown_format(path)
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):  # a FIFO would be read once and then block; a device never ends
        raise InputError(
            f"is {file_kind(mode)}, not a regular file: write it to a file first", source=str(path)
        )
    if not os.access(path, os.R_OK):
        raise InputError("file is not readable (permission denied)", source=str(path))
    return [(kind, str(path), [])]


def _expand_dir(path: Path, input_format: str) -> list[tuple[str, str, list[str]]]:
    """A directory's entries: a ``save_to_disk`` dataset, one text directory (one sample per file), or
    each of its files by its reader."""
    if _is_hf_disk(path):
        return [("hf_disk", str(path), [])]
    tree = scan_directory(path)
    for p in tree.broken:  # a broken link among the files read is named as one (not skipped)
        if _reader_of(p, input_format):
            raise _missing(p)
    files = [str(p) for p in tree.files]
    return _dir_entries(str(path), files, lambda f: os.path.relpath(f, path), input_format)


def _dir_entries(
    source: str, files: list[str], relative: Callable[[str], str], input_format: str
) -> list[tuple[str, str, list[str]]]:
    """The entries of directory (or prefix) ``source`` holding ``files`` (in tree order): one text
    directory when every file read is text, else each file by its reader."""
    reader = {f: _reader_of(f, input_format) for f in files}
    known = [f for f in files if reader[f]]
    if not known:
        names = [relative(f) for f in files]
        held = f"it holds {_count(names, 'file')} ({_names(names)})" if names else "it holds no file"
        hint = "; --input-format text reads every file as text" if names else ""
        raise InputError(
            f"directory holds no file of a known format ({KNOWN}, compressed or not): {held}{hint}",
            source=source,
        )
    if all(reader[f] == "text" for f in known):  # the others (README, notes) are not read
        return [("text_dir", source, known)]
    return [(reader[f], f, []) for f in known]


@dataclass
class DirectoryTree:
    """What a directory holds, its subdirectories included: ``files``, the regular files (symbolic links
    to files too) sorted in tree order; what is never read: ``hidden`` entries (names starting with
    ``.``, not looked into), ``linked_dirs`` (symbolic links to directories, not followed: a tree linking
    into itself would be read without end, one linking elsewhere twice), ``other`` entries (FIFOs,
    sockets, devices) and ``broken`` links. The last four relative to the directory, except ``broken``."""

    files: list[Path] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    linked_dirs: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    broken: list[Path] = field(default_factory=list)


def scan_directory(path: Path) -> DirectoryTree:
    """Walk ``path`` and its subdirectories (``DirectoryTree``); ``InputError`` naming a subdirectory
    that cannot be listed, rather than leaving its files out unsaid.

    Files are in tree order: sorted by their path's parts (``a/z.txt`` before ``a.txt``, a directory's
    files in name order, as a flat directory's always were)."""
    tree = DirectoryTree()

    def unreadable(e: OSError) -> None:
        raise InputError(f"cannot list a directory: {e.strerror or e}", source=e.filename or str(path))

    for root, dirs, names in os.walk(path, onerror=unreadable):
        here = Path(root)
        keep = []
        for d in dirs:
            rel = str((here / d).relative_to(path))
            if d.startswith("."):
                tree.hidden.append(rel)
            elif (here / d).is_symlink():
                tree.linked_dirs.append(rel)
            else:
                keep.append(d)
        dirs[:] = keep
        for n in names:
            p = here / n
            if n.startswith("."):
                tree.hidden.append(str(p.relative_to(path)))
            elif p.is_file():
                _plain_name(p)
                tree.files.append(p)
            elif p.is_symlink() and not p.exists():
                tree.broken.append(p)
            else:
                tree.other.append(str(p.relative_to(path)))
    tree.files.sort(key=lambda p: p.relative_to(path).parts)
    for names in (tree.hidden, tree.linked_dirs, tree.other):
        names.sort()
    return tree


def _reader_of(path: Path | str, input_format: str = "auto") -> str | None:
    """The reader of a file: ``input_format`` unless ``auto``, else by its name's suffixes, None if
    none (a compressed file's inner suffix decides; Parquet compresses its own pages: a file named as
    compressed Parquet is not read; nor a compressed tar, which has no member offsets to hand out)."""
    if input_format != "auto":
        return input_format
    suffix, codec = name_format(path)
    kind = _FILE_READERS.get(suffix.lower())
    return None if codec is not None and kind in ("parquet", "webdataset") else kind


@dataclass
class Unread:
    """What the directory ``source`` (an input) holds that a run leaves out (``DirectoryTree``):
    ``files`` of no known format (with ``input_format`` ``auto``), ``linked_dirs``, ``other`` entries and
    ``hidden`` ones, relative to it."""

    source: str
    files: list[str]
    linked_dirs: list[str]
    other: list[str]
    hidden: list[str]

    def warnings(self) -> list[str]:
        """A line per kind of entry a user may have meant to pack (hidden ones are said by ``note``)."""
        out = []
        if self.files:
            out.append(
                f"{self.source}: {_count(self.files, 'file')} of no known format not read "
                f"({_names(self.files)}; known: {KNOWN}, compressed or not; --input-format text reads "
                "every file as text)"
            )
        if self.linked_dirs:
            out.append(
                f"{self.source}: {_count(self.linked_dirs, 'symbolic link')} to a directory not followed "
                f"({_names(self.linked_dirs)}; give the directory as an input of its own)"
            )
        if self.other:
            out.append(
                f"{self.source}: {_count(self.other, 'entry', 'entries')} that are not regular files not "
                f"read ({_names(self.other)})"
            )
        return out

    def note(self) -> str | None:
        """The hidden entries left out, if any: never meant as data, said all the same."""
        if not self.hidden:
            return None
        hidden = _count(self.hidden, "hidden entry", "hidden entries")
        return f"{self.source}: {hidden} left out ({_names(self.hidden)})"


def _count(names: list[str], one: str, many: str | None = None) -> str:
    return f"{len(names):,} {one if len(names) == 1 else (many or one + 's')}"


def _names(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown:,} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def unread_files(inputs: list[str], input_format: str = "auto") -> list[Unread]:
    """What each directory among ``inputs`` (and among a glob's matches) holds that is not read, and
    the files a glob matches that are not read, where there are any; each entry said once per input
    (``DIR/**`` matches the directory and what it holds)."""
    out = []
    for spec in inputs:
        if spec.startswith("hf:"):
            continue
        if is_url(spec):
            out += _unread_urls(spec, input_format)
            continue
        literal, matches = _matches(spec)
        said: set[str] = set()
        for m in matches:
            path = Path(m)
            if not path.is_dir() or _is_hf_disk(path):
                continue
            tree = scan_directory(path)
            unread = [
                str(p.relative_to(path))
                for p in [*tree.files, *tree.broken]
                if not _reader_of(p, input_format)
            ]
            lists = [
                _not_said(path, names, said) for names in (unread, tree.linked_dirs, tree.other, tree.hidden)
            ]
            entry = Unread(str(path), *lists)
            if entry.warnings() or entry.note():
                out.append(entry)
        unknown = [] if literal else [m for m in matches if _unknown_file(Path(m), input_format)]
        unknown = [m for m in unknown if m not in said]
        if unknown:
            out.append(Unread(spec, unknown, [], [], []))
    return out


def _unread_urls(spec: str, input_format: str) -> list[Unread]:
    """``unread_files`` for a URL: what a prefix holds unread (its objects of no known format, its
    hidden ones); a pattern's matches of no known format."""
    if has_glob(spec):
        unknown = [m for m in glob_urls(spec) if not _reader_of(m, input_format)]
        return [Unread(spec, unknown, [], [], [])] if unknown else []
    if not is_dir(spec) or _is_hf_disk(spec):
        return []
    base = spec.rstrip("/")
    listing = list_prefix(spec)
    unknown = [f[len(base) + 1 :] for f in listing.files if not _reader_of(f, input_format)]
    entry = Unread(base, unknown, [], [], listing.hidden)
    return [entry] if entry.warnings() or entry.note() else []


def _not_said(directory: Path, names: list[str], said: set[str]) -> list[str]:
    """``names`` (relative to ``directory``) whose paths are not in ``said`` yet, sorted; adds them."""
    new = sorted(n for n in names if str(directory / n) not in said)
    said.update(str(directory / n) for n in new)
    return new


def read_inputs(
    inputs: list[str],
    *,
    split: str = "train",
    text_field: str = "text",
    sink: ErrorSink | None = None,
    lazy: bool = False,
    used_fields: UsedFields = None,
    input_format: str = "auto",
) -> Iterator[SourceBatch]:
    """Stream every input as ``SourceBatch`` objects, in order.

    With ``lazy``, nothing but what locates the records is read here: Parquet files yield ``ParquetRows``,
    JSON Lines files (after their first record) ``JsonlLines``, ``.txt`` files ``TextLines``, directories
    of them ``TextFiles`` and Hugging Face datasets on disk ``HfRows`` (where the dataset is its Arrow
    files), row, line or file ranges read later, by whoever calls their ``load(sink)``.

    ``used_fields`` names the fields the caller reads (``base.UsedFields``: a set, or a function of a
    batch's field names; None: all): a field outside them whose values cannot be one column (mixed types,
    an integer beyond int64, a lone surrogate) is left out of the batch rather than being an error.

    Bad records go to ``sink`` (default: raise ``InputError``); a file that cannot be read at all raises
    ``InputError`` under every policy. ``input_format``: see the module's docstring.
    """
    sink = sink or ErrorSink()
    for kind, source, files in expand_inputs(inputs, input_format):
        if kind == "jsonl":
            batches = read_jsonl(source, sink=sink, text_field=text_field, lazy=lazy, used_fields=used_fields)
        elif kind == "parquet":
            batches = read_parquet(source, lazy=lazy)
        elif kind == "text":
            batches = read_text_lines(source, text_field=text_field, sink=sink, lazy=lazy)
        elif kind == "text_dir":
            batches = read_text_dir(files, source, text_field=text_field, sink=sink, lazy=lazy)
        elif kind == "webdataset":
            batches = read_webdataset(source, sink=sink, lazy=lazy)
        else:  # datasets is slow to import: only a run that reads a dataset pays for it
            from packtool.readers import hf

            read = hf.read_hf_disk if kind == "hf_disk" else hf.read_hf_hub
            batches = read(source, split=split, lazy=lazy)
        try:
            for batch in batches:
                if batch.num_rows:
                    yield batch
        except OSError as e:  # e.g. a directory named like a file, permission denied, an I/O error
            raise InputError(f"cannot read: {e.strerror or e}", source=e.filename or source) from None


def input_bytes(inputs: list[str], input_format: str = "auto") -> int | None:
    """Bytes of the inputs when each is read as line or file ranges whose bytes are known as they are
    handed out (plain JSON Lines, ``.txt`` files and directories of text files), so a progress bar can
    show a total and an ETA from the start; ``None`` otherwise (Parquet counts rows from its footers
    instead; compressed files, JSON arrays and datasets have no such measure)."""
    total = 0
    for kind, source, files in expand_inputs(inputs, input_format):
        if kind not in ("jsonl", "text", "text_dir") or (kind != "text_dir" and is_compressed(source)):
            return None
        if kind == "jsonl":
            with open_read(source, block_size=1 << 16) as f:
                if f.read(64).lstrip().startswith(b"["):  # a JSON array: read whole, in one piece
                    return None
        total += int(file_sizes(files).sum()) if kind == "text_dir" else size(source)
    return total


def piece_bytes(piece) -> int:
    """Bytes of input a piece covers: a line range's span, a file range's sizes; 0 for records already
    read (the first ones of a JSON Lines file, read to learn its fields)."""
    starts = getattr(piece, "line_starts", None)
    if starts is not None:
        return int(starts[-1] - starts[0]) if len(starts) else 0
    sizes = getattr(piece, "sizes", None)
    if sizes is not None:
        return int(sizes.sum())
    return 0


def record_bytes(piece) -> np.ndarray:
    """``(num_rows,)`` int64: about how many bytes of input each record of ``piece`` is, what a chunk's
    size is counted in (``pipeline.encode.chunked``): each line of a line range, each file of a file
    range, and for rows (Parquet's row group, a dataset's Arrow file, records already read) their share
    of the bytes they take uncompressed. Depends on the input alone, never on who reads it.

    >>> from packtool.readers.text import TextLines
    >>> record_bytes(TextLines("a.txt", 1, np.array([0, 10, 300]))).tolist()
    [10, 290]
    """
    starts = getattr(piece, "line_starts", None)
    if starts is not None:
        return np.diff(starts)
    sizes = getattr(piece, "sizes", None)
    if sizes is not None:
        return np.asarray(sizes, dtype=np.int64)
    per_row = getattr(piece, "row_bytes", None)
    if per_row is None:  # records read already (a SourceBatch): their Arrow buffers
        per_row = piece.batch.nbytes / max(piece.num_rows, 1)
    return np.full(piece.num_rows, int(per_row), dtype=np.int64)
