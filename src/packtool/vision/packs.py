"""Packs of vision-language samples, in memory: a ``PackPlan`` over ``sample_lengths`` laid out as the
model reads it.

``plan_packs(sequences, packed_sequence_size, ...)`` plans whole samples with
``packtool.packing.planner.make_plan`` (best-fit decreasing by default; ``check_plannable`` refuses
what would cut an image).
``assemble_pack(columns, plan, k, pad_id)`` lays out pack ``k``: its samples' tokens one after the other,
padded to N, and where each image's run of image tokens sits in the pack. Images keep their samples'
order, so the k-th image of a pack is the k-th run of image tokens in its ``input_ids``: the order in which
LLaVA and Qwen2-VL put image features into the sequence (``pixel_values`` are given in that order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packtool.arrays import np_view
from packtool.errors import InputError
from packtool.packing.planner import PackingOptions, PackPlan, make_plan
from packtool.vision.samples import VisionSample
from packtool.vision.sequences import VisionSequence, check_plannable, sample_lengths

IGNORE_INDEX = -100


@dataclass
class VisionPack:
    """One pack of N tokens.

    Attributes:
        input_ids, labels: ``(N,)`` int64; the padding is ``pad_id`` / -100.
        position_ids: ``(N,)`` int64, from 0 in every sample and in the padding.
        seq_lens: ``(num_samples,)`` int64, and the padding's length last when there is padding.
        samples: ``(num_samples,)`` int64, the input index of each sample, in pack order.
        image_sample: ``(num_images,)`` int64, the position in ``samples`` of each image's sample.
        image_index: ``(num_images,)`` int64, each image's index within its sample.
        image_offsets, image_lengths: ``(num_images,)`` int64, its run of image tokens in the pack.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    seq_lens: np.ndarray
    samples: np.ndarray
    image_sample: np.ndarray
    image_index: np.ndarray
    image_offsets: np.ndarray
    image_lengths: np.ndarray


def plan_packs(
    sequences: list[VisionSequence],
    packed_sequence_size: int,
    long_samples: str = "error",
    seed: int = 0,
    samples: list[VisionSample] | None = None,
) -> PackPlan:
    """Plan whole samples into packs of ``packed_sequence_size`` tokens (``bfd``, packs in a shuffled order
    from ``seed``).

    A sample longer than N is an ``InputError`` (``long_samples="error"``) or left out (``"drop"``), counted
    in ``plan.stats``. An image whose tokens alone exceed N is an ``InputError`` under either policy: no
    setting of N packs it. With ``samples`` (the ``VisionSample`` of each sequence), errors name the
    sample's file, line or row, and the image.
    """
    check_plannable(False, long_samples)
    n = packed_sequence_size
    for i, seq in enumerate(sequences):
        over = np.flatnonzero(seq.image_lengths > n)
        if len(over):
            k = int(over[0])
            tokens = int(seq.image_lengths[k])
            message = f"image {k} alone takes {tokens} tokens, more than packed_sequence_size {n}"
            if samples is not None:
                raise samples[i].error(f"{message} ({samples[i].images[k].name})", "image")
            raise InputError(f"sample {i}: {message}", field="image")

    def locate(i: int, field: str, message: str) -> InputError:
        return samples[i].error(message, "messages")

    options = PackingOptions(packed_sequence_size=n, long_samples=long_samples, seed=seed)
    return make_plan(sample_lengths(sequences), options, locate if samples is not None else None)


def assemble_pack(columns: pa.RecordBatch, plan: PackPlan, k: int, pad_id: int) -> VisionPack:
    """Pack ``k`` of ``plan`` from ``columns`` (``sequence_columns``: one row per input sample)."""
    n = plan.packed_sequence_size
    pieces = slice(int(plan.pack_offsets[k]), int(plan.pack_offsets[k + 1]))
    samples = plan.sample[pieces]
    lengths = plan.length[pieces]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    used = int(lengths.sum())

    def flat(name: str, fill: int) -> np.ndarray:
        out = np.full(n, fill, dtype=np.int64)
        column = columns.column(name).take(pa.array(samples))
        out[:used] = np_view(column.flatten())
        return out

    positions = np.arange(n, dtype=np.int64) - np.repeat(
        np.append(starts, used), np.append(lengths, n - used)
    )
    image_offsets = columns.column("image_offsets").take(pa.array(samples))
    per_sample = np_view(image_offsets.value_lengths()).astype(np.int64)
    image_sample = np.repeat(np.arange(len(samples), dtype=np.int64), per_sample)
    return VisionPack(
        input_ids=flat("input_ids", pad_id),
        labels=flat("labels", IGNORE_INDEX),
        position_ids=positions,
        seq_lens=np.append(lengths, n - used) if used < n else lengths.copy(),
        samples=samples.copy(),
        image_sample=image_sample,
        image_index=np.arange(len(image_sample), dtype=np.int64)
        - np.repeat(np.cumsum(per_sample) - per_sample, per_sample),
        image_offsets=np_view(image_offsets.flatten()).astype(np.int64) + starts[image_sample],
        image_lengths=np_view(columns.column("image_lengths").take(pa.array(samples)).flatten()).astype(
            np.int64
        ),
    )
