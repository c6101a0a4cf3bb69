"""Where a packed sample came from: its input file and row, found again from the manifest.

The manifest records how many samples each input gave (``InputEntry.num_samples``), so the input of
sample ``i`` is known at once; its row is found by reading that input again up to it (only that input,
and only up to the sample). Bad records the run skipped (``--on-error skip``) are left out as the run
left them out, using ``errors.jsonl``; when the run skipped more records than that log lists, the row
cannot be told and only the input and the sample's place among its samples are given.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from packtool.encoders.registry import fields_read
from packtool.errors import MAX_LOGGED, ErrorSink, PacktoolError
from packtool.manifest import ERRORS_LOG, Manifest
from packtool.options import PackOptions
from packtool.readers.inputs import read_inputs
from packtool.safepath import output_file_problem


def locate_samples(
    directory: str | Path, manifest: Manifest, samples: list[int], *, read_inputs: bool = False
) -> dict[int, dict]:
    """``{sample: {"source", "sample_in_source", "row_kind", "row"}}`` for input samples ``samples``
    (``row`` is ``None`` where it cannot be told). Samples a custom policy made (numbered past the input)
    and outputs of runs before inputs recorded their counts are left out.

    The input and the sample's place in it come from the manifest alone. ``row`` needs ``read_inputs``:
    the input files the manifest names are then read, outside ``directory`` (``inspect --pack --locate``,
    asked for by the user: an output read as untrusted opens nothing outside it)."""
    starts, first = [], 0
    for entry in manifest.inputs:
        if entry.num_samples is None:
            return {}
        starts.append(first)
        first += entry.num_samples
    skipped = _skipped_rows(Path(directory), manifest)
    out: dict[int, dict] = {}
    for k, entry in enumerate(manifest.inputs):
        lo, hi = starts[k], starts[k] + entry.num_samples
        wanted = sorted(s for s in set(samples) if lo <= s < hi)
        if not wanted:
            continue
        # the inputs the manifest names are read with packtool's readers only (no code), and only where
        # they are regular files or folders (a FIFO or a device would block or never end)
        paths = (entry.source, entry.path) if read_inputs else ()
        found = next((p for p in paths if p and _plain(p)), None)
        try:
            rows = _rows(found, manifest, [s - lo for s in wanted], skipped) if found else {}
        except PacktoolError:  # the input changed since the run: its rows cannot be told
            rows = {}
        for s in wanted:
            kind, row = rows.get(s - lo, (None, None))
            out[s] = {"source": entry.source, "sample_in_source": s - lo, "row_kind": kind, "row": row}
    return out


def _skipped_rows(directory: Path, manifest: Manifest) -> set[tuple[str, int]] | None:
    """The (source, row) of every record the run skipped, or ``None`` when the log does not list all."""
    if not manifest.stats.skipped_samples:
        return set()
    if manifest.stats.skipped_samples > MAX_LOGGED:
        return None
    if output_file_problem(directory, ERRORS_LOG) is not None:
        return None
    try:
        lines = (directory / ERRORS_LOG).read_text(errors="replace").splitlines()
        entries = [json.loads(line) for line in lines if line.strip()]
        return {(os.path.abspath(e["source"]), int(e["row"])) for e in entries}
    except (OSError, ValueError, TypeError, KeyError):  # a damaged log: the rows cannot be told
        return None


def _plain(path: str) -> bool:
    """``path`` is a regular file or a folder (``isfile`` follows a symlink; a FIFO is neither)."""
    return os.path.isfile(path) or os.path.isdir(path)


def _rows(
    path: str, manifest: Manifest, wanted: list[int], skipped: set[tuple[str, int]] | None
) -> dict[int, tuple[str, int]]:
    """``{k: (row_kind, row)}`` for the ``k``-th samples of the input at ``path`` (0-based)."""
    if skipped is None:
        return {}
    options = PackOptions.from_provenance(manifest.provenance)  # the run's, as it recorded them
    sink = ErrorSink("skip")  # records the run skipped are skipped here too, never raised
    found: dict[int, tuple[str, int]] = {}
    seen, todo = 0, sorted(wanted)
    used = fields_read(
        options.encoding, manifest.sample_format
    )  # the fields the run read, so the same records are bad
    batches = read_inputs(
        [path],
        split=options.reading.split,
        text_field=options.encoding.text_field,
        sink=sink,
        used_fields=used,
        files=options.reading.files,  # files listed and read as the run did
    )
    for batch in batches:
        src = os.path.abspath(batch.source)
        rows = [int(r) for r in batch.rows if (src, int(r)) not in skipped]
        while todo and todo[0] < seen + len(rows):
            found[todo[0]] = (batch.row_kind, rows[todo[0] - seen])
            todo.pop(0)
        seen += len(rows)
        if not todo:
            break
    return found
