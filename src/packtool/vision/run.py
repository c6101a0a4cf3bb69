"""``packtool pack`` for vision-language samples (``--processor DIR``): read -> encode -> plan -> write.

``run_vision`` is what ``pipeline.run.run_pack`` runs for ``--sample-format vision`` (or ``auto`` with a
``--processor``), inside the same atomic output directory (``pipeline.output.OutputDir``):

1. **read and encode** (this process): ``read_vision_samples`` over the inputs (LLaVA and chat JSON /
   JSON Lines, ``save_to_disk`` datasets with ``Image`` features, WebDataset captioning shards), each
   image's size from its header, ``encode_samples`` through the processor's chat template and counts; a
   bad record (a missing, unreadable, cut or zero-size image, a bomb, a count of images that differs from
   the placeholders, an image whose tokens alone exceed N) raises its one-line error or, under
   ``--on-error skip``, is counted by reason like a text record.
2. **plan**: ``packing.make_plan`` over the samples' lengths, whole samples only (``run_pack`` refuses
   what would cut an image: ``pipeline.run.check_vision_options``); ``--balance-visual-tokens R``
   orders the packs (``balance.balance_visual_tokens``), then ``--val-fraction`` holds some out.
3. **write**: the encoded tokens are a ``MemoryStore`` (``pipeline.memory``), so each block of packs is
   gathered by the text path's ``build_pack_arrays`` (both ``--columns`` layouts), and the images' columns
   and bytes are added (``storage.ImageTable``); the shard format writes it whole or not at all.
4. **manifest**: the text path's, with ``image_columns`` and ``vision`` (the processor's identity, the
   images read, packed and dropped, and ``stats.image_stats`` of the packs in their order).

The samples and their images' names are held in memory (the image bytes of one block at a time).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from packtool.binding import content_run_key
from packtool.errors import ConfigError, DataLossError, ErrorSink, InputError
from packtool.formats.card import write_dataset_card
from packtool.formats.registry import ShardMeta, get_format
from packtool.layout import labels_follow_rule
from packtool.manifest import ERRORS_LOG, IMAGE_COLUMNS, Manifest
from packtool.options import PackOptions
from packtool.packing.planner import hold_out, make_plan
from packtool.pipeline.identity import (
    bind_run_id,
    check_inputs_unchanged,
    input_fingerprint,
    input_stamps,
    make_run_id,
    shard_numbers,
)
from packtool.pipeline.memory import MemoryStore
from packtool.pipeline.summary import build_manifest, input_entries, run_stats, with_path
from packtool.pipeline.write import build_pack_arrays, output_columns, shard_entry, split_shard_ranges
from packtool.stats import image_stats
from packtool.version import __version__
from packtool.vision.balance import balance_visual_tokens
from packtool.vision.inputs import expand_vision_inputs, read_vision_samples
from packtool.vision.processor import load_processor
from packtool.vision.samples import VisionSample, report
from packtool.vision.sequences import VisionSequence, encode_samples, sequence_columns
from packtool.vision.storage import ImageTable, pack_image_tokens

DEFAULT_RANKS = 8  # the step the image statistics' spread is measured over without --balance-visual-tokens


def run_vision(options: PackOptions, out, show: bool, say) -> Manifest:
    """Pack the vision-language samples of ``options`` into ``out`` (an open ``OutputDir``); returns the
    manifest for ``out.commit``. ``say``: the run's ``warning``/``note`` lines (``pipeline.run``)."""
    n = options.packing.packed_sequence_size
    processor = load_processor(options.encoding.vision.processor)
    fingerprint = input_fingerprint(options.reading.inputs, expand_vision_inputs)
    stamps = input_stamps(options.reading.inputs, expand_vision_inputs)
    sink = ErrorSink(options.running.on_error)
    with _bar(show, desc="encode", unit=" samples") as bar:
        kept, sequences = encode_samples(
            processor, _counted(read_vision_samples(options.reading.inputs, sink), bar), sink
        )
    kept, sequences = fitting(kept, sequences, n, sink)
    if not kept:
        raise InputError(_nothing_left(sink), source=", ".join(options.reading.inputs), code="empty_input")
    identity = {**processor.tokenizer.identity(), "name": processor.path}
    if identity.get("vocab_size") is not None and options.packing.pad_token_id >= identity["vocab_size"]:
        raise ConfigError(
            f"pad_token_id {options.packing.pad_token_id} is not a token id of the processor's tokenizer "
            f"(vocabulary of {identity['vocab_size']:,})"
        )
    identity_key = make_run_id(options, {**identity, "processor": processor.identity()}, fingerprint)
    out.begin({"run_id": identity_key, "inputs": stamps, "packtool": __version__})
    store, digest = memory_store(kept, sequences, options, out.work)
    table = ImageTable.of(kept, sequences)
    lengths = store.lengths()
    plan = make_plan(
        lengths,
        options.packing,
        lambda i, f, m: kept[i].error(m, "messages"),
        fetch=store.samples,  # a custom select_samples_to_pack sees the samples' tokens, as for text
        store_packs=_no_policy_packs,
    )
    stats = run_stats(options, plan, lengths, skipped=sink)
    if plan.num_packs == 0:
        raise InputError(
            f"nothing to pack: all {stats.input_samples:,} samples were left out ("
            + "; ".join(stats.losses(n, options.packing.max_packs))
            + ")",
            source=", ".join(options.reading.inputs),
            code="empty_input",
        )
    if options.running.strict and (losses := stats.losses(n, options.packing.max_packs)):
        raise DataLossError(
            "--strict: not every sample would be packed whole, so no shard was written: " + "; ".join(losses)
        )
    ranks = options.encoding.vision.balance_visual_tokens
    if ranks is not None:  # consecutive packs (one step of `ranks` ranks) get similar image tokens
        plan = plan.permute(
            balance_visual_tokens(pack_image_tokens(table, plan), ranks, options.packing.seed)
        )
    plan, num_train = hold_out(plan, options.packing.val_fraction, options.packing.seed)
    columns = output_columns(options, store)
    fmt = get_format(options.output.format)
    ranges = split_shard_ranges(fmt, plan, num_train, options, columns)
    shard_ranges, numbers = list(enumerate(ranges)), shard_numbers(ranges)
    run_key = content_run_key(identity_key, [digest, table.digest()])
    run_id = bind_run_id(run_key, options, fmt, ranges, plan.position_ids, columns, "vision", IMAGE_COLUMNS)
    shards = []
    with _bar(show, desc="write", unit=" packs", total=plan.num_packs) as bar:
        for i, (a, b, split) in shard_ranges:
            meta = ShardMeta(run_id, i, a, n)
            part = plan.slice(a, b)
            path = Path(out.partial) / fmt.writer.shard_name(numbers[i], split)
            blocks = _blocks(part, store, table, options, columns, bar)
            shards.append(
                shard_entry(path, meta, part, split, fmt.writer.write(path, blocks, meta, options.output))
            )
    check_inputs_unchanged(options.reading.inputs, stamps, expand_vision_inputs)
    if sink.total:  # in input order (an image over N is found after its sample is encoded)
        order = {source: i for i, source in enumerate(options.reading.inputs)}
        entries = sorted(sink.entries, key=lambda e: (order.get(e["source"], len(order)), e["row"] or 0))
        with open(Path(out.partial) / ERRORS_LOG, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in entries)
    manifest = build_manifest(
        options,
        plan,
        lengths,
        stats,
        shards,
        with_path(identity),
        "vision",
        run_id,
        input_entries(fingerprint, store.samples_per_source()),
        columns=columns,
    )
    manifest.run_key = run_key
    manifest.image_columns = list(IMAGE_COLUMNS)
    identity = {**processor.identity(), "path": os.path.abspath(processor.path)}  # found from anywhere
    manifest.vision = vision_record(identity, table, plan, ranks or DEFAULT_RANKS)
    manifest.index_files = fmt.writer.write_dataset_index(out.partial, manifest, options.output)
    write_dataset_card(out.partial, manifest, fmt.suffix)
    return manifest


def _no_policy_packs(packs: list) -> None:
    """A custom strategy's ``pack_selected_samples`` makes new samples of its own: their images' spans
    would not be known."""
    raise ConfigError(
        "a custom strategy's pack_selected_samples is not available with images (the packs it makes would "
        "lose their images' spans): give select_samples_to_pack alone"
    )


def vision_record(processor: dict, table: ImageTable, plan, ranks: int) -> dict:
    """The manifest's ``vision``: the processor's identity; ``input_images`` (the images of the samples
    encoded), ``packed_images`` and ``dropped_images`` (in samples the plan left out: too long, over
    ``max_packs``); ``images``: ``stats.image_stats`` of the packs in their written order."""
    columns, _ = table.pack_columns(plan)
    packed = int(len(columns["image_length"]))
    n = plan.packed_sequence_size
    stats = image_stats(
        columns["image_length"], columns["image_sample_offsets"], np.full(plan.num_packs, n), ranks
    )
    return {
        "processor": processor,
        "input_images": table.num_images,
        "packed_images": packed,
        "dropped_images": table.num_images - packed,
        "images": stats,
    }


def _blocks(
    plan, store: MemoryStore, table: ImageTable, options: PackOptions, columns: list[str], bar
) -> Iterator:
    """The shard's packs in blocks of the format's size: tokens gathered as the text path does, the
    images' columns and bytes beside them."""
    writer = get_format(options.output.format).writer
    step = writer.block_packs(options.output, options.packing.packed_sequence_size) or max(plan.num_packs, 1)
    for a in range(0, plan.num_packs, step):
        part = plan.slice(a, min(a + step, plan.num_packs))
        packs = build_pack_arrays(part, store, options.packing.pad_token_id, columns)
        image_columns, index = table.pack_columns(part)
        for name, values in image_columns.items():
            setattr(packs, name, values)
        packs.images = table.read(index)
        yield packs
        bar.update(part.num_packs)


def memory_store(
    samples: list[VisionSample], sequences: list[VisionSequence], options: PackOptions, work: Path
) -> tuple[MemoryStore, str]:
    """The encoded samples as one in-memory chunk (``MemoryStore``: what ``build_pack_arrays`` gathers
    packs from) and a digest of its tokens."""
    columns = sequence_columns(sequences, options.encoding.labels)
    offsets = np.asarray(columns.column("input_ids").offsets, dtype=np.int64)
    unit = {
        "input_ids": np.asarray(columns.column("input_ids").values, dtype=np.int32),
        "labels": np.asarray(columns.column("labels").values, dtype=np.int32),
        "loss_mask": np.asarray(columns.column("loss_mask").values, dtype=np.int8),
        "offsets": offsets - offsets[0],
    }
    sources: list[str] = []
    row_kinds: list[str] = []
    source_ids = np.empty(len(samples), dtype=np.int32)
    for i, s in enumerate(samples):
        if not sources or (sources[-1], row_kinds[-1]) != (s.source, s.row_kind):
            sources.append(s.source)
            row_kinds.append(s.row_kind)
        source_ids[i] = len(sources) - 1
    unit["rows"] = np.array([s.row for s in samples], dtype=np.int64)
    unit["source_ids"] = source_ids
    meta = {
        "index": 0,
        "num_samples": len(samples),
        "has_loss_mask": True,
        "sources": sources,
        "row_kinds": row_kinds,
    }
    if options.output.columns == "minimal":  # whether the minimal layout may rebuild the labels
        shifted = options.encoding.labels == "shifted"
        follow = labels_follow_rule(
            unit["input_ids"], unit["labels"], unit["loss_mask"], unit["offsets"], shifted
        )
        meta.update(labels_rule=options.encoding.labels, labels_follow_rule=follow)
    h = hashlib.sha256()
    for name in ("input_ids", "labels", "loss_mask", "offsets"):
        h.update(np.ascontiguousarray(unit[name]).tobytes())
    return MemoryStore(Path(work), [meta], units=[unit]), h.hexdigest()


def fitting(
    samples: list[VisionSample], sequences: list[VisionSequence], n: int, sink: ErrorSink
) -> tuple[list[VisionSample], list[VisionSequence]]:
    """The samples none of whose images alone takes more than ``n`` tokens: no setting of the long-sample
    policy packs such an image, so each is a bad record (``image_too_large``: an error, or counted)."""
    kept, seqs = [], []
    for sample, seq in zip(samples, sequences, strict=True):
        over = np.flatnonzero(seq.image_lengths > n)
        if len(over):
            k = int(over[0])
            message = (
                f"image {k} ({sample.images[k].name}) alone takes {int(seq.image_lengths[k])} tokens, more "
                f"than packed_sequence_size {n}"
            )
            report(sink, sample.error(message, "image", "image_too_large"))
            continue
        kept.append(sample)
        seqs.append(seq)
    return kept, seqs


def _counted(samples: Iterator[VisionSample], bar: tqdm) -> Iterator[VisionSample]:
    for sample in samples:
        bar.update(1)
        yield sample


def _bar(show: bool, **kw) -> tqdm:
    return tqdm(disable=not show, file=sys.stderr, dynamic_ncols=True, **kw)


def _nothing_left(sink: ErrorSink) -> str:
    if not sink.total:
        return "input holds no records"
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(sink.counts.items()))
    return f"no record left: all {sink.total} were skipped as bad input ({reasons})"
