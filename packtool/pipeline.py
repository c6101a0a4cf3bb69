"""``packtool pack`` as four steps: read -> encode -> plan -> write.

* **read** (this process): inputs are streamed as ``SourceBatch`` objects and grouped into chunks of
  ``chunk_size`` records, in input order. Parquet rows and JSON Lines are handed out as row and line
  ranges (``ParquetRows``, ``JsonlLines``) that the process encoding them reads, so a chunk of them
  counts rows or lines (blank and bad ones included), not records.
* **encode** (engine, parallel by chunk): each chunk goes through the encoder and is written to the
  scratch directory as flat token arrays (``packtool.writers.chunks``).
* **plan** (this process): sample lengths are read from the chunks' offsets and packed by the strategy
  into a ``PackPlan``; no token is touched.
* **write** (engine, parallel by pack range): each shard gathers its packs' tokens from the chunks with
  vectorized copies and writes them; the manifest is written last and the directory renamed into place.

Chunk and shard boundaries depend only on the config, never on the number of processes, so the output
is byte-identical for every ``num_proc`` and engine.

**Resuming.** The run's identity (``run_id``: config minus runtime keys, input names and sizes, tokenizer
identity; plus the input files' modification times and packtool's version) is recorded in
``<output>.partial/_work/run.json``. A run started again with the same command after being killed
(SIGKILL included) or interrupted finds it, skips the chunks whose ``meta.json`` exists (it still
streams past their records, but does not encode them again) and the shards whose
``_work/shards/packs-NNNNNN.json`` exists, and writes the same bytes as an uninterrupted run.

Bad records (``on_error``) are handled by one ``ErrorSink`` per place they arise: the readers' (this
process, in input order) and one per encoded chunk (returned in the chunk's meta, merged in chunk order).
A batch the encoder rejects is re-encoded record by record to find the bad records: the first one is
raised (``fail``) or all are left out and counted (``skip``), so the rest keep their order and the output
stays the same for any ``num_proc``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool import __version__
from packtool.config import PackConfig
from packtool.encoders import build_encoder, fields_read, resolve_sample_format
from packtool.engines import make_engine
from packtool.errors import MAX_LOGGED, ErrorSink, InputError, PacktoolError
from packtool.packing import PackPlan, make_plan
from packtool.readers import expand_inputs, read_inputs
from packtool.readers.base import SourceBatch
from packtool.reading import samples_per_pack_stats, total_stats
from packtool.utils import file_sha256
from packtool.writers import OutputDir, build_pack_arrays, write_chunk, write_parquet_shard, write_tar_shard
from packtool.writers.chunks import ChunkStore, read_chunk_meta
from packtool.writers.output import write_json_atomic
from packtool.writers.webdataset import shard_bounds, write_dataset_index

# 2: every pack's .json member in a tar shard carries the run_id and shard number (verify matches them)
FORMAT_VERSION = 2

# tokens gathered into packs at once when writing Parquet (whole row groups; 4 MiB per int32 column). On
# 1M shuffled samples (N=4096) a gather of 256 packs cost 0.34 s a shard against 0.45 s for 128 and 0.24 s
# for 512; 512 peaked 41 MiB higher than 256 at 400k samples (scripts/bench_memory.py: 313 vs 272 MiB).
GATHER_TOKENS = 1 << 20

# --- worker state: built once per process by ``_init_worker`` --------------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(config: dict, sample_format: str, run: str) -> None:
    """Build this process's worker state for the run ``run``, once: the driver builds it first (its
    encoder fails fast on a bad tokenizer), and it runs tasks itself too (``--num-proc 1``, or while the
    workers start), so the engine's own call in the driver finds it built."""
    if _WORKER.get("run") == run:
        return
    cfg = PackConfig.from_dict(config)
    _WORKER.clear()
    _WORKER.update(run=run, config=cfg, encoder=build_encoder(cfg, sample_format), stores={})


def init_run(config: PackConfig, sample_format: str) -> tuple[Any, tuple]:
    """Start a run in this process: its worker state (the encoder fails fast here on a bad tokenizer
    spec), and the ``_init_worker`` arguments for the engine. Returns ``(encoder, initargs)``."""
    initargs = (config.to_dict(), sample_format, os.urandom(8).hex())
    _init_worker(*initargs)
    return _WORKER["encoder"], initargs


def _encode_chunk(task: tuple[int, list[SourceBatch], str]) -> dict:
    """Encode one chunk and write it to the scratch directory; every engine runs this same function."""
    index, pieces, work_dir = task
    sink = ErrorSink(_WORKER["config"].on_error)
    kept, encoded = encode_batches(_WORKER["encoder"], pieces, sink)
    # kept in meta.json: a resumed run counts the chunk's skipped records, and compares input_rows (rows
    # or lines of input the chunk covers, bad and blank ones included) with the chunk it would make
    extra = {"skipped": sink.to_dict(), "input_rows": sum(p.num_rows for p in pieces)}
    return write_chunk(work_dir, index, kept, encoded, extra)


def encode_batches(
    encoder, pieces: list[SourceBatch], sink: ErrorSink
) -> tuple[list[SourceBatch], list[pa.RecordBatch]]:
    """The encode loop: load ``pieces`` (lazy Parquet rows are read here, by the process that encodes
    them) and encode them batch by batch; returns the records kept and their encodings, in order."""
    kept, encoded = [], []
    for b in (b for piece in pieces for b in piece.load(sink)):
        good, enc = encode_checked(encoder, b, sink)
        if good.num_rows:
            kept.append(good)
            encoded.append(enc)
    return kept, encoded


def _encode_chunks(tasks: list[tuple[int, list[SourceBatch], str]]) -> list[dict]:
    """Several consecutive chunks in one task: a worker reading lazy Parquet rows then continues one
    stream through them instead of decoding the row groups that other workers' chunks share."""
    return [_encode_chunk(t) for t in tasks]


def encode_checked(encoder, batch: SourceBatch, sink: ErrorSink) -> tuple[SourceBatch, pa.RecordBatch | None]:
    """Encode ``batch``; if the encoder rejects it, find the bad records one by one and hand them to ``sink``.

    Returns the records kept (all of them unless ``sink`` skips some) and their encoding (None if none
    is left). Under ``on_error=fail`` the first bad record's error is raised, naming its row and field.
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


def _store(work_dir: str) -> ChunkStore:
    stores = _WORKER.setdefault("stores", {})
    if work_dir not in stores:
        metas = json.loads((Path(work_dir) / "chunks.json").read_text())
        stores[work_dir] = ChunkStore(Path(work_dir), metas)
    return stores[work_dir]


def _write_shard(task: tuple[int, PackPlan, str, str, dict]) -> dict:
    index, plan, work_dir, out_dir, meta = task
    cfg: PackConfig = _WORKER["config"]
    store = _store(work_dir)
    if cfg.format == "webdataset":
        name = f"packs-{index:06d}.tar"
        path = Path(out_dir) / name
        info = write_tar_shard(
            path,
            build_pack_arrays(plan, store, cfg.pad_token_id),
            first_pack=meta["first_pack"],
            run_id=meta["run_id"],
            shard=index,
        )
    else:
        # a few row groups at a time (GATHER_TOKENS): each gather visits every chunk its pieces are in,
        # so fewer, larger gathers cost fewer chunk visits, while the block's arrays stay small (peak RSS)
        rg = cfg.row_group_size
        step = max(rg, GATHER_TOKENS // cfg.packed_sequence_size // rg * rg)
        packs = (
            build_pack_arrays(plan.slice(a, min(a + step, plan.num_packs)), store, cfg.pad_token_id)
            for a in range(0, plan.num_packs, step)
        )
        name = f"packs-{index:06d}.parquet"
        path = Path(out_dir) / name
        info = write_parquet_shard(
            path, packs, row_group_size=cfg.row_group_size, metadata={**meta, "shard": index}
        )
    used = int(plan.length.sum())
    info = {
        "path": name,
        "first_pack": meta["first_pack"],
        "num_packs": plan.num_packs,
        "num_tokens": used,
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
        **info,
    }
    write_json_atomic(_shard_record(work_dir, index), info)  # the shard is done: a resumed run skips it
    return info


def _shard_record(work_dir: str, index: int) -> Path:
    return Path(work_dir) / "shards" / f"packs-{index:06d}.json"


def _finished_shard(work_dir: str, out_dir: str, index: int) -> dict | None:
    """The record of shard ``index`` if an earlier attempt of this run wrote it whole, else None."""
    record = _shard_record(work_dir, index)
    if not record.exists():
        return None
    info = json.loads(record.read_text())
    shard = Path(out_dir) / info["path"]
    return info if shard.exists() and shard.stat().st_size == info["bytes"] else None


def _fault(step: str, done: int) -> None:
    """Test hook: ``PACKTOOL_TEST_KILL=STEP:N`` SIGKILLs this process once N items of STEP are done.

    STEP is ``encode`` (chunks) or ``write`` (shards); it lets the tests kill a job at a chosen point.
    """
    spec = os.environ.get("PACKTOOL_TEST_KILL")
    if spec and spec == f"{step}:{done}":
        os.kill(os.getpid(), signal.SIGKILL)


# --- the driver ----------------------------------------------------------------------------------------
def chunked(batches: Iterator[SourceBatch], chunk_size: int) -> Iterator[list[SourceBatch]]:
    """Group batches into chunks of exactly ``chunk_size`` records (the last may be smaller)."""
    chunk: list[SourceBatch] = []
    size = 0
    for b in batches:
        start = 0
        while start < b.num_rows:
            take = min(chunk_size - size, b.num_rows - start)
            piece = b if (start == 0 and take == b.num_rows) else b.slice(start, take)
            chunk.append(piece)
            size += take
            start += take
            if size == chunk_size:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


def _batched(items: Iterator, n: int) -> Iterator[list]:
    while batch := list(itertools.islice(items, n)):
        yield batch


def _task_group(config: PackConfig, workers: int) -> int:
    """Chunks per encode task: 1 unless every input is Parquet (whose rows the workers read), where a
    worker given consecutive chunks reads them as one stream; then about 4 tasks per worker (input rows
    known from the footers), at most 8 chunks each. Only how work is handed out depends on ``workers``
    (the engine's parallelism), never a chunk's bytes."""
    if workers <= 1:
        return 1
    rows = 0
    for kind, source, _ in expand_inputs(config.inputs):
        if kind != "parquet":
            return 1
        rows += pq.ParquetFile(source).metadata.num_rows
    chunks = -(-rows // config.chunk_size)
    return max(1, min(8, -(-chunks // (4 * workers))))


def input_fingerprint(inputs: list[str]) -> list[dict]:
    """Names and sizes of the input files (what the run_id is made from)."""
    out = []
    for kind, source, files in expand_inputs(inputs):
        paths = files or ([source] if Path(source).is_file() else [])
        if Path(source).is_dir() and not files:
            paths = sorted(str(p) for p in Path(source).rglob("*") if p.is_file())
        out.append({"source": source, "kind": kind, "bytes": sum(os.path.getsize(p) for p in paths)})
    return out


def input_stamps(inputs: list[str]) -> list[list]:
    """``[path, size, mtime_ns]`` of every input file: a resumed run must see the very same files."""
    out = []
    for _kind, source, files in expand_inputs(inputs):
        paths = files or ([source] if Path(source).is_file() else [])
        if Path(source).is_dir() and not files:
            paths = sorted(str(p) for p in Path(source).rglob("*") if p.is_file())
        for p in paths:
            st = os.stat(p)
            out.append([str(p), st.st_size, st.st_mtime_ns])
        if not paths:
            out.append([source, None, None])
    return out


def run_pack(config: PackConfig, *, progress: bool | None = None) -> dict:
    """Run ``packtool pack`` for ``config``; return the manifest. Raises ``PacktoolError`` subclasses.

    On every error it reports (bad input or options, disk full, internal error) the partial directory is
    removed: nothing is left behind. When the job is interrupted (Ctrl-C) or killed it is kept, so that the
    same command resumes the run.
    """
    config.validate()
    show = (not config.quiet) if progress is None else progress
    out = OutputDir(config.output, overwrite=config.overwrite).open()
    try:
        manifest = _run(config, out, show)
        out.commit(manifest)
        return manifest
    except OSError as e:  # reading errors are InputError by now: this is the output (disk full, ...)
        out.abort()
        detail = os.strerror(e.errno) if e.errno else str(e)
        raise PacktoolError(
            f"{config.output}: cannot write the output ({detail}; is the disk full?); nothing was left behind"
        ) from e
    except Exception:
        out.abort()
        raise
    except BaseException:  # KeyboardInterrupt: keep the finished work for a resume
        out.abort(keep=True)
        raise


def _note(config: PackConfig, message: str) -> None:
    if not config.quiet:
        print(f"packtool: {message}", file=sys.stderr, flush=True)


def _progress(show: bool, **kw):
    from tqdm import tqdm

    return tqdm(disable=not show, file=sys.stderr, dynamic_ncols=True, **kw)


class _FieldsRead:
    """``read_inputs``' ``used_fields`` for a run: the sample format is resolved once, from the fields of
    the first batch that needs it (the readers ask only when a field cannot be one column)."""

    def __init__(self, config: PackConfig) -> None:
        self.config, self.sample_format = config, None

    def __call__(self, names: list[str]) -> frozenset[str] | None:
        if self.sample_format is None:
            self.sample_format = resolve_sample_format(self.config, names)
        return fields_read(self.config, self.sample_format)


def _run(config: PackConfig, out: OutputDir, show: bool) -> dict:
    sink = ErrorSink(config.on_error)  # bad records met while reading
    fields = _FieldsRead(config)
    # workers (local processes or Ray tasks) read their own Parquet rows: the driver hands out row ranges
    batches = read_inputs(
        config.inputs,
        split=config.split,
        text_field=config.text_field,
        sink=sink,
        lazy=True,
        used_fields=fields,
    )
    first = next(batches, None)
    if first is None:
        raise InputError(_nothing_left(sink), source=", ".join(config.inputs), code="empty_input")
    if fields.sample_format is None:
        fields.sample_format = resolve_sample_format(config, first.schema.names)
    sample_format = fields.sample_format
    encoder, worker_args = init_run(config, sample_format)
    work = str(out.work)
    fingerprint = input_fingerprint(config.inputs)
    identity = encoder.identity()
    config_dict = config.to_dict(include_runtime=False)
    run_id = hashlib.sha256(
        json.dumps([config_dict, identity, fingerprint, FORMAT_VERSION], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]

    resume = out.begin({"run_id": run_id, "inputs": input_stamps(config.inputs), "packtool": __version__})
    if resume is not None and not resume["resumed"]:
        _note(
            config,
            f"{out.partial} holds an interrupted run of another job (config, inputs or "
            "tokenizer differ); starting afresh",
        )
    resumed = bool(resume and resume["resumed"])
    if resumed:
        _note(config, f"resuming the interrupted run in {out.partial} (finished chunks and shards kept)")

    engine = make_engine(config, _init_worker, worker_args)
    with engine:
        done: dict[int, dict] = {}  # chunks finished by an earlier attempt of this run

        def encode_tasks():
            for i, chunk in enumerate(chunked(itertools.chain([first], batches), config.chunk_size)):
                meta = read_chunk_meta(work, i) if resumed else None
                if meta is not None and meta.get("input_rows") == sum(b.num_rows for b in chunk):
                    done[i] = meta
                    bar.update(meta["num_samples"])
                    continue
                yield (i, chunk, work)

        metas = []
        group = _task_group(config, engine.workers)
        with _progress(show, desc="encode", unit=" samples") as bar:
            for group_metas in engine.map(_encode_chunks, _batched(encode_tasks(), group)):
                for meta in group_metas:
                    metas.append(meta)
                    bar.update(meta["num_samples"])
                    _fault("encode", len(metas))
        metas = sorted([*metas, *done.values()], key=lambda m: m["index"])
        assert [m["index"] for m in metas] == list(range(len(metas)))
        skipped = _merge_skipped(config, sink, metas)
        (Path(work) / "chunks.json").write_text(json.dumps(metas))
        store = ChunkStore(Path(work), metas)
        if store.num_samples == 0:
            raise InputError(_nothing_left(skipped), source=", ".join(config.inputs), code="empty_input")
        lengths = store.lengths()
        # a too-long sample is named by the field it was read from
        field = {"text": config.text_field, "pretokenized": "input_ids"}.get(sample_format)
        plan = make_plan(lengths, config, lambda i, f, m: store.locate(i, field or f, m), store=store)
        if plan.num_packs == 0:  # an empty output would look like a finished dataset
            st = plan.stats
            raise InputError(
                f"nothing to pack: all {st.num_samples} samples were left out (empty: {st.empty_samples}, "
                f"too long and dropped: {st.dropped_samples})",
                source=", ".join(config.inputs),
                code="empty_input",
            )
        max_bytes = config.shard_max_bytes if config.format == "webdataset" else None
        shard_ranges = [
            (i, a, b)
            for i, (a, b) in enumerate(shard_bounds(plan, config.shard_size, max_bytes, store.has_loss_mask))
        ]
        meta = {
            "run_id": run_id,
            "packed_sequence_size": config.packed_sequence_size,
            "format_version": FORMAT_VERSION,
        }
        finished = {}
        if resumed:
            finished = {i: f for i, _, _ in shard_ranges if (f := _finished_shard(work, str(out.partial), i))}
            _note(
                config,
                f"resumed: {len(done)} of {len(metas)} chunks and {len(finished)} of "
                f"{len(shard_ranges)} shards were already done",
            )
        (Path(work) / "shards").mkdir(exist_ok=True)
        written = []
        with _progress(show, desc="write", unit=" packs", total=plan.num_packs) as bar:
            bar.update(sum(f["num_packs"] for f in finished.values()))
            tasks = (
                (i, plan.slice(a, b), work, str(out.partial), {**meta, "first_pack": a})
                for i, a, b in shard_ranges
                if i not in finished
            )
            for info in engine.map(_write_shard, tasks):
                written.append(info)
                bar.update(info["num_packs"])
                _fault("write", len(written))
        shards = sorted([*written, *finished.values()], key=lambda f: f["path"])
    if skipped.total:
        with open(out.partial / ERRORS_LOG, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in skipped.entries)
    manifest = build_manifest(
        config,
        plan,
        lengths,
        shards,
        identity,
        sample_format,
        run_id,
        fingerprint,
        has_loss_mask=store.has_loss_mask,
        empty_loss_samples=sum(m.get("empty_loss_samples", 0) for m in metas),
        skipped=skipped,
    )
    if config.format == "webdataset":  # wids and Energon indexes, so no separate preparation step
        manifest["index_files"] = write_dataset_index(out.partial, manifest)
    return manifest


ERRORS_LOG = "errors.jsonl"  # first MAX_LOGGED skipped records (on_error=skip), one JSON object a line


def _merge_skipped(config: PackConfig, sink: ErrorSink, metas: list[dict]) -> ErrorSink:
    """One sink for the run: the readers' and every chunk's counts; the first entries in input order."""
    encoding = ErrorSink(config.on_error)
    for meta in metas:
        encoding.merge(meta.pop("skipped", {}))
    total = ErrorSink(config.on_error)
    for part in (sink, encoding):
        for code, n in part.counts.items():
            total.counts[code] = total.counts.get(code, 0) + n
    # each part's entries are its first MAX_LOGGED in input order, so together they hold the first overall
    order = {src: i for i, (_, src, _) in enumerate(expand_inputs(config.inputs))}
    entries = sorted(
        sink.entries + encoding.entries,
        key=lambda e: (order.get(e["source"], len(order)), str(e["source"]), e["row"] or 0),
    )
    total.entries = entries[:MAX_LOGGED]
    return total


def _nothing_left(sink: ErrorSink) -> str:
    if not sink.total:
        return "input holds no records"
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(sink.counts.items()))
    return f"no record left: all {sink.total} were skipped as bad input ({reasons})"


def encode_to_chunks(
    config: PackConfig, batches: Iterator[SourceBatch], work: str, engine: Any, show: bool
) -> ChunkStore:
    """The encode step: ``batches`` -> encoded chunks in ``work`` (by ``engine``, whose workers were
    started with ``_init_worker``). Shared by ``packtool pack`` and ``packtool verify --source``."""
    metas = []
    with _progress(show, desc="encode", unit=" samples") as bar:
        tasks = ((i, chunk, work) for i, chunk in enumerate(chunked(batches, config.chunk_size)))
        for meta in engine.map(_encode_chunk, tasks):
            metas.append(meta)
            bar.update(meta["num_samples"])
    (Path(work) / "chunks.json").write_text(json.dumps(metas))
    return ChunkStore(Path(work), metas)


def _histogram(values: np.ndarray, edges: np.ndarray) -> dict:
    counts, edges = np.histogram(values, bins=edges)
    return {"edges": [int(e) for e in edges], "counts": [int(c) for c in counts]}


def build_manifest(
    config: PackConfig,
    plan: PackPlan,
    lengths: np.ndarray,
    shards: list[dict],
    tokenizer: dict,
    sample_format: str,
    run_id: str,
    inputs: list[dict],
    has_loss_mask: bool,
    empty_loss_samples: int = 0,
    skipped: ErrorSink | None = None,
) -> dict:
    n = config.packed_sequence_size
    pack_tokens = plan.pack_tokens()
    per_pack = np.diff(plan.pack_offsets)
    num_packs, num_tokens = plan.num_packs, int(pack_tokens.sum())
    totals = total_stats(n, int(num_packs), num_tokens)
    stats = {
        "num_samples": int(len(lengths)),
        "packed_samples": int(len(np.unique(plan.sample))),
        "num_packs": totals.pop("num_packs"),
        "num_tokens": totals.pop("num_tokens"),
        "input_tokens": int(lengths.sum()),
        **totals,
        "samples_per_pack": samples_per_pack_stats(
            int(num_packs),
            len(plan.sample),
            int(per_pack.min()) if num_packs else 0,
            int(per_pack.max()) if num_packs else 0,
        ),
        **plan.stats.to_dict(),
        # bad records left out under on_error=skip (not in num_samples), by reason; see errors.jsonl
        "skipped_samples": skipped.total if skipped else 0,
        "skipped_by_reason": dict(sorted(skipped.counts.items())) if skipped else {},
    }
    stats["num_samples"] = int(len(lengths))
    # samples with tokens but no trained token (empty_loss policy); when dropped, the planner saw them as
    # empty: count them here only, so empty_samples keeps meaning "encoded to no tokens"
    stats["empty_loss_samples"] = int(empty_loss_samples)
    if config.empty_loss == "drop":
        stats["empty_samples"] -= int(empty_loss_samples)
    length_edges = np.unique(
        np.linspace(0, max(int(lengths.max()) if len(lengths) else 1, n), 33).astype(int)
    )
    histograms = {
        "sample_lengths": _histogram(lengths, length_edges),
        "pack_fill": _histogram(pack_tokens, np.linspace(0, n, 21).astype(int)),
        "samples_per_pack": _histogram(per_pack, np.arange(0, (int(per_pack.max()) if num_packs else 1) + 2)),
    }
    return {
        "format": "packtool",
        "format_version": FORMAT_VERSION,
        "packtool_version": __version__,
        "run_id": run_id,
        "shard_format": config.format,
        "packed_sequence_size": n,
        "sample_format": sample_format,
        "labels": config.labels,
        "position_ids": plan.position_ids,
        "pad_token_id": config.pad_token_id,
        "columns": ["input_ids", "labels", "position_ids", "seq_lens"]
        + (["loss_mask"] if has_loss_mask else [])
        + ["sample_index", "sample_offset"],
        "tokenizer": tokenizer,
        "inputs": inputs,
        "config": config.to_dict(include_runtime=False),
        "stats": stats,
        "histograms": histograms,
        "shards": shards,
    }
