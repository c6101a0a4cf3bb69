"""``packtool verify``: prove that an output directory is whole, and (``--source``) that nothing was lost.

Three layers of checks, each problem reported with its shard, pack and field:

* **files**: the manifest parses and is packtool's; every shard it names exists with the recorded size
  and sha256; no shard file (of any format) lies in the directory that the manifest does not name.
* **format** (one ``ShardFormat`` per shard format, so a new format adds one entry to ``SHARD_FORMATS``):
  the shard parses, carries this manifest's ``run_id`` (a manifest from another run is caught here),
  holds the recorded number of packs, and its index agrees with it (Parquet: the recorded
  ``row_groups``; tar: the ``.tar.idx`` offsets, and each pack's members, ``.npy`` dtypes and shapes and
  ``.json``). ``check_index`` compares the dataset-level index files (tar: ``wids.json``, ``.nv-meta/``)
  with the manifest. The format then hands its packs over as ``PackArrays`` batches.
* **packs** (format-independent, vectorized per batch): every fixed-width column has ``N`` values,
  ``sum(seq_lens) == N``, ``seq_lens`` and ``sample_index`` agree, padding carries ``pad_token_id`` and
  labels ``-100``, labels are aligned with ``input_ids`` (text input), token ids lie inside the
  tokenizer's vocabulary, per-shard token counts match the manifest. The manifest's totals (``stats``:
  packs, tokens, padding, fill rate, lower bound, ``samples_per_pack``) must be those of its shards, by
  the definitions ``packtool pack`` writes them with (``reading.total_stats``).

With ``--source``, the inputs are read and encoded again by the pipeline's own reader and encoder under
the manifest's ``config``, and every piece in the packs is compared token by token (``input_ids``,
``labels``, ``loss_mask``) with the source sample named by its ``sample_index``. Pieces of a sample are
reassembled in the order they appear; a sample whose tokens appear twice overruns its length and is
reported. Every sample with no tokens in the packs must be one the manifest counts (empty, dropped,
over ``max_packs``), every sample packed short must be truncated or cut at ``max_packs``, and the counts
must equal the manifest's ``stats``.

Example::

    >>> report = verify_output("out/demo")  # doctest: +SKIP
    >>> report.ok, report.problems[:1]  # doctest: +SKIP
    (True, [])
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from packtool.encoders.base import IGNORE_INDEX
from packtool.reading import FIXED_COLUMNS, load_manifest, samples_per_pack_stats, total_stats
from packtool.utils import file_sha256
from packtool.writers.chunks import ChunkStore, ranges
from packtool.writers.output import MANIFEST
from packtool.writers.packs import PackArrays, pack_position_ids

# problems of one kind listed in full up to this many; the rest are counted
MAX_LISTED = 10


@dataclass
class Problem:
    """One finding: where (``shard``, global ``pack`` index, ``field``) and what."""

    message: str
    shard: str | None = None
    pack: int | None = None
    field: str | None = None
    kind: str = "other"

    def __str__(self) -> str:
        where = [w for w in (self.shard, None if self.pack is None else f"pack {self.pack}") if w]
        if self.field:
            where.append(f"field '{self.field}'")
        return f"{', '.join(where)}: {self.message}" if where else self.message

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "shard": self.shard,
            "pack": self.pack,
            "field": self.field,
            "message": self.message,
        }


@dataclass
class VerifyReport:
    """What ``verify_output`` found. ``ok`` is True when no problem was found."""

    directory: str
    problems: list[Problem] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # problems per kind, listed or not
    checked: dict = field(default_factory=dict)  # figures of what was checked (packs, tokens, ...)

    @property
    def ok(self) -> bool:
        return not self.counts

    def add(
        self,
        kind: str,
        message: str,
        *,
        shard: str | None = None,
        pack: int | None = None,
        field: str | None = None,
    ) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_LISTED:
            self.problems.append(Problem(message, shard, pack, field, kind))

    def add_many(
        self,
        kind: str,
        count: int,
        problems: Iterable[tuple[str, int | None]],
        *,
        shard: str | None = None,
        field: str | None = None,
    ) -> None:
        """``count`` problems of one kind, every one counted: ``problems`` yields ``(message, pack)`` of
        each, and only those listed (while the kind has room) are taken from it, so a lazy iterator
        builds no message for the others."""
        listed = min(count, max(0, MAX_LISTED - self.counts[kind]))
        for message, pack in itertools.islice(problems, listed):
            self.add(kind, message, shard=shard, pack=pack, field=field)
        if count > listed:
            self.counts[kind] += count - listed

    def lines(self) -> list[str]:
        """The human report: one line per listed problem, then what was left unlisted, then a verdict."""
        out = [f"problem: {p}" for p in self.problems]
        for kind, n in self.counts.items():
            if n > MAX_LISTED:
                out.append(f"... and {n - MAX_LISTED} more problem(s) of kind '{kind}'")
        c = self.checked
        what = ", ".join(f"{k}: {v:,}" for k, v in c.items() if isinstance(v, int))
        if self.ok:
            out.append(f"OK: {self.directory} ({what})")
        else:
            total = sum(self.counts.values())
            out.append(f"FAILED: {self.directory}: {total:,} problem(s) ({what} checked)")
        return out

    def to_dict(self) -> dict:
        return {
            "directory": self.directory,
            "ok": self.ok,
            "problem_counts": dict(self.counts),
            "problems": [p.to_dict() for p in self.problems],
            "checked": self.checked,
        }


# --- formats ------------------------------------------------------------------------------------------
ShardOpener = Callable[[Path, dict, dict, VerifyReport, int, int], Iterator[tuple[int, PackArrays]]]


@dataclass(frozen=True)
class ShardFormat:
    """How ``verify`` (and ``inspect``) reads one shard format.

    Attributes:
        shard_glob: pattern of this format's shard files in an output directory (to find shards the
            manifest does not name).
        index_files: ``entry -> [file names]``: index files that belong to a manifest shard entry.
        open: ``(path, entry, manifest, report, shard_index, base) -> iterator of (first pack in shard,
            PackArrays)``, ``base`` being the global index of the shard's first pack (problems name
            packs by global index); checks what is specific to the format (parsing, run_id, pack
            count, the shard's own index), reports problems on ``report`` and yields the packs it could
            read.
        summary: ``path -> dict``: cheap figures from the shard's own metadata (``inspect``'s fast path);
            keys ``run_id``, ``shard`` or any key of the manifest's shard entry.
        check_index: ``(directory, manifest, report)``: checks the dataset-level index files (those not
            tied to one shard) against the manifest.
    """

    shard_glob: str
    index_files: Callable[[dict], list[str]]
    open: ShardOpener
    summary: Callable[[Path], dict] | None = None
    check_index: Callable[[Path, dict, VerifyReport], None] | None = None


def _shard_meta_problems(
    meta: dict | None, entry: dict, manifest: dict, index: int, report: VerifyReport, name: str
) -> None:
    """Compare a shard's own ``packtool`` metadata with the manifest (any format)."""
    if meta is None:
        report.add("run_id", "shard carries no packtool metadata (not written by packtool?)", shard=name)
        return
    if meta.get("run_id") != manifest.get("run_id"):
        report.add(
            "run_id",
            f"shard belongs to run {meta.get('run_id')}, the manifest to run {manifest.get('run_id')} "
            "(a manifest or shard from another run)",
            shard=name,
            field="run_id",
        )
    if meta.get("shard") is not None and meta.get("shard") != index:
        report.add(
            "shard",
            f"shard metadata says shard {meta.get('shard')}, manifest lists it as {index}",
            shard=name,
            field="shard",
        )
    if meta.get("packed_sequence_size") not in (None, manifest["packed_sequence_size"]):
        report.add(
            "packed_sequence_size",
            f"shard has packed_sequence_size {meta.get('packed_sequence_size')}, manifest "
            f"{manifest['packed_sequence_size']}",
            shard=name,
            field="packed_sequence_size",
        )


def _fixed(
    offsets: np.ndarray, values: np.ndarray, n: int, first: int, name: str, col: str, report: VerifyReport
) -> np.ndarray | None:
    """A list column whose every row must hold ``n`` values, as ``(rows, n)``; None (reported) if not."""
    lens = np.diff(offsets)
    bad = np.flatnonzero(lens != n)
    problems = ((f"has {lens[i]} values, expected packed_sequence_size {n}", first + int(i)) for i in bad)
    report.add_many("length", len(bad), problems, shard=name, field=col)
    if len(bad):
        return None
    return values[offsets[0] : offsets[-1]].reshape(len(lens), n)


def _list_column(table, col: str) -> tuple[np.ndarray, np.ndarray]:
    arr = table.column(col).combine_chunks()
    return arr.offsets.to_numpy().astype(np.int64), arr.values.to_numpy(zero_copy_only=False)


def _parquet_open(
    path: Path, entry: dict, manifest: dict, report: VerifyReport, index: int = 0, base: int = 0
) -> Iterator[tuple[int, PackArrays]]:
    name = entry["path"]
    n = manifest["packed_sequence_size"]
    try:
        pf = pq.ParquetFile(path)
        md = pf.metadata
    except Exception as e:  # any parse failure of a damaged file
        report.add("parse", f"does not parse as Parquet: {str(e).splitlines()[0]}", shard=name)
        return
    raw = (pf.schema_arrow.metadata or {}).get(b"packtool")
    try:
        meta = json.loads(raw) if raw else None
    except ValueError:
        meta = None
    _shard_meta_problems(meta, entry, manifest, index, report, name)
    if md.num_rows != entry.get("num_packs"):
        report.add(
            "num_packs",
            f"holds {md.num_rows} packs, manifest says {entry.get('num_packs')}",
            shard=name,
            field="num_packs",
        )
    groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    if "row_groups" in entry and groups != entry["row_groups"]:
        report.add(
            "index",
            f"row groups {groups} differ from the manifest's index {entry['row_groups']} (stale index)",
            shard=name,
            field="row_groups",
        )
    need = [c for c in manifest.get("columns", []) if c not in pf.schema_arrow.names]
    if need:
        report.add("columns", f"missing column(s) {', '.join(need)}", shard=name)
        return
    first = 0
    for rg, rows in enumerate(groups):
        try:
            table = pf.read_row_group(rg)
        except Exception as e:
            report.add(
                "parse",
                f"row group {rg} does not parse: {str(e).splitlines()[0]}",
                shard=name,
                pack=base + first,
            )
            first += rows
            continue
        fixed = {}
        for col in ("input_ids", "labels", "position_ids", "loss_mask"):
            if col in table.column_names:
                fixed[col] = _fixed(*_list_column(table, col), n, base + first, name, col, report)
        if any(v is None for v in fixed.values()):
            first += rows
            continue
        sl_off, sl = _list_column(table, "seq_lens")
        si_off, si = _list_column(table, "sample_index")
        so = _list_column(table, "sample_offset")[1] if "sample_offset" in table.column_names else None
        yield (
            first,
            PackArrays(
                input_ids=fixed["input_ids"],
                labels=fixed["labels"],
                position_ids=fixed["position_ids"],
                loss_mask=fixed.get("loss_mask"),
                seq_lens=sl[sl_off[0] : sl_off[-1]],
                seq_lens_offsets=sl_off - sl_off[0],
                sample_index=si[si_off[0] : si_off[-1]],
                sample_index_offsets=si_off - si_off[0],
                # where each piece starts in its sample (bfd shuffles packs, so pack order does not say)
                sample_offset=None if so is None else so[si_off[0] : si_off[-1]],
            ),
        )
        first += rows


def _parquet_summary(path: Path) -> dict:
    """Packs, row groups, run_id and shard number from the Parquet footer alone (no page is read)."""
    pf = pq.ParquetFile(path)
    md = pf.metadata
    raw = (pf.schema_arrow.metadata or {}).get(b"packtool")
    meta = json.loads(raw) if raw else {}
    return {
        "run_id": meta.get("run_id"),
        "shard": meta.get("shard"),
        "num_packs": md.num_rows,
        "row_groups": [md.row_group(i).num_rows for i in range(md.num_row_groups)],
    }


# --- webdataset (tar) ---------------------------------------------------------------------------------
TAR_BATCH_TOKENS = 1 << 22  # a tar shard is handed to the checks in batches of about this many tokens


@dataclass
class _TarBatch:
    """Packs of a tar shard gathered for one ``PackArrays`` batch (fixed columns preallocated)."""

    first: int  # index in the shard of the first pack
    fixed: dict[str, np.ndarray]  # column -> (capacity, N)
    ragged: dict[str, list[np.ndarray]] = field(default_factory=dict)
    k: int = 0

    @classmethod
    def new(cls, first: int, capacity: int, n: int, columns: list[str]) -> _TarBatch:
        from packtool.writers.webdataset import NPY_MEMBERS

        fixed = {c: np.empty((capacity, n), NPY_MEMBERS[c]) for c in _FIXED if c in columns}
        return cls(first, fixed, {c: [] for c in _RAGGED})

    def arrays(self) -> PackArrays:
        k = self.k

        def csr(col: str) -> tuple[np.ndarray, np.ndarray]:
            parts = self.ragged[col]
            offsets = np.zeros(k + 1, dtype=np.int64)
            np.cumsum([len(p) for p in parts], out=offsets[1:])
            dtype = np.int32 if col == "seq_lens" else np.int64
            return (np.concatenate(parts) if parts else np.zeros(0, dtype)), offsets

        seq_lens, sl_off = csr("seq_lens")
        sample_index, si_off = csr("sample_index")
        return PackArrays(
            input_ids=self.fixed["input_ids"][:k],
            labels=self.fixed["labels"][:k],
            position_ids=self.fixed["position_ids"][:k],
            loss_mask=self.fixed["loss_mask"][:k] if "loss_mask" in self.fixed else None,
            seq_lens=seq_lens,
            seq_lens_offsets=sl_off,
            sample_index=sample_index,
            sample_index_offsets=si_off,
            # None for an output whose manifest has no sample_offset column (as for Parquet)
            sample_offset=np.concatenate(self.ragged["sample_offset"])
            if self.ragged["sample_offset"]
            else None,
        )


_FIXED = FIXED_COLUMNS
_RAGGED = ("seq_lens", "sample_index", "sample_offset")


def _tar_pack_arrays(
    path: Path, buf, key: str, members: dict, columns: list[str], n: int, problem: Callable
) -> dict[str, np.ndarray] | None:
    """The ``.npy`` members of one pack as arrays (copies), or None (reported) if one is unusable."""
    from packtool.errors import PacktoolError
    from packtool.writers.webdataset import NPY_MEMBERS, npy_view

    arrays: dict[str, np.ndarray] = {}
    for col in columns:
        offset, nbytes = members[f"{col}.npy"]
        try:
            arr = npy_view(path, f"{key}.{col}.npy", buf, offset, nbytes)
        except PacktoolError as e:
            problem("npy", str(e).removeprefix(f"{path}: "), col)
            continue
        want = np.dtype(NPY_MEMBERS[col])
        if arr.dtype != want or arr.ndim != 1:
            problem("npy", f"{arr.dtype} array of shape {arr.shape}, expected a 1-D {want} array", col)
        elif col in _FIXED and len(arr) != n:
            problem("length", f"has {len(arr)} values, expected packed_sequence_size {n}", col)
        else:
            arrays[col] = arr.copy()  # the mmap closes after the walk: no view may outlive it
        del arr
    return arrays if len(arrays) == len(columns) else None


def _tar_pack_json(buf, key: str, members: dict, problem: Callable) -> dict | None:
    """The ``.json`` member of one pack, or None (reported) if it does not parse as an object."""
    offset, nbytes = members["json"]
    try:
        meta = json.loads(bytes(buf[offset : offset + nbytes]))
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        problem("json", f"member {key}.json is not a JSON object", "json")
        return None
    return meta


def _tar_open(
    path: Path, entry: dict, manifest: dict, report: VerifyReport, index: int = 0, base: int = 0
) -> Iterator[tuple[int, PackArrays]]:
    """Parse a tar shard member by member; check each pack's members, ``.npy`` headers (dtype, shape)
    and ``.json`` (pack index, run_id, shard, counts), the shard's pack count and its ``.tar.idx``;
    yield the packs that could be read, in batches of consecutive packs."""
    import mmap
    import os

    from packtool.errors import PacktoolError
    from packtool.writers.webdataset import (
        BLOCK,
        NPY_MEMBERS,
        RECORD,
        pack_key,
        tar_pack_groups,
    )

    name = entry["path"]
    n = manifest["packed_sequence_size"]
    columns = [c for c in manifest.get("columns", []) if c in NPY_MEMBERS]
    want = {f"{c}.npy" for c in columns} | {"json"}
    old = manifest.get("format_version", 1) < 2  # no run_id in .json; verify_output says so once
    capacity = max(1, TAR_BATCH_TOKENS // n)
    starts: list[int] = []  # header offset of every pack, then the end of the last one
    shard_meta: dict | None = None  # the .json of the shard's first pack: its run_id and shard
    batch = _TarBatch.new(0, capacity, n, columns)
    local = 0  # index in the shard of the pack being read

    def problem(kind: str, message: str, col: str | None = None) -> None:
        report.add(kind, message, shard=name, pack=base + local, field=col)

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            report.add("parse", "empty file, not a tar archive", shard=name)
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            groups = tar_pack_groups(path, buf, complete=want)
            end = 0
            while True:
                try:
                    key, start, members, end = next(groups)
                except StopIteration:
                    break
                except PacktoolError as e:
                    problem("parse", f"does not parse as tar: {str(e).removeprefix(f'{path}: ')}")
                    starts = []  # no pack count or index to compare: the parse problem says it all
                    break
                starts.append(start)
                missing, extra = sorted(want - members.keys()), sorted(members.keys() - want)
                if extra:
                    problem("members", f"unexpected member(s) {', '.join(f'{key}.{x}' for x in extra)}")
                if missing:
                    problem("members", f"missing member(s) {', '.join(f'{key}.{x}' for x in missing)}")
                arrays = None if missing else _tar_pack_arrays(path, buf, key, members, columns, n, problem)
                meta = _tar_pack_json(buf, key, members, problem) if "json" in members else None
                if meta is not None and shard_meta is None:
                    shard_meta = meta
                    if "run_id" in meta:
                        _shard_meta_problems(meta, entry, manifest, index, report, name)
                    elif not old:
                        problem("run_id", "the pack's .json carries no run_id", "run_id")
                # a shard of another run is reported once, above, not as every pack's misplaced number
                ours = shard_meta is None or shard_meta.get("run_id") in (None, manifest.get("run_id"))
                if ours and key != pack_key(base + local):
                    problem("key", f"members are named {key}.*, expected {pack_key(base + local)}.*")
                if meta is not None:
                    expect = {
                        "pack_index": base + local if ours else None,
                        "run_id": shard_meta.get("run_id"),
                        "shard": shard_meta.get("shard"),
                    }
                    if arrays is not None:
                        expect["num_samples"] = len(arrays["sample_index"])
                        expect["num_tokens"] = int(arrays["seq_lens"][: expect["num_samples"]].sum())
                    for k, v in expect.items():
                        if v is not None and meta.get(k) != v:
                            problem("json", f"{key}.json says {k} {meta.get(k)}, expected {v}", k)
                if arrays is not None:
                    for col, arr in arrays.items():
                        if col in _FIXED:
                            batch.fixed[col][batch.k] = arr
                        else:
                            batch.ragged[col].append(arr)
                    batch.k += 1
                local += 1
                if arrays is None or batch.k == capacity:  # a batch holds consecutive packs: cut here
                    if batch.k:
                        yield batch.first, batch.arrays()
                    batch = _TarBatch.new(local, capacity, n, columns)
            if batch.k:
                yield batch.first, batch.arrays()
            if starts:
                # two zero blocks, then zeros up to the tar record size (a whole record at most)
                tail = bytes(buf[end : end + RECORD + 2 * BLOCK + 1])
                if len(tail) < 2 * BLOCK or len(tail) > RECORD + 2 * BLOCK or tail.count(0) != len(tail):
                    report.add(
                        "parse",
                        "the archive does not end with zero blocks after its last member (truncated, "
                        "or data appended?)",
                        shard=name,
                    )
    if starts and local != entry.get("num_packs"):
        report.add(
            "num_packs",
            f"holds {local} packs, manifest says {entry.get('num_packs')}",
            shard=name,
            field="num_packs",
        )
    if starts:
        idx = path.parent / _tar_index_name(entry)
        _check_tar_idx(idx, [*starts, end], base, report, name)


def _tar_index_name(entry: dict) -> str:
    """The ``.tar.idx`` file of a manifest shard entry (its ``index`` key; older manifests have none)."""
    from packtool.writers.webdataset import INDEX_SUFFIX

    return entry.get("index", entry["path"] + INDEX_SUFFIX)


def _check_tar_idx(idx: Path, real: list[int], base: int, report: VerifyReport, name: str) -> None:
    """``packs-NNNNNN.tar.idx`` must hold the offsets ``real`` found by parsing the tar."""
    if not idx.exists():
        report.add("index", f"index file {idx.name} is missing", shard=name, field="index")
        return
    raw = idx.read_bytes()
    offsets = np.frombuffer(raw[: len(raw) // 8 * 8], dtype="<u8").astype(np.int64)
    real_arr = np.asarray(real, dtype=np.int64)
    if len(raw) % 8 or len(offsets) != len(real_arr):
        report.add(
            "index",
            f"{idx.name} holds {len(raw) / 8:g} offsets, the tar has {len(real_arr) - 1} packs + 1 "
            "(stale index)",
            shard=name,
            field="index",
        )
        return
    diff = np.flatnonzero(offsets != real_arr)
    if len(diff):
        i = int(diff[0])
        what = f"pack {base + i}" if i < len(real_arr) - 1 else "the end"
        report.add(
            "index",
            f"{idx.name} puts {what} at byte {offsets[i]}, the tar at byte {real_arr[i]} "
            f"({len(diff)} offset(s) differ: stale index)",
            shard=name,
            pack=base + i if i < len(real_arr) - 1 else None,
            field="index",
        )


def _tar_pack_meta(path: Path, buf, start: int, end: int) -> dict:
    """The ``.json`` member of the pack at ``buf[start:end]`` (offsets from the ``.tar.idx``)."""
    from packtool.errors import PacktoolError
    from packtool.writers.webdataset import _tar_members

    chunk = bytes(buf[start:end])  # one pack: a few times N bytes
    for member, offset, size in _tar_members(path, chunk):
        if member.endswith(".json"):
            return json.loads(chunk[offset : offset + size])
    raise PacktoolError(f"{path}: no .json member between bytes {start} and {end}")


def _tar_summary(path: Path) -> dict:
    """run_id, shard number, first pack and pack count of a tar shard from its ``.tar.idx`` and the
    ``.json`` of its first and last packs (two small reads, whatever the shard's size)."""
    import mmap

    from packtool.errors import PacktoolError
    from packtool.writers.webdataset import BLOCK, INDEX_SUFFIX, RECORD, read_tar_index

    offsets = read_tar_index(path).astype(np.int64)
    size = path.stat().st_size
    if len(offsets) < 2 or size != -(-(int(offsets[-1]) + 2 * BLOCK) // RECORD) * RECORD:
        raise PacktoolError(
            f"{path.name}{INDEX_SUFFIX} does not end where the tar's {size:,} bytes do (stale index?)"
        )
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        first = _tar_pack_meta(path, buf, int(offsets[0]), int(offsets[1]))
        last = _tar_pack_meta(path, buf, int(offsets[-2]), int(offsets[-1]))
    # a shard written before format_version 2 has no run_id or shard to compare (verify says so)
    return {
        **{key: first[key] for key in ("run_id", "shard") if key in first},
        "first_pack": first.get("pack_index"),
        "num_packs": last["pack_index"] - first["pack_index"] + 1,
    }


def _diff(want, got, where: str = "") -> Iterator[tuple[str, object, object]]:
    """``(field path, wanted, found)`` for every leaf where ``got`` differs from ``want``."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in [*want, *(k for k in got if k not in want)]:
            yield from _diff(want.get(k), got.get(k), f"{where}.{k}" if where else str(k))
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            yield from _diff(a, b, f"{where}[{i}]")
    elif want != got:
        yield where, want, got


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tar_check_index(directory: Path, manifest: dict, report: VerifyReport) -> None:
    """``wids.json`` and ``.nv-meta/`` must say what the manifest says; no stray ``.tar.idx``."""
    import yaml

    from packtool.writers.webdataset import INDEX_SUFFIX, dataset_index_contents

    for name, want in dataset_index_contents(manifest).items():
        path = directory / name
        if not path.exists():
            report.add("dataset index", "index file is missing", shard=name)
            continue
        try:
            got = json.loads(path.read_text()) if name.endswith(".json") else yaml.safe_load(path.read_text())
        except (ValueError, yaml.YAMLError) as e:
            report.add("dataset index", f"does not parse ({str(e).splitlines()[0]})", shard=name)
            continue
        diffs = list(_diff(want, got))
        if diffs:  # one problem per file: its first difference, and how many more
            where, a, b = diffs[0]
            more = f"; {len(diffs) - 1} more field(s) differ" if len(diffs) > 1 else ""
            report.add(
                "dataset index",
                f"{_short(b)} in the file, the manifest gives {_short(a)} (stale index{more})",
                shard=name,
                field=where or None,
            )
    named = {_tar_index_name(e) for e in manifest["shards"]}
    for path in sorted(directory.glob("*.tar" + INDEX_SUFFIX)):
        if path.name not in named:
            report.add("unlisted", "index file of a shard the manifest does not name", shard=path.name)


SHARD_FORMATS: dict[str, ShardFormat] = {
    "parquet": ShardFormat("*.parquet", lambda entry: [], _parquet_open, _parquet_summary),
    "webdataset": ShardFormat(
        "*.tar",
        lambda entry: [_tar_index_name(entry)],
        _tar_open,
        _tar_summary,
        _tar_check_index,
    ),
}


def shard_format(manifest: dict) -> ShardFormat:
    from packtool.errors import PacktoolError

    fmt = manifest.get("shard_format", "parquet")
    if fmt not in SHARD_FORMATS:
        raise PacktoolError(
            f"shard format {fmt!r} is not known to this packtool (known: {', '.join(SHARD_FORMATS)})"
        )
    return SHARD_FORMATS[fmt]


def iter_batches(
    directory: str | Path, manifest: dict, report: VerifyReport
) -> Iterator[tuple[int, dict, int, PackArrays]]:
    """Every readable batch of packs: ``(shard index, shard entry, global index of first pack, packs)``."""
    fmt = shard_format(manifest)
    base = 0
    for i, entry in enumerate(manifest["shards"]):
        path = Path(directory) / entry["path"]
        if path.exists():
            for first, packs in fmt.open(path, entry, manifest, report, i, base):
                yield i, entry, base + first, packs
        base += int(entry.get("num_packs", 0))


# --- checks -------------------------------------------------------------------------------------------
def _check_files(directory: Path, manifest: dict, report: VerifyReport, fmt: ShardFormat) -> None:
    named = set()
    for entry in manifest["shards"]:
        name = entry["path"]
        named.add(name)
        named.update(fmt.index_files(entry))
        path = directory / name
        if not path.exists():
            report.add("missing", "shard named in the manifest is missing", shard=name)
            continue
        size = path.stat().st_size
        if size != entry.get("bytes"):
            how = "truncated" if size < entry.get("bytes", 0) else "grown"
            report.add(
                "size",
                f"{size:,} bytes, manifest says {entry.get('bytes'):,} ({how})",
                shard=name,
                field="bytes",
            )
        if file_sha256(path) != entry.get("sha256"):
            report.add(
                "sha256",
                "sha256 differs from the manifest's (the file was changed)",
                shard=name,
                field="sha256",
            )
    # a shard of any format: one of another format left beside the output's own is stray too
    strays = {path for other in SHARD_FORMATS.values() for path in directory.glob(other.shard_glob)}
    for path in sorted(strays):
        if path.name not in named:
            report.add(
                "unlisted", "shard file is not in the manifest (left from another run?)", shard=path.name
            )


def _check_packs(
    packs: PackArrays,
    first: int,
    name: str,
    manifest: dict,
    report: VerifyReport,
    vocab_size: int | None,
    text_labels: bool,
) -> np.ndarray:
    """Format-independent checks of a batch of packs; returns ``(k,)`` real tokens per pack."""
    k, n = packs.input_ids.shape
    pad_id = manifest.get("pad_token_id", 0)
    sl, slo = packs.seq_lens.astype(np.int64), packs.seq_lens_offsets
    npieces = np.diff(packs.sample_index_offsets)
    nsl = np.diff(slo)
    csl = np.concatenate([[0], np.cumsum(sl)])
    sums = csl[slo[1:]] - csl[slo[:-1]]
    nonpos = np.concatenate([[0], np.cumsum(sl <= 0)])
    has_pad = nsl - npieces
    layout = {
        "seq_lens": [
            (sums != n, lambda i: f"sum(seq_lens) = {sums[i]}, expected {n}"),
            (nonpos[slo[1:]] > nonpos[slo[:-1]], lambda i: "holds a zero or negative length"),
        ],
        "sample_index": [
            (
                (has_pad < 0) | (has_pad > 1) | (npieces == 0),
                lambda i: f"{npieces[i]} sample_index entries for {nsl[i]} seq_lens entries",
            )
        ],
    }
    broken = np.zeros(k, dtype=bool)
    for col, tests in layout.items():
        for bad, message in tests:
            broken |= bad
            where = np.flatnonzero(bad)
            problems = ((message(i), first + int(i)) for i in where)
            report.add_many(col, len(where), problems, shard=name, field=col)
    # a pack whose layout is broken is reported once, above; the checks below look at the others
    _check_position_ids(packs, broken, first, name, manifest, report)
    pad_len = np.where((has_pad == 1) & ~broken, sl[np.clip(slo[1:] - 1, 0, max(len(sl) - 1, 0))], 0)
    used = n - pad_len
    cols = np.arange(n)[None, :]
    pad = cols >= used[:, None]
    checks = [
        ("input_ids", packs.input_ids, pad_id, "padding is not pad_token_id"),
        ("labels", packs.labels, IGNORE_INDEX, "label on padding is not -100"),
    ]
    if packs.loss_mask is not None:
        checks.append(("loss_mask", packs.loss_mask, 0, "loss_mask on padding is not 0"))
    for col, arr, want, message in checks:
        where = np.flatnonzero((pad & (arr != want)).any(axis=1) & ~broken)
        problems = ((message, first + int(i)) for i in where)
        report.add_many(f"padding {col}", len(where), problems, shard=name, field=col)
    real = ~pad
    ids = packs.input_ids
    bad_vocab = real & ((ids < 0) | (ids >= vocab_size) if vocab_size else (ids < 0))
    size = f" (size {vocab_size})" if vocab_size else ""

    def vocab_problem(i: int) -> tuple[str, int]:
        j = int(np.flatnonzero(bad_vocab[i])[0])
        return f"token id {ids[i, j]} at position {j} is outside the vocabulary{size}", first + i

    where = np.flatnonzero(bad_vocab.any(axis=1))  # any pack: the ids are there
    report.add_many("vocab", len(where), map(vocab_problem, where.tolist()), shard=name, field="input_ids")
    if text_labels:
        # inside a piece, label j is -100 or the id the labels convention names; a piece's last label
        # may point past the pack (split or truncated samples), so it is not checked
        csl = np.cumsum(sl)
        ends = csl - np.repeat(np.r_[0, csl][slo[:-1]], nsl)  # end of every seq_lens entry, 1..n
        piece_end = np.zeros((k, n + 1), dtype=bool)
        whole = np.repeat(~broken, nsl)
        piece_end[np.repeat(np.arange(k), nsl)[whole], ends[whole]] = True
        last = piece_end[:, 1:]  # last[i, j]: token j is the last of its piece
        shifted = manifest.get("labels", "shifted") == "shifted"
        target = np.concatenate([ids[:, 1:], ids[:, -1:]], axis=1) if shifted else ids
        bad = real & ~(last & shifted) & (packs.labels != IGNORE_INDEX) & (packs.labels != target)

        def labels_problem(i: int) -> tuple[str, int]:
            j = int(np.flatnonzero(bad[i])[0])
            return (
                f"label {packs.labels[i, j]} at position {j} is not aligned with input_ids "
                f"({manifest.get('labels', 'shifted')} labels expect {target[i, j]} or -100)",
                first + i,
            )

        where = np.flatnonzero(bad.any(axis=1) & ~broken)
        report.add_many("labels", len(where), map(labels_problem, where.tolist()), shard=name, field="labels")
    return used


def _check_position_ids(
    packs: PackArrays, broken: np.ndarray, first: int, name: str, manifest: dict, report: VerifyReport
) -> None:
    """``position_ids`` must be what the writer makes of each pack's layout (``seq_lens``, each piece's
    ``sample_offset``) under the manifest's ``position_ids`` convention; packs whose layout is broken are
    left out (already reported)."""
    k, n = packs.position_ids.shape
    convention = manifest.get("position_ids", "nemo")
    ok = np.flatnonzero(~broken)
    if not len(ok) or (packs.sample_offset is None and convention == "nemo"):  # an older output
        return
    nsl, npieces = np.diff(packs.seq_lens_offsets), np.diff(packs.sample_index_offsets)
    csr = lambda counts: np.concatenate([[0], np.cumsum(counts[ok])])  # noqa: E731
    starts = np.zeros(int(npieces[ok].sum()), dtype=np.int64)
    if packs.sample_offset is not None:
        starts = packs.sample_offset[np.repeat(~broken, npieces)]
    want = pack_position_ids(
        packs.seq_lens[np.repeat(~broken, nsl)], csr(nsl), csr(npieces), starts, n, convention
    )
    got = packs.position_ids[ok]
    bad = np.flatnonzero((got != want).any(axis=1))

    def problem(i: int) -> tuple[str, int]:
        j = int(np.flatnonzero(got[i] != want[i])[0])
        return f"position id {got[i, j]} at position {j}, the layout gives {want[i, j]}", first + int(ok[i])

    report.add_many("position_ids", len(bad), map(problem, bad.tolist()), shard=name, field="position_ids")


def _check_version(manifest: dict, report: VerifyReport) -> None:
    """An output of a newer packtool cannot be judged; a tar output older than format_version 2 has no
    run_id in its shards (said once here; its other checks still run)."""
    from packtool.pipeline import FORMAT_VERSION

    version = manifest.get("format_version", 1)
    if version > FORMAT_VERSION:
        report.add(
            "format_version",
            f"written by a newer packtool (format_version {version}, this one reads up to "
            f"{FORMAT_VERSION}): upgrade packtool to verify it",
            shard=MANIFEST,
            field="format_version",
        )
    elif manifest.get("shard_format") == "webdataset" and version < 2:
        report.add(
            "format_version",
            f"written by an older packtool (format_version {version}): its tar shards carry no run_id, "
            "so they cannot be matched to this manifest; pack it again to verify it (it still loads)",
            shard=MANIFEST,
            field="format_version",
        )


def verify_output(
    directory: str | Path, *, source: list[str] | None = None, progress: bool = False
) -> VerifyReport:
    """Check the output directory ``directory``; with ``source``, re-encode those inputs and prove that
    every kept sample's tokens are in the packs exactly once (see module docstring)."""
    directory = Path(directory)
    report = VerifyReport(str(directory))
    report.checked.update(shards=0, packs=0, tokens=0)
    try:
        manifest = load_manifest(directory)
    except Exception as e:
        report.add("manifest", str(e), field=MANIFEST)
        return report
    for key in ("run_id", "packed_sequence_size", "shards", "stats"):
        if key not in manifest:
            report.add("manifest", f"manifest has no '{key}'", shard=MANIFEST, field=key)
    if not report.ok:
        return report
    fmt = shard_format(manifest)
    _check_version(manifest, report)
    _check_files(directory, manifest, report, fmt)
    if fmt.check_index is not None:
        fmt.check_index(directory, manifest, report)
    tok = manifest.get("tokenizer") or {}
    vocab_size = tok.get("vocab_size")
    text_labels = manifest.get("sample_format") == "text" and tok.get("kind") == "huggingface"
    source_check = _SourceCheck.start(manifest, source, report, progress) if source is not None else None
    num_packs = num_tokens = num_pieces = 0
    fewest, most = sys.maxsize, 0  # pieces in one pack
    shard_tokens: Counter = Counter()
    shard_packs: Counter = Counter()
    try:
        for i, entry, first, packs in iter_batches(directory, manifest, report):
            used = _check_packs(packs, first, entry["path"], manifest, report, vocab_size, text_labels)
            shard_tokens[i] += int(used.sum())
            shard_packs[i] += packs.num_packs
            num_packs += packs.num_packs
            num_tokens += int(used.sum())
            pieces = np.diff(packs.sample_index_offsets)
            num_pieces += int(pieces.sum())
            fewest, most = int(pieces.min(initial=fewest)), int(pieces.max(initial=most))
            if source_check is not None:
                source_check.add(packs, used, first, entry["path"])
        all_read = True
        for i, entry in enumerate(manifest["shards"]):
            if shard_packs[i] != entry.get("num_packs"):
                all_read = False
            elif shard_tokens[i] != entry.get("num_tokens"):
                report.add(
                    "num_tokens",
                    f"holds {shard_tokens[i]:,} tokens, manifest says {entry.get('num_tokens'):,}",
                    shard=entry["path"],
                    field="num_tokens",
                )
        per_pack = samples_per_pack_stats(num_packs, num_pieces, fewest, most) if all_read else None
        _check_stats(manifest, report, per_pack)
        if source_check is not None:
            source_check.finish()
    finally:
        if source_check is not None:
            source_check.close()
    report.checked.update(shards=len(manifest["shards"]), packs=num_packs, tokens=num_tokens)
    return report


def _check_stats(manifest: dict, report: VerifyReport, per_pack: dict | None) -> None:
    """The manifest's totals must be those of its shard entries (each checked against its shard's data),
    and ``samples_per_pack`` (``per_pack``, None when not every pack could be read) that of the packs."""
    stats, shards = manifest["stats"], manifest["shards"]
    packs = sum(int(e.get("num_packs", 0)) for e in shards)
    tokens = sum(int(e.get("num_tokens", 0)) for e in shards)
    basis = f"the shards' {packs:,} packs of {tokens:,} tokens give"
    for key, want in total_stats(manifest["packed_sequence_size"], packs, tokens).items():
        got = stats.get(key)
        if got == want:
            continue
        if key in ("num_packs", "num_tokens"):
            message = f"the shards list {want:,} {key.removeprefix('num_')}, stats say {_number(got)}"
        else:
            message = f"stats say {_number(got)}, {basis} {_number(want)}"
        report.add(key, message, shard=MANIFEST, field=key)
    recorded = stats.get("samples_per_pack")
    for key, want in (per_pack or {}).items():
        got = recorded.get(key) if isinstance(recorded, dict) else None
        if got != want:
            field = f"samples_per_pack.{key}"
            message = f"stats say {_number(got)}, the packs give {_number(want)}"
            report.add("samples_per_pack", message, shard=MANIFEST, field=field)


def _number(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


# --- the source check ---------------------------------------------------------------------------------
@dataclass
class _SourceCheck:
    """Re-encoded source samples, and how many tokens of each the packs have delivered so far."""

    manifest: dict
    report: VerifyReport
    store: ChunkStore
    lengths: np.ndarray  # (num_samples,) tokens per source sample
    seen: np.ndarray  # (num_samples,) tokens found in the packs so far
    tmp: tempfile.TemporaryDirectory

    @classmethod
    def start(cls, manifest: dict, inputs: list[str], report: VerifyReport, progress: bool) -> _SourceCheck:
        import itertools

        from packtool.config import PackConfig
        from packtool.encoders import resolve_sample_format
        from packtool.engines import make_engine
        from packtool.errors import InputError
        from packtool.pipeline import _init_worker, encode_to_chunks, init_run
        from packtool.readers import read_inputs

        values = dict(manifest["config"])
        values["inputs"] = list(inputs) or values.get("inputs", [])
        config = PackConfig.from_dict(values, origin=f"{MANIFEST} config")
        batches = read_inputs(config.inputs, split=config.split, text_field=config.text_field)
        first = next(batches, None)
        if first is None:
            raise InputError("input holds no records", source=", ".join(config.inputs))
        sample_format = resolve_sample_format(config, first.batch.schema.names)
        encoder, worker_args = init_run(config, sample_format)
        ident, recorded = encoder.identity(), manifest.get("tokenizer") or {}
        if ident.get("sha256") != recorded.get("sha256"):
            report.add(
                "source",
                f"tokenizer {ident.get('name')} (sha256 {str(ident.get('sha256'))[:12]}) is "
                f"not the one of the run (sha256 {str(recorded.get('sha256'))[:12]})",
                shard=MANIFEST,
                field="tokenizer",
            )
        tmp = tempfile.TemporaryDirectory(prefix="packtool-verify-")
        engine = make_engine(config, _init_worker, worker_args)
        with engine:
            store = encode_to_chunks(config, itertools.chain([first], batches), tmp.name, engine, progress)
        lengths = store.lengths().astype(np.int64)
        return cls(manifest, report, store, lengths, np.zeros(len(lengths), dtype=np.int64), tmp)

    def where(self, sample: int) -> str:
        """``file, line L`` of source sample ``sample``."""
        e = self.store.locate(sample, "input_ids", "")
        return f"{e.source}, {e.row_kind} {e.row}"

    def close(self) -> None:
        self.store._open.clear()
        self.tmp.cleanup()

    def add(self, packs: PackArrays, used: np.ndarray, first: int, name: str) -> None:
        """Compare every piece of a batch of packs with its source sample."""
        k, n = packs.input_ids.shape
        npieces = np.diff(packs.sample_index_offsets)
        sl, slo = packs.seq_lens.astype(np.int64), packs.seq_lens_offsets
        # piece lengths: the first npieces entries of each pack's seq_lens
        piece_slot = ranges(slo[:-1], npieces)
        length = sl[piece_slot] if len(piece_slot) == len(packs.sample_index) else None
        if length is None or np.any(length <= 0):
            return  # broken layout, already reported by the structure checks
        sample = packs.sample_index.astype(np.int64)
        pack = np.repeat(np.arange(k, dtype=np.int64), npieces)
        cs = np.concatenate([[0], np.cumsum(length)])
        dest = pack * n + cs[:-1] - cs[packs.sample_index_offsets[:-1]][pack]
        bad = (sample < 0) | (sample >= len(self.lengths))
        where = np.flatnonzero(bad)
        problems = (
            (
                f"sample_index {sample[j]} is not a sample of the source ({len(self.lengths):,} samples)",
                first + int(pack[j]),
            )
            for j in where
        )
        self.report.add_many("source", len(where), problems, shard=name, field="sample_index")
        ok = ~bad
        offsets = None if packs.sample_offset is None else packs.sample_offset.astype(np.int64)[ok]
        sample, length, dest, pack = sample[ok], length[ok], dest[ok], pack[ok]
        # offset of each piece inside its sample: tokens of earlier pieces, this batch included
        order = np.argsort(sample, kind="stable")
        s_sorted, l_sorted = sample[order], length[order]
        csum = np.cumsum(l_sorted) - l_sorted
        group_start = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
        before = np.empty_like(csum)
        before[order] = csum - np.repeat(csum[group_start], np.diff(np.r_[group_start, len(s_sorted)]))
        start = self.seen[sample] + before if offsets is None else offsets
        np.add.at(self.seen, sample, length)
        over = (start + length > self.lengths[sample]) | (self.seen[sample] > self.lengths[sample])
        where = np.flatnonzero(over)
        problems = (
            (
                f"sample {sample[j]} has more tokens in the packs than in the source "
                f"({self.lengths[sample[j]]}): duplicated?",
                first + int(pack[j]),
            )
            for j in where
        )
        self.report.add_many("source", len(where), problems, shard=name, field="input_ids")
        keep = ~over
        sample, length, dest, start, pack = sample[keep], length[keep], dest[keep], start[keep], pack[keep]
        want = {"input_ids": np.zeros(k * n, dtype=np.int32), "labels": np.zeros(k * n, dtype=np.int32)}
        if packs.loss_mask is not None:
            want["loss_mask"] = np.zeros(k * n, dtype=np.int8)
        self.store.pieces_into(sample, start, length, dest, want)
        pos = ranges(dest, length)
        piece_of_token = np.repeat(np.arange(len(sample)), length)
        got = {"input_ids": packs.input_ids, "labels": packs.labels, "loss_mask": packs.loss_mask}
        for col, expected in want.items():
            values = got[col].reshape(-1)
            diff = np.flatnonzero(values[pos] != expected[pos])
            pieces = np.unique(piece_of_token[diff])
            at = pos[diff[np.searchsorted(piece_of_token[diff], pieces)]]  # each piece's first difference
            problems = (
                (
                    f"sample {sample[j]} ({self.where(int(sample[j]))}): token {start[j] + t - dest[j]} is "
                    f"{values[t]} in the pack, {expected[t]} in the source",
                    first + int(pack[j]),
                )
                for j, t in zip(pieces, at, strict=True)
            )
            self.report.add_many("source", len(pieces), problems, shard=name, field=col)

    def finish(self) -> None:
        """Account for every sample: whole, truncated, cut at max_packs, or left out for a counted reason."""
        cfg, stats, n = self.manifest["config"], self.manifest["stats"], self.manifest["packed_sequence_size"]
        lengths, seen = self.lengths, self.seen
        long = lengths > n
        policy = None if cfg.get("split_across_pack") else cfg.get("long_samples")
        counted = {
            "num_samples": len(lengths),
            "packed_samples": int((seen > 0).sum()),
            "empty_samples": int((lengths == 0).sum()),
            # the long_samples policy applies to every long sample, before max_packs cuts any of them
            "dropped_samples": int(long.sum()) if policy == "drop" else 0,
            "truncated_samples": int(long.sum()) if policy == "truncate" else 0,
        }
        short = (seen < lengths) & (lengths > 0)
        explained = (long & (seen == 0)) if policy == "drop" else np.zeros(len(lengths), dtype=bool)
        if policy == "truncate":
            explained |= long & (seen == n)
        over_max = short & ~explained
        if cfg.get("max_packs"):  # left out whole, or partly kept (also counted as packed)
            counted["samples_over_max_packs"] = int((over_max & (seen == 0)).sum())
            counted["partial_samples"] = int((over_max & (seen > 0)).sum())
        else:
            counted.update(samples_over_max_packs=0, partial_samples=0)

            def lost(s: int) -> tuple[str, None]:
                what = (
                    "is missing from the packs" if seen[s] == 0 else f"has {seen[s]} of {lengths[s]} tokens"
                )
                return f"sample {s} ({self.where(s)}) {what}", None

            where = np.flatnonzero(over_max)
            self.report.add_many("source", len(where), map(lost, where.tolist()), field="sample_index")
        for key, value in counted.items():
            if stats.get(key) != value:
                self.report.add(
                    "source",
                    f"the source gives {key} = {value:,}, the manifest says {stats.get(key)}",
                    shard=MANIFEST,
                    field=key,
                )
        self.report.checked["source samples"] = len(lengths)
