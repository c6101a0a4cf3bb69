"""``--balance-visual-tokens``'s order: every step of R consecutive packs carries similar image tokens."""

from __future__ import annotations

import numpy as np
import pytest

from packtool.packing.balance import balance_visual_tokens, step_spread


@pytest.mark.parametrize("ranks", [1, 2, 8])
def test_the_order_is_a_permutation_with_small_steps(ranks):
    rng = np.random.default_rng(0)
    tokens = np.where(rng.random(203) < 0.2, 0, rng.integers(64, 4000, 203))  # some text-only packs
    order = balance_visual_tokens(tokens, ranks, seed=1)
    assert sorted(order.tolist()) == list(range(203))
    assert np.array_equal(order, balance_visual_tokens(tokens, ranks, seed=1))
    balanced = step_spread(tokens[order], ranks)
    unbalanced = step_spread(tokens, ranks)
    if ranks == 1:
        assert balanced.max() == 0
    else:  # sorted groups: the steps' spreads add up to at most the whole range
        assert balanced.sum() <= tokens.max() - tokens.min() < unbalanced.mean() * len(unbalanced) / 4
    assert not np.array_equal(order, np.argsort(tokens, kind="stable"))  # the steps are shuffled


def test_ranks_must_be_positive():
    with pytest.raises(ValueError, match="ranks must be at least 1"):
        balance_visual_tokens(np.array([3, 1]), 0, seed=0)
