"""``packtool.schema``: the layout's derived views agree with the layout's definition (each pack's
``seq_lens`` = its pieces' spans, then its padding if any; ``cp_padding`` inside the spans) on random
layouts, and with the loader's ``cu_seqlens`` of the same packs."""

from __future__ import annotations

import numpy as np
import torch

from packtool import schema
from packtool.masks import cu_seqlens_of
from packtool.packs import PackArrays


def random_packs(seed: int, k: int = 40, n: int = 64) -> tuple[list[list[int]], list[list[int]], int]:
    """``k`` packs of ``n`` tokens as plain lists: each pack's pieces' spans and their cp padding (some
    packs full, some padded)."""
    rng = np.random.default_rng(seed)
    spans, cps = [], []
    for _ in range(k):
        pieces, left = [], n
        while left and (not pieces or rng.random() < 0.7):
            span = int(rng.integers(1, left + 1)) if rng.random() < 0.8 else left
            pieces.append(span)
            left -= span
        spans.append(pieces)
        cps.append([int(rng.integers(0, s)) for s in pieces])
    return spans, cps, n


def as_arrays(spans: list[list[int]], cps: list[list[int]], n: int) -> PackArrays:
    seq_lens = [s + ([n - sum(s)] if sum(s) < n else []) for s in spans]
    offsets = lambda rows: np.cumsum([0] + [len(r) for r in rows])  # noqa: E731
    return PackArrays(
        input_ids=np.zeros((len(spans), n), np.int32),
        seq_lens=np.array([x for r in seq_lens for x in r], np.int32),
        seq_lens_offsets=offsets(seq_lens),
        sample_index_offsets=offsets(spans),
        cp_padding=np.array([x for r in cps for x in r], np.int32),
    )


def test_views_follow_the_layout_definition():
    for seed in range(5):
        spans, cps, n = random_packs(seed)
        packs = as_arrays(spans, cps, n)
        assert packs.pieces_per_pack().tolist() == [len(s) for s in spans]
        assert packs.has_padding().tolist() == [sum(s) < n for s in spans]
        assert packs.padding_lengths().tolist() == [n - sum(s) for s in spans]
        assert packs.piece_spans().tolist() == [x for s in spans for x in s]
        pairs = list(zip(spans, cps, strict=True))
        assert packs.piece_lengths().tolist() == [
            x - c for s, cp in pairs for x, c in zip(s, cp, strict=True)
        ]
        assert packs.real_tokens().tolist() == [sum(s) - sum(cp) for s, cp in pairs]
        starts = schema.piece_starts(packs.piece_spans(), packs.sample_index_offsets)
        assert starts.tolist() == [sum(s[:i]) for s in spans for i in range(len(s))]
        assert schema.pack_of_piece(packs.sample_index_offsets).tolist() == [
            p for p, s in enumerate(spans) for _ in s
        ]


def test_pack_seq_lens_is_the_inverse_of_the_views():
    spans, cps, n = random_packs(7)
    packs = as_arrays(spans, cps, n)
    seq_lens, offsets = schema.pack_seq_lens(packs.piece_spans(), packs.sample_index_offsets, n)
    assert seq_lens.tolist() == packs.seq_lens.tolist()
    assert offsets.tolist() == packs.seq_lens_offsets.tolist()


def test_per_pack_sum_of_a_pack_without_values_is_zero():
    # np.add.reduceat would give the next pack's first value for the empty one
    assert schema.per_pack_sum(np.array([5, 6]), np.array([0, 1, 1, 2])).tolist() == [5, 0, 6]


def test_cu_seqlens_agrees_with_the_loaders():
    spans, cps, n = random_packs(3, k=8)
    packs = as_arrays(spans, cps, n)
    rows = [packs.row("seq_lens", i) for i in range(packs.num_packs)]
    padded = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
    want, _ = cu_seqlens_of(torch.from_numpy(padded))
    assert schema.cu_seqlens(packs.seq_lens).tolist() == want.tolist()
    assert schema.cu_seqlens(padded).tolist() == want.tolist()
