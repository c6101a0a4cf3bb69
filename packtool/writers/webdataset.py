"""Packs -> WebDataset tar shards ``packs-NNNNNN.tar``, their indexes, and the Energon/wids metadata.

Each pack is one WebDataset *sample*: the tar members ``KEY.EXT`` with ``KEY`` the pack's global index
as nine digits (``000000123``, no dots) and ``EXT`` one of

=================== ========================= ========================================================
member              content                   meaning
=================== ========================= ========================================================
input_ids.npy       int32 ``(N,)``            token ids, padded with ``pad_token_id``
json                UTF-8 JSON object         ``{"pack_index", "num_tokens", "num_samples", "run_id",
                                              "shard"}`` (``run_id``/``shard``: the manifest's)
labels.npy          int32 ``(N,)``            labels, ``-100`` where no loss is taken
loss_mask.npy       int8 ``(N,)``             only if the input carried a loss mask
position_ids.npy    int32 ``(N,)``            position ids (convention in the manifest)
sample_index.npy    int64 ``(num_samples,)``  global input index of each sample (piece) in the pack
sample_offset.npy   int64 ``(num_samples,)``  where each piece starts inside its sample (0 unless split)
seq_lens.npy        int32 ``(num_samples[+1],)`` sample lengths, then the padding if any
=================== ========================= ========================================================

Members follow the ``webdataset.TarWriter`` conventions (USTAR, members of a sample adjacent and sorted
by extension, ``.npy`` written by ``numpy.lib.format`` without pickle) but are written with the standard
``tarfile`` module and fixed metadata (mtime 0, uid/gid 0, mode 0444, no user or group name), so a shard
is byte-identical for every run and ``num_proc``; importing ``webdataset`` is not needed to write.

Beside each ``packs-NNNNNN.tar`` goes ``packs-NNNNNN.tar.idx``: little-endian uint64, the byte offset of
every sample's first header, then the offset where the last sample ends (the layout Megatron-Energon
reads). When all shards are written, ``write_dataset_index`` adds

* ``wids.json``: the ``wids`` shard index (``wids-shard-index-v1``, urls relative to the directory);
* ``.nv-meta/.info.json``, ``.nv-meta/split.yaml``, ``.nv-meta/dataset.yaml``: the Energon dataset
  metadata, with ``packtool.energon.PackSample`` as sample type, so ``energon prepare`` is not needed.

Example::

    >>> from packtool.writers.webdataset import read_tar_packs
    >>> for pack in read_tar_packs("out/packs-000000.tar", n=4096):  # doctest: +SKIP
    ...     pack["input_ids"].shape
    (4096,)
"""

from __future__ import annotations

import functools
import io
import json
import math
import mmap
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import yaml

from packtool.errors import ConfigError, PacktoolError
from packtool.packing.plan import PackPlan
from packtool.reading import PACK_FIELDS
from packtool.writers.packs import PackArrays

BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 10240: tarfile pads the archive to a multiple of this
KEY_DIGITS = 9
INDEX_SUFFIX = ".idx"  # packs-000000.tar -> packs-000000.tar.idx
WIDS_INDEX = "wids.json"
ENERGON_DIR = ".nv-meta"
ENERGON_SAMPLE_TYPE = {"__module__": "packtool.energon", "__class__": "PackSample"}
# name -> dtype of the .npy members, in member order (TarWriter sorts a sample's members by name)
NPY_MEMBERS = {
    "input_ids": np.int32,
    "labels": np.int32,
    "loss_mask": np.int8,
    "position_ids": np.int32,
    "sample_index": np.int64,
    "sample_offset": np.int64,
    "seq_lens": np.int32,
}


def pack_key(index: int) -> str:
    """The WebDataset key of global pack ``index``: digits only, so no dot can split it.

    >>> pack_key(123)
    '000000123'
    """
    return f"{index:0{KEY_DIGITS}d}"


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


@functools.lru_cache(maxsize=4096)
def _npy_size(length: int, dtype: str) -> int:
    """Bytes of a 1-D ``.npy`` file of ``length`` items of ``dtype`` (header included), without writing it."""
    buf = io.BytesIO()
    header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (int(length),)}
    np.lib.format.write_array_header_1_0(buf, header)
    return len(buf.getvalue()) + int(length) * np.dtype(dtype).itemsize


def _member_size(data_bytes: int) -> int:
    return BLOCK + -(-data_bytes // BLOCK) * BLOCK


def pack_json(pack_index: int, num_tokens: int, num_samples: int, run_id: str, shard: int) -> bytes:
    """The ``.json`` member of a pack (always under one tar block).

    ``run_id`` and ``shard`` (the shard's number in the manifest) let ``packtool verify`` match a shard
    to its manifest, as the Parquet footer's ``packtool`` metadata does.
    """
    return json.dumps(
        {
            "pack_index": int(pack_index),
            "num_tokens": int(num_tokens),
            "num_samples": int(num_samples),
            "run_id": str(run_id),
            "shard": int(shard),
        },
        separators=(",", ":"),
    ).encode()


def pack_tar_bytes(plan: PackPlan, has_loss_mask: bool) -> np.ndarray:
    """``(num_packs,)`` int64: bytes each pack of ``plan`` takes in a tar shard, computed from the plan alone.

    Used to cut shards by ``shard_max_bytes`` before any token is written.
    """
    n = plan.packed_sequence_size
    counts = np.diff(plan.pack_offsets).astype(np.int64)
    n_seq_lens = counts + (plan.pack_tokens() < n)
    fixed = 3 * _member_size(_npy_size(n, "int32")) + _member_size(BLOCK - 1)  # 3 (N,) int32 + json
    if has_loss_mask:
        fixed += _member_size(_npy_size(n, "int8"))

    def ragged(lengths: np.ndarray, dtype: str) -> np.ndarray:
        uniq, inv = np.unique(lengths, return_inverse=True)
        sizes = np.array([_member_size(_npy_size(int(u), dtype)) for u in uniq], dtype=np.int64)
        return sizes[inv.reshape(-1)]

    return fixed + ragged(n_seq_lens, "int32") + 2 * ragged(counts, "int64")  # sample_index, sample_offset


def shard_bounds(
    plan: PackPlan, shard_size: int, shard_max_bytes: int | None, has_loss_mask: bool
) -> list[tuple[int, int]]:
    """Pack ranges ``[(first, last), ...]`` of the tar shards: at most ``shard_size`` packs and, when
    ``shard_max_bytes`` is set, at most that many bytes per ``.tar`` file (end-of-archive blocks included).

    Raises ``ConfigError`` when one pack alone is larger than ``shard_max_bytes``.
    """
    k = plan.num_packs
    if shard_max_bytes is None:
        return [(a, min(a + shard_size, k)) for a in range(0, k, shard_size)]
    sizes = pack_tar_bytes(plan, has_loss_mask)
    cum = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(sizes, out=cum[1:])
    # a shard of S bytes of members becomes ceil((S + 2 blocks) / RECORD) * RECORD bytes on disk
    budget = (shard_max_bytes // RECORD) * RECORD - 2 * BLOCK
    out, a = [], 0
    while a < k:
        by_bytes = int(np.searchsorted(cum, cum[a] + budget, side="right")) - 1
        b = min(a + shard_size, by_bytes, k)
        if b <= a:
            need = -(-(int(sizes[a]) + 2 * BLOCK) // RECORD) * RECORD
            raise ConfigError(
                f"shard_max_bytes {shard_max_bytes} is smaller than one pack's tar shard ({need} bytes)"
            )
        out.append((a, b))
        a = b
    return out


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mtime = 0
    ti.mode = 0o444
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def write_tar_shard(path: str | Path, packs: PackArrays, *, first_pack: int, run_id: str, shard: int) -> dict:
    """Write ``packs`` as the tar shard ``path`` and its ``path.idx``; return the manifest's index info.

    Both files are written to ``.tmp`` names and renamed into place. ``first_pack`` is the global index
    of ``packs``' first pack (it makes the keys); ``run_id`` and ``shard`` (this shard's number) go into
    every pack's ``.json`` member. Returns ``{"index": "packs-NNNNNN.tar.idx"}``.
    """
    path = Path(path)
    k, n = packs.input_ids.shape
    num_samples = np.diff(packs.sample_index_offsets)
    has_pad = np.diff(packs.seq_lens_offsets) > num_samples
    pad = np.where(has_pad, packs.seq_lens[np.maximum(packs.seq_lens_offsets[1:] - 1, 0)], 0)
    num_tokens = n - pad
    offsets = np.zeros(k + 1, dtype="<u8")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(k):
                offsets[i] = tar.offset
                key = pack_key(first_pack + i)
                meta = pack_json(first_pack + i, num_tokens[i], num_samples[i], run_id, shard)
                assert len(meta) < BLOCK, meta  # pack_tar_bytes counts one block for it
                members = {
                    "input_ids.npy": _npy_bytes(packs.input_ids[i]),
                    "json": meta,
                    "labels.npy": _npy_bytes(packs.labels[i]),
                    "position_ids.npy": _npy_bytes(packs.position_ids[i]),
                    "sample_index.npy": _npy_bytes(
                        packs.sample_index[packs.sample_index_offsets[i] : packs.sample_index_offsets[i + 1]]
                    ),
                    "sample_offset.npy": _npy_bytes(
                        packs.sample_offset[packs.sample_index_offsets[i] : packs.sample_index_offsets[i + 1]]
                    ),
                    "seq_lens.npy": _npy_bytes(
                        packs.seq_lens[packs.seq_lens_offsets[i] : packs.seq_lens_offsets[i + 1]]
                    ),
                }
                if packs.loss_mask is not None:
                    members["loss_mask.npy"] = _npy_bytes(packs.loss_mask[i])
                for ext in sorted(members):
                    data = members[ext]
                    tar.addfile(_tarinfo(f"{key}.{ext}", len(data)), io.BytesIO(data))
            offsets[k] = tar.offset
        f.flush()
        os.fsync(f.fileno())
    index = path.with_name(path.name + INDEX_SUFFIX)
    index_tmp = index.with_name(index.name + ".tmp")
    index_tmp.write_bytes(offsets.tobytes())
    os.replace(tmp, path)
    os.replace(index_tmp, index)
    return {"index": index.name}


def read_tar_index(tar_path: str | Path) -> np.ndarray:
    """``(num_packs + 1,)`` uint64 byte offsets of the packs of shard ``tar_path`` (from its ``.tar.idx``)."""
    return np.fromfile(str(tar_path) + INDEX_SUFFIX, dtype="<u8")


def _tar_members(path: Path, buf) -> Iterator[tuple[str, int, int]]:
    """``(name, data_offset, size)`` of every regular file of a USTAR archive in ``buf``, in order.

    Headers are parsed directly (name, size, type, checksum): ``tarfile`` costs ~100 us per member.
    """
    pos, end = 0, len(buf)
    while pos + BLOCK <= end:
        hdr = bytes(buf[pos : pos + BLOCK])
        if hdr == bytes(BLOCK):
            return  # end-of-archive marker
        try:
            checksum = int(hdr[148:156].strip(b" \0") or b"0", 8)
            size = int(hdr[124:136].strip(b" \0") or b"0", 8)
            if sum(hdr[:148]) + 8 * 32 + sum(hdr[156:]) != checksum:
                raise ValueError
            name = hdr[:100].split(b"\0", 1)[0].decode()
            prefix = hdr[345:500].split(b"\0", 1)[0].decode() if hdr[257:262] == b"ustar" else ""
        except (ValueError, UnicodeDecodeError):  # not octal, not UTF-8, or the sum differs
            raise PacktoolError(f"{path}: bad tar header checksum at byte {pos}") from None
        if pos + BLOCK + size > end:
            raise PacktoolError(
                f"{path}: truncated tar archive (member {name} at byte {pos} runs past the end)"
            )
        if hdr[156:157] in (b"0", b"\0"):
            yield (f"{prefix}/{name}" if prefix else name), pos + BLOCK, size
        pos += BLOCK + -(-size // BLOCK) * BLOCK
    if pos != end:
        raise PacktoolError(f"{path}: truncated tar archive (ends inside the member at byte {pos})")


def tar_pack_groups(
    path: Path, buf, complete: set[str] | None = None
) -> Iterator[tuple[str, int, dict[str, tuple[int, int]], int]]:
    """The packs of a tar in ``buf`` as ``(key, header offset, {ext: (data offset, size)}, end offset)``:
    adjacent members with the same key, as WebDataset groups them (a repeated member is kept as
    ``"EXT (again)"``).

    Raises ``PacktoolError`` where the archive does not parse, after yielding the packs before it. The
    pack being read when it fails is yielded first only if ``complete`` is given and the pack already
    holds every member of it (so the error belongs to the next pack); else it is left out.
    """
    key, start, members, end = None, 0, {}, 0
    try:
        for member, offset, size in _tar_members(path, buf):
            k, _, ext = member.partition(".")
            if k != key:
                if key is not None:
                    yield key, start, members, end
                key, start, members = k, offset - BLOCK, {}
            members[ext if ext not in members else f"{ext} (again)"] = (offset, size)
            end = offset + -(-size // BLOCK) * BLOCK
    except PacktoolError:
        if key is not None and complete is not None and complete <= members.keys():
            yield key, start, members, end
        raise
    if key is not None:
        yield key, start, members, end


@functools.lru_cache(maxsize=4096)
def _npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool]:
    d = np.lib.format.read_array_header_1_0(io.BytesIO(header))
    return np.dtype(d[2]), tuple(d[0]), bool(d[1])


def _npy_array(path: Path, name: str, buf, offset: int, size: int) -> np.ndarray:
    """The ``.npy`` member at ``buf[offset : offset + size]`` as an array (a copy, so ``buf`` may close)."""
    return npy_view(path, name, buf, offset, size).copy()


def npy_view(path: Path, name: str, buf, offset: int, size: int) -> np.ndarray:
    """The ``.npy`` member at ``buf[offset : offset + size]`` as a read-only view into ``buf``.

    Raises ``PacktoolError`` naming ``path`` and member ``name`` if it is not a plain version 1 array
    of exactly ``size`` bytes (no pickle, no Fortran order).
    """
    head = bytes(buf[offset : offset + 10])
    if head[:6] != b"\x93NUMPY" or head[6] != 1:
        raise PacktoolError(f"{path}: member {name} is not a version 1 .npy array")
    header_end = 10 + int.from_bytes(head[8:10], "little")
    try:
        dtype, shape, fortran = _npy_header(bytes(buf[offset + 8 : offset + header_end]))
    except ValueError as e:
        raise PacktoolError(f"{path}: member {name} has a bad .npy header ({e})") from None
    count = math.prod(shape)
    if dtype.hasobject or fortran or header_end + count * dtype.itemsize != size:
        raise PacktoolError(f"{path}: member {name} is not a plain C-order .npy array of its size")
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset + header_end).reshape(shape)


def read_tar_packs(
    path: str | Path, n: int, with_sample_index: bool = False, run_id: str | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Yield the packs of one tar shard in order, as ``read_packs`` does (same keys, shapes and dtypes).

    The shard is memory-mapped; each ``.npy`` member becomes one array copy (no pickle, no per-token loop).
    With ``run_id``, a shard whose first ``.json`` member names another run raises ``PacktoolError``
    (shards written before format_version 2 name none and are read as they are).
    """
    path = Path(path)

    def finish(key: str, pack: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [f for f in PACK_FIELDS if f not in pack]
        if missing:
            raise PacktoolError(f"{path}: pack {key} has no {', '.join(missing)} member")
        if not with_sample_index:
            pack.pop("sample_index", None)
            pack.pop("sample_offset", None)
        if pack["input_ids"].shape != (n,):
            shape = pack["input_ids"].shape
            raise PacktoolError(f"{path}: pack {key} has input_ids of shape {shape}, expected ({n},)")
        return pack

    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            for key, _start, members, _end in tar_pack_groups(path, buf):
                if run_id is not None and "json" in members:
                    offset, size = members["json"]
                    _check_run_id(path, f"{key}.json", bytes(buf[offset : offset + size]), run_id)
                    run_id = None  # the first pack's is enough: a shard is written by one run
                yield finish(key, _npy_members(path, key, members, buf))


def read_tar_pack(path: str | Path, row: int, n: int) -> dict[str, np.ndarray] | None:
    """Pack ``row`` (0-based, in this shard) of tar shard ``path``, with ``sample_index``/``sample_offset``,
    read alone through the shard's ``.tar.idx``: only that pack's bytes are read.

    Returns None when the index is missing or does not describe exactly one whole pack there (the caller
    then reads the shard in order, which names what is wrong).
    """
    path = Path(path)
    try:
        offsets = read_tar_index(path)
    except OSError:
        return None
    if not 0 <= row < len(offsets) - 1:
        return None
    start, end = int(offsets[row]), int(offsets[row + 1])
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if len(data) != end - start:
        return None
    try:
        groups = list(tar_pack_groups(path, data))
    except PacktoolError:
        return None
    if len(groups) != 1:
        return None
    key, _, members, _ = groups[0]
    pack = _npy_members(path, key, members, data)
    if any(f not in pack for f in (*PACK_FIELDS, "sample_index")) or pack["input_ids"].shape != (n,):
        return None
    return pack


def _npy_members(path: Path, key: str, members: dict[str, tuple[int, int]], buf) -> dict[str, np.ndarray]:
    """The ``.npy`` members of pack ``key`` (``{ext: (data offset, size)}`` in ``buf``), as arrays by name."""
    return {
        ext[: -len(".npy")]: _npy_array(path, f"{key}.{ext}", buf, *members[ext])
        for ext in members
        if ext.endswith(".npy")
    }


def _check_run_id(path: Path, name: str, data: bytes, run_id: str) -> None:
    try:
        found = json.loads(data).get("run_id")
    except (ValueError, AttributeError):
        raise PacktoolError(f"{path}: member {name} is not a JSON object") from None
    if found is not None and found != run_id:
        raise PacktoolError(f"{path}: shard of run {found}, the manifest is run {run_id}")


ENERGON_DATASET_COMMENT = (
    "# Megatron-Energon dataset config written by packtool (one sample per pack; see packtool.energon)\n"
)


def dataset_index_contents(manifest: dict) -> dict[str, dict]:
    """What the dataset-level index files of a webdataset output hold, from the run's ``manifest``
    (its ``run_id``, ``shards`` and ``columns``): ``{relative file name: parsed content}``.

    ``write_dataset_index`` writes these; ``packtool verify`` compares the files on disk with them.
    """
    shards = manifest["shards"]
    return {
        WIDS_INDEX: {
            "__kind__": "wids-shard-index-v1",
            "wids_version": 1,
            "name": f"packtool-{manifest['run_id']}",
            "shardlist": [
                {"url": s["path"], "nsamples": s["num_packs"], "filesize": s["bytes"]} for s in shards
            ],
        },
        f"{ENERGON_DIR}/.info.json": {"shard_counts": {s["path"]: s["num_packs"] for s in shards}},
        f"{ENERGON_DIR}/split.yaml": {"split_parts": {"train": [s["path"] for s in shards]}, "exclude": []},
        f"{ENERGON_DIR}/dataset.yaml": {
            "sample_type": ENERGON_SAMPLE_TYPE,
            "field_map": {c: f"{c}.npy" for c in manifest["columns"]},
        },
    }


def write_dataset_index(directory: str | Path, manifest: dict) -> list[str]:
    """Write the dataset-level index files of a webdataset output (wids and Energon); return their paths.

    ``manifest`` is the run's manifest (its ``run_id``, ``shards`` and ``columns`` are used).
    """
    directory = Path(directory)
    (directory / ENERGON_DIR).mkdir(exist_ok=True)
    contents = dataset_index_contents(manifest)
    for name, content in contents.items():
        if name.endswith(".json"):
            text = json.dumps(content, indent=1) + "\n"
        else:
            comment = ENERGON_DATASET_COMMENT if name.endswith("dataset.yaml") else ""
            text = comment + yaml.safe_dump(content, sort_keys=False)
        (directory / name).write_text(text)
    return list(contents)
