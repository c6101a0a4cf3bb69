"""The run's manifest: what the packs hold and what happened to every input sample, from the plan."""

from __future__ import annotations

import numpy as np

from packtool.config import PackConfig
from packtool.errors import ErrorSink
from packtool.manifest import (
    Histogram,
    InputEntry,
    Manifest,
    SamplesPerPack,
    ShardEntry,
    Stats,
    TokenizerIdentity,
    column_names,
    total_stats,
)
from packtool.packing.plan import PackPlan


def build_manifest(
    config: PackConfig,
    plan: PackPlan,
    lengths: np.ndarray,
    shards: list[ShardEntry],
    tokenizer: dict,
    sample_format: str,
    run_id: str,
    inputs: list[dict],
    has_loss_mask: bool,
    empty_loss_samples: int = 0,
    skipped: ErrorSink | None = None,
) -> Manifest:
    """The manifest of a finished run (``index_files`` are added by the format, if it writes any)."""
    n = config.packed_sequence_size
    pack_tokens = plan.pack_tokens()
    per_pack = np.diff(plan.pack_offsets)
    num_packs = plan.num_packs
    planned = plan.stats.to_dict()
    # samples with tokens but no trained token (empty_loss policy); when dropped, the planner saw them as
    # empty: count them here only, so empty_samples keeps meaning "encoded to no tokens"
    if config.empty_loss == "drop":
        planned["empty_samples"] -= int(empty_loss_samples)
    stats = Stats(
        **total_stats(n, num_packs, int(pack_tokens.sum())),
        packed_samples=int(len(np.unique(plan.sample))),
        input_tokens=int(lengths.sum()),
        samples_per_pack=SamplesPerPack.of(
            num_packs,
            len(plan.sample),
            int(per_pack.min()) if num_packs else 0,
            int(per_pack.max()) if num_packs else 0,
        ),
        **planned,
        skipped_samples=skipped.total if skipped else 0,
        skipped_by_reason=dict(sorted(skipped.counts.items())) if skipped else {},
        empty_loss_samples=int(empty_loss_samples),
    )
    return Manifest(
        run_id=run_id,
        shard_format=config.format,
        packed_sequence_size=n,
        sample_format=sample_format,
        labels=config.labels,
        position_ids=plan.position_ids,
        pad_token_id=config.pad_token_id,
        columns=column_names(has_loss_mask),
        tokenizer=TokenizerIdentity.from_dict(tokenizer),
        inputs=[InputEntry(**i) for i in inputs],
        config=config,
        stats=stats,
        histograms={
            "sample_lengths": Histogram.lengths(lengths, n),
            "pack_fill": Histogram.pack_fill(pack_tokens, n),
            "samples_per_pack": Histogram.per_pack(per_pack),
        },
        shards=shards,
    )
