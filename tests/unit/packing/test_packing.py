"""The sequential strategy on hand-checked cases (PackedSequence semantics), at the plan level."""

from __future__ import annotations

import numpy as np
import pytest

from packtool.errors import InputError
from packtool.options import PackOptions
from packtool.packing.options import PackingOptions
from packtool.packing.planner import make_plan
from packtool.packing.sequential import plan_sequential


def _cfg(**kw) -> PackingOptions:
    base = {"inputs": ["x"], "output": "o", "packed_sequence_size": 5, "strategy": "sequential"}
    return PackOptions.from_dict({**base, **kw}).packing


def _packs(plan):
    """[(sample, start, length), ...] per pack."""
    return [
        list(zip(plan.sample[a:b].tolist(), plan.start[a:b].tolist(), plan.length[a:b].tolist(), strict=True))
        for a, b in zip(plan.pack_offsets[:-1], plan.pack_offsets[1:], strict=True)
    ]


def test_next_fit_without_split():
    plan = make_plan(np.array([3, 2, 4, 1, 5]), _cfg())
    assert _packs(plan) == [[(0, 0, 3), (1, 0, 2)], [(2, 0, 4), (3, 0, 1)], [(4, 0, 5)]]


def test_next_fit_does_not_look_back():
    # 4 does not fit after 3, so a new pack starts; the later 1 does not go back into the first pack
    plan = make_plan(np.array([3, 4, 1]), _cfg())
    assert _packs(plan) == [[(0, 0, 3)], [(1, 0, 4), (2, 0, 1)]]


def test_exactly_full_packs():
    plan = make_plan(np.array([5, 2, 3, 5]), _cfg())
    assert _packs(plan) == [[(0, 0, 5)], [(1, 0, 2), (2, 0, 3)], [(3, 0, 5)]]
    assert plan.pack_tokens().tolist() == [5, 5, 5]


def test_split_cuts_every_n_tokens():
    plan = make_plan(np.array([3, 4, 2]), _cfg(split_across_pack=True))
    assert _packs(plan) == [[(0, 0, 3), (1, 0, 2)], [(1, 2, 2), (2, 0, 2)]]
    assert plan.stats.split_samples == 1


def test_split_sample_longer_than_2n():
    plan = make_plan(np.array([2, 12, 1]), _cfg(split_across_pack=True))
    assert _packs(plan) == [[(0, 0, 2), (1, 0, 3)], [(1, 3, 5)], [(1, 8, 4), (2, 0, 1)]]


def test_max_packs_keeps_the_first_packs_and_counts_the_rest():
    plan = make_plan(np.array([3, 2, 4, 1, 5]), _cfg(max_packs=2))
    assert _packs(plan) == [[(0, 0, 3), (1, 0, 2)], [(2, 0, 4), (3, 0, 1)]]
    assert plan.stats.samples_over_max_packs == 1 and plan.stats.tokens_over_max_packs == 5


def test_max_packs_with_split_counts_a_partly_kept_sample():
    plan = make_plan(np.array([3, 4, 2]), _cfg(split_across_pack=True, max_packs=1))
    assert _packs(plan) == [[(0, 0, 3), (1, 0, 2)]]
    # sample 1 is partly kept (packed and partial), sample 2 wholly left out (over max_packs)
    assert plan.stats.samples_over_max_packs == 1 and plan.stats.tokens_over_max_packs == 4
    assert plan.stats.partial_samples == 1
    # one fate each: sample 1 counts as partly cut (not also as split), sample 0 as whole
    assert plan.stats.split_samples == 0 and plan.stats.whole_samples == 1


@pytest.mark.parametrize("strategy", ["sequential", "bfd"])
def test_max_packs_sample_counts_partition_the_samples(strategy):
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 13, size=60)
    lengths[::7] = 0
    full = make_plan(lengths, _cfg(strategy=strategy, split_across_pack=True))
    for max_packs in range(1, full.num_packs):
        plan = make_plan(lengths, _cfg(strategy=strategy, split_across_pack=True, max_packs=max_packs))
        s = plan.stats
        kept = np.bincount(plan.sample, weights=plan.length, minlength=len(lengths)).astype(np.int64)
        packed = int((kept > 0).sum())
        assert packed + s.empty_samples + s.samples_over_max_packs == s.num_samples == len(lengths)
        assert s.partial_samples == int(((kept > 0) & (kept < lengths)).sum())
        assert s.samples_over_max_packs == int(((kept == 0) & (lengths > 0)).sum())
        assert s.tokens_over_max_packs == int((lengths - kept).sum())
        # split: kept samples the planner cut over more than one pack, all of whose pieces were kept
        pack_of = np.repeat(np.arange(full.num_packs), np.diff(full.pack_offsets))
        packs_of = np.bincount(np.unique(full.sample * full.num_packs + pack_of) // full.num_packs)
        split = np.zeros(len(lengths), dtype=bool)
        split[: len(packs_of)] = packs_of > 1
        partial = (kept > 0) & (kept < lengths)
        assert s.split_samples == int((split & (kept > 0) & ~partial).sum())
        assert s.whole_samples + s.split_samples + s.partial_samples == packed


def test_long_sample_policies():
    lengths = np.array([2, 7, 3])
    with pytest.raises(InputError, match="7 tokens, more than packed_sequence_size 5"):
        make_plan(lengths, _cfg())
    dropped = make_plan(lengths, _cfg(long_samples="drop"))
    assert _packs(dropped) == [[(0, 0, 2), (2, 0, 3)]]
    assert dropped.stats.dropped_samples == 1 and dropped.stats.dropped_tokens == 7
    truncated = make_plan(lengths, _cfg(long_samples="truncate"))
    assert _packs(truncated) == [[(0, 0, 2)], [(1, 0, 5)], [(2, 0, 3)]]
    assert truncated.stats.truncated_samples == 1 and truncated.stats.truncated_tokens == 2


def test_empty_samples_are_left_out_and_counted():
    plan = make_plan(np.array([0, 2, 0, 3]), _cfg())
    assert _packs(plan) == [[(1, 0, 2), (3, 0, 3)]]
    assert plan.stats.empty_samples == 2


def test_no_samples_gives_no_packs():
    plan = make_plan(np.array([0, 0]), _cfg())
    assert plan.num_packs == 0


def test_permute_reorders_whole_packs():
    plan = plan_sequential(np.array([3, 2, 4, 1, 5]), np.arange(5), 5, False)
    moved = plan.permute(np.array([2, 0, 1]))
    assert _packs(moved) == [_packs(plan)[2], _packs(plan)[0], _packs(plan)[1]]


@pytest.mark.parametrize("strategy", ["bfd", "sequential"])
@pytest.mark.parametrize("long_samples", ["drop", "truncate", "split"])
def test_cp_size_pads_every_piece_to_a_multiple_of_twice_it(strategy, long_samples):
    """``cp_size``: each piece takes its length rounded up to a multiple of 2 x cp_size (NeMo's
    ``pack_dataset(cp_size)``), every pack's spans fit N, and the fates and tokens add up as without it."""
    n, cp = 64, 4
    lengths = np.random.default_rng(7).integers(0, 150, size=300)
    cfg = PackOptions.of(packed_sequence_size=n, strategy=strategy, long_samples=long_samples, cp_size=cp)
    plan = make_plan(lengths, cfg.packing)
    assert plan.span is not None and np.all(plan.span % (2 * cp) == 0)
    assert np.all((plan.span >= plan.length) & (plan.span - plan.length < 2 * cp))
    assert np.all(plan.pack_spans() <= n)
    plain = make_plan(lengths, cfg.replace(cp_size=1).packing)
    assert plan.num_tokens == plain.num_tokens  # the padding is not tokens
    assert plan.stats.to_dict() == plain.stats.to_dict()
    assert plan.num_packs >= plain.num_packs
