"""The run's manifest: what the packs hold and what happened to every input sample, from the plan."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from packtool.errors import ErrorSink
from packtool.formats.registry import get_format
from packtool.manifest import (
    BASE_FORMAT_VERSION,
    IMAGES_FORMAT_VERSION,
    NEWEST_MINOR,
    Histogram,
    InputEntry,
    Manifest,
    SamplesPerPack,
    ShardEntry,
    Stats,
    TokenizerIdentity,
    total_stats,
)
from packtool.options import PackOptions
from packtool.packing.plan import PackPlan
from packtool.stats import READ_NOTES


def run_stats(
    options: PackOptions,
    plan: PackPlan,
    lengths: np.ndarray,
    empty_loss: tuple[int, int] = (0, 0),
    skipped: ErrorSink | None = None,
) -> Stats:
    """What happened to every input sample and token of the run, from its plan.

    ``lengths``: the planned samples' lengths; ``empty_loss``: (samples, tokens) with nothing to learn
    (under ``empty_loss=drop`` they reach the planner as empty samples); ``skipped``: the bad records,
    and what the readers counted beside them (``READ_NOTES``).
    Raises ``AssertionError`` when the fates do not add up (a packtool bug).
    """
    n = options.packing.packed_sequence_size
    pack_tokens = plan.pack_tokens()
    per_pack = np.diff(plan.pack_offsets)
    num_packs = plan.num_packs
    planned = plan.stats.to_dict()
    planned.pop("num_samples")
    empty_loss_samples, empty_loss_tokens = (int(v) for v in empty_loss)
    dropping = options.encoding.fine_tuning.empty_loss == "drop"
    if dropping:  # the planner saw them as empty: count them once, as what they are
        planned["empty_samples"] -= empty_loss_samples
    stats = Stats(
        **total_stats(n, num_packs, int(pack_tokens.sum())),
        cp_padding_tokens=int(plan.spans.sum()) - plan.num_tokens,
        num_samples=len(lengths),
        packed_samples=len(plan.packed_inputs()),
        input_tokens=int(lengths.sum()) + (empty_loss_tokens if dropping else 0),
        samples_per_pack=SamplesPerPack.of(
            num_packs,
            len(plan.sample),
            int(per_pack.min()) if num_packs else 0,
            int(per_pack.max()) if num_packs else 0,
        ),
        **planned,
        empty_loss_samples=empty_loss_samples,
        empty_loss_dropped=empty_loss_samples if dropping else 0,
        empty_loss_tokens=empty_loss_tokens if dropping else 0,
        skipped_samples=skipped.total if skipped else 0,
        skipped_by_reason=dict(sorted(skipped.counts.items())) if skipped else {},
        **{k: skipped.notes.get(k, 0) for k in READ_NOTES if skipped},
    )
    wrong = stats.check()
    assert not wrong, f"packtool bug, the run's accounting: {'; '.join(wrong)}"
    return stats


def build_manifest(
    options: PackOptions,
    plan: PackPlan,
    lengths: np.ndarray,
    stats: Stats,
    shards: list[ShardEntry],
    tokenizer: dict,
    sample_format: str,
    run_id: str,
    inputs: list[dict],
    columns: list[str],
) -> Manifest:
    """The manifest of a finished run (``index_files`` are added by the format, if it writes any)."""
    n = options.packing.packed_sequence_size
    return Manifest(
        run_id=run_id,
        shard_format=options.output.format,
        packed_sequence_size=n,
        sample_format=sample_format,
        labels=options.encoding.labels,
        position_ids=plan.position_ids,
        pad_token_id=options.packing.pad_token_id,
        columns=columns,
        tokenizer=TokenizerIdentity.from_dict(tokenizer),
        inputs=[InputEntry(**i) for i in inputs],
        provenance=options.to_dict(include_runtime=False),  # a plain record: readers never parse it
        stats=stats,
        histograms={
            "sample_lengths": Histogram.lengths(lengths, n),
            "pack_fill": Histogram.pack_fill(plan.pack_tokens(), n),
            "samples_per_pack": Histogram.per_pack(np.diff(plan.pack_offsets)),
        },
        shards=shards,
        layout=options.output.columns,
    )


def input_entries(fingerprint: list[dict], counts: dict[str, int]) -> list[dict]:
    """The inputs' entries for the manifest, each with the samples it gave (a folder's files add up)."""
    out = []
    entries = {entry["source"] for entry in fingerprint}
    for entry in fingerprint:
        src = entry["source"]
        mine = counts.get(src, 0)
        if os.path.isdir(src):  # a folder read as one input: its files are the sources (not the inputs
            prefix = src.rstrip("/") + "/"  # of their own below it: `docs docs/sub` reads sub twice)
            mine += sum(n for s, n in counts.items() if s.startswith(prefix) and s not in entries)
        path = None if src.startswith("hf:") else os.path.abspath(src)
        out.append({**entry, "num_samples": mine, "path": path})
    return out


def with_path(identity: dict) -> dict:
    """The tokenizer identity for the manifest, with its absolute ``path`` when it is a local file or
    folder, so that ``inspect --decode`` finds it from any directory (not in the run_id: the same input
    gives the same shards wherever it lies)."""
    name = identity.get("name")
    if identity.get("kind") == "huggingface" and name and os.path.exists(name):
        return {**identity, "path": os.path.abspath(name)}
    return identity


def lowest_version(manifest: Manifest) -> Manifest:
    """``manifest`` saying the lowest ``format_version`` whose readers read it whole: its format's say for
    each shard (``ShardWriter.format_major``: compressed tar members need 6), 6 for images, else 5; the
    minor is that major's newest (docs/formats.md#compatibility). Readers pinned to an older packtool so
    keep reading every output that needs nothing newer."""
    writer = get_format(manifest.shard_format).writer
    needs = [writer.format_major(entry.fields) for entry in manifest.shards]
    if manifest.image_columns:
        needs.append(IMAGES_FORMAT_VERSION)
    major = max([BASE_FORMAT_VERSION, *needs])
    return dataclasses.replace(manifest, format_version=major, format_minor=NEWEST_MINOR[major])
