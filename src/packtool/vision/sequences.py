"""A vision-language sample as the model sees it: image tokens expanded, labels, each image's span.

``encode_sample(processor, sample)``:

1. reads each image's size from its header and asks the processor how many tokens it becomes;
2. renders the conversation with the model's chat template (the image parts become the template's
   placeholder: ``<image>`` for LLaVA, ``<|vision_start|><|image_pad|><|vision_end|>`` for Qwen2-VL) and
   finds the trained characters as the ``chat`` encoder does (assistant turns: ``{% generation %}`` spans
   or prefix renders; ``packtool.encoders.chat``);
3. tokenizes the text (``encode_samples``: the texts of ``CHUNK_SIZE`` samples in one call; the image
   token is a special token, so one image is one token id here), and
   repeats the k-th image token id ``image_tokens(k)`` times, in NumPy: the same ids the processor writes
   when it replaces each placeholder by that many image tokens before tokenizing. The vision start/end
   tokens the template writes stay around each run; image tokens are never trained.

``VisionSequence.image_offsets`` / ``image_lengths`` give each image's run of image tokens (the positions the
vision tower's features replace). ``sequence_columns`` turns sequences into the columns the text path uses
(``input_ids``, ``labels``, ``loss_mask`` under a labels convention) plus the image columns;
``sample_lengths`` is what ``packtool.packing.planner.make_plan`` plans from. ``check_plannable`` refuses
the options that would cut a sample, and so possibly an image, between packs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packtool.arrays import large_lists, token_lists
from packtool.encoders.masking import loss_columns
from packtool.errors import ConfigError, ErrorSink, InputError
from packtool.vision.processor import VisionProcessor
from packtool.vision.samples import VisionSample, report

CHUNK_SIZE = 256  # samples whose rendered texts are tokenized in one call


@dataclass
class VisionSequence:
    """One sample's tokens.

    Attributes:
        input_ids: ``(L,)`` int32, image tokens expanded.
        trained: ``(L,)`` bool, the tokens the loss is on (never an image token).
        image_offsets: ``(k,)`` int64, where image ``i``'s run of image tokens starts.
        image_lengths: ``(k,)`` int64, its length (the processor's count for the image's size).
        image_sizes: ``(k, 2)`` int64, ``(height, width)`` from each image's header.
    """

    input_ids: np.ndarray
    trained: np.ndarray
    image_offsets: np.ndarray
    image_lengths: np.ndarray
    image_sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.input_ids)

    def image_token_mask(self) -> np.ndarray:
        """``(L,)`` bool, True on image tokens (Qwen2-VL's ``mm_token_type_ids == 1``)."""
        mask = np.zeros(len(self.input_ids), dtype=bool)
        for a, n in zip(self.image_offsets.tolist(), self.image_lengths.tolist(), strict=True):
            mask[a : a + n] = True
        return mask


@dataclass
class _Rendered:
    """A sample rendered, before tokenizing: its text, trained character spans and images."""

    sample: VisionSample
    text: str
    spans: list[tuple[int, int]]
    counts: np.ndarray  # (k,) int64 image tokens per image
    sizes: np.ndarray  # (k, 2) int64 (height, width)


def _render(processor: VisionProcessor, sample: VisionSample) -> _Rendered:
    sizes = sample.image_sizes()
    counts = np.zeros(len(sizes), dtype=np.int64)
    for k, size in enumerate(sizes):
        try:
            counts[k] = processor.image_tokens(size.height, size.width)
        except ValueError as e:  # the processor refuses the size (Qwen: an aspect ratio over 200)
            raise sample.error(f"image {k} ({sample.images[k].name}): {e}", "image", "bad_image") from None
    try:
        text, spans = processor.chat.trained_spans(sample.messages)
    except ValueError as e:
        raise sample.error(str(e), "messages") from None
    except Exception as e:  # the template raised (raise_exception, an undefined variable, ...)
        reason = str(e).splitlines()[0] if str(e) else ""
        raise sample.error(f"chat template failed: {type(e).__name__}: {reason}", "messages") from None
    shape = np.array([(s.height, s.width) for s in sizes], dtype=np.int64).reshape(-1, 2)
    return _Rendered(sample, text, spans, counts, shape)


def _expand(processor: VisionProcessor, r: _Rendered, ids: list[int], starts: np.ndarray) -> VisionSequence:
    """The tokenized text with the k-th image token repeated ``r.counts[k]`` times."""
    ids = np.asarray(ids, dtype=np.int32)
    trained = np.zeros(len(ids), dtype=bool)
    for a, b in r.spans:  # tokens whose first character lies in [a, b)
        trained[np.searchsorted(starts, a, side="left") : np.searchsorted(starts, b, side="left")] = True
    where = np.flatnonzero(ids == processor.image_token_id)
    if len(where) != len(r.counts):
        raise r.sample.error(
            f"the rendered text has {len(where)} image token(s) {processor.image_token!r} for "
            f"{len(r.counts)} image(s) (is an image token written in the text?)",
            "messages",
            "image_count",
        )
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[where] = r.counts
    ends = np.cumsum(repeats)
    expanded = np.repeat(ids, repeats)
    return VisionSequence(
        input_ids=expanded,
        trained=np.repeat(trained, repeats) & (expanded != processor.image_token_id),
        image_offsets=(ends[where] - r.counts).astype(np.int64),
        image_lengths=r.counts,
        image_sizes=r.sizes,
    )


def encode_sample(processor: VisionProcessor, sample: VisionSample) -> VisionSequence:
    """The tokens of ``sample`` as the model sees them (see the module docstring).

    Raises ``InputError`` naming the sample's file, row and image: a bad image, a template that fails, or a
    rendered text whose image tokens are not one per image (an image token typed in the text).
    """
    return encode_samples(processor, [sample])[1][0]


def encode_samples(
    processor: VisionProcessor,
    samples: Iterable[VisionSample],
    sink: ErrorSink | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[list[VisionSample], list[VisionSequence]]:
    """``encode_sample`` over ``samples``, tokenizing ``chunk_size`` rendered texts in one call; the samples
    kept and their sequences, in input order. A sample whose encoding fails (a bad image, a template
    error, ...) goes to ``sink`` (``--on-error skip`` counts it and leaves it out; ``fail`` raises); without
    a sink the error raises."""
    kept: list[VisionSample] = []
    sequences: list[VisionSequence] = []
    rendered: list[_Rendered] = []

    def flush() -> None:
        ids, starts = processor.tokenizer.encode_batch_offsets([r.text for r in rendered])
        for r, sample_ids, sample_starts in zip(rendered, ids, starts, strict=True):
            try:
                sequences.append(_expand(processor, r, sample_ids, sample_starts))
            except InputError as e:
                report(sink, e)
                continue
            kept.append(r.sample)
        rendered.clear()

    for sample in samples:
        try:
            rendered.append(_render(processor, sample))
        except InputError as e:
            report(sink, e)
        if len(rendered) >= chunk_size:
            flush()
    if rendered:
        flush()
    return kept, sequences


def sample_lengths(sequences: list[VisionSequence]) -> np.ndarray:
    """``(num_samples,)`` int64 token counts, for ``packtool.packing.planner.make_plan``."""
    return np.array([len(s) for s in sequences], dtype=np.int64)


def sequence_columns(sequences: list[VisionSequence], labels: str = "shifted") -> pa.RecordBatch:
    """The sequences as one record batch: ``input_ids`` (``large_list<int32>``), ``labels`` and
    ``loss_mask`` under the ``labels`` convention (``packtool.encoders.masking``), and per sample
    ``image_offsets``, ``image_lengths`` (``large_list<int64>``) and ``image_sizes`` (``large_list<int64>``,
    height and width interleaved).

    >>> seq = VisionSequence(np.array([5, 9, 9, 6, 7], np.int32), np.array([0, 0, 0, 1, 1], bool),
    ...                      np.array([1]), np.array([2]), np.array([[30, 40]]))
    >>> rb = sequence_columns([seq])
    >>> rb.column("labels").to_pylist(), rb.column("image_offsets").to_pylist()
    ([[-100, -100, 6, 7, -100]], [[1]])
    """
    ids = token_lists([s.input_ids for s in sequences])
    trained = np.concatenate([s.trained for s in sequences]) if sequences else np.zeros(0, dtype=bool)
    label_column, mask_column = loss_columns(ids, trained, labels)

    def ragged(arrays: list[np.ndarray]) -> pa.LargeListArray:
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return large_lists(offsets, flat.astype(np.int64), pa.int64())

    return pa.RecordBatch.from_pydict(
        {
            "input_ids": ids,
            "labels": label_column,
            "loss_mask": mask_column,
            "image_offsets": ragged([s.image_offsets for s in sequences]),
            "image_lengths": ragged([s.image_lengths for s in sequences]),
            "image_sizes": ragged([s.image_sizes.reshape(-1) for s in sequences]),
        }
    )


def check_plannable(split_across_pack: bool, long_samples: str) -> None:
    """An image is never split across packs and never truncated through: a vision sample is packed whole
    or, when longer than the pack, refused (``long_samples=error``) or dropped (``drop``)."""
    if split_across_pack:
        raise ConfigError("split_across_pack would cut images between packs: not available with images")
    if long_samples not in ("error", "drop"):
        raise ConfigError(f"long_samples {long_samples} would cut through images: use error or drop")
