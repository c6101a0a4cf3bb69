"""``packtool pack`` as four steps: read -> encode -> plan -> write, for every sample format.

* **read** (the driver): inputs are streamed as ``SourceBatch`` objects and grouped into chunks
  (``encode.chunk_records`` records), in input order. Parquet rows, JSON Lines and text lines, text files,
  WebDataset samples and Hugging Face datasets' rows are handed out as ranges that the process encoding
  them reads, so a chunk of them counts rows, lines, files or samples, not records.
* **encode** (the engine, parallel by chunk; ``pipeline.encode``): each chunk is encoded by the sample
  format's encoder (built once per worker process) and written to the scratch directory as flat token
  arrays (``pipeline.chunks``); a vision-language chunk keeps its samples' images beside them (each
  image's span, size, digest, and its bytes or its file: ``pipeline.images``).
* **plan** (the driver; ``packing``): sample lengths are read from the chunks' offsets and packed by the
  strategy into a ``PackPlan``; no token is touched. ``--balance-visual-tokens`` orders the packs.
* **write** (the engine, parallel by shard; ``pipeline.write``): each shard gathers its packs' tokens (and
  images) from the chunks and is written by its format; the manifest is written last and the directory
  renamed.

Chunk and shard boundaries depend only on the options, and the packs and the run id not even on the chunk
size, so the output is byte-identical for every ``num_proc``, engine and ``chunk_size``.

**Pretokenized Parquet** that fits in memory skips the scratch chunks (``pipeline.memory``): the driver
reads and encodes the chunks itself and keeps them in a ``MemoryStore``, and ``num_proc`` threads of the
driver write the shards from it; the same plan gives the same bytes. Which store a run uses is chosen once
(``pipeline.stores.open_store``); the steps below it do not ask.

**The run's identity.** ``run_id`` binds what the output is made from (options, tokenizer or processor,
the inputs' names and sizes: ``identity.make_run_id``), what it encoded (``identity.content_key``: every
token, and every image's digest) and the manifest's reading fields (``identity.bind_run_id``).

**Resuming.** The run's identity key, the input files' stamps and packtool's version are recorded in
``<output>.partial/_work/run.json``. A run started again with the same command after being killed
(SIGKILL included) or interrupted finds it, keeps the chunks whose ``meta.json`` exists, covers the same
input rows and still holds what was written (images included), skips the shards whose record exists,
and writes the same bytes as an uninterrupted run. Before the output is committed, every input file and
image file is checked against its stamp: one that changed while the run read it fails the run.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from packtool.binding import content_run_key, processor_run_key
from packtool.encoders.registry import SLOW_TO_BUILD, VISION_FORMATS, fields_read, resolve_sample_format
from packtool.errors import (
    MAX_LOGGED,
    ConfigError,
    DataLossError,
    ErrorSink,
    InputError,
    PacktoolError,
    WorkerDied,
)
from packtool.formats.card import write_dataset_card
from packtool.formats.registry import ShardMeta, get_format
from packtool.manifest import ERRORS_LOG, IMAGE_COLUMNS, Manifest, ShardEntry
from packtool.options import PackOptions
from packtool.packing.balance import balance_visual_tokens
from packtool.packing.plan import PackPlan
from packtool.packing.planner import hold_out, make_plan, resolve_position_ids
from packtool.pipeline import progress
from packtool.pipeline.chunks import ChunkStore
from packtool.pipeline.content import labels_as_given
from packtool.pipeline.encode import EncoderFacts, RunSpec, describe_encoder, first_bad_record, precut_limit
from packtool.pipeline.engines import make_engine, resolve_num_proc, worker_preload
from packtool.pipeline.engines.local import give_back_freed_memory
from packtool.pipeline.identity import (
    bind_run_id,
    check_inputs_unchanged,
    content_key,
    input_fingerprint,
    input_stamps,
    make_run_id,
    shard_numbers,
)
from packtool.pipeline.images import vision_record
from packtool.pipeline.interrupt import stop_on_interrupt
from packtool.pipeline.output import Output, open_output
from packtool.pipeline.preflight import check_memory, check_vision_options, unread_token_fields
from packtool.pipeline.report import losses_line as losses_line  # the CLI's, imported with run_pack
from packtool.pipeline.report import summary_line as summary_line
from packtool.pipeline.stores import EncodedStore, open_store
from packtool.pipeline.summary import build_manifest, input_entries, lowest_version, run_stats, with_path
from packtool.pipeline.write import ShardTask, finished_shard, output_columns, split_shard_ranges
from packtool.readers.base import SourceBatch
from packtool.readers.decode import decoded_warnings
from packtool.readers.inputs import expand_inputs, input_bytes, read_inputs, unread_files
from packtool.readers.parquet import num_rows as parquet_rows
from packtool.storage.urls import configure as configure_storage
from packtool.version import __version__

DEFAULT_RANKS = 8  # the step the image statistics' spread is measured over without --balance-visual-tokens


def run_pack(
    options: PackOptions, *, progress: bool | None = None, say: Callable[[str], None] | None = None
) -> Manifest:
    """Run ``packtool pack`` for ``options``; return the manifest. Raises ``PacktoolError`` subclasses.

    What the run has to tell its user before a step (a resumed run, a guessed special token, a
    convention to know of) goes to ``say`` as it goes, one line each: ``"warning: ..."`` always, the
    notes unless ``quiet`` (the CLI prints ``packtool: LINE``); without ``say`` the warnings go to
    ``warnings.warn`` and the notes nowhere. What the finished output lacks is returned in the manifest
    (``warnings``; ``stats.losses(...)``): the caller says it.

    On every error it reports (bad input or options, disk full, internal error) the partial directory is
    removed: nothing is left behind. When the job is interrupted (Ctrl-C) or killed it is kept, so that the
    same command resumes the run.
    """
    options.check_required()
    configure_storage(options.running.storage_options)  # inputs, output and workers' stores
    # resolved once: the memory check and the engine size themselves by it
    options = options.replace(num_proc=resolve_num_proc(options.to_dict()))
    check_memory(options)
    show = (not options.running.quiet) if progress is None else progress
    running = options.running
    out = open_output(options.output.output, overwrite=running.overwrite, scratch=running.scratch)
    try:
        with stop_on_interrupt():  # Ctrl-C: "stopping" at once, a second one stops at once
            try:
                manifest = _run(options, out, show, _Say(say, options.running.quiet))
            except InputError as e:
                raise first_bad_record(options, e) from None
            manifest = lowest_version(manifest)
            out.commit(manifest)
        return manifest
    except WorkerDied as e:  # killed from outside (out of memory): keep the work for a resume
        out.abort(keep=True)
        raise WorkerDied(
            f"{e}; the finished work is kept in {out.kept_in}: run the same command again to resume"
        ) from None
    except OSError as e:  # reading errors are InputError by now: this is the output (disk full, ...)
        out.abort()
        detail = os.strerror(e.errno) if e.errno else str(e)
        raise PacktoolError(
            f"{options.output.output}: cannot write the output ({detail}; is the disk full?); "
            "nothing was left behind"
        ) from e
    except Exception:
        out.abort()
        raise
    except BaseException:  # KeyboardInterrupt: keep the finished work for a resume
        out.abort(keep=True)
        raise


class _Say:
    """A run's lines for its user as it goes (``run_pack``'s ``say``): warnings always, notes unless
    ``quiet``."""

    def __init__(self, say: Callable[[str], None] | None, quiet: bool) -> None:
        self.say, self.quiet = say, quiet

    def warning(self, text: str) -> None:
        if self.say is None:
            warnings.warn(text, stacklevel=4)  # to run_pack's caller
        else:
            self.say(f"warning: {text}")

    def note(self, text: str) -> None:
        if self.say is not None and not self.quiet:
            self.say(text)


def _input_rows(inputs: list[str], files: Any) -> int | None:
    """Records in the inputs when the files say so cheaply (Parquet footers), else ``None``."""
    total = 0
    for kind, source, _ in expand_inputs(inputs, files):
        if kind != "parquet":
            return None
        try:
            total += parquet_rows(source)
        except Exception:  # the reader names a damaged file; the bar just goes without its total
            return None
    return total


def _progress(show: bool, **kw) -> tqdm:
    return tqdm(disable=not show, file=sys.stderr, dynamic_ncols=True, **kw)


class _FieldsRead:
    """``read_inputs``' ``used_fields`` for a run: the sample format is resolved once, from the fields of
    the first batch that needs it (the readers ask only when a field cannot be one column)."""

    def __init__(self, options: PackOptions) -> None:
        self.options, self.sample_format = options, None

    def __call__(self, names: list[str]) -> frozenset[str] | None:
        if self.sample_format is None:
            self.sample_format = resolve_sample_format(self.options.encoding, names)
        return fields_read(self.options.encoding, self.sample_format)


def start_run(
    options: PackOptions, sample_format: str, engine: Any = None, first: SourceBatch | None = None
) -> tuple[RunSpec, EncoderFacts]:
    """The run's ``RunSpec`` and what the driver needs of its encoder (``EncoderFacts``), from an encoder
    built in this process, or in one of ``engine``'s workers when it is slow to build (``SLOW_TO_BUILD``):
    a bad tokenizer or processor fails here, before any record is encoded. The spec carries what that
    encoder found that the workers' need not find again (``Encoder.state()``); a custom encoder's identity
    holds what it makes of ``first``'s first records (``encode.describe_encoder``)."""
    spec = RunSpec(json.dumps(options.to_dict()), sample_format, os.urandom(8).hex())
    tokens = options.encoding.tokens
    task = (spec, {"bos": tokens.bos_token, "eos": tokens.eos_token}, options.packing.pad_token_id, first)
    if engine is not None and sample_format in SLOW_TO_BUILD:  # (no custom encoder: nothing to probe)
        (facts,) = engine.map(describe_encoder, [(*task[:3], None)])  # the map generator runs to its end
    else:
        facts = describe_encoder(task)
    return dataclasses.replace(spec, encoder_state=facts.state), facts


@dataclass
class _Started:
    """What a run knows once its first records are read: the sample format they turned out to be, the
    input stream (the first batch again at its head), the readers' bad records so far (``sink``), the
    task spec every worker builds its encoder from, and the run's identity."""

    sample_format: str
    records: Iterator[SourceBatch]
    first_schema: pa.Schema
    sink: ErrorSink
    spec: RunSpec
    identity: dict  # the encoder's (tokenizer or processor), special tokens named
    identity_key: str  # make_run_id: options, identity, inputs' names and sizes
    fingerprint: list[dict]
    warnings: list[str]
    expand: functools.partial  # the inputs as the readers expand them (--input-format)


@dataclass
class _Planned:
    """The plan of a run and what follows from it: the stats, the stored columns, the shards' ranges and
    the run's content key and id."""

    plan: PackPlan
    lengths: np.ndarray
    stats: Any
    skipped: ErrorSink
    columns: list[str]
    ranges: list[tuple[int, int, str]]
    run_key: str
    run_id: str
    warnings: list[str]


def _run(options: PackOptions, out: Output, show: bool, say: _Say) -> Manifest:
    values = options.to_dict()
    with make_engine(options.running, resolve_num_proc(values), worker_preload(values)) as engine:
        if out.taken_over is not None:
            say.warning(f"{out.final}: took over the lock of a run that is dead ({out.taken_over})")
        started = _start(options, say, engine)
        stamps = input_stamps(options.reading.inputs, started.expand)  # the inputs as the run starts reading
        resume = out.begin({"run_id": started.identity_key, "inputs": stamps, "packtool": __version__})
        if resume is not None and not resume["resumed"]:
            say.note(
                f"{out.kept_in} holds an interrupted run of another job (options, inputs or tokenizer "
                "differ); starting afresh"
            )
        resumed = bool(resume and resume["resumed"])
        if resumed:
            say.note(f"resuming the interrupted run in {out.kept_in} (finished chunks and shards kept)")
        store = open_store(started.spec, options, started.sample_format, out.scratch, engine, resumed)
        for line in store.resume_notes():
            say.note(line)
        progress.step_done("read", 0)  # (a test or a benchmark may time the steps from here)
        _encode(store, started.records, options, engine, show)
        planned = _plan(store, started, options, say)
        progress.step_done("plan", planned.plan.num_packs)
        store.chunks.drop_caches()  # the plan's temporaries and the chunks' caches go back to the OS before
        give_back_freed_memory()  # the workers write (their peak): a million samples' plan held 150 MB more
        shards = _write(planned, store, started.spec, options, out, resumed, show, say)
    check_inputs_unchanged(options.reading.inputs, stamps, started.expand)  # nothing from a changed input
    if store.chunks.images is not None and (changed := store.chunks.images.changed_file()) is not None:
        raise changed  # an image file replaced while the run read the images: no mix of old and new
    return _manifest(planned, shards, store.chunks, store.metas, started, options, out)


def _start(options: PackOptions, say: _Say, engine: Any) -> _Started:
    """Read the first records, resolve and check the options for the sample format they are, build the
    encoder (``start_run``: a bad tokenizer or processor fails here, before any record is encoded) and the
    run's identity; say what the user should know before the work."""
    sink = ErrorSink(options.running.on_error)  # bad records met while reading
    fields = _FieldsRead(options)
    files = options.reading.files
    expand = functools.partial(expand_inputs, files=files)
    # workers (local processes or Ray tasks) read their own rows and lines: the driver hands out ranges
    batches = read_inputs(
        options.reading.inputs,
        split=options.reading.split,
        text_field=options.encoding.text_field,
        sink=sink,
        lazy=True,
        used_fields=fields,
        files=files,
    )
    first = next(batches, None)
    if first is None:
        raise InputError(_nothing_left(sink), source=", ".join(options.reading.inputs), code="empty_input")
    if fields.sample_format is None:
        fields.sample_format = resolve_sample_format(options.encoding, first.schema.names)
    sample_format = fields.sample_format
    options.check(sample_format)  # the options set for the sample format the input turned out to be
    if sample_format in VISION_FORMATS:
        check_vision_options(options, sample_format)
    run_warnings = unread_token_fields(first.schema) if sample_format == "pretokenized" else []
    for unread in unread_files(options.reading.inputs, files):  # what the directories hold unread
        run_warnings += unread.warnings()
        for note in unread.notes():
            say.note(f"note: {note}")
    _say_positions(options, say)
    spec, facts = start_run(options, sample_format, engine, first)
    vocab = facts.identity.get("vocab_size")
    if vocab is not None and options.packing.pad_token_id >= vocab:
        raise ConfigError(
            f"pad_token_id {options.packing.pad_token_id} is not a token id of the tokenizer "
            f"(vocabulary of {vocab:,})"
        )
    fingerprint = input_fingerprint(options.reading.inputs, expand)
    identity_key = make_run_id(options, facts.identity, fingerprint)  # the run_id is bound to content below
    for line in facts.warnings:  # said before the work, even with --quiet: not a loss, so not in warnings
        say.warning(line)
    records = itertools.chain([first], batches)
    return _Started(
        sample_format, records, first.schema, sink, spec, facts.named, identity_key, fingerprint,
        run_warnings, expand,
    )  # fmt: skip


def _say_positions(options: PackOptions, say: _Say) -> None:
    """The note on NeMo's position ids, and the warning when a split sample's positions wrap around."""
    if resolve_position_ids(options.packing) != "nemo":
        return
    say.note(
        "note: position_ids follow NeMo's convention (they run on over a split sample and through the "
        "padding): give attention seq_lens or cu_seqlens, not position_ids alone (transformers' "
        "position-id packing would join samples); --position-ids restart makes them safe for it",
    )
    if options.packing.split_across_pack:  # said even under --quiet: it changes what training sees
        say.warning(
            "--split-across-pack with --position-ids nemo: the positions of a piece "
            "that continues a sample in the next pack wrap around at the pack size instead of going on "
            "(e.g. 1223..2999 then 0..1222), and every attention mask trains on them; keep nemo for "
            "parity with NeMo AutoModel, else pass --position-ids restart (each piece from 0) or train "
            "with batch.flattened()"
        )


def _encode(
    store: EncodedStore, records: Iterator[SourceBatch], options: PackOptions, engine, show: bool
) -> None:
    """Encode the input into ``store``, with the encode bar: the input's bytes where they are known as
    ranges are handed out, else Parquet's rows from the footers, else records."""
    files = options.reading.files
    size = input_bytes(options.reading.inputs, files) if show else None
    rows = _input_rows(options.reading.inputs, files) if show and size is None else None
    kw = dict(unit="B", unit_scale=True, unit_divisor=1024, total=size) if size else {"total": rows}
    encoded, records_done = 0, 0
    with _progress(show, desc="encode", **({"unit": " records"} | kw)) as bar:
        # bytes move the bar as the encoding reads them (pipeline.progress): in this process at once, from
        # a local pool's workers through their shared counter while the driver waits; else (Ray) as each
        # chunk is finished
        counter = getattr(engine, "progress", None) if size else None
        live = bool(size) and engine.name == "local"
        if live and counter is None:
            progress.set_sink(bar.update)
        elif live:
            engine.on_wait = lambda: counter.value > bar.n and bar.update(counter.value - bar.n)

        def on_chunk(meta: dict, new: bool) -> None:
            nonlocal encoded, records_done
            done = meta.get("input_rows", meta["num_samples"])
            if size:
                records_done += done
                bar.set_postfix_str(f"{records_done:,} records", refresh=False)
                # the first records of a file, read by the driver to learn its fields, have no byte range:
                # the bar catches up with the end of the file at its last chunk
                if counter is not None and live and counter.value > bar.n:
                    bar.update(counter.value - bar.n)
                if not live or not new:  # a chunk a resumed run keeps is not read again
                    bar.update(meta.get("input_bytes", 0))
                    if counter is not None and not new:
                        counter.value += meta.get("input_bytes", 0)
            else:
                bar.update(done)
            if new:
                encoded += 1
                progress.step_done("encode", encoded)

        try:
            store.encode(records, on_chunk)
        finally:
            progress.set_sink(None)
            engine.on_wait = None
        if size:
            bar.update(size - bar.n)  # the bytes of pieces the driver read itself


def _plan(store: EncodedStore, started: _Started, options: PackOptions, say: _Say) -> _Planned:
    """Plan the packs from the samples' lengths, account for every sample, stop here under ``--strict``
    when one is not packed whole, order and split the packs, and bind the run's id."""
    chunks, metas, sample_format = store.chunks, store.metas, started.sample_format
    skipped = _merge_skipped(options, started.sink, metas)
    if chunks.num_samples == 0:
        raise InputError(_nothing_left(skipped), source=", ".join(options.reading.inputs), code="empty_input")
    lengths = chunks.lengths()
    run_key = content_run_key(started.identity_key, [content_key(chunks)])  # what the run encoded
    if chunks.images is not None:  # the processor record the manifest keeps, bound (processor_run_key)
        run_key = processor_run_key(run_key, started.identity["processor"])
    # a too-long sample is named by the field it was read from
    field = {"text": options.encoding.text_field, "pretokenized": "input_ids"}.get(sample_format)
    plan = make_plan(
        lengths,
        options.packing,
        lambda i, f, m: chunks.locate(i, field or f, m),
        fetch=chunks.samples,  # a custom select_samples_to_pack sees the samples' tokens
        store_packs=chunks.append_packs if chunks.images is None else _no_policy_packs,
        blocks=None if chunks.images is None else chunks.images.blocks,  # an image is never cut
    )
    empty_loss = [sum(m.get(k, 0) for m in metas) for k in ("empty_loss_samples", "empty_loss_tokens")]
    stats = run_stats(options, plan, lengths, empty_loss=tuple(empty_loss), skipped=skipped)
    n, max_packs = options.packing.packed_sequence_size, options.packing.max_packs
    if plan.num_packs == 0:  # an empty output would look like a finished dataset
        raise InputError(
            f"nothing to pack: all {stats.input_samples:,} samples were left out ("
            + "; ".join(stats.losses(n, max_packs))
            + ")",
            source=", ".join(options.reading.inputs),
            code="empty_input",
        )
    if options.running.strict and (losses := stats.losses(n, max_packs)):
        raise DataLossError(
            "--strict: not every sample would be packed whole, so no shard was written: " + "; ".join(losses)
        )
    warnings = started.warnings + labels_as_given(
        options.encoding.labels, options.running.strict, sample_format, started.first_schema.names, metas
    )
    columns = output_columns(options, chunks)
    if options.output.columns == "minimal" and "labels" in columns:
        say.note(
            "note: --columns minimal stores labels: the input's own labels are not the ones packtool "
            "rebuilds (input_ids shifted, -100 where no loss is taken), so they carry information",
        )
    ranks = options.encoding.vision.balance_visual_tokens
    if ranks is not None:  # consecutive packs (one step of `ranks` ranks) get similar image tokens
        tokens = chunks.images.tokens_per_pack(plan)
        plan = plan.permute(balance_visual_tokens(tokens, ranks, options.packing.seed))
    plan, num_train = hold_out(plan, options.packing.val_fraction, options.packing.seed)
    fmt = get_format(options.output.format)
    ranges = split_shard_ranges(fmt, plan, num_train, options, columns)
    images = IMAGE_COLUMNS if chunks.images is not None else None
    run_id = bind_run_id(run_key, options, fmt, ranges, plan.position_ids, columns, sample_format, images)
    return _Planned(plan, lengths, stats, skipped, columns, ranges, run_key, run_id, warnings)


def _no_policy_packs(packs: list) -> None:
    """A custom strategy's ``pack_selected_samples`` makes new samples of its own: their images' spans
    would not be known."""
    raise ConfigError(
        "a custom strategy's pack_selected_samples is not available with images (the packs it makes would "
        "lose their images' spans): give select_samples_to_pack alone"
    )


def _write(
    planned: _Planned,
    store: EncodedStore,
    spec: RunSpec,
    options: PackOptions,
    out: Output,
    resumed: bool,
    show: bool,
    say: _Say,
) -> list[ShardEntry]:
    """Write the shards (those a killed attempt of this run finished are kept); their entries in order."""
    plan, numbers = planned.plan, shard_numbers(planned.ranges)
    finished = {}
    if resumed:
        finished = {
            i: e for i in range(len(planned.ranges)) if (e := finished_shard(out.scratch, out.has_shard, i))
        }
        say.note(store.resumed_note(f"{len(finished)} of {len(planned.ranges)} shards were already done"))
    out.before_write()
    n = options.packing.packed_sequence_size
    tasks = (
        ShardTask(
            spec,
            ShardMeta(planned.run_id, i, a, n),
            plan.slice(a, b),
            out.scratch,
            str(out.staging),
            split,
            numbers[i],
            out.shard_url,
        )  # fmt: skip
        for i, (a, b, split) in enumerate(planned.ranges)
        if i not in finished
    )
    written = []
    with _progress(show, desc="write", unit=" packs", total=plan.num_packs) as bar:
        bar.update(sum(e.num_packs for e in finished.values()))
        for entry in store.write_shards(tasks):
            written.append(entry)
            bar.update(entry.num_packs)
            progress.step_done("write", len(written))
    return sorted([*written, *finished.values()], key=lambda e: e.path)


def _manifest(
    planned: _Planned,
    shards: list[ShardEntry],
    chunks: ChunkStore,
    metas: list[dict],
    started: _Started,
    options: PackOptions,
    out: Output,
) -> Manifest:
    """The finished run's errors log, manifest, dataset index and card (the manifest is committed last)."""
    if planned.skipped.total:
        with open(out.staging / ERRORS_LOG, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in planned.skipped.entries)
    identity = {k: v for k, v in started.identity.items() if k != "processor"}  # (its own record below)
    manifest = build_manifest(
        options,
        planned.plan,
        planned.lengths,
        planned.stats,
        shards,
        with_path(identity),
        started.sample_format,
        planned.run_id,
        input_entries(started.fingerprint, chunks.samples_per_source()),
        columns=planned.columns,
    )
    manifest.run_key = planned.run_key
    if chunks.images is not None:
        processor = started.identity["processor"]
        manifest.image_columns = list(IMAGE_COLUMNS)
        manifest.vision = vision_record(
            {**processor, "path": os.path.abspath(processor["path"])},  # found from anywhere
            chunks.images,
            sum(m.get("num_images", 0) for m in metas),
            planned.plan,
            options.encoding.vision.balance_visual_tokens or DEFAULT_RANKS,
        )
    fmt = get_format(options.output.format)
    manifest.index_files = fmt.writer.write_dataset_index(
        out.staging, manifest, options.output, out.fetch_shard
    )
    warnings = planned.warnings
    precut = sum(m.get("precut_samples", 0) for m in metas)
    if precut:  # recorded: what of the input was never tokenized
        limit = precut_limit(options, started.sample_format)
        warnings = [
            *warnings,
            f"{precut:,} text sample(s) longer than {limit:,} characters were cut to that length before "
            "tokenizing (--long-samples truncate keeps only their first tokens)",
        ]
    manifest.warnings = warnings + decoded_warnings(planned.skipped.notes, options.reading.files.decode)
    write_dataset_card(out.staging, manifest, fmt.suffix)  # datasets.load_dataset(DIR) reads it
    return manifest


def _merge_skipped(options: PackOptions, sink: ErrorSink, metas: list[dict]) -> ErrorSink:
    """One sink for the run: the readers' and every chunk's counts; the first entries in input order."""
    encoding = ErrorSink(options.running.on_error)
    for meta in metas:
        encoding.merge(meta.get("skipped", {}))
    total = ErrorSink(options.running.on_error)
    for part in (sink, encoding):
        for code, n in part.counts.items():
            total.counts[code] = total.counts.get(code, 0) + n
        total.merge({"notes": part.notes})  # what the readers did to records kept (--decode, --exclude)
    # each part's entries are its first MAX_LOGGED in input order, so together they hold the first overall
    inputs = expand_inputs(options.reading.inputs, options.reading.files)
    order = {src: i for i, (_, src, _) in enumerate(inputs)}
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
