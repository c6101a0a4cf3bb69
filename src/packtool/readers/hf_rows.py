"""Row ranges of a Hugging Face dataset's Arrow files, read by the process that encodes them.

``datasets`` keeps a dataset on disk as Arrow IPC stream files: the cache of ``load_dataset`` and the
``data-*.arrow`` files of ``save_to_disk``. When a dataset is exactly its files, in order (no indices
mapping, no slice, no in-memory table), ``packtool.readers.hf`` hands it out as ``HfRows``: a file, a
row range, and where that range starts in the dataset. A worker memory-maps the file (nothing is copied;
``datasets`` does the same) and slices its rows: the records never go through the driver, and this module
does not import ``datasets`` (slow to import), so a worker never pays for it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc

from packtool.errors import ErrorSink, InputError
from packtool.readers.base import SourceBatch

BATCH_ROWS = 8192


@dataclass
class HfRows:
    """Rows ``start .. start + num_rows - 1`` of the Arrow file ``path``, which are rows ``first_row ..``
    of the dataset ``source`` (a ``save_to_disk`` directory or ``hf:NAME``, as error messages name it).

    It stands for a ``SourceBatch`` until ``load()`` reads it; pickling it costs a few bytes and the
    schema, whatever the rows hold.
    """

    source: str
    path: str
    start: int
    num_rows: int
    first_row: int
    schema: pa.Schema
    row_kind: str = "row"
    row_bytes: float = 0.0  # the bytes a row of its file takes, on average

    def slice(self, offset: int, length: int) -> HfRows:
        length = min(length, self.num_rows - offset)
        return HfRows(
            self.source, self.path, self.start + offset, length, self.first_row + offset, self.schema,
            row_bytes=self.row_bytes,
        )  # fmt: skip

    def load(self, sink: ErrorSink | None = None) -> list[SourceBatch]:
        """The rows as ``SourceBatch`` objects (0-based rows of the dataset), memory-mapped."""
        table = arrow_file(self.path, self.source)
        if table.num_rows < self.start + self.num_rows or not table.schema.equals(self.schema):
            raise InputError(f"dataset changed while being read ({self.path})", source=self.source)
        out, row = [], self.first_row
        for b in table.slice(self.start, self.num_rows).to_batches(max_chunksize=BATCH_ROWS):
            if b.num_rows:
                out.append(SourceBatch(self.source, b, np.arange(row, row + b.num_rows, dtype=np.int64)))
                row += b.num_rows
        return out


def arrow_file(path: str, source: str) -> pa.Table:
    """The Arrow IPC stream file ``path`` as a memory-mapped table (opened once per process, again when
    its size or modification time changed: a worker may outlive a job, e.g. a Ray worker);
    ``InputError`` naming ``source`` if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}", source=source) from None
    stamp = (st.st_size, st.st_mtime_ns)
    cached = _OPEN.pop(path, None)
    if cached is None or cached[0] != stamp:
        try:
            cached = (stamp, pa.ipc.open_stream(pa.memory_map(path)).read_all())
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"not a readable Arrow file {path}: {e}", source=source) from None
    _OPEN[path] = cached  # most recently used last
    while len(_OPEN) > _MAX_OPEN:
        _OPEN.popitem(last=False)
    return cached[1]


_OPEN: OrderedDict[str, tuple[tuple[int, int], pa.Table]] = OrderedDict()  # per process
_MAX_OPEN = 8
