"""The order on pack indices alone (``packtool.loader.order``): a mixture's sequence, and the flat order a
run at another world size is cut from. (The order of one output is pinned in test_loader.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from packtool.loader.order import (
    Layout,
    Shares,
    Units,
    draw_skip,
    flat_order,
    mixture_counts,
    mixture_sequence,
    rank_positions,
    recut,
    source_cycle,
    take,
)

UNITS = [np.array([7, 7, 7, 5]), np.array([3, 4]), np.array([2, 2, 2])]  # 26, 7 and 6 packs
SIZES = np.array([u.sum() for u in UNITS])
BASE = np.concatenate([[0], np.cumsum(SIZES)[:-1]])


def source_of(ids: np.ndarray) -> np.ndarray:
    return np.searchsorted(BASE, ids, side="right") - 1


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_source_cycles_through_its_own_epochs_every_pack_once_per_lap(shuffle):
    units = np.array([4, 3, 5])
    packs, laps = source_cycle(units, 5, 40, source=1, seed=2, shuffle=shuffle)
    positions = np.arange(5, 45)
    assert laps.tolist() == (positions // 12).tolist()
    for lap in range(laps.min(), laps.max() + 1):
        here = packs[laps == lap]
        assert len(np.unique(here)) == len(here)  # no pack twice before the others
    full = packs[(laps >= 1) & (laps <= 2)].reshape(2, 12)
    assert all(sorted(row) == list(range(12)) for row in full)  # whole laps: every pack once
    if shuffle:
        assert full[0].tolist() != full[1].tolist()  # another order each lap
    # a unit's packs stay together within a lap (what a worker decodes once)
    first = np.concatenate([[0], np.cumsum(units)])
    unit = np.searchsorted(first, full[0], side="right") - 1
    assert (np.diff(unit) != 0).sum() == len(units) - 1


def test_repeats_give_each_source_exactly_its_share_each_epoch_a_different_part_of_a_fraction():
    shares = Shares(repeats=(1.0, 2.0, 0.5))
    counts = mixture_counts(SIZES, shares, epoch=0, seed=0, shuffle=True)
    assert counts.tolist() == [26, 14, 3]
    halves = []
    for epoch in range(4):
        ids, laps, _ = mixture_sequence(UNITS, shares, epoch=epoch, seed=0, shuffle=True)
        src = source_of(ids)
        assert np.bincount(src, minlength=3).tolist() == [26, 14, 3]
        assert sorted(ids[src == 0] - BASE[0]) == list(range(26))  # repeat 1: every pack once
        twice = np.bincount(ids[src == 1] - BASE[1], minlength=7)
        assert (twice == 2).all()  # repeat 2: every pack twice, in two laps
        halves.append(frozenset((ids[src == 2] - BASE[2]).tolist()))
    assert halves[0] | halves[1] == set(range(6)) and not halves[0] & halves[1]  # 0.5: the other half next


def test_weighted_counts_are_drawn_per_epoch_and_sum_to_the_sources_packs():
    shares = Shares(weights=(0.5, 0.3, 0.2))
    per_epoch = [mixture_counts(SIZES, shares, epoch=e, seed=1, shuffle=True) for e in range(400)]
    assert all(c.sum() == SIZES.sum() for c in per_epoch)
    assert len({tuple(c) for c in per_epoch}) > 10  # drawn, not fixed
    share = np.sum(per_epoch, axis=0) / (400 * SIZES.sum())
    # binomial bounds: 4 standard deviations of the mean share over 400 * 39 draws
    sd = np.sqrt(np.array([0.5, 0.3, 0.2]) * (1 - np.array([0.5, 0.3, 0.2])) / (400 * SIZES.sum()))
    assert (np.abs(share - [0.5, 0.3, 0.2]) < 4 * sd).all(), share
    fixed = mixture_counts(SIZES, shares, epoch=0, seed=1, shuffle=False)  # the largest remainders
    assert (
        fixed.tolist()
        == [19, 12, 8]
        == mixture_counts(SIZES, shares, epoch=5, seed=9, shuffle=False).tolist()
    )


def test_a_weighted_source_continues_its_cycle_across_epochs():
    """The packs each source gives in epochs 0, 1, 2 are consecutive places of its own cycle: a small source
    drawn often repeats only after all of its packs."""
    shares = Shares(weights=(1, 1, 8))
    drawn = [mixture_sequence(UNITS, shares, epoch=e, seed=3, shuffle=True) for e in range(3)]
    small = np.concatenate([ids[source_of(ids) == 2] - BASE[2] for ids, _, _ in drawn])
    laps = np.concatenate([lap[source_of(ids) == 2] for ids, lap, _ in drawn])
    assert len(small) > 3 * 6
    for lap in np.unique(laps)[:-1]:  # every whole lap holds each of its 6 packs once
        assert sorted(small[laps == lap].tolist()) == list(range(6))
    assert (np.diff(laps) >= 0).all()


def test_the_mixture_sequence_is_a_function_of_seed_and_epoch():
    shares = Shares(weights=(2, 1, 1))
    a = mixture_sequence(UNITS, shares, epoch=3, seed=7, shuffle=True)
    b = mixture_sequence(UNITS, shares, epoch=3, seed=7, shuffle=True)
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    assert a[0].tolist() != mixture_sequence(UNITS, shares, epoch=4, seed=7, shuffle=True)[0].tolist()
    assert a[0].tolist() != mixture_sequence(UNITS, shares, epoch=3, seed=8, shuffle=True)[0].tolist()


def test_unshuffled_mixture_spreads_the_sources_evenly():
    ids, _, rng = mixture_sequence(UNITS, Shares(repeats=(1, 1, 1)), epoch=0, seed=0, shuffle=False)
    assert rng is None
    src = source_of(ids)
    for i, n in enumerate(SIZES):  # in every tenth of the epoch, each source about its share
        for part in np.array_split(src, 5):
            assert abs((part == i).sum() - len(part) * n / SIZES.sum()) <= 2
        assert (ids[src == i] - BASE[i]).tolist() == list(range(n))  # file order


@pytest.mark.parametrize("drop_last", [True, False])
def test_flat_order_is_what_the_ranks_consume_global_batch_after_global_batch(drop_last):
    layout = Layout(3, 4, lanes=2, drop_last=drop_last, seed=1, shuffle=True, shuffle_buffer=5)
    total = 59
    skip = draw_skip(np.random.default_rng(0), total, layout)
    ranks = [rank_positions(total, skip, layout, epoch=2, rank=r) for r in range(3)]
    flat = flat_order(total, skip, layout, epoch=2)
    for k in range(len(ranks[0])):  # after k steps, the first k global batches' places
        step = np.concatenate([r[k][r[k] >= 0] for r in ranks])
        assert sorted(flat[k * 12 : k * 12 + len(step)].tolist()) == sorted(step.tolist())
    if drop_last:
        assert sorted(flat.tolist()) == list(range(total))  # the packs left over at the end
    else:
        assert set(flat.tolist()) == set(range(total))


@pytest.mark.parametrize(("world_size", "batch_size"), [(4, 3), (2, 6), (3, 5), (1, 7)])
def test_recut_shares_the_rest_among_the_new_ranks(world_size, batch_size):
    layout = Layout(world_size, batch_size)
    parts = [recut(100, 13, layout, rank=r) for r in range(world_size)]
    got = np.concatenate([p.reshape(-1) for p in parts])
    g = world_size * batch_size
    assert len(got) == len(set(got.tolist())) == (100 - 13) // g * g  # no place twice; lost < g
    assert got.min() >= 13
    for k in range(len(parts[0])):  # global batch k: the next g places, rank after rank
        step = np.concatenate([p[k] for p in parts])
        assert step.tolist() == list(range(13 + k * g, 13 + (k + 1) * g))


def test_recut_without_drop_last_uses_every_place_with_equal_batch_counts():
    layout = Layout(3, 4, drop_last=False)
    parts = [recut(30, 5, layout, rank=r) for r in range(3)]
    assert len({len(p) for p in parts}) == 1
    got = np.concatenate([p.reshape(-1) for p in parts])
    got = got[got >= 0]
    assert set(got.tolist()) == set(range(5, 30)) and len(got) - 25 < 3  # repeats only to even out


def test_take_keeps_the_holes():
    assert take(np.array([5, 6, 7]), np.array([[2, -1], [0, 1]])).tolist() == [[7, -1], [5, 6]]


def _decodes(batches: np.ndarray, unit: np.ndarray, lanes: int) -> int:
    """The units the workers decode, a worker a lane: each lane's units once."""
    return sum(len(np.unique(unit[batches[lane::lanes].reshape(-1)])) for lane in range(lanes))


def test_a_mixtures_lanes_split_no_more_units_than_one_outputs():
    """Cut into contiguous segments, every lane boundary of a mixture's slice would split a unit of every
    source (decoded by two workers); cut at the units, one unit a boundary is split, as for one output, and
    each lane holds exactly its segment's count of packs."""
    shares = Shares(repeats=(1, 1, 1))
    units = [np.full(12, 16), np.full(7, 16), np.full(5, 16)]
    sizes = np.array([u.sum() for u in units])
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    first = np.concatenate([[0], np.cumsum(np.concatenate(units))])
    for seed in range(5):
        ids, _, rng = mixture_sequence(units, shares, epoch=seed, seed=seed, shuffle=True)
        unit = np.searchsorted(first, ids, side="right") - 1
        source = np.searchsorted(base, ids, side="right") - 1
        for lanes in (2, 4, 8):
            layout = Layout(1, 4, lanes=lanes, seed=seed, shuffle=True, shuffle_buffer=0)
            plain = rank_positions(len(ids), 0, layout, epoch=seed, rank=0)
            cut = rank_positions(len(ids), 0, layout, epoch=seed, rank=0, units=Units(source, unit))
            assert sorted(cut.reshape(-1).tolist()) == sorted(plain.reshape(-1).tolist())  # the same packs
            assert _decodes(cut, unit, lanes) <= len(first) - 1 + lanes - 1 < _decodes(plain, unit, lanes)
            for lane in range(lanes):  # each lane's batches in the sequence's order
                places = cut[lane::lanes].reshape(-1)
                assert (np.diff(places) > 0).all()
