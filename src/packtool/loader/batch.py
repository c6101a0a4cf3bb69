"""Batches: ``PackedBatch`` (what the loader yields) and the Energon-style batching helpers.

The loader's default stages stack packs into a ``PackedBatch`` with array copies (``gather_batch``, no
per-pack dicts); a task encoder's ``batch`` stage can use the same helpers (``batch_stack``,
``batch_pad_stack``, ``batch_list``, ``default_batch``) on pack dicts.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from packtool.masks import (
    SEQ_LENS_PAD,
    AttentionPattern,
    additive_mask,
    block_causal_mask,
    cu_seqlens_of,
    flattening_kwargs,
    flex_block_mask,
)
from packtool.packs import PackArrays
from packtool.schema import TOKEN_COLUMNS, cu_seqlens

LABELS = ("shifted", "unshifted")  # the manifest's ``labels``: how labels[i] relates to input_ids
# varlen: cu_seqlens only (FlashAttention varlen, TE THD, flattening_kwargs); dense: bool, for SDPA;
# additive: 0 / -inf floats, for eager attention (it adds the mask to the scores); flex: a BlockMask
MASKS = ("varlen", "dense", "additive", "flex")
WIDE_FIELDS = TOKEN_COLUMNS  # kept as stored (int32 / int8) on the host, widened to int64 by PackedBatch.to


class SkipSample(Exception):
    """Raise in ``encode_sample`` to drop a pack, or in ``batch`` / ``encode_batch`` to drop a batch.

    Dropped packs and batches are counted in ``loader.stats`` (``skipped_packs``, ``skipped_batches``).
    A dropped pack leaves its batch one pack shorter. Dropping whole batches gives ranks different batch
    counts, which hangs DDP: under ``torch.distributed`` prefer dropping packs.
    """


IgnoreSample = SkipSample  # Megatron-Energon's other name for it


# --- batching helpers --------------------------------------------------------------------------------
def _is_array(v: Any) -> bool:
    return isinstance(v, (np.ndarray, torch.Tensor))


def _torch_dtype(v: np.ndarray | torch.Tensor) -> torch.dtype:
    return v.dtype if isinstance(v, torch.Tensor) else torch.from_numpy(np.empty(0, dtype=v.dtype)).dtype


def _fill(out: torch.Tensor, values: Sequence[np.ndarray | torch.Tensor]) -> torch.Tensor:
    """Copy ``values[j]`` into ``out[j, :len]`` for every ``j`` (casting), one NumPy call when it can."""
    if not any(isinstance(v, torch.Tensor) for v in values):
        dst = out.numpy()
        if all(v.shape[0] == dst.shape[1] for v in values):
            np.stack(values, axis=0, out=dst, casting="unsafe")
        else:
            for j, v in enumerate(values):
                dst[j, : v.shape[0]] = v
        return out
    for j, v in enumerate(values):
        out[j, : v.shape[0]].copy_(torch.as_tensor(v))
    return out


def batch_stack(
    values: Sequence[np.ndarray | torch.Tensor], dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Stack same-shape arrays/tensors into one tensor ``(len(values), *shape)``, cast to ``dtype``.

    Example::

        >>> batch_stack([np.arange(3), np.arange(3)], torch.int64).shape
        torch.Size([2, 3])
    """
    dtype = dtype or _torch_dtype(values[0])
    return _fill(torch.empty((len(values), *values[0].shape), dtype=dtype), values)


def batch_pad_stack(
    values: Sequence[np.ndarray | torch.Tensor], pad_value: int | float = 0, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Stack 1-D (or leading-dim ragged) arrays, padding each to the longest with ``pad_value``.

    Example::

        >>> batch_pad_stack([np.array([3, 2, 1]), np.array([6])]).tolist()
        [[3, 2, 1], [6, 0, 0]]
    """
    dtype = dtype or _torch_dtype(values[0])
    longest = max(v.shape[0] for v in values)
    out = torch.empty((len(values), longest, *values[0].shape[1:]), dtype=dtype)
    out.fill_(pad_value)
    return _fill(out, values)


def batch_list(values: Sequence[Any]) -> list:
    """Keep values as a plain list (for strings, ints, dicts...)."""
    return list(values)


def default_batch(packs: list[dict]) -> dict[str, Any]:
    """The default ``batch`` stage: a dict with one entry per key of the packs.

    Arrays/tensors are stacked (pad-stacked when their lengths differ), keeping their dtype: ``input_ids``,
    ``labels``, ``position_ids`` int32 and ``loss_mask`` int8 ``(B, N)`` as stored (``PackedBatch.to``
    widens them to int64 on the device); ``seq_lens`` as int32 ``(B, max_seqs)`` padded with
    ``SEQ_LENS_PAD`` (0). Everything else becomes a list.
    """
    out: dict[str, Any] = {}
    for key in packs[0]:
        values = [p[key] for p in packs]
        if not all(_is_array(v) for v in values):
            out[key] = batch_list(values)
            continue
        dtype = torch.int32 if key == "seq_lens" else None
        if all(v.shape == values[0].shape for v in values):
            out[key] = batch_stack(values, dtype)
        else:
            out[key] = batch_pad_stack(values, SEQ_LENS_PAD if key == "seq_lens" else 0, dtype)
    return out


@dataclass
class PackedBatch:
    """One batch of ``B`` packs of ``N`` tokens.

    On the host (as the loader yields it) the token tensors keep the stored dtypes, half the bytes to move
    between processes and to the device; ``to(device)`` widens them to int64 there, as trainers expect:

    * ``input_ids``, ``labels``, ``position_ids``: ``(B, N)`` int32 on the host, int64 after ``to()``
      (``labels`` is ``-100`` where no loss);
    * ``seq_lens``: ``(B, max_seqs)`` int32, each row the pack's sequence lengths (the padding, if any, is
      the last one) then ``SEQ_LENS_PAD`` = 0; every row sums to ``N``;
    * ``cu_seqlens``: ``(T + 1,)`` int32 and ``max_seqlen`` (int): the ``T`` non-empty sequences of the
      batch flattened to ``B * N`` tokens, for varlen kernels (FlashAttention, TE THD);
    * ``loss_mask``: ``(B, N)`` int8 on the host, int64 after ``to()``; ``None`` when the data has none;
    * ``cp_padding``: ``(B, max_seqs)`` int32, aligned with ``seq_lens``: how many of each sequence's tokens
      are context-parallel padding (``--cp-size``; 0 for the pack's own padding), and
      ``cu_seqlens_unpadded``: ``(T + 1,)`` int32, ``cu_seqlens`` without it; both ``None`` when the output
      has no context-parallel padding. Transformer Engine's THD attention takes ``cu_seqlens_unpadded``
      as ``cu_seqlens_q`` / ``cu_seqlens_kv`` and ``cu_seqlens`` as ``cu_seqlens_q_padded`` /
      ``cu_seqlens_kv_padded``;
    * ``pack_index``: ``(B,)`` int64, each pack's index in the output directory (shard order);
    * ``mask``: which mask ``to()`` / ``build_mask()`` builds: ``"varlen"`` (none beyond ``cu_seqlens``;
      ``flattened()`` gives the kwargs of a flattened batch), ``"dense"`` (``attention_mask``, bool
      ``[B, 1, N, N]``, for SDPA), ``"additive"`` (``attention_mask``, float32 ``[B, 1, N, N]``, ``0`` /
      ``-inf``, for eager attention, which adds it to the scores) or ``"flex"`` (``block_mask``, a
      ``flex_attention.BlockMask``);
    * ``attention``: the model's ``AttentionPattern`` (``masks.attention_pattern(model.config)``; None
      only for ``"varlen"``: the other masks are never built without it): the masks keep each query
      inside its sequence and inside the sliding window or the attention chunk of the layers that have
      one. With one layer type ``attention_mask`` / ``block_mask`` is one mask; with several (Gemma 2
      and 3: sliding and full layers; Llama 4: chunked and full) a dict of masks keyed by layer type
      (``{"sliding_attention": ..., "full_attention": ...}``), which transformers' models take as
      ``attention_mask`` and give to each layer by its type;
    * ``labels_convention``: the output's ``labels`` (manifest): ``"shifted"`` (``labels[i]`` is the
      target of ``input_ids[i]``) or ``"unshifted"`` (``labels == input_ids``, -100 where no loss).

    **As a mapping** (what ``transformers.Trainer``, TRL and accelerate expect of a batch): ``keys()``,
    ``batch[key]``, ``key in batch``, ``dict(batch)`` and ``model(**batch)`` give ``model_inputs()``, the
    keyword arguments of a transformers ``...ForCausalLM`` forward that train on exactly the packs'
    targets, each sequence alone, whatever the model's defaults. ``len(batch)`` stays the number of packs
    ``B``. It is deliberately not registered as a ``collections.abc.Mapping``: trainers rebuild those with
    ``type(batch)({...})``; they move a ``PackedBatch`` with its own ``to()`` (accelerate's
    ``send_to_device`` does), which builds the mask on the device.

    Example::

        >>> batch = next(iter(loader))  # doctest: +SKIP
        >>> batch.input_ids.dtype, batch.to("cuda").input_ids.dtype  # doctest: +SKIP
        (torch.int32, torch.int64)
        >>> loss = model(**batch.to("cuda")).loss  # doctest: +SKIP
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    loss_mask: torch.Tensor | None = None
    pack_index: torch.Tensor | None = None
    cp_padding: torch.Tensor | None = None
    cu_seqlens_unpadded: torch.Tensor | None = None
    mask: str = "varlen"
    attention_mask: torch.Tensor | None = None
    block_mask: Any = None
    extra: dict = field(default_factory=dict)
    labels_convention: str = "shifted"
    attention: AttentionPattern | None = None
    _inputs: dict | None = field(default=None, init=False, repr=False, compare=False)  # model_inputs() cache

    @property
    def source(self) -> torch.Tensor | None:
        """``(B,)`` int64: the source each pack of a mixture's batch came from (an index into the dataset's
        ``outputs``); None for a batch of one output."""
        return self.extra.get("source")

    @property
    def packed_sequence_size(self) -> int:
        return self.input_ids.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _map(self, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> PackedBatch:
        changes = {
            f.name: fn(f.name, getattr(self, f.name))
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **changes)

    def pin_memory(self) -> PackedBatch:
        """A copy with every tensor in pinned memory (``DataLoader(pin_memory=True)`` calls this)."""
        return self._map(lambda name, t: t.pin_memory())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """A copy on ``device``, with the mask of kind ``self.mask`` built there.

        ``input_ids``, ``labels``, ``position_ids`` and ``loss_mask`` arrive as int64 (copied at their
        host dtype, widened on the device); the other tensors keep their dtype.
        """

        def move(name: str, t: torch.Tensor) -> torch.Tensor:
            t = t.to(device, non_blocking=non_blocking)
            return t.to(torch.int64) if name in WIDE_FIELDS else t

        moved = self._map(move)
        if isinstance(self.attention_mask, dict):  # one mask per layer type (a mask two types share once)
            on_device = {id(m): m.to(device, non_blocking=non_blocking) for m in self.attention_mask.values()}
            moved.attention_mask = {kind: on_device[id(m)] for kind, m in self.attention_mask.items()}
        # built again on the device, not moved: BlockMask.to moves its block tensors but not the tensors
        # its mask_mod captured (the per-token sequence ids), which flex_attention would index on the host
        moved.block_mask = None
        return moved.build_mask()

    def build_mask(self) -> PackedBatch:
        """Build the ``dense``, ``additive`` or ``flex`` mask (if not built yet) on the batch's device, one
        per layer type of ``attention`` (a dict keyed by layer type when there are several); returns self.
        """
        if self.mask not in MASKS:
            raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {self.mask!r}")
        if self.mask != "varlen" and self.attention is None:
            raise ValueError(
                f"PackedBatch: mask={self.mask!r} is built for the model's attention and this batch has "
                "none: make it with attention=model.config (PackedDataset, collate_packs), or set .attention"
            )
        n, seq_lens = self.packed_sequence_size, self.seq_lens
        if self.mask == "dense" and self.attention_mask is None:
            self.attention_mask = self._per_layer_type(
                lambda w, c: block_causal_mask(seq_lens, n, window=w, chunk=c)
            )
        elif self.mask == "additive" and self.attention_mask is None:
            self.attention_mask = self._per_layer_type(
                lambda w, c: additive_mask(seq_lens, n, window=w, chunk=c)
            )
        elif self.mask == "flex" and self.block_mask is None:
            self.block_mask = self._per_layer_type(
                lambda w, c: flex_block_mask(seq_lens, n, window=w, chunk=c)
            )
        return self

    def _per_layer_type(self, build: Callable[[int | None, int | None], Any]) -> Any:
        """``build(window, chunk)`` for each layer type of ``attention``: the mask alone for one type, else a
        dict by type. A window or chunk no shorter than the batch's longest sequence (``max_seqlen``) cuts
        nothing: that type shares the full mask."""
        windows, chunks = self.attention.windows(), self.attention.chunks()
        longest = self.max_seqlen

        def cuts(size: int | None) -> int | None:
            return None if size is None or size >= longest else size

        keys = {kind: (cuts(windows[kind]), cuts(chunks[kind])) for kind in windows}
        built = {key: build(*key) for key in dict.fromkeys(keys.values())}
        masks = {kind: built[key] for kind, key in keys.items()}
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def shift_labels(self) -> torch.Tensor:
        """``(B, N)`` int64: the target of each token, ``-100`` where none; what a transformers model takes
        as ``shift_labels`` (it then scores ``logits[:, i]`` against ``shift_labels[:, i]`` and does not
        shift). ``"shifted"`` labels are that already; ``"unshifted"`` ones are shifted left inside each
        sequence, so the last token of a sequence never takes the next sequence's first token as target.

        >>> b = PackedBatch(torch.tensor([[5, 6, 7, 8]]), torch.tensor([[5, 6, 7, 8]]), torch.zeros(1, 4),
        ...                 torch.tensor([[2, 2]]), torch.tensor([0, 2, 4]), 2, labels_convention="unshifted")
        >>> b.shift_labels().tolist()
        [[6, -100, 8, -100]]
        """
        labels = self.labels.to(torch.int64)
        if self.labels_convention == "shifted":
            return labels
        if self.labels_convention != "unshifted":
            raise ValueError(
                f"labels_convention must be one of {', '.join(LABELS)}, got {self.labels_convention!r}"
            )
        out = torch.full_like(labels, -100)
        out[:, :-1] = labels[:, 1:]
        lengths = self.seq_lens.to(device=labels.device, dtype=torch.int64)
        ends = lengths.cumsum(1) - 1  # each sequence's last token
        rows = torch.arange(len(labels), device=labels.device).view(-1, 1).expand_as(ends)
        real = lengths > 0
        out[rows[real], ends[real]] = -100
        return out

    def flattened(self) -> dict[str, Any]:
        """The batch as one row of ``B * N`` tokens: the keyword arguments of a transformers model's
        forward, complete (``model(**batch.flattened())`` trains on exactly the packs' targets whatever
        the model's defaults).

        What transformers' ``DataCollatorWithFlattening(return_flash_attn_kwargs=True,
        return_seq_idx=True)`` returns for the same sequences: ``input_ids`` and ``position_ids``
        ``(1, B * N)`` int64 (positions restart at each sequence, computed from ``seq_lens``),
        ``cu_seq_lens_q/k``, ``max_length_q/k`` and ``seq_idx`` (``masks.flattening_kwargs``); with
        ``labels`` and ``shift_labels`` ``(1, B * N)`` int64 (``shift_labels()``: the model does not shift
        packtool's labels again, and no target crosses into the next sequence), and ``use_cache=False``:
        with a cache, transformers builds a causal mask over the whole row instead of detecting the
        sequences from ``position_ids`` (attention then crosses samples). Runs with ``flash_attention_2``;
        ``sdpa`` / ``eager`` find the boundaries from the ``position_ids`` where the model's code gives them
        to its mask construction, which not every model's does. So the batch must know the model
        (``attention``: ``attention=model.config`` on the dataset, checked by ``loader.fit``, or a
        declaration such as ``"causal"``); without it, ``ValueError`` (``cu_seqlens`` stay for a kernel of
        your own).
        """
        if self.attention is None:
            raise ValueError(
                "PackedBatch: a flattened row keeps its samples apart only where the model's code finds them "
                "from position_ids: make the batch with attention=model.config (checked against the model)"
            )
        kwargs = flattening_kwargs(self.seq_lens, self.packed_sequence_size)
        device = self.input_ids.device
        out: dict[str, Any] = {"input_ids": self.input_ids.reshape(1, -1).to(torch.int64)}
        out.update({k: v.to(device) if torch.is_tensor(v) else v for k, v in kwargs.items()})
        out["labels"] = self.labels.reshape(1, -1).to(torch.int64)
        out["shift_labels"] = self.shift_labels().reshape(1, -1)
        out["use_cache"] = False
        return out

    def model_inputs(self) -> dict[str, Any]:
        """The keyword arguments of a transformers ``...ForCausalLM`` forward for this batch, by its mask:

        * ``"varlen"``: ``flattened()`` (one row of ``B * N`` tokens; ``flash_attention_2``, or ``sdpa`` /
          ``eager`` from the ``position_ids``);
        * ``"dense"`` (``sdpa``), ``"additive"`` (``eager``), ``"flex"`` (``flex_attention``, the
          ``BlockMask`` as ``attention_mask``): ``input_ids``, ``position_ids``, ``attention_mask``,
          ``labels`` and ``shift_labels`` ``(B, N)`` (int64) and ``use_cache=False``.

        Built once per batch (``batch[key] = value`` overrides an entry, as TRL does with ``use_cache``).
        """
        if self._inputs is None:
            if self.mask == "varlen":
                self._inputs = self.flattened()
            else:
                self.build_mask()
                self._inputs = {
                    "input_ids": self.input_ids.to(torch.int64),
                    "position_ids": self.position_ids.to(torch.int64),
                    "attention_mask": self.block_mask if self.mask == "flex" else self.attention_mask,
                    "labels": self.labels.to(torch.int64),
                    "shift_labels": self.shift_labels(),
                    "use_cache": False,
                }
        return self._inputs

    # the mapping trainers expect (see the class docstring) ------------------------------------------
    def keys(self):
        return self.model_inputs().keys()

    def values(self):
        return self.model_inputs().values()

    def items(self):
        return self.model_inputs().items()

    def get(self, key: str, default: Any = None) -> Any:
        return self.model_inputs().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.model_inputs()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.model_inputs()[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self.model_inputs()

    def __iter__(self):
        return iter(self.model_inputs())


_BATCH_KEYS = {"input_ids", "labels", "position_ids", "seq_lens", "loss_mask", "pack_index", "cp_padding"}


def gather_batch(
    decoded: dict[int, PackArrays],
    units: np.ndarray,
    rows: np.ndarray,
    ids: np.ndarray,
    alloc: Callable[[tuple[int, ...], Any], np.ndarray] = np.empty,
) -> dict:
    """The default raw batch of packs ``rows`` of ``units`` (``default_batch`` of their pack dicts).

    ``decoded`` maps a unit to its ``PackArrays``. No per-pack dicts: each ``(B, N)`` column is filled
    with one row copy per pack (fancy indexing copies every row twice, through a temporary), keeping its
    stored dtype; ``seq_lens`` is int32 ``(B, max_seqs)`` padded with ``SEQ_LENS_PAD``; ``pack_index`` is
    the list of pack indices. The arrays are made by ``alloc(shape, dtype)``.
    """
    k = len(units)
    first = decoded[int(units[0])].token_columns()
    out: dict[str, Any] = {}
    unit_list, row_list = units.tolist(), rows.tolist()
    for name, template in first.items():
        col = alloc((k, template.shape[1]), template.dtype)
        for j in range(k):
            col[j] = getattr(decoded[unit_list[j]], name)[row_list[j]]
        out[name] = torch.from_numpy(col)
    # each pack's seq_lens: a slice of its unit's flat values (a few per batch)
    pieces = [decoded[u].row("seq_lens", r) for u, r in zip(unit_list, row_list, strict=True)]
    width = max(1, max(len(p) for p in pieces))
    seq_lens = alloc((k, width), np.int32)
    for j, piece in enumerate(pieces):
        seq_lens[j, : len(piece)] = piece
        seq_lens[j, len(piece) :] = SEQ_LENS_PAD
    out["seq_lens"] = torch.from_numpy(seq_lens)
    if decoded[unit_list[0]].cp_padding is not None:  # one per piece: the first entries of each seq_lens row
        cp = alloc((k, width), np.int32)
        cp.fill(0)
        for j, (u, r) in enumerate(zip(unit_list, row_list, strict=True)):
            values = decoded[u].row("cp_padding", r)
            cp[j, : len(values)] = values
        out["cp_padding"] = torch.from_numpy(cp)
    out["pack_index"] = ids.tolist()
    return out


def host_cu_seqlens(seq_lens: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``cu_seqlens_of`` for a CPU tensor, in NumPy (``schema.cu_seqlens``; a few times cheaper)."""
    if seq_lens.device.type != "cpu" or seq_lens.dim() != 2:
        return cu_seqlens_of(seq_lens)
    lengths = seq_lens.numpy()
    return torch.from_numpy(cu_seqlens(lengths)), int(lengths.max(initial=0))


def packed_batch(
    raw: dict, mask: str, labels_convention: str = "shifted", attention: AttentionPattern | None = None
) -> PackedBatch:
    """A ``PackedBatch`` from a raw batch (``default_batch``'s dict: ``(B, N)`` token tensors, ``(B, S)``
    ``seq_lens`` padded with ``SEQ_LENS_PAD``, ``pack_index`` a list or None); other keys go to
    ``extra``; ``labels_convention`` is the output's ``labels`` (manifest); ``attention`` the model's
    ``AttentionPattern`` (None: the batch's ``dense``, ``additive`` and ``flex`` masks cannot be built)."""
    seq_lens = raw["seq_lens"]
    cu, max_seqlen = host_cu_seqlens(seq_lens)
    pack_index = raw.get("pack_index")
    cp, cu_unpadded = _cp_padding(raw.get("cp_padding"), seq_lens)
    return PackedBatch(
        input_ids=raw["input_ids"],
        labels=raw["labels"],
        position_ids=raw["position_ids"],
        seq_lens=seq_lens,
        cu_seqlens=cu,
        max_seqlen=max_seqlen,
        loss_mask=raw.get("loss_mask"),
        pack_index=torch.tensor(pack_index, dtype=torch.int64) if pack_index is not None else None,
        cp_padding=cp,
        cu_seqlens_unpadded=cu_unpadded,
        mask=mask,
        extra={k: v for k, v in raw.items() if k not in _BATCH_KEYS},
        labels_convention=labels_convention,
        attention=attention,
    )


def _cp_padding(
    cp: torch.Tensor | None, seq_lens: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``cp`` (each pack's pieces' context-parallel padding, ``(B, max_pieces)``, the pieces being the
    first sequences of each ``seq_lens`` row) widened to ``seq_lens``' shape with 0s, and the
    ``cu_seqlens`` of ``seq_lens - cp`` over the same non-empty sequences; ``(None, None)`` without it.

    >>> cp, cu = _cp_padding(torch.tensor([[1, 0]]), torch.tensor([[4, 2, 2]], dtype=torch.int32))
    >>> cp.tolist(), cu.tolist()
    ([[1, 0, 0]], [0, 3, 5, 7])
    """
    if cp is None:
        return None, None
    wide = torch.zeros(seq_lens.shape, dtype=torch.int32)
    wide[:, : cp.shape[1]] = cp
    lengths = seq_lens.reshape(-1)
    real = (seq_lens - wide).reshape(-1)[lengths > 0]
    cu = torch.zeros(real.numel() + 1, dtype=torch.int32)
    torch.cumsum(real, 0, dtype=torch.int32, out=cu[1:])
    return wide, cu


def pack_dict(packs: PackArrays, row: int, pack_index: int, tensors: bool) -> dict:
    """Row ``row`` of a decoded unit as a pack dict (NumPy views, or tensor views for task encoders; a
    vision-language pack's ``images`` stay a list of ``{"bytes", "path"}``)."""
    pack: dict[str, Any] = packs.pack(row)
    if tensors:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only Arrow memory: documented as views
            pack = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in pack.items()}
    pack["pack_index"] = pack_index
    return pack
