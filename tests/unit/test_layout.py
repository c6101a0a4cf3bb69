"""The storage layouts: ``minimal`` stores what carries information and ``layout.rebuild`` gives back the
``full`` packs, bit for bit, from samples labelled as the encoders label them.

(In-process tests of ``packtool.layout`` on chunks written by ``write_chunk`` and packs built by the write
step; the CLI's, through every reader and both formats, are in tests/e2e/test_columns.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from packtool.arrays import large_lists
from packtool.encoders.base import encoded_batch, make_labels
from packtool.encoders.masking import loss_columns
from packtool.layout import labels_follow_rule, mask_from_bits, rebuild, stored_columns, to_stored
from packtool.manifest import IGNORE_INDEX, column_names
from packtool.options import PackOptions
from packtool.packing.planner import make_plan
from packtool.pipeline.chunks import ChunkStore, write_chunk
from packtool.pipeline.write import build_pack_arrays, output_columns
from packtool.readers.base import batch_from_pylist

N = 40


def samples(
    seed: int, count: int, mask: str | None, convention: str, labels: str = "encoder"
) -> pa.RecordBatch:
    """``count`` encoded samples (1..2N tokens, so some are split or truncated) labelled as the encoders
    label them: ``mask`` None (text, pretokenized ids), ``"runs"`` (a prompt, then a response: the
    fine-tuning encoders) or ``"random"`` (a pretokenized loss_mask); ``labels="arbitrary"``: labels of
    the input's own, which no rule gives."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * N, count)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = large_lists(offsets, rng.integers(0, 500, int(offsets[-1])).astype(np.int32), pa.int32())
    if labels == "arbitrary":
        values = rng.integers(-1, 500, int(offsets[-1])).astype(np.int32)
        values[values < 0] = IGNORE_INDEX
        lab = large_lists(offsets, values, pa.int32())
        loss = large_lists(offsets, (values != IGNORE_INDEX).astype(np.int8), pa.int8()) if mask else None
        return encoded_batch(ids, lab, loss)
    if mask is None:
        return encoded_batch(ids, make_labels(ids, convention))
    if mask == "runs":
        position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        trained = position >= np.repeat(lengths // 3, lengths)
    else:
        trained = rng.random(int(offsets[-1])) < 0.5
    lab, loss = loss_columns(ids, trained.astype(np.int8), convention)
    return encoded_batch(ids, lab, loss)


def store_of(tmp_path, encoded: list[pa.RecordBatch], convention: str) -> ChunkStore:
    metas = []
    for i, rb in enumerate(encoded):
        batch = batch_from_pylist([{"x": 0}] * rb.num_rows, "mem", np.arange(rb.num_rows), "row")
        metas.append(write_chunk(tmp_path, i, [batch], [rb], labels_rule=convention))
    return ChunkStore(tmp_path, metas)


def both_layouts(store: ChunkStore, cfg: PackOptions):
    """``(full packs, minimal packs as stored, the manifest's fields rebuild reads)``, one plan."""
    plan = make_plan(store.lengths(), cfg.packing)
    full = build_pack_arrays(plan, store, cfg.packing.pad_token_id, column_names(store.has_loss_mask))
    columns = output_columns(cfg, store)
    stored = build_pack_arrays(plan, store, cfg.packing.pad_token_id, columns)
    manifest = SimpleNamespace(
        columns=columns, packed_sequence_size=N, position_ids=plan.position_ids, labels=cfg.encoding.labels
    )
    return full, stored, manifest


def assert_same(a, b) -> None:
    assert a.present() == b.present()
    for name in a.present():
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    for name in ("seq_lens_offsets", "sample_index_offsets"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


CASES = [
    pytest.param(mask, convention, split, strategy, id=f"{mask}-{convention}-{split}-{strategy}")
    for mask in (None, "runs", "random")
    for convention in ("shifted", "unshifted")
    for split in ("split", "truncate")
    for strategy in ("bfd", "sequential")
]


@pytest.mark.parametrize("mask, convention, split, strategy", CASES)
def test_minimal_rebuilds_the_full_packs(tmp_path, mask, convention, split, strategy):
    """Whatever the labels convention, loss mask, split or truncated samples and position ids convention
    (nemo for sequential, restart for bfd), the packs rebuilt from what minimal stores are the full ones:
    every column, dtype and value; and minimal stores no labels, no position_ids, no int8 loss_mask."""
    encoded = [samples(seed, 60, mask, convention) for seed in range(3)]  # three chunks
    store = store_of(tmp_path, encoded, convention)
    assert store.labels_follow_rule  # what every encoder makes
    cfg = PackOptions.of(
        packed_sequence_size=N,
        labels=convention,
        strategy=strategy,
        split_across_pack=split == "split",
        long_samples="error" if split == "split" else "truncate",
        columns="minimal",
        pad_token_id=3,
    )
    full, stored, manifest = both_layouts(store, cfg)
    assert {"labels", "position_ids", "loss_mask"}.isdisjoint(manifest.columns)
    assert ("next_label" in manifest.columns) == (convention == "shifted")
    assert ("loss_mask_bits" in manifest.columns) == (mask is not None)
    assert stored.present() == manifest.columns
    if convention == "shifted":  # split or truncated samples: a piece's last label is a token of its sample
        assert (stored.next_label != IGNORE_INDEX).any()
    assert_same(rebuild(stored, manifest), full)
    # what a reader asks for: only those columns, rebuilt from only the stored ones it reads
    wanted = ["input_ids", "labels", "position_ids", "seq_lens"] + (["loss_mask"] if mask else [])
    read = stored_columns(manifest.columns, wanted)
    part = rebuild(to_stored(stored, read), manifest, wanted)
    for name in wanted:
        assert np.array_equal(getattr(part, name), getattr(full, name)), name
    assert part.next_label is None and part.loss_mask_bits is None


@pytest.mark.parametrize("mask", [None, "random"])
def test_labels_of_their_own_are_stored(tmp_path, mask):
    """Pretokenized labels that no rule gives carry information: minimal stores them (and still leaves out
    position_ids, and packs the mask into bits); the chunk records that its labels do not follow."""
    store = store_of(tmp_path, [samples(0, 60, mask, "shifted", labels="arbitrary")], "shifted")
    assert not store.labels_follow_rule
    cfg = PackOptions.of(packed_sequence_size=N, columns="minimal", long_samples="truncate")
    full, stored, manifest = both_layouts(store, cfg)
    assert "labels" in manifest.columns and "next_label" not in manifest.columns
    assert "position_ids" not in manifest.columns
    assert_same(rebuild(stored, manifest), full)


def test_one_chunk_of_labels_of_their_own_stores_them_all(tmp_path):
    """The layout is the output's: one chunk whose labels do not follow the rule stores every label."""
    encoded = [samples(0, 30, None, "shifted"), samples(1, 30, None, "shifted", labels="arbitrary")]
    store = store_of(tmp_path, encoded, "shifted")
    assert [m["labels_follow_rule"] for m in store.metas] == [True, False]
    assert "labels" in output_columns(PackOptions.of(packed_sequence_size=N, columns="minimal"), store)


def test_full_stores_what_it_always_stored(tmp_path):
    store = store_of(tmp_path, [samples(0, 30, "runs", "shifted")], None)
    cfg = PackOptions.of(packed_sequence_size=N, long_samples="truncate")
    assert output_columns(cfg, store) == column_names(True)
    full, stored, manifest = both_layouts(store, cfg)
    assert_same(stored, full)
    assert rebuild(stored, manifest).present() == full.present()


def test_labels_follow_rule_leaves_each_samples_last_label_free():
    ids = np.array([5, 6, 7, 8, 9], np.int32)
    offsets = np.array([0, 3, 5])
    shifted = np.array([6, 7, 42, 9, IGNORE_INDEX], np.int32)  # 42: a truncated sample's next token
    assert labels_follow_rule(ids, shifted, None, offsets, True)
    wrong = shifted.copy()
    wrong[0] = 7
    assert not labels_follow_rule(ids, wrong, None, offsets, True)
    mask = np.array([1, 0, 1, 1, 0], np.int8)
    masked = np.array([6, IGNORE_INDEX, 42, 9, IGNORE_INDEX], np.int32)
    assert labels_follow_rule(ids, masked, mask, offsets, True)
    assert not labels_follow_rule(ids, shifted, mask, offsets, True)  # a label where the mask takes none
    unshifted = np.array([5, IGNORE_INDEX, 7, 8, IGNORE_INDEX], np.int32)  # no label is free: all rebuilt
    assert labels_follow_rule(ids, unshifted, mask, offsets, False)
    assert not labels_follow_rule(ids, np.where(mask == 1, ids, 0).astype(np.int32), mask, offsets, False)


@pytest.mark.parametrize("n", [8, 13, 40])
def test_loss_mask_bits_round_trip(n):
    rng = np.random.default_rng(n)
    mask = (rng.random((5, n)) < 0.5).astype(np.int8)
    bits = np.packbits(mask, axis=1)
    assert bits.shape == (5, -(-n // 8))
    got = mask_from_bits(bits, n)
    assert got.dtype == np.int8 and np.array_equal(got, mask)


def test_rebuild_leaves_broken_packs_out(tmp_path):
    """verify rebuilds a batch in which some packs' layout is broken: those get -100 labels and 0
    positions, the others their own."""
    store = store_of(tmp_path, [samples(0, 60, "runs", "shifted")], "shifted")
    cfg = PackOptions.of(packed_sequence_size=N, columns="minimal", long_samples="truncate")
    full, stored, manifest = both_layouts(store, cfg)
    ok = np.ones(stored.num_packs, dtype=bool)
    ok[[0, 2]] = False
    stored.seq_lens[stored.seq_lens_offsets[0]] += 5  # pack 0 no longer sums to N
    got = rebuild(stored, manifest, ok=ok)
    assert np.array_equal(got.labels[ok], full.labels[ok])
    assert np.array_equal(got.position_ids[ok], full.position_ids[ok])
    assert (got.labels[~ok] == IGNORE_INDEX).all() and (got.position_ids[~ok] == 0).all()


def test_column_names_and_what_readers_read():
    assert column_names(False, "minimal") == [
        "input_ids",
        "seq_lens",
        "sample_index",
        "sample_offset",
        "next_label",
    ]
    assert column_names(False, "minimal", shifted=False) == [
        "input_ids",
        "seq_lens",
        "sample_index",
        "sample_offset",
    ]
    assert column_names(True, "minimal", labels_rebuilt=False) == [
        "input_ids", "labels", "seq_lens", "sample_index", "sample_offset", "loss_mask_bits",
    ]  # fmt: skip
    stored = column_names(True, "minimal")
    assert stored_columns(stored, ["input_ids", "position_ids", "seq_lens"]) == [
        "input_ids", "seq_lens", "sample_offset",
    ]  # fmt: skip
    assert stored_columns(stored, ["loss_mask"]) == ["loss_mask_bits"]
    assert stored_columns(column_names(True), ["labels", "loss_mask"]) == ["labels", "loss_mask"]
