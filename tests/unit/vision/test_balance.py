"""``--balance-visual-tokens``'s order: every step of R consecutive packs carries similar image tokens."""

from __future__ import annotations

import numpy as np
import pytest

from packtool.vision.balance import balance_visual_tokens, image_tokens_per_pack, step_spread
from packtool.vision.packs import plan_packs
from packtool.vision.samples import read_json_samples
from packtool.vision.sequences import encode_sample
from tests.fixtures.vision_inputs import write_llava_input


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


def test_image_tokens_per_pack_of_a_plan(tmp_path, processors):
    samples = list(read_json_samples(write_llava_input(tmp_path))) * 4
    sequences = [encode_sample(processors["qwen2vl"], s) for s in samples]
    plan = plan_packs(sequences, max(len(s) for s in sequences))
    tokens = image_tokens_per_pack(plan, sequences)
    assert tokens.sum() == sum(int(s.image_lengths.sum()) for s in sequences)
    balanced = plan.permute(balance_visual_tokens(tokens, 2, seed=0))
    assert sorted(image_tokens_per_pack(balanced, sequences).tolist()) == sorted(tokens.tolist())
    with pytest.raises(ValueError, match="ranks must be at least 1"):
        balance_visual_tokens(tokens, 0, seed=0)
