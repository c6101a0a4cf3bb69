"""Encoded chunks: the tokenized input, on disk, between encoding and writing.

Each chunk is a directory ``chunk-NNNNNN/`` of flat ``.npy`` arrays (memory-mapped when read back):

* ``input_ids.npy`` / ``labels.npy``: int32, all samples' tokens end to end; ``loss_mask.npy`` int8 if any;
* ``offsets.npy``: int64 ``(num_samples + 1,)``, sample ``i`` is ``input_ids[offsets[i]:offsets[i + 1]]``;
* ``rows.npy`` / ``source_ids.npy``: where each sample came from (for error messages);
* ``meta.json``: sources, row kinds and counts, written last: a chunk without it is incomplete; for a
  ``minimal`` run also whether the chunk's labels follow the rule that layout rebuilds them by
  (``labels_rule``, ``labels_follow_rule``: ``packtool.layout``).

A chunk is written in ``chunk-NNNNNN.tmp-PID/`` and renamed into place, so ``chunk-NNNNNN/meta.json``
exists only for a whole chunk: a resumed run reuses those and rewrites the others.

``ChunkStore`` opens chunks on demand and moves pieces of samples into pack arrays with vectorized
gathers. It keeps at most ``max_open`` chunks mapped (least recently used first out): every mapping holds a
file descriptor and the pages it touched count in the process's resident memory, so keeping all of them
would make memory (and open files) grow with the input.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import stat
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash

from packtool.arrays import groups, list_parts
from packtool.encoders.masking import empty_loss_count
from packtool.errors import InputError
from packtool.fileio import written_whole
from packtool.layout import labels_follow_rule
from packtool.manifest import IGNORE_INDEX
from packtool.options import PackOptions
from packtool.pipeline.content import DIGESTED, chunk_digest, labels_equal_input_ids
from packtool.pipeline.images import MAPPED, ChunkImages, chunk_images, images_intact, write_chunk_images
from packtool.pipeline.open_files import default_max_open
from packtool.pipeline.policy_chunks import policy_chunk
from packtool.readers.base import SourceBatch
from packtool.storage.scratch import Scratch, as_scratch


def chunk_name(index: int) -> str:
    """The folder of chunk ``index`` in the scratch."""
    return f"chunk-{index:06d}"


def chunk_dir(work_dir: str | Path, index: int) -> Path:
    return Path(work_dir) / chunk_name(index)


def write_chunk(
    work_dir: str | Path,
    index: int,
    batches: list[SourceBatch],
    encoded: list[pa.RecordBatch],
    extra: dict | None = None,
    labels_rule: str | None = None,
) -> dict:
    """Write one encoded chunk (the encoder's output for ``batches``) and return its meta (``extra``
    added to it, in ``meta.json`` too, so that a resumed run reads it back). With ``labels_rule`` (a
    ``labels`` convention) the meta says whether every sample's labels follow the rule of
    ``layout.labels_follow_rule`` under it."""
    final = chunk_dir(work_dir, index)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    parts, meta = chunk_parts(batches, encoded, labels_rule)
    # the parts' offsets (each from 0) made the chunk's: one leading 0, then each part's after the last
    starts = np.cumsum([0] + [int(p["offsets"][-1]) for p in parts])[:-1]
    offsets = [np.zeros(1, dtype=np.int64)]
    offsets += [p["offsets"][1:] + start for p, start in zip(parts, starts, strict=True)]
    for name, dtype in CHUNK_ARRAYS.items():
        if name == "offsets":
            _save_parts(tmp / "offsets.npy", offsets, dtype)
        elif name != "loss_mask" or meta["has_loss_mask"]:
            _save_parts(tmp / f"{name}.npy", [p[name] for p in parts], dtype)
    images = chunk_images(encoded)
    if images is not None:  # a vision-language chunk: its samples' images beside the tokens
        meta.update(write_chunk_images(tmp, images))
    meta = {"index": index, **meta, **(extra or {})}
    (tmp / "meta.json").write_text(json.dumps({**meta, "meta_digest": meta_digest(meta)}))
    # A chunk's bytes depend only on its records, so if another writer finished it meanwhile (a task of a
    # killed run still in flight on a cluster while the run is resumed), keep theirs and drop ours.
    if not (final / "meta.json").exists():
        shutil.rmtree(final, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "meta.json").exists():
                raise
    shutil.rmtree(tmp, ignore_errors=True)
    return meta


def meta_digest(meta: dict) -> str:
    """XXH3-128 of a chunk's meta (less this digest) as JSON, written in it: a resumed run trusts no meta
    edited since (its counts, sources and the input rows it covers are what the run's summary adds up)."""
    body = {k: v for k, v in meta.items() if k != "meta_digest"}
    return xxhash.xxh3_128(json.dumps(body, sort_keys=True).encode()).hexdigest()


# a chunk's arrays and their dtypes (rows and source_ids: where each sample came from)
CHUNK_ARRAYS = {
    "input_ids": np.int32,
    "labels": np.int32,
    "loss_mask": np.int8,
    "offsets": np.int64,
    "rows": np.int64,
    "source_ids": np.int32,
}


def chunk_parts(
    batches: list[SourceBatch], encoded: list[pa.RecordBatch], labels_rule: str | None = None
) -> tuple[list[dict], dict]:
    """A chunk of ``batches`` and their encodings as one part per batch, and the chunk's meta (less its
    ``index``).

    A part holds the ``CHUNK_ARRAYS`` of its batch in their dtypes: views of the encoder's Arrow buffers
    where they already are, ``offsets`` from 0 (``num_samples + 1``), ``source_ids`` indexing the meta's
    ``sources``. A chunk has a ``loss_mask`` when any of its batches has one; the batches without one then
    get ``labels != -100`` (a chunk without any has none; read into a store where other chunks have one,
    its tokens get the same rule, so the packs do not depend on where chunks start). With ``labels_rule`` (a
    ``labels`` convention) the meta says whether every sample's labels follow the rule of
    ``layout.labels_follow_rule`` under it (what ``--columns minimal`` rebuilds).
    """
    sources: list[str] = []
    row_kinds: list[str] = []
    parts = []
    has_mask = any("loss_mask" in e.schema.names for e in encoded)
    for b, e in zip(batches, encoded, strict=True):
        if not sources or sources[-1] != b.source or row_kinds[-1] != b.row_kind:
            sources.append(b.source)
            row_kinds.append(b.row_kind)
        # list_parts: an encoder may return slices, whose .values is the whole child array
        offsets, ids = list_parts(e.column("input_ids"))
        labels = np.ascontiguousarray(list_parts(e.column("labels"))[1], dtype=np.int32)
        part = {
            "input_ids": np.ascontiguousarray(ids, dtype=np.int32),
            "labels": labels,
            "offsets": offsets,
            "rows": np.asarray(b.rows, dtype=np.int64),
            "source_ids": np.full(b.num_rows, len(sources) - 1, dtype=np.int32),
        }
        if has_mask:
            if "loss_mask" in e.schema.names:
                part["loss_mask"] = np.ascontiguousarray(list_parts(e.column("loss_mask"))[1], dtype=np.int8)
            else:
                part["loss_mask"] = (labels != IGNORE_INDEX).astype(np.int8)
        parts.append(part)
    meta = {
        "digest": chunk_digest(parts, CHUNK_ARRAYS, CHECKED),
        "num_samples": sum(b.num_rows for b in batches),
        "num_tokens": sum(int(p["offsets"][-1]) for p in parts),
        "has_loss_mask": has_mask,
        # samples with tokens but nothing to learn, as the encoder reported them (packtool.encoders.masking)
        "empty_loss_samples": sum(empty_loss_count(e)[0] for e in encoded),
        "empty_loss_tokens": sum(empty_loss_count(e)[1] for e in encoded),
        "sources": sources,
        "row_kinds": row_kinds,
        "labels_equal_input_ids": labels_equal_input_ids(parts),
    }
    if labels_rule is not None:
        shifted = labels_rule == "shifted"
        follow = all(
            labels_follow_rule(p["input_ids"], p["labels"], p.get("loss_mask"), p["offsets"], shifted)
            for p in parts
        )
        meta.update(labels_rule=labels_rule, labels_follow_rule=follow)
    return parts, meta


CHECKED = (*DIGESTED, "source_ids")  # the arrays a scratch chunk's ``digest`` covers (with the lengths)


def chunk_intact(scratch: Scratch | str | Path, meta: object, index: int) -> bool:
    """Whether scratch chunk ``index`` (its ``meta.json`` read back: ``meta``, None if unreadable) still
    holds what was written: its meta gives its ``meta_digest`` and names ``index``, every file in it is a
    regular file (a FIFO would block the reader), its arrays give ``meta["digest"]`` (a chunk without
    one, of an older packtool, is not trusted), and a vision-language chunk's images give
    ``images_digest`` with their files as they were when read. A chunk that cannot be read at all (a file
    emptied or cut, a header damaged) is not intact either: a resumed run encodes it again."""
    if (
        not isinstance(meta, dict)
        or meta.get("index") != index
        or meta.get("meta_digest") != meta_digest(meta)
    ):
        return False
    name, scratch = chunk_name(index), as_scratch(scratch)
    try:
        for file in scratch.names(name):  # a chunk in a store: its files fetched here first
            scratch.fetch(file)
        path = scratch.path(name)
        if path.is_symlink() or not all(stat.S_ISREG(p.lstat().st_mode) for p in path.iterdir()):
            return False
        arrays = {
            name: np.load(path / f"{name}.npy", mmap_mode="r", allow_pickle=False)
            for name in (*CHECKED, "offsets")
            if (path / f"{name}.npy").exists()
        }
        if "digest" not in meta or chunk_digest([arrays], CHUNK_ARRAYS, CHECKED) != meta["digest"]:
            return False
        return "images_digest" not in meta or images_intact(path, meta)  # and its image files as they were
    except Exception:  # (np.load of an emptied file raises EOFError; of a damaged header, most anything)
        return False


def _save_parts(path: Path, parts: list[np.ndarray], dtype) -> None:
    """``np.save(path, np.concatenate(parts).astype(dtype))`` without building the concatenation: the
    ``.npy`` header for the whole length, then each part written as it is (the encoder's Arrow buffers,
    usually), which saves a copy of every token."""
    dtype = np.dtype(dtype)
    header = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": (sum(map(len, parts)),),
    }
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for part in parts:
            np.ascontiguousarray(part, dtype=dtype).tofile(f)


CHUNK_LIST = "chunks.json"  # the metas of a run's chunks, in order, once all are encoded


def write_chunk_list(scratch: Scratch | str | Path, metas: list[dict]) -> None:
    scratch = as_scratch(scratch)
    scratch.local.mkdir(parents=True, exist_ok=True)
    with written_whole(scratch.path(CHUNK_LIST), fsync=False) as tmp:
        tmp.write_text(json.dumps(metas))
    scratch.publish(CHUNK_LIST)


def read_chunk_list(scratch: Scratch | str | Path) -> list[dict]:
    return json.loads(as_scratch(scratch).fetch(CHUNK_LIST, fresh=True).read_text())


def read_chunk_meta(scratch: Scratch | str | Path, index: int) -> object:
    """Chunk ``index``'s ``meta.json`` as JSON (fetched from the store when mirrored), None where it is
    missing, is no regular file or is no JSON (``chunk_intact`` says whether it is a chunk's whole meta)."""
    try:
        path = as_scratch(scratch).fetch(f"{chunk_name(index)}/meta.json")
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError):  # (none there, a JSONDecodeError, or bytes that are no UTF-8)
        return None


def labels_rule(options: PackOptions) -> str | None:
    """The ``labels`` convention whose rule a run checks its encoded labels against (``--columns minimal``
    stores labels only where they do not follow it: ``packtool.layout``); ``None`` for ``full``."""
    return options.encoding.labels if options.output.columns == "minimal" else None


OFFSETS_CACHE_BYTES = 64 << 20  # chunks' small arrays kept in memory (offsets: 8 bytes a sample: 8M samples)


@dataclass
class ChunkStore:
    """All encoded chunks of a run, memory-mapped, addressed by global sample index. ``scratch``: where
    the chunks are (``storage.scratch``: a chunk in a store is fetched here, a file at a time, when first
    read)."""

    scratch: Scratch | str | Path
    metas: list[dict]
    max_open: int | None = None  # chunks mapped at once (default: what the open-file limit allows)
    _open: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)
    _maps: dict = field(default_factory=dict, init=False, repr=False)
    _headers: dict = field(default_factory=dict, init=False, repr=False)
    _offsets: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)
    _offsets_bytes: int = field(default=0, init=False, repr=False)
    _zigzag: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.scratch = as_scratch(self.scratch)
        counts = np.array([m["num_samples"] for m in self.metas], dtype=np.int64)
        self.sample_starts = np.concatenate([[0], np.cumsum(counts)])
        self.has_loss_mask = any(m["has_loss_mask"] for m in self.metas)
        # every chunk's labels follow the rule the minimal layout rebuilds them by (recorded when encoded)
        self.labels_follow_rule = all(m.get("labels_follow_rule", False) for m in self.metas)
        self.labels_rule = next((m["labels_rule"] for m in self.metas if "labels_rule" in m), None)
        with_images = any("num_images" in m for m in self.metas)
        if self.max_open is None:  # an open chunk maps its token columns, and its image table and blob
            self.max_open = default_max_open(3 + len(MAPPED) * with_images)
        self.images = ChunkImages(self) if with_images else None  # a vision-language run's (pipeline.images)

    @property
    def work_dir(self) -> Path:
        """This machine's folder of the chunks."""
        return self.scratch.local

    def drop_caches(self) -> None:
        """Unmap every chunk and forget the small arrays and headers read (read again when next needed): a
        driver keeps nothing of them while its workers write."""
        self._open.clear()
        self._maps.clear()
        self._offsets.clear()
        self._offsets_bytes = 0
        self._headers.clear()

    def append_packs(self, packs: list[dict[str, np.ndarray]]) -> np.ndarray:
        """Store packs made by a custom ``pack_selected_samples`` as one more chunk, one new sample per
        ``seq_lens`` entry (numbered after every sample of the store), and return their sample numbers
        (``policy_chunk`` says what ``packs`` hold)."""
        first = self.num_samples
        index = max((m["index"] for m in self.metas), default=-1) + 1
        arrays, meta = policy_chunk(packs, self.labels_rule)
        final = self.scratch.path(chunk_name(index))
        shutil.rmtree(final, ignore_errors=True)
        final.mkdir(parents=True)
        for name, values in arrays.items():
            np.save(final / f"{name}.npy", values)
        meta = {"index": index, **meta}
        (final / "meta.json").write_text(json.dumps(meta))
        self.scratch.publish_dir(chunk_name(index), last="meta.json")
        self.metas.append(meta)
        self.__post_init__()
        write_chunk_list(self.scratch, self.metas)
        return first + np.arange(meta["num_samples"], dtype=np.int64)

    def samples(self, sample: np.ndarray, lengths: np.ndarray) -> list[dict]:
        """Samples as dicts (what a custom packing policy is given): ``index``, ``length`` and read-only
        views of their ``input_ids``, ``labels`` (and ``loss_mask``), ``length`` tokens from the start."""
        out = []
        chunk = np.searchsorted(self.sample_starts, sample, side="right") - 1
        for s, c, length in zip(sample.tolist(), chunk.tolist(), lengths.tolist(), strict=True):
            a = self.arrays(c)
            begin = int(a["offsets"][s - int(self.sample_starts[c])])
            d = {"index": s, "length": length}
            for key in self.keys:
                if key in a:
                    d[key] = a[key][begin : begin + length]
                else:  # a chunk without loss_mask in a store with one: trained where a label is
                    d[key] = (a["labels"][begin : begin + length] != IGNORE_INDEX).astype(np.int8)
            out.append(d)
        return out

    def origin(self, sample: np.ndarray) -> np.ndarray:
        """``(k,)`` int64 input index of each of ``sample``: itself, except for samples stored by a
        custom ``pack_selected_samples`` (chunks with ``origin`` in their meta): the input they came from."""
        sample = np.asarray(sample, dtype=np.int64)
        if not any(m.get("origin") for m in self.metas):
            return sample
        out = sample.copy()
        chunk = np.searchsorted(self.sample_starts, sample, side="right") - 1
        for c in np.unique(chunk).tolist():
            if self.metas[c].get("origin"):
                sel = np.flatnonzero(chunk == c)
                out[sel] = self._small(c, "origin")[sample[sel] - self.sample_starts[c]]
        return out

    @property
    def num_samples(self) -> int:
        return int(self.sample_starts[-1])

    def arrays(self, c: int) -> dict[str, np.ndarray]:
        """The memory-mapped arrays of chunk ``c`` (position in ``metas``)."""
        if c in self._open:
            self._open.move_to_end(c)
            return self._open[c]
        while len(self._open) >= self.max_open:
            old, _ = self._open.popitem(last=False)  # unmapped (and its descriptor closed) once unreferenced
            self._maps.pop(old, None)
        d = chunk_name(self.metas[c]["index"])
        names = ["input_ids", "labels"] + (["loss_mask"] if self.metas[c]["has_loss_mask"] else [])
        names += list(MAPPED) if "num_images" in self.metas[c] else []
        arrays, maps = {}, []
        for k in names:  # the token columns (and images) are mapped: one descriptor each while open
            arrays[k], m = self._map(self.scratch.fetch(f"{d}/{k}.npy"))
            if m is not None:
                maps.append(m)
        arrays["offsets"] = self.offsets(c)
        self._open[c], self._maps[c] = arrays, maps
        return arrays

    def offsets(self, c: int) -> np.ndarray:
        """``(num_samples + 1,)`` int64 token offsets of chunk ``c``'s samples (``cached``): locating pieces
        needs no map."""
        return self.cached(c, "offsets")

    def cached(self, c: int, name: str) -> np.ndarray:
        """A small per-sample array of chunk ``c`` (``offsets``, ``image_first``), read (no descriptor kept)
        and cached apart from the maps, up to ``OFFSETS_CACHE_BYTES`` in all."""
        o = self._offsets.get((c, name))
        if o is not None:
            self._offsets.move_to_end((c, name))
            return o
        o = self._offsets[(c, name)] = self._small(c, name)
        self._offsets_bytes += o.nbytes
        while self._offsets_bytes > OFFSETS_CACHE_BYTES and len(self._offsets) > 1:
            _, old = self._offsets.popitem(last=False)
            self._offsets_bytes -= old.nbytes
        return o

    def rows(self, c: int) -> np.ndarray:
        """``(num_samples,)`` int64: the input row (or line) of each of chunk ``c``'s samples."""
        return self._small(c, "rows")

    def _small(self, c: int, name: str) -> np.ndarray:
        """A chunk's per-sample array (``offsets``, ``rows``, ``source_ids``, ``origin``), read whole."""
        path = self.scratch.fetch(f"{chunk_name(self.metas[c]['index'])}/{name}.npy")
        with open(path, "rb") as f:
            shape, dtype, offset = self._header(str(path), f)
            f.seek(offset)
            return np.fromfile(f, dtype=dtype, count=int(np.prod(shape))).reshape(shape)

    def _header(self, key: str, f) -> tuple[tuple, np.dtype, int]:
        """``(shape, dtype, data offset)`` of the ``.npy`` file open as ``f``, parsed once per run."""
        head = self._headers.get(key)
        if head is None:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"{key}: not a .npy file written by write_chunk (version {version})")
            fmt = np.lib.format
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read(f)
            assert not fortran or len(shape) <= 1
            head = self._headers[key] = (shape, dtype, f.tell())
        return head

    def _map(self, path: Path) -> tuple[np.ndarray, mmap.mmap | None]:
        """A read-only ``.npy`` array mapped from ``path``, and its map.

        A plain ndarray over an ``mmap`` (``np.load(mmap_mode=...)`` parses the header with ``ast`` on
        every call, and slicing a ``np.memmap`` costs a subclass round trip): shuffled packs reopen chunks
        in every block, so the headers are parsed once per run and kept.
        """
        with open(path, "rb") as f:
            shape, dtype, offset = self._header(str(path), f)
            count = int(np.prod(shape))
            if count == 0:
                return np.zeros(shape, dtype=dtype), None
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(m, dtype=dtype, count=count, offset=offset).reshape(shape), m

    def release(self, c: int) -> None:
        """Drop the pages of chunk ``c``'s maps from this process's RSS (they stay in the page cache).

        Shuffled packs touch every chunk in every block; without this, the whole encoded input would count
        in the writer's resident memory by the end of a run.
        """
        if hasattr(mmap, "MADV_DONTNEED"):
            for m in self._maps.get(c, ()):
                m.madvise(mmap.MADV_DONTNEED)

    def pieces(self, sample: np.ndarray, start: np.ndarray, length: np.ndarray) -> dict[str, np.ndarray]:
        """The tokens of pieces end to end, in piece order: ``input_ids``/``labels`` ``(sum(length),)`` int32,
        and ``loss_mask`` int8 when the store has one (1 for chunks without).

        One slice copy per run of pieces that are contiguous in a chunk (no per-token index arrays).

        Args:
            sample: ``(k,)`` global sample index of each piece.
            start: ``(k,)`` offset of the piece's first token inside its sample.
            length: ``(k,)`` tokens in the piece.
        """
        length = np.asarray(length, dtype=np.int64)
        dest = np.zeros(len(length), dtype=np.int64)
        np.cumsum(length[:-1], out=dest[1:])
        total = int(length.sum())
        out = {k: np.empty(total, dtype=np.int8 if k == "loss_mask" else np.int32) for k in self.keys}
        self.pieces_into(sample, start, length, dest, out)
        return out

    @property
    def keys(self) -> list[str]:
        """The token columns a chunk holds: ``input_ids``, ``labels`` (and ``loss_mask``)."""
        return ["input_ids", "labels"] + (["loss_mask"] if self.has_loss_mask else [])

    def pieces_into(
        self,
        sample: np.ndarray,
        start: np.ndarray,
        length: np.ndarray,
        dest: np.ndarray,
        out: dict[str, np.ndarray],
    ) -> None:
        """Copy piece ``i`` to ``out[k][dest[i] : dest[i] + length[i]]`` for every key ``k`` of ``out``.

        One slice copy per run of pieces that are contiguous both in a chunk and in ``out`` (sequential
        plans: a whole pack at once), straight from the chunk's map into ``out``: no staging buffer, no
        per-token index arrays. ``out`` holds flat arrays (e.g. ``(k * N,)`` views of the pack arrays).
        """
        sample = np.asarray(sample, dtype=np.int64)
        start = np.asarray(start, dtype=np.int64)
        length = np.asarray(length, dtype=np.int64)
        dest = np.asarray(dest, dtype=np.int64)
        if not len(sample):
            return
        chunk = np.searchsorted(self.sample_starts, sample, side="right") - 1
        begin = self.sample_begins(chunk, sample) + start
        end = begin + length
        new_run = np.ones(len(sample), dtype=bool)
        new_run[1:] = (
            (chunk[1:] != chunk[:-1]) | (begin[1:] != end[:-1]) | (dest[1:] != dest[:-1] + length[:-1])
        )
        first = np.flatnonzero(new_run)
        last = np.append(first[1:], len(sample)) - 1
        # runs grouped by chunk (stable): one chunk mapped at a time, holding every used chunk's maps would
        # hold their file descriptors. The runs' bounds become Python lists once, each chunk's a slice of
        # them: a gather visits every chunk it draws from, and with many chunks the visits add up.
        order = np.argsort(chunk[first], kind="stable")
        run_chunk = chunk[first][order]
        cuts = np.flatnonzero(run_chunk[1:] != run_chunk[:-1]) + 1
        lo, hi = np.concatenate([[0], cuts]), np.append(cuts, len(run_chunk))
        visits = list(zip(run_chunk[lo].tolist(), lo.tolist(), hi.tolist(), strict=True))
        if len(visits) > self.max_open:
            # more chunks than stay open: each gather visits them in the other direction than the last, so
            # it starts with the chunks the last one left open instead of evicting them unused (LRU order)
            self._zigzag = not self._zigzag
            if self._zigzag:
                visits.reverse()
        to, src_begin, src_end = dest[first[order]], begin[first[order]], end[last[order]]
        bounds = (to.tolist(), (to + src_end - src_begin).tolist(), src_begin.tolist(), src_end.tolist())
        for c, i, j in visits:
            a = self.arrays(c)
            runs = [b[i:j] for b in bounds]
            copies = []
            for key, dst in out.items():
                src = a.get(key)
                if src is None:  # a chunk without loss_mask: trained where a label is (chunk_parts' rule)
                    labels = a["labels"]
                    for p, q, b, e in zip(*runs, strict=True):
                        dst[p:q] = labels[b:e] != IGNORE_INDEX
                elif src.dtype == dst.dtype:  # slices of memoryviews cost less than NumPy views
                    copies.append((memoryview(dst), memoryview(src)))
                else:
                    copies.append((dst, src))
            if len(copies) == 2:  # input_ids and labels in one pass over the runs
                (d1, s1), (d2, s2) = copies
                for p, q, b, e in zip(*runs, strict=True):
                    d1[p:q] = s1[b:e]
                    d2[p:q] = s2[b:e]
            else:
                for d, s in copies:
                    for p, q, b, e in zip(*runs, strict=True):
                        d[p:q] = s[b:e]
            del copies
            self.release(c)
            del a

    def values_at(self, sample: np.ndarray, offset: np.ndarray, key: str) -> np.ndarray:
        """``(k,)`` values of token column ``key`` (``labels``, ...) at ``offset`` inside each of ``sample``:
        one gather per chunk."""
        sample = np.asarray(sample, dtype=np.int64)
        out = np.empty(len(sample), dtype=np.int8 if key == "loss_mask" else np.int32)
        chunk = np.searchsorted(self.sample_starts, sample, side="right") - 1
        at = self.sample_begins(chunk, sample) + np.asarray(offset, dtype=np.int64)
        for c, sel in groups(chunk):
            out[sel] = self.arrays(c)[key][at[sel]]
        return out

    def sample_begins(self, chunk: np.ndarray, sample: np.ndarray) -> np.ndarray:
        """Where each of ``sample`` (global indices, in chunks ``chunk``) starts in its chunk's tokens."""
        begin = np.empty(len(sample), dtype=np.int64)
        for c, sel in groups(chunk):
            begin[sel] = self.offsets(c)[sample[sel] - self.sample_starts[c]]
        return begin

    def lengths(self) -> np.ndarray:
        """``(num_samples,)`` int64 tokens per sample, from the offsets alone."""
        parts = [np.diff(self.offsets(c)) for c in range(len(self.metas))]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def samples_per_source(self) -> dict[str, int]:
        """How many samples each source (a file, or an ``hf:`` name) gave, from the chunks' records."""
        counts: dict[str, int] = {}
        for c, meta in enumerate(self.metas):
            if meta.get("origin"):  # packs made by a custom policy: no input of their own
                continue
            per = np.bincount(self._small(c, "source_ids"), minlength=len(meta["sources"]))
            for source, n in zip(meta["sources"], per.tolist(), strict=True):
                counts[source] = counts.get(source, 0) + n
        return counts

    def locate(self, sample: int, field: str, message: str) -> InputError:
        """An ``InputError`` naming the file and row of global sample ``sample``."""
        c = int(np.searchsorted(self.sample_starts, sample, side="right") - 1)
        local = sample - int(self.sample_starts[c])
        sid = int(self._small(c, "source_ids")[local])
        return InputError(
            message,
            source=self.metas[c]["sources"][sid],
            row=int(self._small(c, "rows")[local]),
            field=field,
            row_kind=self.metas[c]["row_kinds"][sid],
        )
