"""Property-based tests of the packers (every strategy in ``packtool.packing.STRATEGIES``).

At the plan level (``make_plan`` + ``build_pack_arrays`` over a real ``ChunkStore`` written by
``write_chunk``), for random sample lengths, N, ``split_across_pack``, ``max_packs``, ``long_samples`` and
``position_ids``:

* every kept token is in the packs exactly once, each sample's tokens in order, and every token that is
  not kept is counted (``dropped``/``truncated``/``over_max_packs``): nothing is lost silently;
* every pack has N tokens; ``seq_lens`` sums to N, with one trailing entry for the padding iff any;
* ``labels``, ``loss_mask`` and ``position_ids`` line up with the tokens they belong to;
* the plan and the packs are the same when made again (with the same seed).

Through the CLI, a few examples check that the output is byte-identical for ``--num-proc`` 1 and 2.


(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.errors import InputError
from packtool.packing.options import PackingOptions
from packtool.packing.planner import STRATEGIES, make_plan
from packtool.pipeline.chunks import ChunkStore, write_chunk
from packtool.pipeline.write import build_pack_arrays
from packtool.readers.base import SourceBatch

LABEL_SHIFT = 1_000_000  # labels of token t are t + LABEL_SHIFT: any misalignment shows
PAD = 7  # pad_token_id, never a real token (real tokens start above it)


def sample_tokens(lengths: list[int]) -> list[np.ndarray]:
    """Distinct token ids for every sample: sample i holds a run of ids no other sample has."""
    starts = np.concatenate([[0], np.cumsum(lengths)]) + PAD + 1
    return [np.arange(starts[i], starts[i] + n, dtype=np.int32) for i, n in enumerate(lengths)]


def write_store(work: Path, tokens: list[np.ndarray], chunk_size: int, with_mask: bool) -> ChunkStore:
    """Write the samples as encoded chunks of ``chunk_size`` samples, as the pipeline does."""
    metas = []
    for index, first in enumerate(range(0, len(tokens), chunk_size)):
        part = tokens[first : first + chunk_size]
        rows = np.arange(first, first + len(part), dtype=np.int64)
        batch = SourceBatch("mem", pa.record_batch({"id": pa.array(rows)}), rows, "row")
        offsets = pa.array(np.concatenate([[0], np.cumsum([len(t) for t in part])]).astype(np.int64))
        flat = np.concatenate(part) if part else np.zeros(0, dtype=np.int32)
        cols = {
            "input_ids": pa.LargeListArray.from_arrays(offsets, pa.array(flat, type=pa.int32())),
            "labels": pa.LargeListArray.from_arrays(offsets, pa.array(flat + LABEL_SHIFT, type=pa.int32())),
        }
        if with_mask:
            cols["loss_mask"] = pa.LargeListArray.from_arrays(offsets, pa.array(flat % 2, type=pa.int8()))
        metas.append(write_chunk(work, index, [batch], [pa.record_batch(cols)]))
    return ChunkStore(work, metas)


@st.composite
def packing_cases(draw):
    n = draw(st.integers(1, 24))
    lengths = draw(st.lists(st.integers(0, 3 * n), max_size=40))
    return {
        "n": n,
        "lengths": lengths,
        "split_across_pack": draw(st.booleans()),
        "max_packs": draw(st.none() | st.integers(1, 6)),
        "long_samples": draw(st.sampled_from(["error", "drop", "truncate"])),
        "position_ids": draw(st.sampled_from(["nemo", "restart"])),
        "chunk_size": draw(st.integers(1, 8)),
        "with_mask": draw(st.booleans()),
        "seed": draw(st.integers(0, 3)),
    }


def check_packs(case: dict, strategy: str, store: ChunkStore, tokens: list[np.ndarray]) -> None:
    n, lengths = case["n"], np.asarray(case["lengths"], dtype=np.int64)
    # the packing stage's own group, built as is: the property covers combinations the CLI refuses as
    # having no effect (a long_samples policy with split_across_pack, a seed with sequential)
    packing = PackingOptions(
        **{
            "packed_sequence_size": n,
            "strategy": strategy,
            "pad_token_id": PAD,
            **{
                k: case[k] for k in ("split_across_pack", "max_packs", "long_samples", "position_ids", "seed")
            },
        }
    )
    long = lengths > n
    if long.any() and not case["split_across_pack"] and case["long_samples"] == "error":
        with pytest.raises(InputError, match="more than packed_sequence_size"):
            make_plan(lengths, packing, store.locate)
        return
    plan = make_plan(lengths, packing, store.locate)
    packs = build_pack_arrays(plan, store, PAD)

    # what should be kept of every sample (before max_packs)
    kept = [t for t in tokens]
    if not case["split_across_pack"]:
        if case["long_samples"] == "drop":
            kept = [t[:0] if len(t) > n else t for t in kept]
        elif case["long_samples"] == "truncate":
            kept = [t[:n] for t in kept]

    k = packs.num_packs
    assert packs.input_ids.shape == packs.labels.shape == packs.position_ids.shape == (k, n)
    if case["max_packs"] is not None:
        assert k <= case["max_packs"]
    delivered: dict[int, list[np.ndarray]] = {}
    for p in range(k):
        sl = packs.seq_lens[packs.seq_lens_offsets[p] : packs.seq_lens_offsets[p + 1]]
        owners = packs.sample_index[packs.sample_index_offsets[p] : packs.sample_index_offsets[p + 1]]
        offsets = packs.sample_offset[packs.sample_index_offsets[p] : packs.sample_index_offsets[p + 1]]
        assert len(owners) >= 1 and sl.sum() == n and (sl >= 1).all()
        used = int(sl[: len(owners)].sum())
        assert len(sl) == len(owners) + (used < n)  # one trailing entry for the padding, iff any
        ids, labels, pos = packs.input_ids[p], packs.labels[p], packs.position_ids[p]
        assert (ids[used:] == PAD).all() and (labels[used:] == -100).all()
        if packs.loss_mask is not None:
            assert (packs.loss_mask[p][used:] == 0).all()
        at = 0
        for s, before, length in zip(
            owners.tolist(), offsets.tolist(), sl[: len(owners)].tolist(), strict=True
        ):
            piece = ids[at : at + length]
            assert (piece == kept[s][before : before + length]).all()  # the piece sample_offset names
            assert (labels[at : at + length] == piece + LABEL_SHIFT).all()
            if packs.loss_mask is not None:
                assert (packs.loss_mask[p][at : at + length] == piece % 2).all()
            within = np.arange(length)
            expected = within if case["position_ids"] == "restart" else (before + within) % n
            assert (pos[at : at + length] == expected).all()
            delivered.setdefault(s, []).append((before, piece))
            at += length
        if used < n:
            last = pos[used - 1]
            pad = (
                np.arange(n - used)
                if case["position_ids"] == "restart"
                else np.minimum(last + 1 + np.arange(n - used), n - 1)
            )
            assert (pos[used:] == pad).all()

    got = {}
    for s, pieces in delivered.items():  # pieces in sample order never overlap; without max_packs cuts,
        pieces.sort(key=lambda x: x[0])  # they tile the sample from 0 with no gap
        starts = [b for b, _ in pieces]
        ends = [b + len(x) for b, x in pieces]
        assert all(e <= b for e, b in zip(ends[:-1], starts[1:], strict=True))
        if plan.stats.tokens_over_max_packs == 0:
            assert starts == [0] + ends[:-1]
        got[s] = np.concatenate([x for _, x in pieces])
    all_tokens = np.concatenate(list(got.values())) if got else np.zeros(0)
    assert len(np.unique(all_tokens)) == len(all_tokens)  # no token twice
    stats = plan.stats
    assert stats.num_samples == len(lengths) and stats.empty_samples == int((lengths == 0).sum())
    over = stats.tokens_over_max_packs
    if case["max_packs"] is None or over == 0:
        # every kept token of every sample is there
        assert set(got) == {s for s, t in enumerate(kept) if len(t)}
        assert all(len(got[s]) == len(kept[s]) for s in got)
    # each fate with the tokens its own samples lost, from what the packs hold: a truncated sample
    # max_packs cut or left out is max_packs' with all it lost, its truncated tail included
    have = np.array([len(got.get(s, ())) for s in range(len(lengths))], dtype=np.int64)
    wanted = np.array([len(t) for t in kept], dtype=np.int64)
    cut_short = (wanted > 0) & (have < wanted)
    truncated = ~cut_short & (wanted > 0) & (lengths > wanted)
    dropped = (wanted == 0) & (lengths > 0)
    assert (stats.truncated_samples, stats.truncated_tokens) == (
        int(truncated.sum()),
        int((lengths - wanted)[truncated].sum()),
    )
    assert stats.samples_over_max_packs + stats.partial_samples == int(cut_short.sum())
    assert over == int((lengths - have)[cut_short].sum())
    assert (stats.dropped_samples, stats.dropped_tokens) == (int(dropped.sum()), int(lengths[dropped].sum()))
    assert len(all_tokens) + stats.dropped_tokens + stats.truncated_tokens + over == lengths.sum()
    if not case["split_across_pack"]:
        # a sample is never cut across packs
        assert len(plan.sample) == len(np.unique(plan.sample))
    if strategy == "sequential":
        assert (np.diff(plan.sample) >= 0).all()  # input order
        used = plan.pack_tokens()
        if case["split_across_pack"]:
            assert (used[:-1] == n).all()  # every pack but the last is full
        else:
            # next-fit: a pack is closed only by a sample that does not fit in it
            first_of_next = plan.length[plan.pack_offsets[1:-1]]
            assert (used[:-1] + first_of_next > n).all()

    # deterministic: the same plan and packs again
    again = make_plan(lengths, packing, store.locate)
    for name in ("pack_offsets", "sample", "start", "length"):
        assert np.array_equal(getattr(plan, name), getattr(again, name))
    packs2 = build_pack_arrays(again, store, PAD)
    assert np.array_equal(packs.input_ids, packs2.input_ids) and np.array_equal(
        packs.seq_lens, packs2.seq_lens
    )


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=packing_cases())
def test_packing_invariants(strategy, case):
    tokens = sample_tokens(case["lengths"])
    with tempfile.TemporaryDirectory() as work:
        store = write_store(Path(work), tokens, case["chunk_size"], case["with_mask"])
        check_packs(case, strategy, store, tokens)
