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
* a directory: its files and its subdirectories' (hidden ones left out; symbolic links to directories
  too, unless ``follow_symlinks``: then each real directory is read once), each read by its name; if
  they are all text files, one sample per file. Files of no known format in it (a README,
  ``copyright``, ``changelog.Debian.gz``) are left out, and ``unread_files`` says which, for the run to
  say so;
* a directory written by ``datasets``' ``save_to_disk``;
* ``hf:NAME[:CONFIG]``: ``datasets.load_dataset`` (offline from the local cache).

Globs take ``**`` for any depth of subdirectories; a local one is listed by the walk a directory has
(``listing.scan_directory``), so that ``DIR/**`` and ``DIR`` read the same files. ``include`` and
``exclude`` patterns (``listing.Patterns``) pick the files of a directory, a prefix or a glob, by their
path below it. ``input_format`` ``jsonl``, ``parquet`` or ``text`` reads every file as that format,
whatever its name (``text``: a file gives one sample per line, a directory one sample per file, every
file of it). Text that is not UTF-8 is read by ``decode`` (``readers.decode``). All of these come in
the run's ``FileOptions``.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch, UsedFields
from packtool.readers.compressed import input_format as name_format
from packtool.readers.compressed import is_compressed
from packtool.readers.jsonl import read_jsonl
from packtool.readers.listing import (
    KNOWN,
    DirectoryTree,
    Parts,
    Patterns,
    Unread,
    match,
    plain_name,
    reader_of,
    scan_directory,
    split_glob,
)
from packtool.readers.listing import count_of as _count
from packtool.readers.listing import names_of as _names
from packtool.readers.options import FileOptions
from packtool.readers.parquet import read_parquet
from packtool.readers.text import read_text_dir, read_text_lines
from packtool.readers.webdataset import read_webdataset
from packtool.safepath import file_kind
from packtool.storage.files import exists, file_sizes, glob_urls, has_glob, list_prefix, open_read, size
from packtool.storage.files import stat as stat_path
from packtool.storage.urls import is_url, join

__all__ = [
    "SourceBatch",
    "expand_inputs",
    "input_bytes",
    "list_input",
    "piece_bytes",
    "read_inputs",
    "record_bytes",
    "unread_files",
]


def _is_hf_disk(path: Path | str) -> bool:
    if is_url(str(path)):
        return exists(join(str(path), "state.json")) or exists(join(str(path), "dataset_dict.json"))
    return (path / "state.json").exists() or (path / "dataset_dict.json").exists()


Entry = tuple[str, str, list[str]]  # (reader kind, source, the files of a text directory, else [])


def file_options(files: FileOptions | str) -> FileOptions:
    """``files`` as ``FileOptions``: a string names the input format alone (``"text"``)."""
    return FileOptions(input_format=files) if isinstance(files, str) else files


@dataclass
class InputListing:
    """One input, listed: its ``entries`` (``expand_inputs``), and what it holds that a run leaves out or
    reads otherwise than the user may think (``unread``: one per directory read, one for a pattern)."""

    entries: list[Entry]
    unread: list[Unread]


def expand_inputs(inputs: list[str], files: FileOptions | str = "auto") -> list[Entry]:
    """Resolve inputs to ``(kind, source, files)`` entries, in a deterministic order (``files``: a text
    directory's files, one sample each; else empty). The ``files`` argument is the run's ``FileOptions``,
    which pick the files (``--include``, ``--exclude``, ``--follow-symlinks``) and read them, or the input
    format alone. A file is read once per input even where a glob matches it and a directory above it
    (``DIR/**``).

    Raises ``InputError`` for a path that does not exist or has no known format.
    """
    files = file_options(files)
    return [entry for spec in inputs for entry in list_input(spec, files).entries]


def list_input(spec: str, files: FileOptions) -> InputListing:
    """``InputListing`` of one input: ``hf:NAME``, a URL, a file, a directory or a glob."""
    if spec.startswith("hf:"):
        return InputListing([("hf_hub", spec, [])], [])
    if is_url(spec):
        return _list_url(spec, files)
    if glob.has_magic(spec) and not os.path.lexists(spec):  # (data[1].jsonl may be a file's name)
        return _list_glob(spec, files)
    path = Path(spec)
    plain_name(path)
    if not path.exists():
        raise _missing(path)
    if not path.is_dir():
        return InputListing([_file_entry(str(path), files.input_format)], [])
    if _is_hf_disk(path):
        return InputListing([("hf_disk", str(path), [])], [])
    patterns = Patterns.of(files.include, files.exclude)
    tree = scan_directory(path, follow_symlinks=files.follow_symlinks, patterns=patterns)
    listing = _read_tree(str(path), lambda p: str(path.joinpath(*p)), tree, (), files, patterns)
    if not listing.entries:
        raise InputError(
            _nothing_known("directory holds no file {known}", "holds", "file", listing.unread, str(path)),
            source=str(path),
        )
    return listing


def _file_entry(name: str, input_format: str) -> Entry:
    """A file read by itself: its reader, once a local one is known to be a readable regular file."""
    kind = reader_of(name, input_format)
    if not kind:
        raise _unknown_format(name)
    if is_url(name):
        return (kind, name, [])
    mode = os.stat(name).st_mode
    if not stat.S_ISREG(mode):  # a FIFO would be read once and then block; a device never ends
        raise InputError(f"is {file_kind(mode)}, not a regular file: write it to a file first", source=name)
    if not os.access(name, os.R_OK):
        raise InputError("file is not readable (permission denied)", source=name)
    return (kind, name, [])


def _read_tree(
    source: str,
    name: Callable[[Parts], str],
    tree: DirectoryTree,
    top: Parts,
    files: FileOptions,
    patterns: Patterns,
) -> InputListing:
    """The directory (or prefix) ``source`` read as one input: one text directory when every file read is
    text (the others, a README, are not read), else each file by its reader; and what it leaves out.
    ``tree``: what it holds, by parts below what the patterns match against (``top``: the directory's
    own parts there); ``name(parts)``: a file's path or URL."""
    fmt = files.input_format
    kept, left, left_dirs = _pick(tree.files, patterns)
    for parts in tree.broken:  # a broken link among the files read is named as one (not skipped)
        if patterns.keeps(parts) and reader_of(parts[-1], fmt):
            raise _missing(Path(name(parts)))
    known = [p for p in kept if reader_of(p[-1], fmt)]
    kinds = {reader_of(p[-1], fmt) for p in known}
    if not known:
        entries = []
    elif kinds == {"text"}:
        entries = [("text_dir", source, [name(p) for p in known])]
    else:
        entries = [(reader_of(p[-1], fmt), name(p), []) for p in known]

    def rel(items: list[Parts]) -> list[str]:
        return ["/".join(p[len(top) :]) for p in items]

    unknown = [p for p in kept if not reader_of(p[-1], fmt)]
    unknown += [p for p in tree.broken if not reader_of(p[-1], fmt)]
    unread = Unread(
        source,
        rel(sorted(unknown)),
        rel(tree.linked_dirs),
        rel(tree.other),
        rel(tree.hidden),
        excluded=_excluded(rel, sorted(tree.excluded + left_dirs), left),
        followed=rel(tree.followed),
        repeated=list(
            zip(rel([p for p, _ in tree.repeated]), [why for _, why in tree.repeated], strict=True)
        ),
    )
    return InputListing(entries, [unread] if unread.warnings() or unread.notes() else [])


def _pick(found: list[Parts], patterns: Patterns) -> tuple[list[Parts], list[Parts], list[Parts]]:
    """The files of ``found`` the patterns keep, those they leave out, and the directories above files
    that an exclude pattern matches (``Patterns.left_out``; a listing that went into them), in order."""
    kept, files, dirs = [], [], {}
    for parts in found:
        out = patterns.left_out(parts)
        if out is None:
            kept.append(parts)
        elif len(out) < len(parts):
            dirs[out] = None
        else:
            files.append(parts)
    return kept, files, list(dirs)


def _excluded(names: Callable[[list[Parts]], list[str]], dirs: list[Parts], files: list[Parts]) -> list[str]:
    """What ``--include``/``--exclude`` leave out, by ``names`` (a directory ``name/``), in tree order."""
    marked = [(p, n + "/") for p, n in zip(dirs, names(dirs), strict=True)]
    marked += zip(files, names(files), strict=True)
    return [n for _, n in sorted(marked)]


def _list_glob(spec: str, files: FileOptions) -> InputListing:
    """A local pattern, listed by the walk a directory input has (hidden entries, links, ``--include`` and
    ``--exclude`` alike, relative to the pattern's folder): a directory it matches is read as a directory
    input (``DIR/**`` matches ``DIR``: the files below are read once), a file it matches by itself."""
    folder, rest = split_glob(spec)
    root = Path(folder or ".")
    if not root.is_dir():
        raise InputError("no file matches this pattern", source=spec)
    patterns = Patterns.of(files.include, files.exclude)

    def group_of(parts: Parts) -> Parts | None:
        """The highest directory above ``parts`` the pattern matches (``()``: the folder itself)."""
        return next((parts[:k] for k in range(len(parts)) if match(rest, parts[:k])), None)

    def within(parts: Parts) -> bool:  # a directory the pattern may match, or one below a match
        return match(rest, parts, partial=True) or group_of(parts) is not None

    tree = scan_directory(root, follow_symlinks=files.follow_symlinks, patterns=patterns, within=within)
    groups: dict[Parts, DirectoryTree] = {}
    own = DirectoryTree()  # what the walk met outside the directories the pattern matches
    for kind in dataclasses.fields(DirectoryTree):
        for item in getattr(tree, kind.name):
            group = group_of(item[0] if kind.name == "repeated" else item)
            target = own if group is None else groups.setdefault(group, DirectoryTree())
            getattr(target, kind.name).append(item)
    entries: list[tuple[Parts, list[Entry]]] = []
    unread: list[Unread] = []
    for group, found in groups.items():
        source = str(root.joinpath(*group))
        if _is_hf_disk(root.joinpath(*group)):
            entries.append((group, [("hf_disk", source, [])]))
            continue
        listing = _read_tree(source, lambda p: str(root.joinpath(*p)), found, group, files, patterns)
        entries.append((group, listing.entries))
        unread += listing.unread
    selected = sorted(p for p in own.files + own.broken + own.other if match(rest, p))
    own.hidden = [p for p in own.hidden if match(rest, p, partial=True)]  # those it would have matched
    mine, said = _read_matches(spec, lambda p: _under(folder, p), selected, own, files, patterns)
    entries += [(parts, [entry]) for parts, entry in mine]
    unread += [said] if said.warnings() or said.notes() else []
    if not any(e for _, e in entries):
        head = (
            "no file {known} matches this pattern" if groups or selected else "no file matches this pattern"
        )
        said_too = [] if said in unread else [said]
        raise InputError(_nothing_known(head, "matches", "file", [*unread, *said_too], spec), source=spec)
    return InputListing([e for _, part in sorted(entries, key=lambda x: x[0]) for e in part], unread)


def _under(folder: str, parts: Parts) -> str:
    """A path below a pattern's folder, spelled as the pattern spells the folder (``./data/a.jsonl``)."""
    if not folder:
        return "/".join(parts)
    return folder.rstrip("/") + "/" + "/".join(parts)


def _read_matches(
    spec: str,
    name: Callable[[Parts], str],
    selected: list[Parts],
    own: DirectoryTree,
    files: FileOptions,
    patterns: Patterns,
) -> tuple[list[tuple[Parts, Entry]], Unread]:
    """The files pattern ``spec`` matches by themselves (``selected``, in tree order), each read as if
    given by name; and what it leaves out: files of no known format it matches, those ``--include`` and
    ``--exclude`` leave out, the links and hidden entries (``own``: what the walk met outside the
    directories the pattern matches)."""
    fmt = files.input_format
    kept, left, left_dirs = _pick(selected, patterns)
    broken = set(own.broken)
    entries, unknown, per_line = [], [], []
    for parts in kept:
        if not reader_of(parts[-1], fmt):
            unknown.append(name(parts))
            continue
        if parts in broken:
            raise _missing(Path(name(parts)))
        entries.append((parts, _file_entry(name(parts), fmt)))
        if fmt == "text" and name_format(parts[-1])[0].lower() != ".txt":  # read a sample per line
            per_line.append(name(parts))
    names = lambda items: [name(p) for p in items]  # noqa: E731
    said = Unread(
        spec,
        unknown,
        names(own.linked_dirs),
        [],
        names(own.hidden),
        excluded=_excluded(names, sorted(own.excluded + left_dirs), left),
        followed=names(own.followed),
        repeated=[(name(p), why) for p, why in own.repeated],
        per_line=per_line,
    )
    return entries, said


def _list_url(spec: str, files: FileOptions) -> InputListing:
    """An object, a prefix (a directory: its objects, as a local directory's files) or a pattern (``*``,
    ``**``: each object it matches by itself) in a store; ``--include``/``--exclude`` as for local inputs.
    There are no links in a store, and objects under a hidden part (``.cache/``) are left out, as a local
    tree's hidden entries."""
    patterns = Patterns.of(files.include, files.exclude)
    if has_glob(spec):
        folder, _ = split_glob(spec)
        base = folder.rstrip("/")
        matches = glob_urls(spec)
        if not matches:
            raise InputError("no object matches this pattern", source=spec)
        own = DirectoryTree()
        for url in matches:
            parts = tuple(url[len(base) + 1 :].split("/"))
            (own.hidden if any(p.startswith(".") for p in parts) else own.files).append(parts)
        mine, said = _read_matches(spec, lambda p: join(base, *p), own.files, own, files, patterns)
        if not mine:
            raise InputError(
                _nothing_known("no object {known} matches this pattern", "matches", "object", [said], spec),
                source=spec,
            )
        return InputListing([e for _, e in mine], [said] if said.warnings() or said.notes() else [])
    try:
        kind = stat_path(spec).kind
    except FileNotFoundError:
        raise InputError("no such file or object (nor a prefix holding any)", source=spec) from None
    if kind != "directory":
        return InputListing([_file_entry(spec, files.input_format)], [])
    base = spec.rstrip("/")
    if _is_hf_disk(spec):
        return InputListing([("hf_disk", base, [])], [])
    listing = list_prefix(spec)
    tree = DirectoryTree(
        files=[tuple(f[len(base) + 1 :].split("/")) for f in listing.files],
        hidden=[tuple(h.split("/")) for h in listing.hidden],
    )
    out = _read_tree(base, lambda p: join(base, *p), tree, (), files, patterns)
    if not out.entries:
        raise InputError(
            _nothing_known("directory holds no file {known}", "holds", "file", out.unread, base), source=base
        )
    return out


def _unknown_format(path: str | Path) -> InputError:
    suffix, codec = name_format(path)
    ext = os.path.splitext(os.fspath(path))[1]
    return InputError(
        f"unknown input format '{ext if codec is None else suffix + ext}' (known: "
        f"{KNOWN}, those but .parquet compressed, a save_to_disk directory, hf:NAME; "
        "--input-format text reads any file as text)",
        source=str(path),
    )


def _nothing_known(head: str, verb: str, one: str, unread: list[Unread], source: str) -> str:
    """The error of the directory or pattern ``source`` of which no file is read: ``head`` (``{known}``:
    of a known format), what it ``verb``s (``...: it holds 2 files (README, NEWS); --input-format text
    ...``), and what the listing left out that may be why (below a directory a pattern matches: named by
    their path)."""

    def named(kind: str) -> list[str]:
        return [n if u.source == source else f"{u.source}/{n}" for u in unread for n in getattr(u, kind)]

    names, excluded, links = named("files"), named("excluded"), named("linked_dirs")
    parts = []
    if names:
        parts.append(
            f"it {verb} {_count(names, one)} ({_names(names)}); --input-format text reads every file as text"
        )
    elif "{known}" in head:
        parts.append(f"it {verb} no {one}")
    if excluded:
        parts.append(
            f"{_count(excluded, 'entry', 'entries')} left out by --include/--exclude ({_names(excluded)})"
        )
    if links:
        parts.append(
            f"{_count(links, 'symbolic link')} to a directory not followed ({_names(links)}; "
            "--follow-symlinks follows them)"
        )
    head = head.format(known=f"of a known format ({KNOWN}, compressed or not)")
    return f"{head}: {'; '.join(parts)}" if parts else head


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


def unread_files(inputs: list[str], files: FileOptions | str = "auto") -> list[Unread]:
    """What each input holds that a run leaves out or reads otherwise (``Unread``), where there is any:
    for each directory read (a directory input, one a glob matches, a prefix), and for each pattern."""
    files = file_options(files)
    return [u for spec in inputs for u in list_input(spec, files).unread]


def read_inputs(
    inputs: list[str],
    *,
    split: str = "train",
    text_field: str = "text",
    sink: ErrorSink | None = None,
    lazy: bool = False,
    used_fields: UsedFields = None,
    files: FileOptions | str = "auto",
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
    ``InputError`` under every policy. ``files``: the ``FileOptions`` (see the module's docstring), or the
    input format alone. What the listing left out or followed, and the records read by ``decode``, are
    counted in ``sink`` (``ErrorSink.note``).
    """
    sink = sink or ErrorSink()
    files = file_options(files)
    listings = [list_input(spec, files) for spec in inputs]
    for unread in (u for listing in listings for u in listing.unread):
        for kind, n in unread.counts().items():
            if n:
                sink.note(kind, n)
    decode = files.decode
    for kind, source, names in (e for listing in listings for e in listing.entries):
        if kind == "jsonl":
            batches = read_jsonl(
                source, sink=sink, text_field=text_field, lazy=lazy, used_fields=used_fields, decode=decode
            )
        elif kind == "parquet":
            batches = read_parquet(source, lazy=lazy)
        elif kind == "text":
            batches = read_text_lines(source, text_field=text_field, sink=sink, lazy=lazy, decode=decode)
        elif kind == "text_dir":
            batches = read_text_dir(names, source, text_field=text_field, sink=sink, lazy=lazy, decode=decode)
        elif kind == "webdataset":
            batches = read_webdataset(source, sink=sink, lazy=lazy, decode=decode)
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


def input_bytes(inputs: list[str], files: FileOptions | str = "auto") -> int | None:
    """Bytes of the inputs when each is read as line or file ranges whose bytes are known as they are
    handed out (plain JSON Lines, ``.txt`` files and directories of text files), so a progress bar can
    show a total and an ETA from the start; ``None`` otherwise (Parquet counts rows from its footers
    instead; compressed files, JSON arrays and datasets have no such measure)."""
    total = 0
    for kind, source, names in expand_inputs(inputs, files):
        if kind not in ("jsonl", "text", "text_dir") or (kind != "text_dir" and is_compressed(source)):
            return None
        if kind == "jsonl":
            with open_read(source, block_size=1 << 16) as f:
                if f.read(64).lstrip().startswith(b"["):  # a JSON array: read whole, in one piece
                    return None
        total += int(file_sizes(names).sum()) if kind == "text_dir" else size(source)
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
