"""Attention masks for packed batches, built from ``seq_lens`` with tensor ops on the input's device.

A pack of ``N`` tokens holds several sequences end to end; ``seq_lens`` gives their lengths (the padding
is one more "sequence", as in NeMo AutoModel's ``PackedSequence``, so every row sums to ``N``). Attention
is *block-causal* (document-causal): a token sees the earlier tokens of its own sequence only, and with a
sliding ``window`` only the last ``window`` of them (itself included: query ``q`` sees key ``k`` when
``q - window < k <= q``, transformers' convention for ``config.sliding_window``); with a ``chunk`` (Llama 4's
chunked attention, ``config.attention_chunk_size``) only those of its own chunk: each sequence is cut into
chunks of ``chunk`` tokens counted from the sequence's start, as the sequence alone would be.
``AttentionPattern`` says which layers of a model slide or attend in chunks
(``attention_pattern(model.config)``).

``seq_lens`` is accepted as a ``(B, S)`` integer tensor padded with ``0`` (the sentinel the loader uses),
a 1-D tensor for one pack, or a list of 1-D tensors (NeMo's form). Three forms of the same mask:

* ``block_causal_mask``: dense bool ``[B, 1, N, N]`` (``True``: may attend) for SDPA, e.g. transformers'
  ``attn_implementation="sdpa"`` (``N^2`` memory). Not for eager attention: transformers' eager path adds
  the mask to the scores, so a bool mask masks nothing there;
* ``additive_mask``: the same mask as floats, ``0`` where a token may attend and ``-inf`` elsewhere, for
  attention that adds the mask to the scores (transformers' ``attn_implementation="eager"``);
* ``flex_block_mask``: a ``torch.nn.attention.flex_attention.BlockMask``, built from the sequence
  boundaries at block level (``O(B * (N / block_size)^2)``), never by evaluating a mask at every position;
* ``varlen_args``: ``cu_seqlens`` / ``max_seqlen`` / ``position_ids`` for FlashAttention varlen and
  Transformer Engine THD, where the batch is seen as ``B * N`` tokens of concatenated sequences;
* ``flattening_kwargs``: the same boundaries under the names transformers' ``DataCollatorWithFlattening``
  gives them (``cu_seq_lens_q/k``, ``max_length_q/k``, ``seq_idx``, ``position_ids``), for a batch flattened
  to one row of ``B * N`` tokens.

No function loops over sequences in Python.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask

SEQ_LENS_PAD = 0
"""Value that pads ``seq_lens`` rows to a common width (a zero-length sequence changes nothing)."""

SeqLens = torch.Tensor | Sequence[torch.Tensor]

MASK_CACHE_SIZE = 4
"""Host buffers ``block_causal_mask`` keeps for reuse (CPU only). Once no tensor uses a kept buffer, the
next mask of the same size is written into it after one ``memset``, instead of into fresh pages that the
kernel must fault in and zero (which costs several times the memset; docs/performance.md). Four buffers
cover a training loop that builds the next batch's masks while the last ones are still referenced, for a
model with two layer types (a sliding and a full mask per batch). ``0`` turns the reuse off."""

MASK_CACHE_BYTES = 1 << 30
"""Buffers larger than this (bytes, ``B * N * N``) are never kept."""

_MASK_BUFFERS: list[np.ndarray] = []  # most recently used first
_MASK_LOCK = threading.Lock()


def clear_mask_cache() -> None:
    """Drop the host buffers kept for reuse (masks still referenced keep their own memory)."""
    with _MASK_LOCK:
        _MASK_BUFFERS.clear()


def _zeroed_host_bools(size: int) -> torch.Tensor:
    """A flat zeroed bool CPU tensor of ``size``: a kept buffer that no tensor uses any more (cleared with
    one memset), else fresh ``calloc``'d memory (kept for reuse when ``MASK_CACHE_SIZE`` allows).

    A tensor made by ``torch.from_numpy`` holds a reference to the NumPy array for as long as its storage
    lives (views included), so a kept array's reference count is 2 (the list, the call's argument)
    exactly when no tensor uses it.
    """
    with _MASK_LOCK:
        for i in range(len(_MASK_BUFFERS)):
            if _MASK_BUFFERS[i].size == size and sys.getrefcount(_MASK_BUFFERS[i]) == 2:
                buf = _MASK_BUFFERS.pop(i)
                _MASK_BUFFERS.insert(0, buf)
                buf.fill(False)  # one memset (torch's fill_ is several times slower on bool)
                return torch.from_numpy(buf)
        buf = np.zeros(size, dtype=np.bool_)
        if MASK_CACHE_SIZE > 0 and size <= MASK_CACHE_BYTES:
            _MASK_BUFFERS.insert(0, buf)
            del _MASK_BUFFERS[MASK_CACHE_SIZE:]
        return torch.from_numpy(buf)


FULL_ATTENTION, SLIDING_ATTENTION, CHUNKED_ATTENTION = (
    "full_attention",
    "sliding_attention",
    "chunked_attention",
)
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION, CHUNKED_ATTENTION)
"""The layer types (transformers' ``config.layer_types``) that packtool builds masks for."""

CAUSAL = "causal"
"""``attention="causal"``: the explicit declaration that every layer of a model attends causally to the
whole of its sequence (no window); ``attention_pattern(CAUSAL)`` is ``AttentionPattern()``. For a model of
your own; a transformers model is described by its config (``attention=model.config``)."""


def _positive_or_none(value: Any, what: str) -> int | None:
    """``value`` as a positive int, or None; ``ValueError`` naming ``what`` it must be otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}, got {value!r}")
    return int(value)


def check_window(window: Any) -> int | None:
    """``window`` as a positive int, or None (no window); ``ValueError`` otherwise."""
    return _positive_or_none(
        window, "window must be a positive integer (the keys a query sees, itself included)"
    )


def check_chunk(chunk: Any) -> int | None:
    """``chunk`` as a positive int, or None (no chunks); ``ValueError`` otherwise."""
    return _positive_or_none(chunk, "chunk must be a positive integer (the tokens of an attention chunk)")


@dataclass(frozen=True)
class AttentionPattern:
    """Which keys each layer of a model lets a query see inside its own sequence: every earlier one
    (``"full_attention"``), only the last ``sliding_window`` of them, itself included
    (``"sliding_attention"``: query ``q`` sees key ``k`` when ``q - sliding_window < k <= q``, the meaning
    of transformers' ``config.sliding_window``), or the earlier ones of its own chunk
    (``"chunked_attention"``, Llama 4: the sequence cut into chunks of ``attention_chunk_size`` tokens from
    its start; ``q`` sees ``k <= q`` when ``k // attention_chunk_size == q // attention_chunk_size``,
    positions counted in the sequence).

    ``layer_types`` is transformers' ``config.layer_types``, one entry per layer (Gemma 2 and 3, Qwen2 with
    ``use_sliding_window``, Llama 4...); ``None``: every layer alike, sliding when ``sliding_window`` is set
    (Mistral, Phi-3), else chunked when ``attention_chunk_size`` is, else full.
    ``attention_pattern(model.config)`` reads it from a model.

    Example::

        >>> AttentionPattern(48, ("sliding_attention", "full_attention")).windows()
        {'sliding_attention': 48, 'full_attention': None}
        >>> AttentionPattern(4096).windows()
        {'sliding_attention': 4096}
        >>> AttentionPattern(None, ("chunked_attention", "full_attention"), 8192).chunks()
        {'chunked_attention': 8192, 'full_attention': None}
    """

    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    attention_chunk_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sliding_window", check_window(self.sliding_window))
        object.__setattr__(self, "attention_chunk_size", check_chunk(self.attention_chunk_size))
        if self.layer_types is None:
            return
        types = tuple(self.layer_types)
        object.__setattr__(self, "layer_types", types)
        unknown = {t: [i for i, u in enumerate(types) if u == t] for t in types if t not in LAYER_TYPES}
        if unknown:
            named = ", ".join(f"{t!r} (layers {', '.join(map(str, at))})" for t, at in unknown.items())
            served = f"{', '.join(map(repr, LAYER_TYPES[:-1]))} and {LAYER_TYPES[-1]!r}"
            raise ValueError(f"packtool builds masks for {served} layers only; this model also has {named}")
        if SLIDING_ATTENTION in types and self.sliding_window is None:
            raise ValueError("layer_types has 'sliding_attention' layers but sliding_window is not set")
        if CHUNKED_ATTENTION in types and self.attention_chunk_size is None:
            raise ValueError("layer_types has 'chunked_attention' layers but attention_chunk_size is not set")

    def _types(self) -> tuple[str, ...]:
        """The layer types, in order of first use."""
        if self.layer_types is not None:
            return tuple(dict.fromkeys(self.layer_types))
        if self.sliding_window is not None:
            return (SLIDING_ATTENTION,)
        return (CHUNKED_ATTENTION,) if self.attention_chunk_size is not None else (FULL_ATTENTION,)

    def windows(self) -> dict[str, int | None]:
        """Each layer type of the model, in order of first use, and its window (None: no window)."""
        return {t: self.sliding_window if t == SLIDING_ATTENTION else None for t in self._types()}

    def chunks(self) -> dict[str, int | None]:
        """Each layer type of the model, in order of first use, and its chunk (None: no chunks)."""
        return {t: self.attention_chunk_size if t == CHUNKED_ATTENTION else None for t in self._types()}


def attention_pattern(source: Any) -> AttentionPattern:
    """The ``AttentionPattern`` of a model, read as transformers' models read it from their config.

    ``source``: a transformers config (``model.config``; a multimodal model's text config is read), a
    mapping with the same keys (``sliding_window``, ``layer_types``, ...), an ``AttentionPattern``
    (returned as is), or ``CAUSAL`` (``"causal"``) or None: full attention on every layer. With
    ``layer_types`` the window applies to the ``"sliding_attention"`` layers and ``attention_chunk_size`` to
    the ``"chunked_attention"`` ones; without, the window to every layer when ``sliding_window`` is set (0
    or ``use_sliding_window=False``: no window), else the chunks when ``attention_chunk_size`` is (as
    transformers' ``create_masks_for_generate`` reads them). Refused (``ValueError``): attention that is
    not causal (``use_bidirectional_attention``, ``is_causal=False``) and layer types other than full,
    sliding and chunked.

    Example::

        >>> from transformers import MistralConfig  # doctest: +SKIP
        >>> attention_pattern(MistralConfig(sliding_window=4096)).windows()  # doctest: +SKIP
        {'sliding_attention': 4096}
    """
    if isinstance(source, str) and source != CAUSAL:
        raise ValueError(f"attention: the one declaration by name is {CAUSAL!r}, got {source!r}")
    if source is None or isinstance(source, str):
        return AttentionPattern()
    if isinstance(source, AttentionPattern):
        return source
    if isinstance(source, Mapping):
        values = dict(source)
    else:
        text_config = getattr(source, "get_text_config", None)
        config = text_config(decoder=True) if callable(text_config) else source
        keys = ("model_type", "sliding_window", "layer_types", "use_sliding_window", "is_causal",
                "attention_chunk_size")  # fmt: skip
        values = {k: getattr(config, k) for k in (*keys, "use_bidirectional_attention") if hasattr(config, k)}
    name = values.get("model_type") or type(source).__name__
    if values.get("use_bidirectional_attention") or values.get("is_causal", True) is False:
        raise ValueError(f"{name}: its attention is bidirectional; packtool's masks are causal")
    window, layer_types = values.get("sliding_window"), values.get("layer_types")
    chunk = values.get("attention_chunk_size")
    if layer_types is not None:
        layer_types = tuple(layer_types)
        window = window if SLIDING_ATTENTION in layer_types else None
        chunk = chunk if CHUNKED_ATTENTION in layer_types else None
    elif not window or values.get("use_sliding_window", True) is False:
        window = None
    else:
        chunk = None  # every layer slides
    try:
        return AttentionPattern(window, layer_types, chunk)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def padded_seq_lens(seq_lens: SeqLens, device: torch.device | str | None = None) -> torch.Tensor:
    """``seq_lens`` as a ``(B, S)`` int64 tensor padded with ``SEQ_LENS_PAD`` (0), on ``device``.

    Example::

        >>> padded_seq_lens([torch.tensor([3, 2, 1]), torch.tensor([6])]).tolist()
        [[3, 2, 1], [6, 0, 0]]
    """
    if isinstance(seq_lens, torch.Tensor):
        out = seq_lens if seq_lens.dim() == 2 else seq_lens.reshape(1, -1)
    else:
        rows = [torch.as_tensor(s).reshape(-1) for s in seq_lens]
        out = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=SEQ_LENS_PAD)
    return out.to(device=device if device is not None else out.device, dtype=torch.int64)


def sequence_starts(
    seq_lens: SeqLens, packed_sequence_size: int, device=None, chunk: int | None = None
) -> tuple[torch.Tensor, ...]:
    """Per token: index of its sequence and the position where that sequence starts, both ``(B, N)`` int64;
    with ``chunk``, of its chunk instead (each sequence cut into chunks of ``chunk`` tokens from its start,
    counted in order along the pack).

    Example::

        >>> doc, start = sequence_starts(torch.tensor([[3, 2, 1]]), 6)
        >>> doc.tolist(), start.tolist()
        ([[0, 0, 0, 1, 1, 2]], [[0, 0, 0, 3, 3, 5]])
        >>> doc, start = sequence_starts(torch.tensor([[5, 1]]), 6, chunk=2)
        >>> doc.tolist(), start.tolist()
        ([[0, 0, 1, 1, 2, 3]], [[0, 0, 2, 2, 4, 5]])
    """
    chunk = check_chunk(chunk)
    sl = padded_seq_lens(seq_lens, device)
    b, n = sl.shape[0], packed_sequence_size
    ends = sl.cumsum(1)  # (B, S): exclusive end of each sequence
    # a sequence index is the number of sequence ends at or before the position: scatter the ends, cumsum
    marks = torch.zeros(b, n + 1, dtype=torch.int64, device=sl.device)
    marks.scatter_add_(1, ends.clamp(max=n), torch.ones_like(ends))
    doc = marks[:, :n].cumsum(1).clamp_(max=sl.shape[1] - 1)
    start = (ends - sl).gather(1, doc)
    if chunk is not None and n > 0:
        within = torch.arange(n, device=sl.device) - start
        start = start + within - within % chunk
        doc = (within % chunk == 0).cumsum(1) - 1  # a chunk starts where a token is first of its chunk
    return doc, start


def block_causal_mask(
    seq_lens: SeqLens,
    packed_sequence_size: int,
    device: torch.device | str | None = None,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Dense block-causal mask, bool ``[B, 1, N, N]``, ``True`` where query row may attend key column;
    with ``window``, only the last ``window`` keys of the query's sequence up to itself (``q - window <
    k <= q``, transformers' sliding window); with ``chunk``, only the keys of the query's chunk (its
    sequence cut into chunks of ``chunk`` tokens from its start: Llama 4's chunked attention).

    Without a window, equal to NeMo AutoModel's ``create_block_causal_mask`` for the same ``seq_lens``
    (rows summing to ``N``). Built on ``device`` (default: the device of ``seq_lens``).

    How: every ``True`` of row ``q`` lies in the band of the ``W`` columns ending at the diagonal
    (``W`` = the longest sequence of the batch, or the window if shorter), so the output starts as zeros
    and only that band is written: row ``q`` of the band is the length-``W`` slice at offset
    ``min(within[q], W - 1)`` (``within[q]``: the query's index in its sequence) of the small pattern
    ``zeros(W - 1) ones(W)``, gathered with one ``index_select`` per pack into a strided view of the
    output. On CPU the zeros are a kept buffer of an earlier mask that nothing references any more,
    cleared with one memset (see ``MASK_CACHE_SIZE``), or else NumPy's ``calloc`` (pages the kernel
    zeroes on first touch).

    Example::

        >>> block_causal_mask(torch.tensor([[2, 1]]), 3)[0, 0].int().tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
        >>> block_causal_mask(torch.tensor([[3]]), 3, window=2)[0, 0].int().tolist()
        [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
        >>> block_causal_mask(torch.tensor([[3]]), 3, chunk=2)[0, 0].int().tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    window = check_window(window)
    _, start = sequence_starts(seq_lens, packed_sequence_size, device, chunk)  # a chunk: a sequence here
    n, b, dev = packed_sequence_size, start.shape[0], start.device
    within = torch.arange(n, device=dev) - start  # (B, N): index of each query inside its sequence
    w = int(within.max()) + 1 if within.numel() else 1  # longest sequence: the band's width
    if window is not None and window < w:
        w = window  # a query sees at most the window: the band narrows, its rows saturate at W - 1
        within = within.clamp(max=w - 1)
    if dev.type == "cpu":
        flat = _zeroed_host_bools(b * n * n)
    else:
        flat = torch.zeros(b * n * n, dtype=torch.bool, device=dev)
    mask = flat.view(b, 1, n, n)
    if b == 0 or n == 0:
        return mask
    mask[:, 0, 0, 0] = True  # row 0 is [1, 0, ...]; rows 1.. are written through the band
    # band[p, q - 1, d] = mask[p, 0, q, q - (W - 1) + d] for rows q >= 1: row stride N + 1 walks the
    # diagonal; columns left of 0 fall at the end of row q - 1, above its diagonal (False there, too)
    band = flat.as_strided((b, n - 1, w), (n * n, n + 1, 1), n + 2 - w)
    pattern = torch.zeros(2 * w - 1, dtype=torch.bool, device=dev)
    pattern[w - 1 :] = True
    windows = pattern.unfold(0, w, 1)  # (W, W): row k is zeros(W - 1 - k) ones(k + 1)
    rows = within[:, 1:]
    for p in range(b):  # one gather per pack: the bands of all packs are not one 2-D strided view
        torch.index_select(windows, 0, rows[p], out=band[p])
    return mask


def additive_mask(
    seq_lens: SeqLens,
    packed_sequence_size: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Block-causal mask to add to attention scores, ``[B, 1, N, N]`` of ``dtype``: ``0`` where the query
    row may attend the key column (``block_causal_mask``, ``window`` and ``chunk`` included), ``-inf``
    elsewhere (every row attends at least itself, so no row is all ``-inf``). What transformers' eager
    attention takes as ``attention_mask``.

    Example::

        >>> additive_mask(torch.tensor([[2, 1]]), 3)[0, 0].tolist()
        [[0.0, -inf, -inf], [0.0, 0.0, -inf], [-inf, -inf, 0.0]]
    """
    allowed = block_causal_mask(seq_lens, packed_sequence_size, device, window, chunk)
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, float("-inf"))


def flex_block_mask(
    seq_lens: SeqLens,
    packed_sequence_size: int,
    block_size: int = 128,
    device: torch.device | str | None = None,
    window: int | None = None,
    chunk: int | None = None,
):
    """Document-causal ``flex_attention`` ``BlockMask`` from sequence boundaries, on ``device``; with
    ``window``, each query sees only the last ``window`` keys of its sequence up to itself; with ``chunk``,
    only those of its chunk (each chunk of a sequence is a sequence here).

    Each ``block_size x block_size`` tile is classified from the sequence ids of its first and last
    tokens: *empty* (above the diagonal, no sequence shared, or its nearest pair farther apart than the
    window), *full* (below the diagonal, both tiles complete and inside one sequence, its farthest pair
    within the window: the kernel skips the mask function there) or *partial* (the ``mask_mod`` ``same
    sequence & q >= kv`` (``& q - kv < window``) decides per element). Cost ``O(B * (N / block_size)^2)``.
    The result has one head (``H=1``, broadcast over heads) and matches what
    ``create_block_mask(mask_mod, B, 1, N, N, BLOCK_SIZE=block_size)`` builds from that mask function.
    Build it on the device attention runs on: ``BlockMask.to(device)`` moves the block tensors but not the
    sequence ids its ``mask_mod`` captured (``PackedBatch.to`` builds the mask again on the new device).

    Example::

        >>> bm = flex_block_mask(torch.tensor([[256, 128, 128]]), 512)
        >>> bm.kv_num_blocks.shape, bm.full_kv_num_blocks[0, 0].tolist()
        (torch.Size([1, 1, 4]), [0, 1, 0, 0])
    """
    window = check_window(window)
    n = packed_sequence_size
    doc, _ = sequence_starts(seq_lens, n, device, chunk)
    dev = doc.device
    nb = -(-n // block_size)
    first = torch.arange(nb, device=dev) * block_size
    last = torch.clamp(first + block_size, max=n) - 1
    first_doc, last_doc = doc[:, first], doc[:, last]  # (B, nb)
    qi = torch.arange(nb, device=dev).view(nb, 1)
    kj = torch.arange(nb, device=dev).view(1, nb)
    complete = (first + block_size) <= n  # (nb,)
    # tiles (q block i, kv block j), shape (B, nq, nkv); kv docs precede q docs when j <= i
    nonempty = (kj <= qi) & (last_doc.unsqueeze(1) >= first_doc.unsqueeze(2))
    full = (
        (kj < qi)
        & (first_doc.unsqueeze(1) == last_doc.unsqueeze(2))
        & complete.view(1, nb)
        & complete.view(nb, 1)
    )
    if window is not None:
        # a tile's token distances q - kv: nearest first[i] - last[j], farthest last[i] - first[j]
        nonempty &= (first.view(nb, 1) - last.view(1, nb)) < window
        full &= (last.view(nb, 1) - first.view(1, nb)) < window
    partial = nonempty & ~full

    def ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # per row: the selected column indices ascending, then the others ascending (a stable
        # partition, what BlockMask expects), placed by cumulative counts instead of a sort
        t = tiles.to(torch.int32).unsqueeze(1)  # (B, 1, rows, cols)
        num = t.sum(-1, dtype=torch.int32)
        slot = torch.where(t.bool(), t.cumsum(-1) - 1, num.unsqueeze(-1) + (1 - t).cumsum(-1) - 1)
        cols = torch.arange(t.shape[-1], dtype=torch.int32, device=t.device).expand_as(t)
        idx = torch.empty_like(t).scatter_(-1, slot.long(), cols)
        return num, idx

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    doc_mod = doc  # captured by the mask function

    def document_causal(b, h, q_idx, kv_idx):
        return (doc_mod[b, q_idx] == doc_mod[b, kv_idx]) & (q_idx >= kv_idx)

    def document_causal_window(b, h, q_idx, kv_idx):
        return (doc_mod[b, q_idx] == doc_mod[b, kv_idx]) & (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    # the q-side (column) view of the same tiles, for the backward pass: computed here from the tiles
    # directly, which is much cheaper than from_kv_blocks' generic transpose of the index lists
    block_mask = BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block_size,
        mask_mod=document_causal if window is None else document_causal_window,
        seq_lengths=(n, n),
        compute_q_blocks=False,
    )
    block_mask.q_num_blocks, block_mask.q_indices = ordered(partial.transpose(1, 2))
    block_mask.full_q_num_blocks, block_mask.full_q_indices = ordered(full.transpose(1, 2))
    return block_mask


def cu_seqlens_of(seq_lens: SeqLens, device=None) -> tuple[torch.Tensor, int]:
    """``cu_seqlens`` (int32, ``(T + 1,)``) over the non-empty sequences of all packs in order, and
    ``max_seqlen`` (a Python int). Pack boundaries are sequence boundaries, so with the batch flattened to
    ``B * N`` tokens this is what varlen kernels take.

    Example::

        >>> cu, m = cu_seqlens_of(torch.tensor([[3, 2, 1], [6, 0, 0]]))
        >>> cu.tolist(), m
        ([0, 3, 5, 6, 12], 6)
    """
    sl = padded_seq_lens(seq_lens, device).reshape(-1)
    sl = sl[sl > 0]
    cu = torch.zeros(sl.numel() + 1, dtype=torch.int32, device=sl.device)
    if sl.numel() == 0:
        return cu, 0
    cu[1:] = torch.cumsum(sl, 0)
    return cu, int(sl.max())


def varlen_args(
    seq_lens: SeqLens, packed_sequence_size: int | None = None, device=None, chunk: int | None = None
) -> dict:
    """Arguments for FlashAttention ``flash_attn_varlen_func`` / Transformer Engine THD attention.

    Returns ``{"cu_seqlens": (T+1,) int32, "max_seqlen": int, "position_ids": (B, N) int64}`` where
    ``position_ids`` is each token's index inside its own sequence. ``N`` defaults to the row sum. With
    ``chunk``, ``cu_seqlens`` and ``max_seqlen`` are those of the chunks (each sequence cut into chunks of
    ``chunk`` tokens from its start), what a varlen kernel needs for Llama 4's chunked layers; the
    ``position_ids`` stay the sequences'.

    Example::

        >>> a = varlen_args(torch.tensor([[3, 2, 1]]))
        >>> a["cu_seqlens"].tolist(), a["max_seqlen"], a["position_ids"].tolist()
        ([0, 3, 5, 6], 3, [[0, 1, 2, 0, 1, 0]])
        >>> a = varlen_args(torch.tensor([[3, 2, 1]]), chunk=2)
        >>> a["cu_seqlens"].tolist(), a["max_seqlen"], a["position_ids"].tolist()
        ([0, 2, 3, 5, 6], 2, [[0, 1, 2, 0, 1, 0]])
    """
    sl = padded_seq_lens(seq_lens, device)
    n = int(sl[0].sum()) if packed_sequence_size is None else packed_sequence_size
    _, start = sequence_starts(sl, n)
    position_ids = torch.arange(n, device=sl.device).view(1, n) - start
    if chunk is None:
        cu, max_seqlen = cu_seqlens_of(sl)
    else:  # each chunk's length: the tokens of one chunk index, counted over the batch
        doc, _ = sequence_starts(sl, n, chunk=chunk)
        doc = doc + torch.arange(sl.shape[0], device=sl.device).view(-1, 1) * n  # apart across packs
        cu, max_seqlen = cu_seqlens_of(torch.unique_consecutive(doc.reshape(-1), return_counts=True)[1])
    return {"cu_seqlens": cu, "max_seqlen": max_seqlen, "position_ids": position_ids}


def flattening_kwargs(seq_lens: SeqLens, packed_sequence_size: int, device=None) -> dict:
    """The sequence boundaries of a batch flattened to one row of ``B * N`` tokens, named and typed as
    transformers' ``DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)``
    returns them for the same sequences (the padding of a pack counts as one):

    ``position_ids`` ``(1, B * N)`` int64 (each token's index in its sequence), ``cu_seq_lens_q`` and
    ``cu_seq_lens_k`` ``(T + 1,)`` int32, ``max_length_q`` and ``max_length_k`` (Python ints), ``seq_idx``
    ``(1, B * N)`` int32 (each token's sequence, counted over the batch).

    Example::

        >>> kw = flattening_kwargs(torch.tensor([[3, 1], [4, 0]]), 4)
        >>> kw["cu_seq_lens_q"].tolist(), kw["max_length_q"], kw["seq_idx"].tolist()
        ([0, 3, 4, 8], 4, [[0, 0, 0, 1, 2, 2, 2, 2]])
    """
    sl = padded_seq_lens(seq_lens, device)
    n = packed_sequence_size
    cu, max_len = cu_seqlens_of(sl)
    doc, start = sequence_starts(sl, n)
    before = torch.zeros(sl.shape[0], 1, dtype=torch.int64, device=sl.device)
    before[1:, 0] = (sl > 0).sum(1).cumsum(0)[:-1]  # sequences in the packs before this one
    position_ids = torch.arange(n, device=sl.device).view(1, n) - start
    return {
        "position_ids": position_ids.reshape(1, -1),
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu.clone(),
        "max_length_q": max_len,
        "max_length_k": max_len,
        "seq_idx": (doc + before).to(torch.int32).reshape(1, -1),
    }
