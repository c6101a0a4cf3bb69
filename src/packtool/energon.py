"""Megatron-Energon types for packtool's ``--format webdataset`` output (``pip install 'packtool[energon]'``).

A webdataset output directory carries ``.nv-meta/`` (``.info.json``, ``split.yaml``, ``dataset.yaml``) naming
``PackSample`` below as its sample type, so Energon loads it as it is, with no ``energon prepare``::

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset
    from packtool.energon import PackTaskEncoder

    ds = get_train_dataset(
        "out/", batch_size=8, shuffle_buffer_size=100, max_samples_per_sequence=100,
        worker_config=WorkerConfig.default_worker_config(), task_encoder=PackTaskEncoder(),
    )
    for batch in get_loader(ds):
        batch.input_ids  # (8, N) int32 tensor; batch.seq_lens: list of (num_samples[+1],) int32 tensors

Without packtool, the same directory loads through Energon's own ``CrudeWebdataset``:
``get_train_dataset(DIR, dataset_config="crude.yaml", task_encoder=...)`` with a cooker for the subflavor
``packtool: pack`` (``cook_pack`` below is one; docs/formats.md shows one that needs no packtool).
``PackTaskEncoder`` carries that cooker, so it reads either config.

Energon's own packing (``packing_buffer_size``) would pack packs again: ``PackTaskEncoder`` refuses it
with a message saying so, unless a subclass implements ``select_samples_to_pack`` and
``pack_selected_samples``.

This module imports ``megatron.energon``; ``import packtool`` never imports this module.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

try:
    import torch
    from megatron.energon import (
        Batch,
        Cooker,
        DefaultTaskEncoder,
        Sample,
        basic_sample_keys,
        edataclass,
        stateless,
    )
except ImportError as e:  # pragma: no cover - only without the optional extra
    raise ImportError(
        f"packtool.energon needs Megatron-Energon: pip install 'packtool[energon]' (import failed: {e})"
    ) from e

from packtool.formats.webdataset_index import ENERGON_SUBFLAVOR


@edataclass
class PackSample(Sample):
    """One pack, as stored in a tar shard (NumPy arrays, ``N`` = packed_sequence_size).

    Attributes:
        input_ids: ``(N,)`` int32 token ids, padded with ``pad_token_id``.
        labels: ``(N,)`` int32 labels, ``-100`` where no loss is taken.
        position_ids: ``(N,)`` int32 position ids.
        seq_lens: ``(num_samples [+1],)`` int32 sample lengths, then the padding if any.
        sample_index: ``(num_samples,)`` int64 global input index of each sample (piece).
        sample_offset: ``(num_samples,)`` int64 where each piece starts inside its sample.
        loss_mask: ``(N,)`` int8, only when the input carried a loss mask.
        cp_padding: ``(num_samples,)`` int32 context-parallel padding ending each piece (``--cp-size``).
    """

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    seq_lens: np.ndarray
    sample_index: np.ndarray
    sample_offset: np.ndarray
    loss_mask: Optional[np.ndarray] = None  # noqa: UP045 - Energon's type parser reads this annotation
    cp_padding: Optional[np.ndarray] = None  # noqa: UP045


@edataclass
class PackBatch(Batch):
    """A batch of ``B`` packs: fixed-width fields stacked to ``(B, N)`` tensors, ragged ones as lists."""

    input_ids: torch.Tensor  # (B, N) int32
    labels: torch.Tensor  # (B, N) int32
    position_ids: torch.Tensor  # (B, N) int32
    seq_lens: list  # B tensors (num_samples [+1],) int32
    sample_index: list  # B tensors (num_samples,) int64
    sample_offset: list  # B tensors (num_samples,) int64
    loss_mask: Optional[torch.Tensor] = None  # noqa: UP045 - (B, N) int8
    cp_padding: Optional[list] = None  # noqa: UP045 - B tensors (num_samples,) int32


def stack_packs(samples: list[PackSample]) -> PackBatch:
    """Batch ``PackSample`` objects into one ``PackBatch`` (one ``np.stack`` per fixed-width field)."""

    def stack(name: str) -> torch.Tensor:
        return torch.from_numpy(np.stack([getattr(s, name) for s in samples]))

    return PackBatch.from_samples(
        samples,
        input_ids=stack("input_ids"),
        labels=stack("labels"),
        position_ids=stack("position_ids"),
        seq_lens=[torch.from_numpy(s.seq_lens) for s in samples],
        sample_index=[torch.from_numpy(s.sample_index) for s in samples],
        sample_offset=[torch.from_numpy(s.sample_offset) for s in samples],
        loss_mask=stack("loss_mask") if samples[0].loss_mask is not None else None,
        cp_padding=None
        if samples[0].cp_padding is None
        else [torch.from_numpy(s.cp_padding) for s in samples],
    )


PACK_FIELDS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_index", "sample_offset")


@stateless
def cook_pack(raw: dict) -> PackSample:
    """A ``CrudeSample`` of ``crude.yaml`` (members ``input_ids.npy``, ..., or ``input_ids.npy.gz``, ...
    with ``--tar-compression gzip``: Energon's decoder has decompressed them) as a ``PackSample``."""
    z = ".gz" if "input_ids.npy.gz" in raw else ""
    return PackSample(
        **basic_sample_keys(raw),
        **{f: raw[f"{f}.npy{z}"] for f in PACK_FIELDS},
        loss_mask=raw.get(f"loss_mask.npy{z}"),
        cp_padding=raw.get(f"cp_padding.npy{z}"),
    )


class PackTaskEncoder(DefaultTaskEncoder[PackSample, PackSample, PackBatch, PackBatch]):
    """Energon task encoder for packtool packs: samples pass through, ``batch`` stacks them. Reads
    ``dataset.yaml`` (``PackSample``) or ``crude.yaml`` (through ``cook_pack``)."""

    cookers = [Cooker(cook_pack, has_subflavors={"packtool": ENERGON_SUBFLAVOR})]

    def batch(self, samples: list[PackSample]) -> PackBatch:
        return stack_packs(samples)

    def build_batch(self, dataset, *, packing_buffer_size=None, **kwargs):
        """Energon's batching stage; refuses ``packing_buffer_size`` unless a subclass packs."""
        if packing_buffer_size is not None and not (
            self._is_overridden(self.select_samples_to_pack)
            and self._is_overridden(self.pack_selected_samples)
        ):
            raise ValueError(
                "packing_buffer_size: packtool packs are already packed to packed_sequence_size tokens "
                "(each pack's seq_lens ends with its padding), so PackTaskEncoder does not pack them again. "
                "Leave packing_buffer_size unset, or subclass PackTaskEncoder and implement "
                "select_samples_to_pack and pack_selected_samples (strip each pack's padding segment first)."
            )
        return super().build_batch(dataset, packing_buffer_size=packing_buffer_size, **kwargs)
