"""``packtool.binding``: what the run_id binds of a manifest, and what the manifest says twice, checked both
ways: a shard entry's ``first_pack`` against the pack counts before it, a vision-language output's processor
record against the digest its ``run_key`` ends with (format 6.2 on; an older output's record is read as it
always was, whatever its ``format_minor`` says)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

from packtool.binding import first_pack_problem, processor_problem, processor_run_key
from packtool.manifest import ShardEntry

RECORD = {
    "path": "/models/qwen",
    "loss_on": "assistant",
    "image_token": "<|image_pad|>",
    "image_token_ids": [9],
}


def vision_manifest(run_key: str, record: dict, minor: int = 2) -> SimpleNamespace:
    return SimpleNamespace(
        run_key=run_key, vision={"processor": record}, format_version=6, format_minor=minor
    )


def test_the_processor_record_is_bound_by_the_run_key_from_6_2_on():
    bound = processor_run_key("0" * 32, RECORD)
    assert processor_problem(vision_manifest(bound, dict(RECORD))) is None
    assert processor_problem(vision_manifest(bound, {**RECORD, "path": "/elsewhere"})) is None  # (a record)
    for key, value in (("loss_on", "all"), ("image_token", "<image>"), ("image_token_ids", [7])):
        edited = {**RECORD, key: value}
        for minor in (2, 1, 0):  # claiming an older version changes nothing: the key binds it
            assert "not the processor record its run_key binds" in processor_problem(
                vision_manifest(bound, edited, minor)
            )
    gone = vision_manifest(bound, {})
    gone.vision = None
    assert processor_problem(gone) is not None


def test_an_older_output_s_record_is_read_as_it_was():
    """A 6.1 output's run_key is 32 hex digits: its processor record was bound to nothing, and reads."""
    assert processor_problem(vision_manifest("0" * 32, {**RECORD, "loss_on": "all"}, minor=1)) is None


def test_first_pack_is_where_the_shards_before_it_end():
    shards = [ShardEntry(f"packs-{i:06d}.parquet", 40 * i, 40, 1, 1, "") for i in range(3)]
    manifest = SimpleNamespace(shards=shards, shard_starts=[0, 40, 80])
    assert first_pack_problem(manifest) is None
    edited = copy.deepcopy(manifest)
    edited.shards[2].first_pack = 79
    assert first_pack_problem(edited).startswith(
        "field 'shards[2].first_pack': 79, where the shards before it"
    )
