"""The encode step: records -> encoded chunks on disk, by the engine's workers.

The driver groups the input stream into chunks of ``chunk_records`` records, fewer where they would hold
more than ``CHUNK_BYTES`` of input (``chunked``), in input order; each chunk is one task. A worker loads
its chunk (the row, line and file ranges the readers hand out lazily are read here, by the process that
encodes them), encodes it batch by batch and writes it to the scratch directory (``chunks.write_chunk``).
Chunk boundaries depend only on the input and the options, and the packs not even on them, so the output
does not depend on the number of workers, the engine or the chunk size.

A worker's state (the config and the encoder) is built once per process and run, by ``worker(spec)``:
every task carries the small ``RunSpec``, so any process (the driver, a pool worker, a Ray worker) can run
any task.

Bad records (``on_error``): a batch the encoder rejects is re-encoded record by record to find the bad
ones; the first is raised (``fail``) or all are left out and counted (``skip``) in the chunk's meta, so the
rest keep their order and the output stays the same for any number of workers.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.arrays import np_view
from packtool.encoders.registry import VISION_FORMATS, Encoder, build_encoder, resolve_sample_format
from packtool.errors import ErrorSink, InputError, PacktoolError
from packtool.options import PackOptions
from packtool.packing.planner import too_long_message
from packtool.pipeline import progress
from packtool.pipeline.chunks import (
    ChunkStore,
    chunk_name,
    labels_rule,
    read_chunk_list,
    write_chunk,
    write_chunk_list,
)
from packtool.pipeline.options import CHUNK_BYTES
from packtool.pipeline.report import name_special_tokens
from packtool.readers.base import SourceBatch
from packtool.readers.inputs import expand_inputs, piece_bytes, read_inputs, record_bytes
from packtool.readers.parquet import num_rows as parquet_rows
from packtool.storage.scratch import Scratch, as_scratch
from packtool.storage.urls import configure as configure_storage


@dataclass(frozen=True)
class RunSpec:
    """What a process needs to run a task of one run: the config (as JSON), the resolved sample format,
    a token unique to the run (a long-lived worker, e.g. Ray's, serves several runs), and what the
    driver's encoder found that a worker's need not find again (``Encoder.state()``, JSON; a vision
    processor's probes)."""

    config: str
    sample_format: str
    token: str
    encoder_state: str = "null"


class Worker:
    """One process's state for one run: the options, the encoder (built when first used: a process that
    only writes shards never loads a processor), the chunk stores it reads."""

    def __init__(self, spec: RunSpec) -> None:
        self.options = PackOptions.from_dict(json.loads(spec.config), given=set())  # checked by the driver
        self.sample_format, self.encoder_state = spec.sample_format, spec.encoder_state
        self.stores: dict[Scratch, ChunkStore] = {}
        configure_storage(self.options.running.storage_options)  # a process the run started: its stores
        self._encoder: Encoder | None = None

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            n = self.options.packing.packed_sequence_size
            state = json.loads(self.encoder_state)
            self._encoder = build_encoder(self.options.encoding, self.sample_format, n, state)
        return self._encoder

    def store(self, scratch: Scratch) -> ChunkStore:
        scratch = as_scratch(scratch)
        if scratch not in self.stores:
            self.stores[scratch] = ChunkStore(scratch, read_chunk_list(scratch))
        return self.stores[scratch]


_WORKER: list[tuple[tuple[str, str, str], Worker]] = []  # this process's: (its run's key, its state)


def worker(spec: RunSpec) -> Worker:
    """This process's state for ``spec``'s run, made on first use and kept for the run (whatever
    ``encoder_state`` a later spec of the same run carries: the process that found it keeps its own)."""
    key = (spec.config, spec.sample_format, spec.token)
    if not _WORKER or _WORKER[0][0] != key:
        _WORKER[:] = [(key, Worker(spec))]
    return _WORKER[0][1]


@dataclass(frozen=True)
class EncoderFacts:
    """What the run's driver needs of the encoder: ``state``, its ``Encoder.state()`` as JSON (what the
    other workers need not find again); ``identity``, ``Encoder.identity()`` (in the run id); ``named``,
    that identity with the special tokens' names (``report.name_special_tokens``, for the manifest); and
    ``warnings``, the tokens chosen by their names alone."""

    state: str
    identity: dict
    named: dict
    warnings: list[str]


PROBE_RECORDS = 16  # the first records a custom encoder is run on for its identity


def describe_encoder(task: tuple[RunSpec, dict, int, SourceBatch | None]) -> EncoderFacts:
    """Build this process's encoder for ``(spec, named, pad_token_id, first)`` (a bad tokenizer or processor
    fails here, before any record is encoded) and return what the driver needs of it (``EncoderFacts``;
    ``named``: the BOS/EOS the user named). An encoder that is code (a custom one) is run on the run's
    first ``PROBE_RECORDS`` records (of the batch ``first``), and its identity holds the digest of what it
    made of them. Run by the driver,
    or by a worker for a sample format whose encoder is slow to build (``encoders.registry.SLOW_TO_BUILD``):
    the driver then never loads it."""
    spec, named, pad_token_id, first = task
    encoder = worker(spec).encoder
    state = encoder.state() if hasattr(encoder, "state") else None
    identity = encoder.identity()
    if first is not None and hasattr(encoder, "probe"):
        try:
            records = first.slice(0, min(first.num_rows, PROBE_RECORDS)).load(ErrorSink("skip"))
        except PacktoolError:  # (the run meets it again, and says so, when it reads these records)
            records = []
        identity["probe_sha256"] = encoder.probe(records)
    with_names, guesses = name_special_tokens(identity, encoder, named, pad_token_id)
    return EncoderFacts(json.dumps(state), identity, with_names, guesses)


def encode_chunk(
    spec: RunSpec, index: int, pieces: list[SourceBatch], scratch: Scratch, start: int = 0
) -> dict:
    """Encode one chunk (its first record the input's ``start``-th) and write it to the ``scratch`` (on
    this machine, and published to the store of a mirrored one); returns its meta. Every engine runs this
    function."""
    progress.step_done("encode_chunk", index)  # a test may kill the worker here (out of memory)
    scratch = as_scratch(scratch)
    kept, encoded, extra = encode_records(spec, pieces)
    extra["input_start"] = start
    rule = labels_rule(worker(spec).options)
    meta = write_chunk(scratch.local, index, kept, encoded, extra, labels_rule=rule)
    scratch.publish_dir(chunk_name(index), last="meta.json")
    return meta


def encode_records(
    spec: RunSpec, pieces: list[SourceBatch]
) -> tuple[list[SourceBatch], list[pa.RecordBatch], dict]:
    """Load and encode the records of one chunk: the records kept, their encodings, and what the chunk's
    meta adds about them (``skipped``, ``input_rows``). Bad records go by the run's ``on_error``; under
    ``long_samples=error`` the first sample too long fails here."""
    w = worker(spec)
    sink = ErrorSink(w.options.running.on_error, rename=FileNames.of(pieces))
    limit = precut_limit(w.options, spec.sample_format)
    cut = 0
    try:
        if limit is not None:  # a text record far longer than the tokens kept is cut before it is tokenized
            pieces, cut = _precut_pieces(pieces, w.options.encoding.text_field, limit, sink)
        kept, encoded = encode_batches(w.encoder, pieces, sink)
        if w.options.packing.long_samples == "error" and not w.options.packing.split_across_pack:
            check_lengths(kept, encoded, w.options, spec.sample_format)  # fail at once, not after the input
    except InputError as e:  # (one the sink did not see: named as the sink names them)
        raise sink.named(e) from None
    # in meta.json: a resumed run counts the chunk's skipped records, and compares input_rows (rows or
    # lines of input the chunk covers, bad and blank ones included) with the chunk it would make
    extra = {"skipped": sink.to_dict(), "input_rows": sum(p.num_rows for p in pieces)}
    if cut:
        extra["precut_samples"] = cut
    return kept, encoded, extra


@dataclass(frozen=True)
class FileNames:
    """The files a chunk's records of a directory are (``readers.text.TextFiles``: a record per file,
    numbered in its directory): an error about one names that file, as one found reading it does, not
    the directory and the file's number."""

    files: dict[tuple[str, int], str]

    @staticmethod
    def of(pieces: list[SourceBatch]) -> FileNames | None:
        files = {
            (piece.source, piece.first_row + k): name
            for piece in pieces
            if piece.row_kind == "file" and isinstance(getattr(piece, "files", None), list)
            for k, name in enumerate(piece.files)
        }
        return FileNames(files) if files else None

    def __call__(self, err: InputError) -> InputError:
        name = self.files.get((err.source, err.row)) if err.row_kind == "file" else None
        if name is None:
            return err
        named = InputError(err.reason, source=name, field=err.field, code=err.code)
        named.hint = err.hint
        return named


# --long-samples truncate keeps a text sample's first N tokens: a text of more than this many characters
# a token (and at least PRECUT_FLOOR) is cut to that length before it is tokenized, so that one huge record
# (50 MB) costs what N tokens need, not minutes and gigabytes (docs/errors.md; recorded in the manifest)
PRECUT_CHARS_PER_TOKEN = 64
PRECUT_FLOOR = 1 << 20


def precut_limit(options: PackOptions, sample_format: str) -> int | None:
    """Characters a text sample is cut to before tokenizing under ``--long-samples truncate``: ``max(N *
    PRECUT_CHARS_PER_TOKEN, PRECUT_FLOOR)``, far past where its first N tokens end; None when the whole
    text counts (another ``long_samples``, ``split_across_pack``, a format other than ``text``).

    >>> options = PackOptions.of(
    ...     inputs=["x"], tokenizer="t", long_samples="truncate", packed_sequence_size=64
    ... )
    >>> precut_limit(options, "text")
    1048576
    """
    packing = options.packing
    if sample_format != "text" or packing.long_samples != "truncate" or packing.split_across_pack:
        return None
    return max(packing.packed_sequence_size * PRECUT_CHARS_PER_TOKEN, PRECUT_FLOOR)


def _precut_pieces(
    pieces: list[SourceBatch], field: str, limit: int, sink: ErrorSink
) -> tuple[list[SourceBatch], int]:
    """``pieces`` loaded (bad records met go to ``sink``), every string ``field`` value longer than
    ``limit`` characters cut to ``limit`` (Arrow kernels, no per-record Python); and how many were cut."""
    out, cut = [], 0
    for b in (b for piece in pieces for b in piece.load(sink)):
        rb = b.batch
        col = rb.column(field) if field in rb.schema.names else None
        if col is None or not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            out.append(b)  # the encoder names what is wrong with it
            continue
        lengths = pc.utf8_length(col)
        if (pc.max(lengths).as_py() or 0) <= limit:  # nearly always; and comparing with a Python int
            out.append(b)  # makes Arrow import pandas (0.2 s in every process that encodes)
            continue
        long = pc.fill_null(pc.greater(lengths, limit), False)
        n = pc.sum(long).as_py() or 0
        if n:
            short = pc.if_else(long, pc.utf8_slice_codeunits(col, 0, limit), col)
            rb = rb.set_column(rb.schema.get_field_index(field), field, short)
            b = SourceBatch(b.source, rb, b.rows, b.row_kind)
            cut += n
        out.append(b)
    return out, cut


def encode_chunks(tasks: list[tuple[RunSpec, int, list[SourceBatch], Scratch, int]]) -> list[dict]:
    """Several consecutive chunks in one task: a worker reading lazy Parquet rows then continues one
    stream through them instead of decoding the row groups that other workers' chunks share."""
    return [encode_chunk(*task) for task in tasks]


def encode_batches(
    encoder: Encoder, pieces: list[SourceBatch], sink: ErrorSink
) -> tuple[list[SourceBatch], list[pa.RecordBatch]]:
    """Load ``pieces`` and encode them batch by batch; returns the records kept and their encodings."""
    kept, encoded = [], []
    for piece in pieces:
        for b in piece.load(sink):
            good, enc = encode_checked(encoder, b, sink)
            if good.num_rows:
                kept.append(good)
                encoded.append(enc)
        progress.report(piece_bytes(piece))  # the encode bar moves within a chunk
    return kept, encoded


def check_lengths(
    kept: list[SourceBatch], encoded: list[pa.RecordBatch], options: PackOptions, sample_format: str
) -> None:
    """Under ``long_samples=error``: ``InputError`` naming the first sample of the chunk longer than
    ``packed_sequence_size`` (the planner would stop there too, but only once the whole input is encoded)."""
    n = options.packing.packed_sequence_size
    field = {"text": options.encoding.text_field, "pretokenized": "input_ids"}.get(sample_format, "input_ids")
    per_batch = [np.diff(np_view(enc.column("input_ids").offsets)) for enc in encoded]
    for batch, lengths in zip(kept, per_batch, strict=True):
        long = np.flatnonzero(lengths > n)
        if len(long):
            i = int(long[0])
            # the chunk's samples say how common such samples are: the first error tells it
            everything = np.concatenate(per_batch)
            cuts = {"vision": "never", "interleaved": "between_images"}.get(sample_format, "anywhere")
            message = too_long_message(int(lengths[i]), n, everything, "this chunk's", cuts)
            raise batch.error(i, field, message, "too_long")


def encode_checked(
    encoder: Encoder, batch: SourceBatch, sink: ErrorSink
) -> tuple[SourceBatch, pa.RecordBatch | None]:
    """Encode ``batch``; if the encoder rejects it, find the bad records one by one and hand them to ``sink``.

    Returns the records kept (all of them unless ``sink`` skips some) and their encoding (None if none is
    left). Under ``on_error=fail`` the first bad record's error is raised, naming its row and field.
    """
    try:
        return batch, encoder(batch)
    except InputError as e:
        batch_error = e
    bad = []
    for i in range(batch.num_rows):
        try:
            encoder(batch.take([i]))
        except InputError as e:
            sink.bad(e)
            bad.append(i)
    if not bad:  # no single record reproduces it
        raise batch_error
    keep = np.setdiff1d(np.arange(batch.num_rows), bad)
    good = batch.take(keep)
    return good, (encoder(good) if len(keep) else None)


CHUNK_RECORDS = 4096  # records per chunk by default
VISION_CHUNK_RECORDS = 256  # a vision-language chunk's images (bytes held in records) stay in memory


def chunk_records(options: PackOptions, sample_format: str) -> int:
    """Records per encoding chunk at most: ``--chunk-size``, else ``CHUNK_RECORDS``
    (``VISION_CHUNK_RECORDS`` for vision samples). It cuts the work only: the packs and the run id are the
    same for any."""
    if options.running.chunk_size is not None:
        return options.running.chunk_size
    return VISION_CHUNK_RECORDS if sample_format in VISION_FORMATS else CHUNK_RECORDS


def chunked(
    batches: Iterator[SourceBatch], chunk_size: int, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[list[SourceBatch]]:
    """Group batches into chunks of ``chunk_size`` records, or fewer where they would hold more than
    ``chunk_bytes`` bytes of input (``readers.inputs.record_bytes``; a larger record is a chunk of its
    own), in input order. Where a chunk ends depends on the input and the two limits alone, never on
    the workers."""
    chunk: list[SourceBatch] = []
    rows = size = 0
    for b in batches:
        ends = np.cumsum(record_bytes(b))  # bytes of the batch up to each record, that one included
        start = 0
        while start < b.num_rows:
            before = int(ends[start - 1]) if start else 0
            room = ends[start : start + chunk_size - rows]
            take = int(np.searchsorted(room, before + chunk_bytes - size, side="right"))
            if take == 0 and rows:  # the next record does not fit: the chunk is done
                yield chunk
                chunk, rows, size = [], 0, 0
                continue
            take = max(take, 1)
            chunk.append(b if (start == 0 and take == b.num_rows) else b.slice(start, take))
            rows += take
            size += int(ends[start + take - 1]) - before
            start += take
            if rows == chunk_size:
                yield chunk
                chunk, rows, size = [], 0, 0
    if chunk:
        yield chunk


def batched(items: Iterator, n: int) -> Iterator[list]:
    while batch := list(itertools.islice(items, n)):
        yield batch


def chunks_per_task(options: PackOptions, workers: int) -> int:
    """Chunks per encode task: 1 unless every input is Parquet (whose rows the workers read), where a
    worker given consecutive chunks reads them as one stream; then about 4 tasks per worker (input rows
    known from the footers), at most 8 chunks each. Only how work is handed out depends on ``workers``,
    never a chunk's bytes."""
    if workers <= 1:
        return 1
    rows = 0
    for kind, source, _ in expand_inputs(options.reading.inputs, options.reading.files):
        if kind != "parquet":
            return 1
        rows += parquet_rows(source)
    chunks = -(-rows // chunk_records(options, "pretokenized"))
    return max(1, min(8, -(-chunks // (4 * workers))))


def encode_to_chunks(
    spec: RunSpec,
    options: PackOptions,
    batches: Iterator[SourceBatch],
    scratch: Scratch,
    engine: Any,
    on_chunk: Callable[[dict, bool], None] = lambda meta, new: None,
    done: dict[int, dict] | None = None,
) -> list[dict]:
    """Encode ``batches`` into chunks in the ``scratch`` with ``engine``; returns every chunk's meta in
    order and writes the list (``chunks.json``). ``done`` holds chunks a killed attempt of this run
    finished: a chunk covering the same input rows is not encoded again (its records are still read past).
    ``on_chunk`` is called with each chunk's meta as it is finished (with ``input_bytes``, the bytes of
    input it covers where known: ``readers.piece_bytes``), and whether it was encoded now (progress, test
    hooks)."""
    done = done if done is not None else {}
    scratch = as_scratch(scratch)
    reused: dict[int, dict] = {}

    handed: dict[int, int] = {}  # chunk -> bytes of input it covers, where known (progress)

    def tasks() -> Iterator[tuple[RunSpec, int, list[SourceBatch], Scratch, int]]:
        start = 0  # input rows before the chunk: a kept chunk must cover the same rows
        for i, chunk in enumerate(chunked(batches, chunk_records(options, spec.sample_format))):
            rows = sum(b.num_rows for b in chunk)
            meta = done.get(i)
            if meta is not None and (meta.get("input_start"), meta.get("input_rows")) == (start, rows):
                reused[i] = meta
                on_chunk({**meta, "input_bytes": sum(piece_bytes(b) for b in chunk)}, False)
            else:
                handed[i] = sum(piece_bytes(b) for b in chunk)
                yield (spec, i, chunk, scratch, start)
            start += rows

    metas = []
    group = chunks_per_task(options, engine.workers)
    for group_metas in engine.map(encode_chunks, batched(tasks(), group)):
        for meta in group_metas:
            metas.append(meta)
            on_chunk({**meta, "input_bytes": handed.pop(meta["index"], 0)}, True)
    metas = sorted([*metas, *reused.values()], key=lambda m: m["index"])
    assert [m["index"] for m in metas] == list(range(len(metas)))
    write_chunk_list(scratch, metas)
    return metas


# what the readers find wrong with a record while they read it, before the encoder sees the records ahead
READ_ERRORS = frozenset({"malformed_json", "not_object", "too_deep", "not_utf8"})


def first_bad_record(options: PackOptions, err: InputError) -> InputError:
    """Under ``on_error=fail``, the error of the first bad record: ``err`` or one before it in its file.

    A record the reader rejects (malformed JSON at line 52) is met while its lines are read, ahead of the
    encoder, which has not yet seen a bad record before it (a text that is not a string at line 51). On
    such an error the file is read again up to it, skipping, and its records encoded: the first bad one
    found is the error (the same ``errors.jsonl`` lists first under ``--on-error skip``).
    """
    if options.running.on_error != "fail" or err.code not in READ_ERRORS:
        return err
    if err.row is None or err.source is None:
        return err
    probe = ErrorSink("skip")
    batches = [
        b
        for b in itertools.takewhile(
            lambda b: b.rows[0] < err.row,
            read_inputs(
                [err.source],
                split=options.reading.split,
                text_field=options.encoding.text_field,
                sink=probe,
                files=options.reading.files,
            ),
        )
    ]
    if not batches:
        return err
    try:
        sample_format = resolve_sample_format(options.encoding, batches[0].schema.names)
        encoder = build_encoder(options.encoding, sample_format, options.packing.packed_sequence_size)
        for b in batches:
            encode_checked(encoder, b.take(np.flatnonzero(b.rows < err.row)), probe)
    except PacktoolError:  # the encoder cannot be built here, or no record alone is bad: err stands
        return err
    earlier = [e for e in probe.entries if e["row"] is not None and e["row"] < err.row]
    if not earlier:
        return err
    first = min(earlier, key=lambda e: e["row"])
    try:
        ErrorSink("fail").bad(
            InputError(
                first["message"],
                source=first["source"],
                row=first["row"],
                field=first["field"],
                row_kind=first["row_kind"],
                code=first["reason"],
            )
        )
    except InputError as e:  # the same error, with the same hint, as a run that met it first
        return e
    return err
