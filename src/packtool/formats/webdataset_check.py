"""``verify``'s side of the tar format, ``TarChecker``: the checks of one tar shard. It parses member by
member, every pack has exactly its members, named by its global index, each ``.npy`` (each field of a
``small_columns.npy`` record) has the right dtype and shape, the pack's metadata (its ``.json``, or the
record's ``PACK_META`` fields) matches the manifest and the arrays, and the ``.tar.idx`` holds the offsets
the tar really has. Problems name global pack numbers, and the member or the column or metadata field."""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packtool.arrays import concat_ragged
from packtool.errors import PacktoolError
from packtool.formats import tar
from packtool.formats.base import UNIT_ERRORS, ProblemSink, ShardChecker, shard_meta_problems
from packtool.formats.tar import (
    BLOCK,
    IMAGE_MEMBER,
    META,
    PACK_META,
    RECORD,
    SMALL_COLUMNS,
    pack_key,
    pack_members,
    record_meta,
    tar_index_name,
)
from packtool.formats.webdataset import TarUnitReader, image_members, images_array
from packtool.formats.webdataset_index import check_dataset_index, old_minimal_layout
from packtool.manifest import COLUMNS, Manifest, ShardEntry, strict_json
from packtool.packs import PackArrays
from packtool.safepath import output_file_problem
from packtool.schema import IMAGES

TAR_BATCH_TOKENS = 1 << 22  # a tar shard is handed to the checks in batches of about this many tokens


@dataclass
class _Batch:
    """Packs of a tar shard gathered for one ``PackArrays`` batch (fixed-width columns preallocated)."""

    first: int  # index in the shard of the first pack
    n: int
    fixed: dict[str, np.ndarray]  # column -> (capacity, width)
    ragged: dict[str, list[np.ndarray]] = field(default_factory=dict)
    k: int = 0
    images: list[list[tuple[str, bytes]]] = field(default_factory=list)  # per pack, a vision output's

    @classmethod
    def new(cls, first: int, capacity: int, n: int, columns: list[str]) -> _Batch:
        widths = {c: COLUMNS[c].width(n) for c in columns}
        fixed = {c: np.empty((capacity, w), COLUMNS[c].dtype) for c, w in widths.items() if w is not None}
        return cls(first, n, fixed, {c: [] for c, w in widths.items() if w is None})

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        for col, arr in arrays.items():
            if col == IMAGES:  # a vision-language pack's (member name, bytes) per image
                self.images.append(arr)
            elif col in self.fixed:
                self.fixed[col][self.k] = arr
            else:
                self.ragged[col].append(arr)
        self.k += 1

    def arrays(self) -> PackArrays:
        """The packs gathered, every stored column as stored (the manifest's columns)."""
        k = self.k
        parts = {
            c: (a[:k].reshape(-1), np.arange(k + 1, dtype=np.int64) * a.shape[1])
            for c, a in self.fixed.items()
        }
        for col, values in self.ragged.items():
            parts[col] = concat_ragged(values, COLUMNS[col].dtype)
        packs = PackArrays.from_parts(parts, self.n)
        counts = [len(pack) for pack in self.images]  # a vision output's image members per pack
        offsets = packs.image_sample_offsets
        if self.images and offsets is not None and np.diff(offsets).tolist() == counts:
            packs.images = images_array([image for pack in self.images for image in pack])
        return packs  # (else no images: verify's image checks say the members are not one per image)


def _member_views(
    path: Path, buf, key: str, members: dict, groups: dict[str, tuple[str, ...]], n: int, problem: Callable
) -> tuple[dict[str, tuple[np.ndarray, str]], dict | None]:
    """Every stored column of one pack as ``(view into buf, where)`` by name (``where``: `` (a field of
    KEY.small_columns.npy)`` or ""; a compressed member's view is into its bytes decompressed, at most
    what a pack of ``n`` tokens holds), and the record's metadata fields (``record_meta``: None without a
    record that parses); the members that do not parse or decompress, and the record's missing,
    unexpected or damaged fields, reported."""
    views: dict[str, tuple[np.ndarray, str]] = {}
    meta = None
    for ext, names in groups.items():
        if ext == META or ext not in members:  # (a missing member is reported as such)
            continue
        name = f"{key}.{ext}"
        is_record = tar.stored_name(ext) == SMALL_COLUMNS
        try:
            arr = tar.npy_member(path, name, buf, *members[ext], n)
            fields = tar.record_fields(path, name, arr) if is_record else {names[0]: arr}
        except PacktoolError as e:
            problem("npy", str(e).removeprefix(f"{path}: "), names[0] if len(names) == 1 else None)
            continue
        if is_record:
            want = [*PACK_META, *names]
            missing, extra = [c for c in want if c not in fields], [c for c in fields if c not in want]
            if missing:
                problem("members", f"{name} has no field(s) {', '.join(missing)}", missing[0])
            if extra:
                problem("members", f"{name} has unexpected field(s) {', '.join(extra)}", extra[0])
            meta, bad = record_meta(fields)
            for field_name, what in bad.items():
                problem("npy", f"{what} (a field of {name})", field_name)
        where = f" (a field of {name})" if is_record else ""
        views.update({c: (fields[c], where) for c in names if c in fields})
    return views, meta


def _pack_arrays(
    path: Path, buf, key: str, members: dict, columns: list[str], groups: dict, n: int, problem: Callable
) -> tuple[dict[str, np.ndarray] | None, dict | None]:
    """The stored ``columns`` of one pack (in the members ``groups``: ``pack_members``) as arrays
    (copies), or None (reported) if one is unusable; and the metadata fields of its record
    (``_member_views``)."""
    views, meta = _member_views(path, buf, key, members, groups, n, problem)
    arrays: dict[str, np.ndarray] = {}
    for col in columns:
        if col not in views:
            continue
        arr, where = views.pop(col)
        column = COLUMNS[col]
        width = column.width(n)
        pieces = len(arrays["sample_index"]) if "sample_index" in arrays else None
        if arr.dtype != column.dtype or arr.ndim != 1:
            problem(
                "npy",
                f"{arr.dtype} array of shape {arr.shape}, expected a 1-D {column.dtype} array{where}",
                col,
            )
        elif width is not None and len(arr) != width:
            what = "packed_sequence_size" if column.per == "token" else "ceil(N / 8) ="
            problem("length", f"has {len(arr)} values, expected {what} {width}{where}", col)
        elif column.per == "piece" and col != "sample_index" and pieces is not None and len(arr) != pieces:
            problem(
                "length", f"has {len(arr)} values, expected one per sample_index entry: {pieces}{where}", col
            )
        else:
            arrays[col] = arr.copy()  # the mmap closes after the walk: no view may outlive it
        del arr
    views.clear()
    return (arrays if len(arrays) == len(columns) else None), meta


def _pack_json(buf, key: str, members: dict, problem: Callable) -> dict | None:
    """The ``.json`` member of one pack, or None (reported) if it does not parse as an object."""
    offset, nbytes = members["json"]
    try:
        meta = strict_json(bytes(buf[offset : offset + nbytes]))
    except ValueError:  # (one nested past Python's recursion limit too)
        meta = None
    if not isinstance(meta, dict):
        problem("json", f"member {key}.json is not a JSON object", "json")
        return None
    return meta


def check_tar_shard(
    path: Path, entry: ShardEntry, manifest: Manifest, report: ProblemSink, index: int = 0, base: int = 0
) -> Iterator[tuple[int, PackArrays]]:
    """Parse a tar shard member by member; check each pack's members, ``.npy`` headers (dtype, shape)
    and metadata (pack index, run_id, shard, counts: the ``.json``, or a minimal pack's record), the
    shard's pack count and its ``.tar.idx``; yield the packs that could be read, in batches of consecutive
    packs."""
    name = entry.path
    n = manifest.packed_sequence_size
    images = manifest.image_columns is not None  # a vision-language output: image columns and members
    columns = [c for c in [*manifest.columns, *(manifest.image_columns or ())] if c in COLUMNS]
    try:
        compression = tar.check_compression(entry)
    except PacktoolError as e:
        report.add("compression", str(e).removeprefix(f"shard {name}, "), shard=name, field="compression")
        return
    stored = pack_members(columns, manifest.layout, compression)  # the members of a pack
    want = set(stored)
    has_json = META in want  # else the metadata is the record's fields, each checked as a field
    old = manifest.format_version < 2  # no run_id in .json; verify says so once
    capacity = max(1, TAR_BATCH_TOKENS // n)
    starts: list[int] = []  # header offset of every pack, then the end of the last one
    shard_meta: dict | None = None  # the metadata of the shard's first pack: its run_id and shard
    batch = _Batch.new(0, capacity, n, columns)
    local = 0  # index in the shard of the pack being read

    def problem(kind: str, message: str, col: str | None = None) -> None:
        report.add(kind, message, shard=name, pack=base + local, field=col)

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            report.add("parse", "empty file, not a tar archive", shard=name)
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            groups = tar.samples(path, buf, complete=want)
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
                extra = sorted(x for x in members.keys() - want if not (images and IMAGE_MEMBER.fullmatch(x)))
                missing = sorted(want - members.keys())
                if extra:
                    problem("members", f"unexpected member(s) {', '.join(f'{key}.{x}' for x in extra)}")
                if missing:
                    problem("members", f"missing member(s) {', '.join(f'{key}.{x}' for x in missing)}")
                # (a pack missing a member still has its other members and metadata checked)
                arrays, meta = _pack_arrays(path, buf, key, members, columns, stored, n, problem)
                if has_json:
                    meta = _pack_json(buf, key, members, problem) if META in members else None
                source = f"{key}.{META if has_json else SMALL_COLUMNS + tar.COMPRESSIONS[compression]}"
                if meta is not None and shard_meta is None:
                    shard_meta = meta
                    if "run_id" in meta:
                        shard_meta_problems(meta, manifest, index, report, name)
                    elif has_json and not old:  # a record's missing field is reported as such
                        problem("run_id", "the pack's .json carries no run_id", "run_id")
                # a shard of another run is reported once, above, not as every pack's misplaced number
                ours = shard_meta is None or shard_meta.get("run_id") in (None, manifest.run_id)
                if ours and key != pack_key(base + local):
                    problem("key", f"members are named {key}.*, expected {pack_key(base + local)}.*")
                if meta is not None:
                    expect = {
                        "pack_index": base + local if ours else None,
                        "run_id": shard_meta.get("run_id"),
                        "shard": shard_meta.get("shard"),
                    }
                    if arrays is not None and {"sample_index", "seq_lens"} <= arrays.keys():
                        expect["num_samples"] = len(arrays["sample_index"])
                        spans = int(arrays["seq_lens"][: expect["num_samples"]].sum())
                        expect["num_tokens"] = spans - int(arrays.get("cp_padding", np.zeros(0)).sum())
                    for k, v in expect.items():
                        # (a record's missing or damaged field is reported as such, not as a value)
                        if v is not None and (has_json or k in meta) and meta.get(k) != v:
                            kind = "json" if has_json else "meta"
                            problem(kind, f"{source} says {k} {meta.get(k)}, expected {v}", k)
                if arrays is not None and images:
                    try:
                        arrays[IMAGES] = image_members(path, key, members, buf)
                    except PacktoolError as e:  # an image larger than any a shard holds: not copied
                        problem("images", str(e).removeprefix(f"{path}: "), IMAGES)
                        arrays = None
                if arrays is not None:
                    batch.add(arrays)
                local += 1
                if arrays is None or batch.k == capacity:  # a batch holds consecutive packs: cut here
                    if batch.k:
                        yield batch.first, batch.arrays()
                    batch = _Batch.new(local, capacity, n, columns)
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
    if starts and local != entry.num_packs:
        report.add(
            "num_packs",
            f"holds {local} packs, manifest says {entry.num_packs}",
            shard=name,
            field="num_packs",
        )
    if starts and output_file_problem(path.parent, tar_index_name(entry)) in (None, "missing"):
        idx = path.parent / tar_index_name(entry)  # (one outside the output: verify's check_files says so)
        _check_tar_idx(idx, [*starts, end], base, report, name)


def _check_tar_idx(idx: Path, real: list[int], base: int, report: ProblemSink, name: str) -> None:
    """``packs-NNNNNN.tar.idx`` must hold the offsets ``real`` found by parsing the tar."""
    if not idx.exists():
        report.add("index", f"index file {idx.name} is missing", shard=name, field="index")
        return
    real_arr = np.asarray(real, dtype=np.int64)
    size = idx.stat().st_size
    if size != 8 * len(real_arr):  # (read only when it is of the size it must be)
        report.add(
            "index",
            f"{idx.name} holds {size / 8:g} offsets, the tar has {len(real_arr) - 1} packs + 1 (stale index)",
            shard=name,
            field="index",
        )
        return
    offsets = np.frombuffer(idx.read_bytes()[:size], dtype="<u8").astype(np.int64)
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


class TarChecker(ShardChecker):
    """``verify``'s checks of a tar shard (``check_tar_shard``) and of the dataset-level index files."""

    def check(
        self, path: Path, entry: ShardEntry, manifest: Manifest, report: ProblemSink, index: int, base: int
    ) -> Iterator[tuple[int, PackArrays]]:
        if old_minimal_layout(manifest):  # one member per column (format 3): read as readers read it
            return _check_by_reading(path, manifest, report, index)
        return check_tar_shard(path, entry, manifest, report, index, base)

    def check_dataset_index(self, directory: Path, manifest: Manifest, report: ProblemSink) -> None:
        check_dataset_index(directory, manifest, report)


def _check_by_reading(
    path: Path, manifest: Manifest, report: ProblemSink, index: int
) -> Iterator[tuple[int, PackArrays]]:
    """A shard of format 3's ``minimal`` layout (one member per column), checked as ``read_packs`` reads
    it (run_id, pack count, the CRC-32, each member's dtype and shape); its packs are yielded for the
    per-pack checks."""
    units = TarUnitReader(path.parent, manifest)
    try:
        packs = units.read_stored(index, 0, list(manifest.columns))
    except UNIT_ERRORS as e:
        report.add("unreadable", f"cannot be read ({e})", shard=path.name)
        return
    finally:
        units.close()
    yield 0, packs
