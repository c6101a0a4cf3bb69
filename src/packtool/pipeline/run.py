"""``packtool pack`` as four steps: read -> encode -> plan -> write.

* **read** (the driver): inputs are streamed as ``SourceBatch`` objects and grouped into chunks of
  ``chunk_size`` records, in input order. Parquet rows, JSON Lines and text lines, text files and Hugging
  Face datasets' rows are handed out as ranges that the process encoding them reads, so a chunk of them
  counts rows, lines or files, not records.
* **encode** (the engine, parallel by chunk; ``pipeline.encode``): each chunk is encoded and written to
  the scratch directory as flat token arrays (``pipeline.chunks``).
* **plan** (the driver; ``packing``): sample lengths are read from the chunks' offsets and packed by the
  strategy into a ``PackPlan``; no token is touched.
* **write** (the engine, parallel by shard; ``pipeline.write``): each shard gathers its packs' tokens from
  the chunks and is written by its format; the manifest is written last and the directory renamed.

Chunk and shard boundaries depend only on the options, never on the number of processes, so the output
is byte-identical for every ``num_proc`` and engine.

**Pretokenized Parquet** that fits in memory skips the scratch chunks (``pipeline.memory``): the driver
reads and encodes the chunks itself and keeps them in a ``MemoryStore``, and ``num_proc`` threads of the
driver write the shards from it; the same chunk boundaries and plan give the same bytes. Which store a
run uses is chosen once (``pipeline.stores.open_store``); the steps below it do not ask.

**Resuming.** The run's identity (``run_id``, plus the input files' sizes and modification times and
packtool's version) is recorded in ``<output>.partial/_work/run.json``. A run started again with the same
command after being killed (SIGKILL included) or interrupted finds it, skips the chunks whose ``meta.json``
exists (it still streams past their records; a run in memory reads them all again) and the shards whose
record exists, and writes the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from packtool.binding import content_run_key
from packtool.encoders.registry import PRETOKENIZED_FIELDS, fields_read, resolve_sample_format
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
from packtool.manifest import ERRORS_LOG, Manifest
from packtool.options import PackOptions
from packtool.packing.planner import hold_out, make_plan, resolve_position_ids
from packtool.pipeline import progress
from packtool.pipeline.content import labels_as_given
from packtool.pipeline.encode import RunSpec, first_bad_record, precut_limit, worker
from packtool.pipeline.engines import make_engine, resolve_num_proc
from packtool.pipeline.identity import (
    bind_run_id,
    check_inputs_unchanged,
    input_fingerprint,
    input_stamps,
    make_run_id,
    shard_numbers,
)
from packtool.pipeline.interrupt import stop_on_interrupt
from packtool.pipeline.output import OutputDir
from packtool.pipeline.report import name_special_tokens
from packtool.pipeline.report import summary_line as summary_line  # the CLI's, imported with run_pack
from packtool.pipeline.stores import open_store
from packtool.pipeline.summary import build_manifest, input_entries, lowest_version, run_stats, with_path
from packtool.pipeline.write import finished_shard, output_columns, split_shard_ranges
from packtool.readers.inputs import expand_inputs, input_bytes, read_inputs, unread_files
from packtool.version import __version__


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
    # resolved once: the memory check and the engine size themselves by it
    options = options.replace(num_proc=resolve_num_proc(options.to_dict()))
    check_memory(options)
    show = (not options.running.quiet) if progress is None else progress
    out = OutputDir(options.output.output, overwrite=options.running.overwrite).open()
    try:
        with stop_on_interrupt():  # Ctrl-C: "stopping" at once, a second one stops at once
            try:
                run = _run_vision if options.encoding.is_vision else _run
                manifest = run(options, out, show, _Say(say, options.running.quiet))
            except InputError as e:  # a vision sample's error names its record already
                raise (e if options.encoding.is_vision else first_bad_record(options, e)) from None
            manifest = lowest_version(manifest)
            out.commit(manifest)
        return manifest
    except WorkerDied as e:  # killed from outside (out of memory): keep the work for a resume
        out.abort(keep=True)
        raise WorkerDied(
            f"{e}; the finished work is kept in {out.partial}: run the same command again to resume"
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


def unread_token_fields(schema: pa.Schema) -> list[str]:
    """A warning naming the list fields of pretokenized input that are not packed (per-token columns beside
    ``input_ids`` such as ``token_type_ids``); empty when there are none."""
    unread = [
        f.name
        for f in schema
        if f.name not in PRETOKENIZED_FIELDS and (pa.types.is_list(f.type) or pa.types.is_large_list(f.type))
    ]
    if not unread:
        return []
    return [
        f"field(s) {', '.join(unread)} hold a list per record and are not packed (the packs hold "
        f"{', '.join(PRETOKENIZED_FIELDS[:3])}; attention_mask strips padding)"
    ]


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


# bytes a writer holds per token of the packs it builds: the token columns (3 x int32, an int8 mask), the
# encoded table beside them, and the next block gathered while this one is written
WRITE_BYTES_PER_TOKEN = 40


def check_memory(options: PackOptions) -> None:
    """``ConfigError`` before any work when one writer's block of packs (``packed_sequence_size`` times
    the packs written at once: a row group's worth for Parquet, a shard for tar) would not fit in a
    quarter of this machine's memory, with each of ``num_proc`` writers holding one."""
    fmt = get_format(options.output.format)
    block = fmt.writer.block_packs(options.output, options.packing.packed_sequence_size)
    packs = block or options.output.shard_size
    need = (
        packs
        * options.packing.packed_sequence_size
        * WRITE_BYTES_PER_TOKEN
        * resolve_num_proc(options.to_dict())
    )
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not known here: nothing to check against
        return
    if need > memory // 4:
        fewer = "--row-group-size" if fmt.reader.unit_kind else "--shard-size (or --shard-max-bytes)"
        raise ConfigError(
            f"--packed-sequence-size {options.packing.packed_sequence_size:,} with {packs:,} packs written "
            "at once "
            f"needs about {need / 2**30:,.1f} GiB, more than a quarter of this machine's "
            f"{memory / 2**30:,.1f} GiB: lower {fewer} or --num-proc"
        )


def _input_rows(inputs: list[str], input_format: str) -> int | None:
    """Records in the inputs when the files say so cheaply (Parquet footers), else ``None``."""
    total = 0
    for kind, source, _ in expand_inputs(inputs, input_format):
        if kind != "parquet":
            return None
        try:
            total += pq.ParquetFile(source).metadata.num_rows
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


def start_run(options: PackOptions, sample_format: str) -> RunSpec:
    """The run's ``RunSpec``, with this process's worker state built (a bad tokenizer fails here)."""
    spec = RunSpec(json.dumps(options.to_dict()), sample_format, os.urandom(8).hex())
    worker(spec)
    return spec


def check_vision_options(options: PackOptions) -> None:
    """``ConfigError`` for a packing option that would cut a vision-language sample, and so possibly an
    image (checked before the vision extra is imported): an image is never split across packs nor
    truncated through, and context-parallel padding is not laid out around image spans."""
    packing = options.packing
    if packing.split_across_pack:
        raise ConfigError("--split-across-pack would cut images between packs: not available with images")
    if packing.long_samples not in ("error", "drop"):
        raise ConfigError(
            f"--long-samples {packing.long_samples} would cut through images: use error or drop"
        )
    if packing.cp_size > 1:
        raise ConfigError("--cp-size is not available with images (pack with --cp-size 1)")
    if options.output.webdataset.shard_max_bytes is not None:  # (set only with --format webdataset)
        raise ConfigError(  # the tar shards are cut from the plan alone, which does not know image bytes
            "--shard-max-bytes is not available with images: cut tar shards with --shard-size"
        )


def _run_vision(options: PackOptions, out: OutputDir, show: bool, say: _Say) -> Manifest:
    """A run of vision-language samples (``packtool.vision.run``)."""
    check_vision_options(options)
    from packtool.vision.run import run_vision  # the vision extra (Pillow, transformers): for images only

    return run_vision(options, out, show, say)


def _run(options: PackOptions, out: OutputDir, show: bool, say: _Say) -> Manifest:
    sink = ErrorSink(options.running.on_error)  # bad records met while reading
    fields = _FieldsRead(options)
    input_format = options.reading.files.input_format
    expand = functools.partial(expand_inputs, input_format=input_format)
    # workers (local processes or Ray tasks) read their own rows and lines: the driver hands out ranges
    batches = read_inputs(
        options.reading.inputs,
        split=options.reading.split,
        text_field=options.encoding.text_field,
        sink=sink,
        lazy=True,
        used_fields=fields,
        input_format=input_format,
    )
    first = next(batches, None)
    if first is None:
        raise InputError(_nothing_left(sink), source=", ".join(options.reading.inputs), code="empty_input")
    if fields.sample_format is None:
        fields.sample_format = resolve_sample_format(options.encoding, first.schema.names)
    sample_format = fields.sample_format
    options.check(sample_format)  # the options set for the sample format the input turned out to be
    run_warnings = unread_token_fields(first.schema) if sample_format == "pretokenized" else []
    for unread in unread_files(options.reading.inputs, input_format):  # what the directories hold unread
        run_warnings += unread.warnings()
        if note := unread.note():
            say.note(f"note: {note}")
    if resolve_position_ids(options.packing) == "nemo":
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
    spec = start_run(options, sample_format)
    identity = worker(spec).encoder.identity()
    vocab = identity.get("vocab_size")
    if vocab is not None and options.packing.pad_token_id >= vocab:
        raise ConfigError(
            f"pad_token_id {options.packing.pad_token_id} is not a token id of the tokenizer "
            f"(vocabulary of {vocab:,})"
        )
    work = str(out.work)
    fingerprint = input_fingerprint(options.reading.inputs, expand)
    identity_key = make_run_id(options, identity, fingerprint)  # the run_id is bound to content below
    # the special tokens by name, in the manifest (not the run_id: the ids are in it already)
    tokens = options.encoding.tokens
    identity, guesses = name_special_tokens(
        identity,
        worker(spec).encoder,
        {"bos": tokens.bos_token, "eos": tokens.eos_token},
        options.packing.pad_token_id,
    )
    for line in guesses:  # said before the work, even with --quiet: not a loss, so not in manifest.warnings
        say.warning(line)

    stamps = input_stamps(options.reading.inputs, expand)  # the inputs as the run starts reading them
    resume = out.begin({"run_id": identity_key, "inputs": stamps, "packtool": __version__})
    if resume is not None and not resume["resumed"]:
        say.note(
            f"{out.partial} holds an interrupted run of another job (options, inputs or "
            "tokenizer differ); starting afresh",
        )
    resumed = bool(resume and resume["resumed"])
    if resumed:
        say.note(f"resuming the interrupted run in {out.partial} (finished chunks and shards kept)")
    fmt = get_format(options.output.format)

    with make_engine(options.running, resolve_num_proc(options.to_dict())) as engine:
        encoded_store = open_store(spec, options, sample_format, work, engine, resumed)
        for line in encoded_store.resume_notes():
            say.note(line)
        encoded, records_done = 0, 0
        # a total from the start, for the percentage and the ETA: the input's bytes for line and file
        # ranges (known as they are handed out), else Parquet's rows from the footers, else none
        size = input_bytes(options.reading.inputs, input_format) if show else None
        rows = _input_rows(options.reading.inputs, input_format) if show and size is None else None
        kw = dict(unit="B", unit_scale=True, unit_divisor=1024, total=size) if size else {"total": rows}
        with _progress(show, desc="encode", **({"unit": " records"} | kw)) as bar:
            # bytes move the bar as the encoding reads them (pipeline.progress): in this process at
            # once, from a local pool's workers through their shared counter while the driver waits;
            # else (Ray) as each chunk is finished
            counter = getattr(engine, "progress", None) if size else None
            live = bool(size) and engine.name == "local"
            if live and counter is None:
                progress.set_sink(bar.update)
            elif live:
                engine.on_wait = lambda: counter.value > bar.n and bar.update(counter.value - bar.n)

            def on_chunk(meta: dict, new: bool) -> None:
                nonlocal encoded, records_done
                records = meta.get("input_rows", meta["num_samples"])
                if size:
                    records_done += records
                    bar.set_postfix_str(f"{records_done:,} records", refresh=False)
                    # the first records of a file, read by the driver to learn its fields, have no byte
                    # range: the bar catches up with the end of the file at its last chunk
                    if counter is not None and live and counter.value > bar.n:
                        bar.update(counter.value - bar.n)
                    if not live or not new:  # a chunk a resumed run keeps is not read again
                        bar.update(meta.get("input_bytes", 0))
                        if counter is not None and not new:
                            counter.value += meta.get("input_bytes", 0)
                else:
                    bar.update(records)
                if new:
                    encoded += 1
                    progress.step_done("encode", encoded)

            records = itertools.chain([first], batches)
            try:
                encoded_store.encode(records, on_chunk)
            finally:
                progress.set_sink(None)
                engine.on_wait = None
            if size:
                bar.update(size - bar.n)  # the bytes of pieces the driver read itself
        store, metas = encoded_store.chunks, encoded_store.metas
        skipped = _merge_skipped(options, sink, metas)
        if store.num_samples == 0:
            raise InputError(
                _nothing_left(skipped), source=", ".join(options.reading.inputs), code="empty_input"
            )
        lengths = store.lengths()
        # a too-long sample is named by the field it was read from
        field = {"text": options.encoding.text_field, "pretokenized": "input_ids"}.get(sample_format)
        plan = make_plan(
            lengths,
            options.packing,
            lambda i, f, m: store.locate(i, field or f, m),
            fetch=store.samples,
            store_packs=store.append_packs,
        )
        stats = run_stats(
            options,
            plan,
            lengths,
            empty_loss=(
                sum(m.get("empty_loss_samples", 0) for m in metas),
                sum(m.get("empty_loss_tokens", 0) for m in metas),
            ),
            skipped=skipped,
        )
        if plan.num_packs == 0:  # an empty output would look like a finished dataset
            raise InputError(
                f"nothing to pack: all {stats.input_samples:,} samples were left out ("
                + "; ".join(stats.losses(options.packing.packed_sequence_size, options.packing.max_packs))
                + ")",
                source=", ".join(options.reading.inputs),
                code="empty_input",
            )
        if options.running.strict and (
            losses := stats.losses(options.packing.packed_sequence_size, options.packing.max_packs)
        ):
            raise DataLossError(
                "--strict: not every sample would be packed whole, so no shard was written: "
                + "; ".join(losses)
            )
        run_warnings += labels_as_given(
            options.encoding.labels, options.running.strict, sample_format, first.schema.names, metas
        )
        columns = output_columns(options, store)
        if options.output.columns == "minimal" and "labels" in columns:
            say.note(
                "note: --columns minimal stores labels: the input's own labels are not the ones packtool "
                "rebuilds (input_ids shifted, -100 where no loss is taken), so they carry information",
            )
        plan, num_train = hold_out(plan, options.packing.val_fraction, options.packing.seed)
        ranges = split_shard_ranges(fmt, plan, num_train, options, columns)
        shard_ranges, numbers = list(enumerate(ranges)), shard_numbers(ranges)
        # the run's identity: what it is made from, what it encoded, and what readers rely on
        run_key = content_run_key(identity_key, [m["digest"] for m in metas])
        run_id = bind_run_id(run_key, options, fmt, ranges, plan.position_ids, columns, sample_format)
        finished = {}
        if resumed:
            finished = {i: e for i, _ in shard_ranges if (e := finished_shard(work, str(out.partial), i))}
            shards = f"{len(finished)} of {len(shard_ranges)} shards were already done"
            say.note(encoded_store.resumed_note(shards))
        (Path(work) / "shards").mkdir(exist_ok=True)
        written = []
        with _progress(show, desc="write", unit=" packs", total=plan.num_packs) as bar:
            bar.update(sum(e.num_packs for e in finished.values()))
            tasks = (
                (
                    spec,
                    ShardMeta(run_id, i, a, options.packing.packed_sequence_size),
                    plan.slice(a, b),
                    work,
                    str(out.partial),
                    split,
                    numbers[i],  # numbered within its split: val-000000 is the first val shard
                )
                for i, (a, b, split) in shard_ranges
                if i not in finished
            )
            for entry in encoded_store.write_shards(tasks):
                written.append(entry)
                bar.update(entry.num_packs)
                progress.step_done("write", len(written))
        shards = sorted([*written, *finished.values()], key=lambda e: e.path)
    check_inputs_unchanged(options.reading.inputs, stamps, expand)  # nothing committed from a changed input
    if skipped.total:
        with open(out.partial / ERRORS_LOG, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in skipped.entries)
    manifest = build_manifest(
        options,
        plan,
        lengths,
        stats,
        shards,
        with_path(identity),
        sample_format,
        run_id,
        input_entries(fingerprint, store.samples_per_source()),
        columns=columns,
    )
    manifest.run_key = run_key
    manifest.index_files = fmt.writer.write_dataset_index(out.partial, manifest, options.output)
    precut = sum(m.get("precut_samples", 0) for m in metas)
    if precut:  # recorded: what of the input was never tokenized
        limit = precut_limit(options, sample_format)
        run_warnings = [
            *run_warnings,
            f"{precut:,} text sample(s) longer than {limit:,} characters were cut to that length before "
            "tokenizing (--long-samples truncate keeps only their first tokens)",
        ]
    manifest.warnings = run_warnings
    write_dataset_card(out.partial, manifest, fmt.suffix)  # datasets.load_dataset(DIR) reads it
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
    # each part's entries are its first MAX_LOGGED in input order, so together they hold the first overall
    inputs = expand_inputs(options.reading.inputs, options.reading.files.input_format)
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
