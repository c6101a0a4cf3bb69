"""``packing.planner``'s ``long_samples=split`` of samples with spans kept whole (an interleaved
document's images: ``blocks``): ``cut_outside`` and ``make_plan(blocks=...)``."""

from __future__ import annotations

import numpy as np
import pytest

from packtool.errors import InputError
from packtool.packing.bfd import cut_long
from packtool.packing.options import PackingOptions
from packtool.packing.planner import cut_outside, make_plan


def random_blocks(rng, length: int, n: int) -> list[tuple[int, int]]:
    """Disjoint blocks of 1 to ``n`` tokens in a sample of ``length``, some side by side, now and then one
    given twice (images that share a token share a block)."""
    out, at = [], int(rng.integers(0, 4))
    while at < length:
        size = int(rng.integers(1, n + 1))
        if at + size > length:
            break
        out += [(at, at + size)] * int(rng.integers(1, 3))
        at += size + int(rng.integers(0, 6))
    return out


def of(blocks: dict[int, list[tuple[int, int]]]):
    """``make_plan``'s ``blocks`` callable over a dict sample -> blocks."""

    def blocks_of(samples):
        spans = [blocks.get(int(s), []) for s in samples]
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in spans])]).astype(np.int64)
        flat = np.array([x for b in spans for x in b], dtype=np.int64).reshape(-1, 2)
        return offsets, flat[:, 0], flat[:, 1]

    return blocks_of


@pytest.mark.parametrize("seed", range(30))
def test_pieces_cover_each_sample_and_never_end_inside_a_block(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 40))
    lengths = rng.integers(1, 6 * n, 12)
    samples = np.arange(100, 112)
    blocks = {100 + i: random_blocks(rng, int(length), n) for i, length in enumerate(lengths)}
    sample, start, length = cut_outside(lengths, samples, n, of(blocks))
    assert (length >= 1).all() and (length <= n).all()
    for i, s in enumerate(samples.tolist()):
        mine = np.flatnonzero(sample == s)
        assert mine.tolist() == list(range(mine[0], mine[-1] + 1))  # in sample order, together
        assert start[mine[0]] == 0 and (start[mine][1:] == (start + length)[mine][:-1]).all()
        assert start[mine[-1]] + length[mine[-1]] == lengths[i]
        for cut in start[mine][1:].tolist():
            assert not any(a < cut < b for a, b in blocks[s]), (cut, blocks[s])
            # as long as it can be: n tokens, or up to the block it would have cut into
            full = int(start[mine][start[mine] < cut].max()) + n
            assert cut == full or any(a == cut < full < b for a, b in blocks[s]), (cut, full, blocks[s])


def test_without_blocks_it_cuts_as_cut_long_does():
    lengths, samples = np.array([5, 17, 3, 40]), np.array([2, 3, 4, 5])
    none = of({})
    got = cut_outside(lengths, samples, 8, none)
    want = cut_long(lengths, samples, 8)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_block_longer_than_n_is_refused_naming_its_sample():
    with pytest.raises(InputError, match=r"sample 7: image 1's tokens .* take 9, more than"):
        cut_outside(np.array([30]), np.array([7]), 8, of({7: [(2, 5), (8, 17)]}))


def test_make_plan_splits_long_samples_between_blocks_only():
    """Under ``long_samples=split`` with ``blocks``, the short samples stay whole, the long ones are cut
    outside their blocks, every token is packed once, and each piece is counted as a split sample's."""
    lengths = np.array([10, 35, 6, 22])
    blocks = {1: [(6, 14), (14, 20), (28, 33)], 3: [(0, 9)]}
    options = PackingOptions(packed_sequence_size=12, long_samples="split", strategy="sequential")
    plan = make_plan(lengths, options, blocks=of(blocks))
    pieces = sorted(zip(plan.sample.tolist(), plan.start.tolist(), plan.length.tolist(), strict=True))
    assert pieces == [(0, 0, 10), (1, 0, 6), (1, 6, 8), (1, 14, 12), (1, 26, 9), (2, 0, 6), (3, 0, 12),
                      (3, 12, 10)]  # fmt: skip
    assert plan.num_tokens == lengths.sum() and plan.stats.split_samples == 2
