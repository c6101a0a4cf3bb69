"""``--strategy bfd``: invariants of the packs through the real CLI, and the planner against a naive BFD.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import numpy as np

from packtool.packing.bfd import bfd_assign, cut_long, plan_bfd


def lognormal_lengths(count: int, mean: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sigma = 1.0
    return np.maximum(1, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, count)).astype(np.int64)


# --- the planner itself --------------------------------------------------------------------------------
def naive_bfd(lengths: list[int], n: int) -> list[int]:
    """Textbook BFD, one sample at a time: the rooms left in the bins."""
    rooms: list[int] = []
    for length in sorted(lengths, reverse=True):
        fits = [j for j, r in enumerate(rooms) if r >= length]
        if fits:
            best = min(fits, key=lambda j: rooms[j])
            rooms[best] -= length
        else:
            rooms.append(n - length)
    return sorted(rooms)


def test_grouped_bfd_is_exact_bfd():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 50))
        lengths = rng.integers(1, n + 1, size=int(rng.integers(1, 60)))
        order, item_bin, k = bfd_assign(lengths, n)
        fill = np.bincount(item_bin, weights=lengths, minlength=k).astype(int)
        assert sorted((n - fill).tolist()) == naive_bfd(lengths.tolist(), n)
        assert np.array_equal(np.sort(order), np.arange(len(lengths)))


def test_lower_bound_targets_on_lognormal_lengths():
    n = 4096
    lengths = lognormal_lengths(40_000, 300, seed=1)
    whole = np.minimum(lengths, n)
    lower = -(-int(whole.sum()) // n)
    plan = plan_bfd(whole, np.arange(len(whole)), n, False, packing_buffer_size=10_000)
    assert plan.num_packs <= lower * 1.001
    split = plan_bfd(lengths, np.arange(len(lengths)), n, True)
    assert split.num_packs == -(-int(lengths.sum()) // n)
    assert split.num_tokens == int(lengths.sum())
    split.validate()


def test_cut_long_pieces():
    sample, start, length = cut_long(np.array([10, 4]), np.array([3, 8]), 4)
    assert sample.tolist() == [3, 3, 3, 8]
    assert start.tolist() == [0, 4, 8, 0] and length.tolist() == [4, 4, 2, 4]
