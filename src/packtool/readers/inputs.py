"""Readers: raw inputs -> a stream of ``SourceBatch`` (records + where they came from).

``read_inputs(inputs, split=..., text_field=...)`` expands globs and directories, picks a reader per
input, and yields batches in a deterministic order: inputs in the order given, glob matches sorted.

Supported inputs:

* ``*.jsonl`` / ``*.json``: JSON Lines, or one JSON array of objects;
* those and ``*.txt`` compressed (``.gz``, ``.bz2``, ``.zst``, ``.lz4``; ``readers.compressed``), read by
  the driver;
* ``*.parquet``;
* ``*.tar``: WebDataset shards, a record per sample key and a field per member extension
  (``readers.webdataset``);
* ``*.txt``: one sample per non-blank line; a directory of ``.txt`` files: one sample per file (files of
  no known format in it, e.g. a README, are ignored, as in any directory);
* a directory written by ``datasets``' ``save_to_disk``;
* ``hf:NAME[:CONFIG]``: ``datasets.load_dataset`` (offline from the local cache).
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch, UsedFields
from packtool.readers.compressed import input_format, is_compressed
from packtool.readers.jsonl import read_jsonl
from packtool.readers.parquet import read_parquet
from packtool.readers.text import read_text_dir, read_text_lines
from packtool.readers.webdataset import read_webdataset
from packtool.safepath import file_kind

__all__ = ["SourceBatch", "expand_inputs", "input_bytes", "piece_bytes", "read_inputs"]

_FILE_READERS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".txt": "text",
    ".tar": "webdataset",
}


def _is_hf_disk(path: Path) -> bool:
    return (path / "state.json").exists() or (path / "dataset_dict.json").exists()


def expand_inputs(inputs: list[str]) -> list[tuple[str, str, list[str]]]:
    """Resolve inputs to ``(kind, source, files)`` entries, in a deterministic order.

    Raises ``InputError`` for a path that does not exist or has no known format.
    """
    out: list[tuple[str, str, list[str]]] = []
    for spec in inputs:
        if spec.startswith("hf:"):
            out.append(("hf_hub", spec, []))
            continue
        # a file that exists is itself, even with glob characters in its name (data[1].jsonl)
        literal = not glob.has_magic(spec) or os.path.lexists(spec)
        matches = [spec] if literal else sorted(glob.glob(spec))
        if not matches:
            raise InputError("no file matches this pattern", source=spec)
        for m in matches:
            out.extend(_expand_path(Path(m)))
    return out


def _plain_name(path: Path) -> None:
    """``InputError`` when ``path``'s name is not UTF-8: the manifest, Arrow and JSON need one."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise InputError("file name is not valid UTF-8: rename it", source=shown) from None


def _expand_path(path: Path) -> list[tuple[str, str, list[str]]]:
    _plain_name(path)
    if not path.exists():
        if path.is_symlink():
            try:
                path.resolve(strict=True)
            except RuntimeError:  # Python 3.11 reports a loop this way
                raise InputError("a symbolic link that loops back on itself", source=str(path)) from None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise InputError("a symbolic link that loops back on itself", source=str(path)) from None
            raise InputError(f"a broken symbolic link (to {os.readlink(path)})", source=str(path))
        raise InputError("no such file or directory", source=str(path))
    if path.is_dir():
        if _is_hf_disk(path):
            return [("hf_disk", str(path), [])]
        entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
        for p in entries:  # a broken link among the inputs is named as one (not skipped, not an OSError)
            if _reader_of(p) and p.is_symlink() and not p.exists():
                _expand_path(p)
        files = [p for p in entries if p.is_file()]
        for p in files:
            _plain_name(p)
        known = [p for p in files if _reader_of(p)]
        if known and all(p.suffix == ".txt" for p in known):  # other files (README, notes) are ignored
            return [("text_dir", str(path), [str(p) for p in known])]
        if not known:
            raise InputError(
                "directory holds no file of a known format (.jsonl .json .parquet .txt .tar)",
                source=str(path),
            )
        return [(_reader_of(p), str(p), []) for p in known]
    if not _reader_of(path):
        suffix, codec = input_format(path)
        raise InputError(
            f"unknown input format '{path.suffix if codec is None else suffix + path.suffix}' (known: .jsonl "
            ".json .parquet .txt .tar, compressed .jsonl .json .txt (.gz .bz2 .zst .lz4), a save_to_disk "
            "directory, hf:NAME)",
            source=str(path),
        )
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):  # a FIFO would be read once and then block; a device never ends
        raise InputError(
            f"is {file_kind(mode)}, not a regular file: write it to a file first", source=str(path)
        )
    if not os.access(path, os.R_OK):
        raise InputError("file is not readable (permission denied)", source=str(path))
    return [(_reader_of(path), str(path), [])]


def _reader_of(path: Path) -> str | None:
    """The reader of a file by its suffixes, None if none: a compressed file's inner suffix decides
    (Parquet compresses its own pages: a compressed Parquet file is not read; a compressed tar has no
    member offsets to hand out)."""
    suffix, codec = input_format(path)
    kind = _FILE_READERS.get(suffix)
    return None if codec is not None and kind in ("parquet", "webdataset") else kind


def read_inputs(
    inputs: list[str],
    *,
    split: str = "train",
    text_field: str = "text",
    sink: ErrorSink | None = None,
    lazy: bool = False,
    used_fields: UsedFields = None,
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
    ``InputError`` under every policy.
    """
    sink = sink or ErrorSink()
    for kind, source, files in expand_inputs(inputs):
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


def input_bytes(inputs: list[str]) -> int | None:
    """Bytes of the inputs when each is read as line or file ranges whose bytes are known as they are
    handed out (plain JSON Lines, ``.txt`` files and directories of them), so a progress bar can show a
    total and an ETA from the start; ``None`` otherwise (Parquet counts rows from its footers instead;
    compressed files, JSON arrays and datasets have no such measure)."""
    total = 0
    for kind, source, files in expand_inputs(inputs):
        if kind not in ("jsonl", "text", "text_dir") or (kind != "text_dir" and is_compressed(source)):
            return None
        if kind == "jsonl":
            with open(source, "rb") as f:
                if f.read(64).lstrip().startswith(b"["):  # a JSON array: read whole, in one piece
                    return None
        total += sum(os.path.getsize(f) for f in files) if kind == "text_dir" else os.path.getsize(source)
    return total


def piece_bytes(piece) -> int:
    """Bytes of input a piece covers: a line range's span, a file range's sizes; 0 for records already
    read (the first ones of a JSON Lines file, read to learn its fields)."""
    starts = getattr(piece, "line_starts", None)
    if starts is not None:
        return int(starts[-1] - starts[0]) if len(starts) else 0
    files = getattr(piece, "files", None)
    if files is not None:
        return sum(os.path.getsize(f) for f in files)
    return 0
