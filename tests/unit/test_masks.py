"""packtool.masks against slow obvious references, NeMo AutoModel's mask, flex attention's own builder, and
a tiny causal self-attention layer run on packed batches versus on each sample alone."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from packtool import masks
from packtool.masks import (
    AttentionPattern,
    additive_mask,
    attention_pattern,
    block_causal_mask,
    clear_mask_cache,
    flex_block_mask,
    padded_seq_lens,
    sequence_starts,
    varlen_args,
)
from tests.nemo_reference import find_wheel, load_packed_sequence_module


def random_seq_lens(batch: int, n: int, max_len: int, seed: int) -> list[torch.Tensor]:
    """Rows of random lengths summing to ``n`` (the last one is the padding, as in packtool output)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        lens, total = [], 0
        while total < n:
            x = min(int(torch.randint(1, max_len + 1, (), generator=g)), n - total)
            lens.append(x)
            total += x
        rows.append(torch.tensor(lens))
    return rows


def slow_mask(
    rows: list[torch.Tensor], n: int, window: int | None = None, chunk: int | None = None
) -> torch.Tensor:
    """The definition, element by element: q sees k iff same sequence and k <= q (and q - k < window) (and,
    counted from the sequence's start, q // chunk == k // chunk)."""
    out = torch.zeros(len(rows), 1, n, n, dtype=torch.bool)
    for b, lens in enumerate(rows):
        seq, at = [], []
        for i, length in enumerate(lens.tolist()):
            seq += [i] * length
            at += list(range(length))
        for q in range(n):
            for k in range(q + 1):
                same = seq[q] == seq[k] and (chunk is None or at[q] // chunk == at[k] // chunk)
                out[b, 0, q, k] = same and (window is None or q - k < window)
    return out


CASES = [(1, 7, 7, 0), (3, 40, 12, 1), (2, 64, 64, 2), (4, 130, 25, 3), (2, 256, 300, 4)]


@pytest.mark.parametrize("batch,n,max_len,seed", CASES)
def test_block_causal_mask_matches_definition(batch, n, max_len, seed):
    rows = random_seq_lens(batch, n, max_len, seed)
    expected = slow_mask(rows, n)
    assert torch.equal(block_causal_mask(rows, n), expected)
    assert torch.equal(block_causal_mask(padded_seq_lens(rows), n), expected)  # padded with 0
    assert torch.equal(block_causal_mask(padded_seq_lens(rows).int(), n, device="cpu"), expected)


@pytest.mark.parametrize(
    "rows,n",
    [([[1]], 1), ([[9]], 9), ([[1] * 9], 9), ([[9], [1] * 9, [4, 5]], 9), ([[2, 0, 3], [5, 0, 0]], 5)],
)
def test_block_causal_mask_extremes(rows, n):
    """One sequence filling the pack (band = whole row), all length 1 (band of one), zero-length pads."""
    rows = [torch.tensor(r) for r in rows]
    expected = slow_mask(rows, n)
    mask = block_causal_mask(padded_seq_lens(rows), n)
    assert torch.equal(mask, expected) and mask.is_contiguous() and mask.dtype == torch.bool
    again = block_causal_mask(padded_seq_lens(rows), n)
    mask.fill_(False)  # each call returns its own writable memory
    assert torch.equal(again, expected)


def test_block_causal_mask_reuses_only_buffers_nothing_references(monkeypatch):
    monkeypatch.setattr(masks, "MASK_CACHE_SIZE", 2)
    clear_mask_cache()
    n = 48
    a_rows, b_rows, c_rows = (random_seq_lens(3, n, 20, seed) for seed in (10, 11, 12))
    a = block_causal_mask(a_rows, n)
    b = block_causal_mask(b_rows, n)
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    assert a_ptr != b_ptr  # a is in use: b got its own memory
    view_of_b = b[1]  # a view keeps b's buffer in use
    del b
    c = block_causal_mask(c_rows, n)
    assert c.data_ptr() not in (a_ptr, b_ptr)  # both still in use: fresh memory (the cache keeps c, b)
    assert torch.equal(a, slow_mask(a_rows, n)) and torch.equal(view_of_b, slow_mask(b_rows, n)[1])
    view_of_b.fill_(True)  # a caller may scribble on a mask before dropping it
    del view_of_b
    again = block_causal_mask(a_rows, n)
    assert again.data_ptr() == b_ptr  # the free kept buffer, cleared
    assert torch.equal(again, slow_mask(a_rows, n))
    assert torch.equal(a, again) and torch.equal(c, slow_mask(c_rows, n))  # the others untouched
    other_size = block_causal_mask(a_rows[:2], n)  # another size never takes a buffer of this one
    assert torch.equal(other_size, slow_mask(a_rows[:2], n))
    monkeypatch.setattr(masks, "MASK_CACHE_SIZE", 0)
    clear_mask_cache()
    assert masks._MASK_BUFFERS == []
    del again, c
    assert torch.equal(block_causal_mask(c_rows, n), slow_mask(c_rows, n))
    assert masks._MASK_BUFFERS == []  # nothing kept with MASK_CACHE_SIZE = 0


@pytest.mark.skipif(find_wheel() is None, reason="NeMo AutoModel wheel not fetched (make install)")
@pytest.mark.parametrize("batch,n,max_len,seed", CASES + [(8, 512, 100, 5), (2, 512, 512, 6)])
def test_block_causal_mask_equals_nemo(batch, n, max_len, seed):
    nemo = load_packed_sequence_module().create_block_causal_mask
    rows = random_seq_lens(batch, n, max_len, seed)
    assert torch.equal(block_causal_mask(rows, n), nemo(rows))


@pytest.mark.parametrize("batch,n,max_len,seed", CASES)
def test_varlen_args_match_definition(batch, n, max_len, seed):
    rows = random_seq_lens(batch, n, max_len, seed)
    out = varlen_args(padded_seq_lens(rows), n)
    lens = [x for r in rows for x in r.tolist()]
    cu = [0]
    for x in lens:
        cu.append(cu[-1] + x)
    assert out["cu_seqlens"].dtype == torch.int32 and out["cu_seqlens"].tolist() == cu
    assert out["max_seqlen"] == max(lens)
    expected = [[p for x in r.tolist() for p in range(x)] for r in rows]
    assert out["position_ids"].tolist() == expected


def dense_of(block_mask, doc: torch.Tensor, n: int) -> torch.Tensor:
    """Element-level form of a BlockMask: full tiles all True, partial tiles as the mask_mod says."""
    qb, kb = block_mask.BLOCK_SIZE

    def tiles(num, idx):
        if num is None:
            return torch.zeros(doc.shape[0], 1, idx.shape[-2], idx.shape[-1], dtype=torch.bool)
        cols = torch.arange(idx.shape[-1])
        dense = torch.zeros(*idx.shape, dtype=torch.bool)
        valid = cols < num.unsqueeze(-1)
        dense.scatter_(-1, idx.long(), valid)
        return dense

    def expand(t):
        return t.repeat_interleave(qb, -2).repeat_interleave(kb, -1)[..., :n, :n]

    full = expand(tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices))
    partial = expand(tiles(block_mask.kv_num_blocks, block_mask.kv_indices))
    b = torch.arange(doc.shape[0]).view(-1, 1, 1, 1)
    q = torch.arange(n).view(1, 1, n, 1)
    k = torch.arange(n).view(1, 1, 1, n)
    return full | (partial & block_mask.mask_mod(b, 0, q, k))


@pytest.mark.parametrize("block_size", [8, 16, 128])
@pytest.mark.parametrize("batch,n,max_len,seed", CASES)
def test_flex_block_mask_equals_dense_and_create_block_mask(batch, n, max_len, seed, block_size):
    rows = random_seq_lens(batch, n, max_len, seed)
    bm = flex_block_mask(rows, n, block_size=block_size)
    doc, _ = sequence_starts(rows, n)
    assert torch.equal(dense_of(bm, doc, n), block_causal_mask(rows, n))

    def document_causal(b, h, q, k):
        return (doc[b, q] == doc[b, k]) & (q >= k)

    ref = create_block_mask(document_causal, batch, 1, n, n, device="cpu", BLOCK_SIZE=block_size)
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(bm, name), getattr(ref, name)), name
    assert torch.equal(bm.to_dense(), ref.to_dense())
    assert bm.seq_lengths == ref.seq_lengths == (n, n)


# --- a tiny model step ------------------------------------------------------------------------------
class CausalSelfAttention(torch.nn.Module):
    """One attention layer with rotary positions; ``attend(q, k, v)`` is the packed-attention kernel."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.hd // 2
        freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
        ang = pos.unsqueeze(-1).float() * freq  # (B, S, half)
        cos, sin = ang.cos().unsqueeze(1), ang.sin().unsqueeze(1)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, attend) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        q, k = self.rope(q, pos), self.rope(k, pos)
        y = attend(q, k, v)  # (B, H, S, hd)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_model_step_on_packed_batch_equals_each_sample_alone():
    torch.manual_seed(0)
    n, dim = 96, 16
    rows = random_seq_lens(3, n, 40, seed=7)
    seq_lens = padded_seq_lens(rows)
    layer = CausalSelfAttention(dim)
    x = torch.randn(3, n, dim)
    va = varlen_args(seq_lens, n)
    pos = va["position_ids"]

    def run_alone():  # each sample alone: plain causal attention at positions 0..len-1
        out = torch.empty_like(x).view(-1, dim)
        cu = va["cu_seqlens"].tolist()
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            seg = x.reshape(-1, dim)[a:b].unsqueeze(0)
            y = layer(seg, torch.arange(b - a).unsqueeze(0), lambda q, k, v: sdpa(q, k, v, is_causal=True))
            out[a:b] = y[0]
        return out.view_as(x)

    dense = block_causal_mask(seq_lens, n)
    kernels = {
        "dense": lambda q, k, v: sdpa(q, k, v, attn_mask=dense),
        "flex": lambda q, k, v: flex_attention(q, k, v, block_mask=flex_block_mask(seq_lens, n, 16)),
        "varlen": lambda q, k, v: varlen_reference(q, k, v, va["cu_seqlens"], n),
    }
    with torch.no_grad():  # flex_attention has no CPU backward
        alone = run_alone()
        for name, attend in kernels.items():
            torch.testing.assert_close(layer(x, pos, attend), alone, atol=1e-5, rtol=1e-5, msg=name)

    # a training step: the packed batch's gradients equal those of the samples run one by one
    weight = torch.randn_like(x)

    def grads(fn):
        layer.zero_grad()
        (fn() * weight).sum().backward()
        return [p.grad.clone() for p in layer.parameters()]

    for g_packed, g_alone in zip(
        grads(lambda: layer(x, pos, kernels["dense"])), grads(run_alone), strict=True
    ):
        torch.testing.assert_close(g_packed, g_alone, atol=1e-4, rtol=1e-4)


def sdpa(q, k, v, **kw):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


def varlen_reference(q, k, v, cu_seqlens, n):
    """What a varlen kernel computes from ``cu_seqlens`` on the batch flattened to B*N tokens (THD)."""
    b, h, _, d = q.shape
    qf, kf, vf = (t.transpose(1, 2).reshape(b * n, h, d) for t in (q, k, v))
    out = torch.empty_like(qf)
    cu = cu_seqlens.tolist()
    for a, e in zip(cu[:-1], cu[1:], strict=True):
        s = torch.einsum("qhd,khd->hqk", qf[a:e], kf[a:e]) / math.sqrt(d)
        s = s.masked_fill(~torch.ones(e - a, e - a, dtype=torch.bool).tril(), float("-inf"))
        out[a:e] = torch.einsum("hqk,khd->qhd", s.softmax(-1), vf[a:e])
    return out.view(b, n, h, d).transpose(1, 2)


def test_additive_mask_is_the_bool_mask_as_zero_and_minus_inf():
    rows = random_seq_lens(3, 40, 12, seed=7)
    want = slow_mask(rows, 40)
    got = additive_mask(padded_seq_lens(rows), 40, dtype=torch.float64)
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert torch.equal(got == 0, want) and torch.isneginf(got[~want]).all()


def test_flattening_kwargs_count_sequences_over_the_batch():
    from packtool.masks import flattening_kwargs

    rows = random_seq_lens(3, 30, 9, seed=3)
    kw = flattening_kwargs(padded_seq_lens(rows), 30)
    lens = torch.cat(rows).tolist()
    seq_idx = [i for i, n in enumerate(lens) for _ in range(n)]
    positions = [p for n in lens for p in range(n)]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    assert kw["seq_idx"].tolist() == [seq_idx] and kw["seq_idx"].dtype == torch.int32
    assert kw["position_ids"].tolist() == [positions] and kw["position_ids"].dtype == torch.int64
    assert kw["cu_seq_lens_q"].tolist() == kw["cu_seq_lens_k"].tolist() == cu
    assert kw["max_length_q"] == kw["max_length_k"] == max(lens)


# --- sliding windows ----------------------------------------------------------------------------------
# (batch, n, longest sequence, seed, window): windows shorter than most sequences, of one token, equal to the
# longest sequence and longer than the pack
WINDOWED = [
    (3, 40, 12, 1, 5),
    (2, 130, 100, 2, 48),
    (2, 64, 64, 3, 1),
    (2, 64, 64, 4, 64),
    (4, 130, 25, 5, 500),
]


@pytest.mark.parametrize("batch,n,max_len,seed,window", WINDOWED)
def test_windowed_masks_match_definition(batch, n, max_len, seed, window):
    rows = random_seq_lens(batch, n, max_len, seed)
    expected = slow_mask(rows, n, window)
    assert torch.equal(block_causal_mask(rows, n, window=window), expected)
    added = additive_mask(padded_seq_lens(rows), n, dtype=torch.float64, window=window)
    assert torch.equal(added == 0, expected) and torch.isneginf(added[~expected]).all()


@pytest.mark.parametrize("block_size", [8, 16, 128])
@pytest.mark.parametrize("batch,n,max_len,seed,window", WINDOWED)
def test_windowed_flex_block_mask_equals_dense_and_create_block_mask(
    batch, n, max_len, seed, window, block_size
):
    """Tiles farther apart than the window are empty, tiles wholly inside it (and one sequence) full."""
    rows = random_seq_lens(batch, n, max_len, seed)
    bm = flex_block_mask(rows, n, block_size=block_size, window=window)
    doc, _ = sequence_starts(rows, n)
    assert torch.equal(dense_of(bm, doc, n), slow_mask(rows, n, window))

    def windowed(b, h, q, k):
        return (doc[b, q] == doc[b, k]) & (q >= k) & (q - k < window)

    ref = create_block_mask(windowed, batch, 1, n, n, device="cpu", BLOCK_SIZE=block_size)
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(bm, name), getattr(ref, name)), name
    assert torch.equal(bm.to_dense(), ref.to_dense())


# --- chunked attention (Llama 4) ---------------------------------------------------------------------
# (batch, n, longest sequence, seed, chunk): chunks shorter than most sequences, of one token, equal to the
# longest sequence, longer than the pack, and not dividing the block size
CHUNKED = [
    (3, 40, 12, 1, 5),
    (2, 130, 100, 2, 32),
    (2, 64, 64, 3, 1),
    (2, 64, 64, 4, 64),
    (4, 130, 25, 5, 500),
    (2, 200, 150, 6, 24),
]


@pytest.mark.parametrize("batch,n,max_len,seed,chunk", CHUNKED)
def test_chunked_masks_match_definition(batch, n, max_len, seed, chunk):
    """Each sequence cut into chunks counted from its own start: a token sees the earlier tokens of its
    chunk only, in the dense, additive and varlen forms."""
    rows = random_seq_lens(batch, n, max_len, seed)
    expected = slow_mask(rows, n, chunk=chunk)
    assert not torch.equal(expected, slow_mask(rows, n)) or chunk >= max_len  # the chunks cut something
    assert torch.equal(block_causal_mask(rows, n, chunk=chunk), expected)
    added = additive_mask(padded_seq_lens(rows), n, dtype=torch.float64, chunk=chunk)
    assert torch.equal(added == 0, expected) and torch.isneginf(added[~expected]).all()
    assert torch.equal(block_causal_mask(rows, n, window=3, chunk=chunk), slow_mask(rows, n, 3, chunk))
    out = varlen_args(padded_seq_lens(rows), n, chunk=chunk)
    pieces = [min(chunk, x - a) for r in rows for x in r.tolist() for a in range(0, x, chunk)]
    assert out["cu_seqlens"].tolist() == [0, *torch.tensor(pieces).cumsum(0).tolist()]
    assert out["max_seqlen"] == max(pieces) and out["cu_seqlens"].dtype == torch.int32
    assert out["position_ids"].tolist() == [[p for x in r.tolist() for p in range(x)] for r in rows]


@pytest.mark.parametrize("block_size", [8, 128])
@pytest.mark.parametrize("batch,n,max_len,seed,chunk", CHUNKED)
def test_chunked_flex_block_mask_equals_dense_and_create_block_mask(
    batch, n, max_len, seed, chunk, block_size
):
    rows = random_seq_lens(batch, n, max_len, seed)
    bm = flex_block_mask(rows, n, block_size=block_size, chunk=chunk)
    doc, _ = sequence_starts(rows, n, chunk=chunk)
    assert torch.equal(dense_of(bm, doc, n), slow_mask(rows, n, chunk=chunk))

    def chunk_causal(b, h, q, k):
        return (doc[b, q] == doc[b, k]) & (q >= k)

    ref = create_block_mask(chunk_causal, batch, 1, n, n, device="cpu", BLOCK_SIZE=block_size)
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(bm, name), getattr(ref, name)), name


@pytest.mark.parametrize("window", [0, -3, 2.5, True, "48"])
def test_a_window_is_a_positive_int(window):
    with pytest.raises(ValueError, match="window must be a positive integer"):
        block_causal_mask([torch.tensor([4])], 4, window=window)


def test_attention_pattern_reads_transformers_configs_as_their_models_do():
    from transformers import (
        Gemma2Config,
        Gemma3Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
    )

    sliding, full = "sliding_attention", "full_attention"
    cases = [
        (MistralConfig(sliding_window=48), {sliding: 48}),  # every layer slides
        (MistralConfig(sliding_window=None), {full: None}),
        (Phi3Config(sliding_window=2047), {sliding: 2047}),
        (LlamaConfig(), {full: None}),
        (Gemma2Config(sliding_window=48, num_hidden_layers=4), {sliding: 48, full: None}),  # alternating
        (Gemma3TextConfig(sliding_window=48, num_hidden_layers=6), {sliding: 48, full: None}),  # 5 then 1
        (Gemma3TextConfig(sliding_window=48, num_hidden_layers=2), {sliding: 48}),  # both slide
        (Gemma3Config(text_config={"sliding_window": 48, "num_hidden_layers": 6}), {sliding: 48, full: None}),
        (Qwen2Config(sliding_window=48), {full: None}),  # use_sliding_window=False: no window anywhere
        (
            Qwen2Config(use_sliding_window=True, sliding_window=48, max_window_layers=1, num_hidden_layers=3),
            {full: None, sliding: 48},
        ),  # fmt: skip
        ({"sliding_window": 48, "layer_types": [full, sliding]}, {full: None, sliding: 48}),
        (None, {full: None}),
    ]
    for config, windows in cases:
        assert attention_pattern(config).windows() == windows, config
        assert set(attention_pattern(config).chunks().values()) == {None}, config
    from transformers import Llama4Config, Llama4TextConfig

    chunked = "chunked_attention"
    cases = [  # Llama 4: chunked layers with RoPE, every 4th a full one without
        (Llama4TextConfig(attention_chunk_size=64, num_hidden_layers=4), {chunked: 64, full: None}),
        (Llama4TextConfig(attention_chunk_size=64, num_hidden_layers=2), {chunked: 64}),
        (Llama4TextConfig(attention_chunk_size=None, num_hidden_layers=4), {full: None}),
        (
            Llama4Config(text_config={"attention_chunk_size": 64, "num_hidden_layers": 4}),
            {chunked: 64, full: None},
        ),
        ({"attention_chunk_size": 8}, {chunked: 8}),  # no layer types: every layer chunked
        (
            {"attention_chunk_size": 8, "sliding_window": 4},
            {sliding: None},
        ),  # the window first, as transformers
        ({"attention_chunk_size": 8, "layer_types": [full]}, {full: None}),
    ]
    for config, chunks in cases:
        assert attention_pattern(config).chunks() == chunks, config
    assert attention_pattern({"attention_chunk_size": 8, "sliding_window": 4}).windows() == {sliding: 4}
    pattern = AttentionPattern(16)
    assert attention_pattern(pattern) is pattern


def test_attention_pattern_refuses_what_no_mask_here_honours():
    from transformers import Gemma3TextConfig

    with pytest.raises(ValueError, match="bidirectional; packtool's masks are causal"):
        attention_pattern(Gemma3TextConfig(use_bidirectional_attention=True))
    with pytest.raises(ValueError, match=r"only; this model also has 'linear_attention' \(layers 1, 3\)"):
        attention_pattern({"layer_types": ["full_attention", "linear_attention"] * 2})
    with pytest.raises(ValueError, match="'chunked_attention' layers but attention_chunk_size is not set"):
        attention_pattern({"layer_types": ["full_attention", "chunked_attention"]})
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        AttentionPattern(None, None, 0)
    with pytest.raises(ValueError, match="'sliding_attention' layers but sliding_window is not set"):
        AttentionPattern(None, ("sliding_attention",))
    with pytest.raises(ValueError, match="window must be a positive integer"):
        AttentionPattern(-1)
