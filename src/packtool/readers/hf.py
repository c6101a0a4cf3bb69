"""Hugging Face datasets -> ``SourceBatch`` stream.

Two sources: a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, and
``hf:NAME[:CONFIG]``, loaded with ``datasets.load_dataset`` offline, from the local cache (no request is
made, whatever ``HF_HUB_OFFLINE`` says).
Both are read as Arrow, batch by batch, without converting rows to Python objects. This module imports
``datasets``, which is slow to import: ``packtool.readers`` imports it only for these inputs.

**Lazy.** With ``lazy=True`` (what ``packtool pack`` uses) the driver only loads the dataset (memory-mapped,
no record read) and, when it is exactly its Arrow files in order, yields ``HfRows`` row ranges that the
workers read from those files themselves (``packtool.readers.hf_rows``). A dataset that is not (an indices
mapping, a sliced split such as ``train[:10%]``, a table in memory) is read here, as without ``lazy``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import datasets
import datasets.config
import huggingface_hub.constants
import numpy as np

from packtool.errors import InputError
from packtool.readers.base import SourceBatch
from packtool.readers.hf_rows import HfRows, arrow_file
from packtool.storage.urls import is_url, options_for, scheme


def _pick_split(ds, split: str, source: str):
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise InputError(f"no split '{split}' (has: {', '.join(ds.keys())}); pass --split", source=source)
        return ds[split]
    return ds


def _iter_dataset(ds, source: str, batch_rows: int, lazy: bool = False) -> Iterator[SourceBatch | HfRows]:
    files = _arrow_files(ds, source) if lazy else None
    if files is not None:
        row = 0
        for path, num_rows, nbytes in files:
            for start in range(0, num_rows, batch_rows):
                n = min(batch_rows, num_rows - start)
                yield HfRows(source, path, start, n, row + start, ds.data.schema, row_bytes=nbytes / num_rows)
            row += num_rows
        return
    table = ds.data.table if hasattr(ds, "data") else None
    if ds._indices is not None or table is None:  # a filtered/shuffled view: let datasets resolve it
        row = 0
        for t in ds.with_format("arrow").iter(batch_size=batch_rows):
            for batch in t.to_batches():
                yield SourceBatch(source, batch, np.arange(row, row + batch.num_rows, dtype=np.int64), "row")
                row += batch.num_rows
        return
    row = 0
    for batch in table.to_batches(max_chunksize=batch_rows):
        yield SourceBatch(source, batch, np.arange(row, row + batch.num_rows, dtype=np.int64), "row")
        row += batch.num_rows


def _arrow_files(ds, source: str) -> list[tuple[str, int, int]] | None:
    """The dataset's Arrow files, their row counts and bytes, when the dataset is exactly those files' rows in
    order: no indices mapping, each file once and of the dataset's schema, their rows adding up to the
    dataset's (so no file is sliced: a split such as ``train[:10%]`` is not). Else ``None``: the driver
    reads the dataset."""
    if getattr(ds, "_indices", None) is not None:
        return None
    paths = [f["filename"] for f in ds.cache_files]
    if not paths or len(set(paths)) != len(paths):
        return None
    files = []
    for path in paths:
        try:
            table = arrow_file(path, source)
        except InputError:
            return None
        if not table.schema.equals(ds.data.schema):
            return None
        files.append((path, table.num_rows, table.nbytes))
    if sum(n for _, n, _ in files) != ds.num_rows:
        return None
    return files


def read_hf_disk(
    path: str, split: str = "train", batch_rows: int = 8192, lazy: bool = False
) -> Iterator[SourceBatch | HfRows]:
    """A dataset saved with ``save_to_disk`` (memory-mapped Arrow; nothing is copied into Python)."""
    try:  # one in a store: datasets copies it to a local temporary folder first, with the run's options
        options = options_for(scheme(path)) if is_url(path) else None
        ds = datasets.load_from_disk(path, storage_options=options)
    except Exception as e:  # datasets raises several types for a bad directory
        raise InputError(f"not a readable saved Hugging Face dataset: {e}", source=path) from None
    yield from _iter_dataset(_pick_split(ds, split, path), path, batch_rows, lazy)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Hugging Face's offline mode for the calls inside (no request is made: the dataset comes from the
    local cache or is an error at once, not after retries), restored afterwards. ``datasets`` and
    ``huggingface_hub`` read ``HF_HUB_OFFLINE`` once, at import, into module constants: those are set
    (the variables too, for what is imported inside), whenever the modules were imported."""
    saved_env = {k: os.environ.get(k) for k in _OFFLINE_VARS}
    modules = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE")]
    modules.append((huggingface_hub.constants, "HF_HUB_OFFLINE"))
    saved = [(m, k, getattr(m, k)) for m, k in modules if hasattr(m, k)]
    os.environ.update(dict.fromkeys(_OFFLINE_VARS, "1"))
    for m, k, _ in saved:
        setattr(m, k, True)
    try:
        yield
    finally:
        for m, k, v in saved:
            setattr(m, k, v)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def read_hf_hub(
    spec: str, split: str = "train", batch_rows: int = 8192, lazy: bool = False
) -> Iterator[SourceBatch | HfRows]:
    """``hf:NAME[:CONFIG]`` through ``datasets.load_dataset``, offline: from the local cache only."""
    name, _, config = spec[len("hf:") :].partition(":")
    try:
        with _offline():
            ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as e:
        raise InputError(
            f"could not load Hugging Face dataset from the local cache (read offline): "
            f"{str(e).splitlines()[0]}",
            source=spec,
        ) from None
    yield from _iter_dataset(ds, spec, batch_rows, lazy)
