"""Read packtool output back: ``load_manifest(DIR)`` and ``read_packs(DIR)``; and how the manifest's pack
statistics are defined (``total_stats``, ``samples_per_pack_stats``), for pack, verify and inspect alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.errors import PacktoolError
from packtool.utils import list_parts

PACK_FIELDS = ("input_ids", "labels", "position_ids", "seq_lens")


def load_manifest(directory: str | Path) -> dict:
    """The run's ``manifest.json``; raises ``PacktoolError`` if the directory is not packtool output."""
    path = Path(directory) / "manifest.json"
    if not path.exists():
        raise PacktoolError(f"{directory}: no manifest.json (not packtool output, or an unfinished run)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PacktoolError(f"{path}: not valid JSON ({e.msg})") from None


def total_stats(n: int, num_packs: int, num_tokens: int) -> dict[str, int | float]:
    """The manifest ``stats`` that follow from ``num_packs`` packs of ``n`` tokens holding ``num_tokens``
    real tokens (``build_manifest`` writes them, ``verify`` and ``inspect --full`` check them).

    >>> total_stats(4, 3, 10)["fill_rate"], total_stats(4, 3, 10)["packs_over_lower_bound"]
    (0.833333, 0)
    """
    lower_bound = -(-num_tokens // n)
    return {
        "num_packs": num_packs,
        "num_tokens": num_tokens,
        "padding_tokens": num_packs * n - num_tokens,
        "fill_rate": round(num_tokens / (num_packs * n), 6) if num_packs else 0.0,
        "lower_bound_packs": lower_bound,
        "packs_over_lower_bound": num_packs - lower_bound,
    }


def samples_per_pack_stats(num_packs: int, num_pieces: int, fewest: int, most: int) -> dict[str, int | float]:
    """``stats.samples_per_pack`` of ``num_packs`` packs holding ``num_pieces`` pieces (sample_index
    entries), ``fewest`` to ``most`` in one pack."""
    return {
        "mean": round(num_pieces / num_packs, 4) if num_packs else 0.0,
        "min": fewest if num_packs else 0,
        "max": most if num_packs else 0,
    }


def _column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table.column(name)
    # a row group read is one chunk: combine_chunks would copy it anyway
    return list_parts(col.chunk(0) if col.num_chunks == 1 else col.combine_chunks())


def table_arrays(table: pa.Table, n: int) -> dict[str, np.ndarray]:
    """The pack columns of a table (a row group) as NumPy views, without a loop over packs (see
    ``list_arrays``)."""
    names = [c for c in (*FIXED_COLUMNS, "seq_lens") if c in table.column_names]
    return list_arrays({name: _column(table, name) for name in names}, table.num_rows, n)


FIXED_COLUMNS = ("input_ids", "labels", "position_ids", "loss_mask")  # (N,) per pack


def list_arrays(lists: dict[str, tuple[np.ndarray, np.ndarray]], k: int, n: int) -> dict[str, np.ndarray]:
    """``k`` packs from their list columns, each ``(offsets (k + 1,) from 0, values)``, as NumPy views.

    Fixed-width columns (``FIXED_COLUMNS``, those present) come back as ``(k, N)`` arrays; ``seq_lens``
    as its flat values plus ``seq_lens_offsets`` ``(k + 1,)``. Raises ``ValueError`` if a fixed-width
    column does not hold exactly ``N`` values in every row.
    """
    out = {}
    for name in FIXED_COLUMNS:
        if name in lists:
            offsets, values = lists[name]
            if values.size != k * n:
                raise ValueError(f"column '{name}' holds {values.size} values, expected {k} x {n}")
            if not np.array_equal(offsets, np.arange(k + 1, dtype=np.int64) * n):
                raise ValueError(f"column '{name}' does not hold {n} values in every row")
            out[name] = values.reshape(k, n)
    out["seq_lens_offsets"], out["seq_lens"] = lists["seq_lens"]
    return out


def iter_row_group_packs(table: pa.Table, n: int, with_sample_index: bool = False) -> Iterator[dict]:
    """Packs of one Parquet table (row group) as dicts of NumPy arrays."""
    k = table.num_rows
    arrays = table_arrays(table, n)
    sl_off, sl = arrays.pop("seq_lens_offsets"), arrays.pop("seq_lens")
    fixed = arrays
    si = _column(table, "sample_index") if with_sample_index else None
    so = (
        _column(table, "sample_offset")
        if with_sample_index and "sample_offset" in table.column_names
        else None
    )
    for i in range(k):
        pack = {name: arr[i] for name, arr in fixed.items()}
        pack["seq_lens"] = sl[sl_off[i] : sl_off[i + 1]]
        if si is not None:
            pack["sample_index"] = si[1][si[0][i] : si[0][i + 1]]
        if so is not None:
            pack["sample_offset"] = so[1][so[0][i] : so[0][i + 1]]
        yield pack


def read_packs(directory: str | Path, *, with_sample_index: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Yield every pack of a packtool output directory, in shard order.

    Each pack is a dict of NumPy arrays in NeMo AutoModel ``PackedSequence`` layout:
    ``input_ids`` ``(N,)`` int32, ``labels`` ``(N,)`` int32, ``position_ids`` ``(N,)`` int32,
    ``seq_lens`` ``(num_samples_in_pack [+1 padding],)`` int32, and ``loss_mask`` ``(N,)`` int8 when the
    input had one. ``with_sample_index`` adds ``sample_index``, the input index of each sample, and
    ``sample_offset``, where each piece starts inside its sample.

    Example::

        >>> for pack in read_packs("out/"):  # doctest: +SKIP
        ...     assert pack["seq_lens"].sum() == len(pack["input_ids"])
    """
    directory = Path(directory)
    manifest = load_manifest(directory)
    n = manifest["packed_sequence_size"]
    fmt = manifest.get("shard_format", "parquet")
    for shard in manifest["shards"]:
        path = directory / shard["path"]
        count = 0
        try:
            for pack in _shard_packs(path, fmt, n, manifest.get("run_id"), with_sample_index):
                count += 1
                yield pack
        except (pa.ArrowException, OSError) as e:
            raise PacktoolError(f"{path}: cannot be read ({e}); run packtool verify") from None
        if count != shard["num_packs"]:  # a shard cut short where a pack ends reads without an error
            raise PacktoolError(
                f"{path}: {count} packs, the manifest says {shard['num_packs']}; run packtool verify"
            )


def _shard_packs(
    path: Path, fmt: str, n: int, run_id: str | None, with_sample_index: bool
) -> Iterator[dict[str, np.ndarray]]:
    if fmt != "parquet":
        from packtool.writers import read_shard_packs  # other formats register a reader there

        yield from read_shard_packs(fmt, path, n, with_sample_index)
        return
    pf = pq.ParquetFile(path)
    meta = json.loads((pf.schema_arrow.metadata or {}).get(b"packtool", b"{}"))
    if run_id is not None and meta.get("run_id") not in (None, run_id):
        raise PacktoolError(f"{path}: a shard of another run (run_id {meta.get('run_id')}, not {run_id})")
    for rg in range(pf.num_row_groups):
        yield from iter_row_group_packs(pf.read_row_group(rg), n, with_sample_index)
