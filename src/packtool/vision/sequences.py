"""A vision-language sample as the model sees it: the processor's tokens for it, labels, each image's span.

``encode_samples(processor, samples)`` gives, for each sample, exactly the ids of
``processor.apply_chat_template(messages, tokenize=True)`` with the sample's images (the processor's
``__call__`` on the rendered conversation), without running the image processor on the sample's pixels.
An interleaved document (``VisionSample.document``) has no conversation: its text is its texts joined with
the processor's own placeholder at each image (``VisionProcessor.image_placeholder``), after the BOS and
before the EOS that ``Documents`` names (``--add-bos`` / ``--add-eos``), and its ids are exactly those of
``processor(text=text, images=images)`` (without the tokenizer's special tokens where the text starts with
its BOS, the rule below); its texts' tokens are trained (``Documents.loss_on``: ``all`` trains every
token but the images' spans, as ``--loss-on all`` does a conversation's). Then:

1. each image's size is read from its header (``sample.image_sizes()``) and the processor's expansion for
   that size taken (``VisionProcessor.expansion``: the processor's own text for such an image, run once
   per distinct size; ``packtool.vision.expansion``);
2. the conversation is rendered with the chat template (a document joined, above) and the trained
   characters found as the ``chat`` encoder finds them (assistant turns: ``{% generation %}`` spans or
   prefix renders; ``packtool.tokenizing.chat_template``); the text is laid out by the processor's
   ``prepare_inputs_layout`` (characters it inserts are not trained);
3. each image placeholder is replaced by the processor's text for its image, with every run of one image
   token written once; the texts of ``CHUNK_SIZE`` samples are tokenized in one call by the processor's
   tokenizer (with its special tokens unless the text starts with its BOS, as ``apply_chat_template``
   does), and each run's token id is repeated, in NumPy.

``VisionSequence.image_offsets`` / ``image_lengths`` give each image's span: the tokens from the first to
the last of the processor's image tokens written for it (``packtool.vision.expansion``: for LLaVA and
Qwen2-VL the run of ``<image>`` / ``<|image_pad|>``; for Idefics3 from the first tile's first ``<image>``
to the global image's last, tile tags between; Gemma 3's ``<start_of_image>`` and ``<end_of_image>`` are
outside). Each span is checked against the processor's ids for that size; no token of a span is trained.
``VisionSequence.image_blocks`` give each image's block: every token of the text the processor wrote for
it, its span and what is around it (Gemma 3's ``<start_of_image>``, Qwen2-VL's ``<|vision_start|>``;
images that share a token share a block; for a processor whose text for an image depends on the sample's
images, LLaVA-OneVision's, the tokens from the first image's to the last's); blocks are disjoint or
equal, and a long document is cut only outside its images' blocks
(``--long-samples split``), so that each piece is what the processor writes for it alone.
The vision encoder (``packtool.encoders.vision``) turns sequences into the columns the text path uses
(``input_ids``, ``labels``, ``loss_mask`` under a labels convention) plus the image columns;
``sample_lengths`` is what ``packtool.packing.planner.make_plan`` plans from. ``check_plannable`` refuses
the options that would cut a sample, and so possibly an image, between packs.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from packtool.errors import ConfigError, ErrorSink, InputError
from packtool.vision.expansion import Expansion
from packtool.vision.images import ImageSize
from packtool.vision.processor import VisionProcessor
from packtool.vision.samples import VisionSample, report

CHUNK_SIZE = 256  # samples whose rendered texts are tokenized in one call


@dataclass
class VisionSequence:
    """One sample's tokens.

    Attributes:
        input_ids: ``(L,)`` int32, the processor's ids for the sample.
        trained: ``(L,)`` bool, the tokens the loss is on (never a token of an image's span).
        image_offsets: ``(k,)`` int64, where image ``i``'s span starts (module docstring).
        image_lengths: ``(k,)`` int64, its length in tokens.
        image_sizes: ``(k, 2)`` int64, ``(height, width)`` from each image's header.
        image_blocks: ``(k, 2)`` int64, ``[start, end)`` of image ``i``'s block: the tokens of the text the
            processor wrote for it, its span inside (module docstring); ``None``: its span's.
    """

    input_ids: np.ndarray
    trained: np.ndarray
    image_offsets: np.ndarray
    image_lengths: np.ndarray
    image_sizes: np.ndarray
    image_blocks: np.ndarray | None = None

    def blocks(self) -> np.ndarray:
        """``(k, 2)`` int64: ``image_blocks``, or each span's ``[start, end)`` where they are not known."""
        if self.image_blocks is not None:
            return self.image_blocks
        return np.stack([self.image_offsets, self.image_offsets + self.image_lengths], axis=1).reshape(-1, 2)

    def __len__(self) -> int:
        return len(self.input_ids)

    def image_token_mask(self) -> np.ndarray:
        """``(L,)`` bool, True on the tokens of the images' spans."""
        mask = np.zeros(len(self.input_ids), dtype=bool)
        for a, n in zip(self.image_offsets.tolist(), self.image_lengths.tolist(), strict=True):
            mask[a : a + n] = True
        return mask


@dataclass
class _Rendered:
    """A sample rendered, before tokenizing: the text to tokenize, its trained character spans, and for
    each image its expansion and where its replacement starts in the text."""

    sample: VisionSample
    text: str
    spans: list[tuple[int, int]]
    expansions: list[Expansion]
    starts: list[int]
    sizes: np.ndarray  # (k, 2) int64 (height, width)
    special: bool  # the tokenizer adds its special tokens


@dataclass(frozen=True)
class Documents:
    """How an interleaved document becomes text (module docstring): ``bos`` before it and ``eos`` after it
    (a token's text, or ``None``: ``--add-bos`` / ``--add-eos``); ``loss_on``: ``all`` trains every token
    but the images' spans, any other value the texts' tokens (and the EOS) only.

    >>> Documents(eos="</s>").text(["A cat:", None, "!"], "<image>")
    ('A cat:<image>!</s>', [(0, 6), (13, 14), (14, 18)])
    """

    bos: str | None = None
    eos: str | None = None
    loss_on: str = "texts"

    def text(self, document: list[str | None], placeholder: str) -> tuple[str, list[tuple[int, int]]]:
        """The document's text, and the character spans trained: its texts' (and the EOS), or all."""
        texts = ((placeholder, False) if t is None else (t, True) for t in document)
        parts = [(self.bos or "", False), *texts, (self.eos or "", True)]
        spans, at = [], 0
        for piece, trained in parts:
            if trained and piece:
                spans.append((at, at + len(piece)))
            at += len(piece)
        text = "".join(piece for piece, _ in parts)
        return text, ([(0, len(text))] if self.loss_on == "all" else spans)


def _field(sample: VisionSample) -> str:
    """The record field an error about the sample's text names."""
    return "messages" if sample.document is None else "texts"


def _render(processor: VisionProcessor, sample: VisionSample, documents: Documents | None) -> _Rendered:
    sizes = sample.image_sizes()
    if sample.document is not None:
        placeholder = processor.image_placeholder
        held = next((j for j, t in enumerate(sample.document) if t is not None and placeholder in t), None)
        if held is not None:  # the processor would take it for an image
            message = f"position {held}: the text holds the processor's image placeholder {placeholder!r}"
            raise sample.error(message, "texts", "image_count")
        text, spans = (documents or Documents()).text(sample.document, placeholder)
    else:
        try:
            text, spans = processor.chat.trained_spans(sample.messages)
        except ValueError as e:  # (a template over its budget: its own reason, template_budget)
            raise sample.error(str(e), "messages", getattr(e, "skip_reason", "invalid")) from None
        except Exception as e:  # the template raised (raise_exception, an undefined variable, ...)
            reason = str(e).splitlines()[0] if str(e) else ""
            raise sample.error(f"chat template failed: {type(e).__name__}: {reason}", "messages") from None
    found = len(processor.expander.pattern.findall(text))
    if found != len(sizes):
        raise sample.error(
            f"the rendered text has {found} image token(s) {processor.image_token!r} for {len(sizes)} "
            "image(s) (is an image token written in the text?)",
            _field(sample),
            "image_count",
        )
    expansions = []
    for k, size in enumerate(sizes):
        try:
            expansions.append(processor.expansion(size.height, size.width, len(sizes), size.mode))
        except ValueError as e:  # the processor refuses the image (Qwen: an aspect ratio over 200)
            message = f"image {k} ({sample.images[k].name}): {size.height}x{size.width} image: {e}"
            raise sample.error(message, "image", "bad_image") from None
    special = processor.adds_special_tokens(text)
    laid = processor.layout(text, len(sizes))
    written = processor.expander.written
    if laid.count(written) != found:  # the processor refuses a placeholder without its wrapping
        raise sample.error(
            f"an image is written {processor.image_token!r} where the processor takes only {written!r} "
            "(is the chat template the model's?)",
            "messages",
        )
    if laid != text:
        try:
            spans = _follow(text, laid, spans)
        except ValueError as e:
            raise sample.error(str(e), _field(sample)) from None
    pieces, starts, shifts, at, last = [], [], [], 0, 0
    for m, expansion in zip(processor.expander.pattern.finditer(laid), expansions, strict=True):
        pieces.append(laid[last : m.start()])
        at += m.start() - last
        starts.append(at)
        shifts.append((m.end(), len(expansion.text) - (m.end() - m.start())))
        pieces.append(expansion.text)
        at += len(expansion.text)
        last = m.end()
    pieces.append(laid[last:])
    shape = np.array([(s.height, s.width) for s in sizes], dtype=np.int64).reshape(-1, 2)
    moved = [(_shifted(a, shifts), _shifted(b, shifts)) for a, b in spans]
    return _Rendered(sample, "".join(pieces), moved, expansions, starts, shape, special)


def _shifted(position: int, shifts: list[tuple[int, int]]) -> int:
    """A character position of the laid-out text in the text with its placeholders replaced."""
    return position + sum(delta for end, delta in shifts if end <= position)


def _follow(old: str, new: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` of ``old`` in ``new``, a copy of it with characters inserted (a layout that deletes or
    changes characters is refused): inserted characters are outside every span."""
    where = np.full(len(old) + 1, -1, dtype=np.int64)
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for op, a0, a1, b0, _ in matcher.get_opcodes():
        if op not in ("equal", "insert"):
            raise ValueError(
                "the processor's layout of the text changes it (packtool follows insertions only)"
            )
        if op == "equal":
            where[a0:a1] = np.arange(b0, b0 + a1 - a0)
    where[len(old)] = len(new)
    return [
        (int(where[a]), int(where[b - 1]) + 1) if b > a else (int(where[a]), int(where[a])) for a, b in spans
    ]


def _expand(
    r: _Rendered, ids: list[int], offsets: list[tuple[int, int]], in_text: np.ndarray, per_sample: bool
) -> VisionSequence:
    """The tokenized text with each image's runs repeated, its images' spans found and checked, and their
    blocks: the tokens whose characters meet the text written for the image (images that share a token
    share one block; every image's for all, ``per_sample``, where what the processor writes for an image
    depends on the sample's images: LLaVA-OneVision's)."""
    ids = np.asarray(ids, dtype=np.int64)
    starts, char_ends = np.asarray(offsets, dtype=np.int64).reshape(-1, 2).T
    text_tokens = np.flatnonzero(in_text)
    text_starts, text_ends = starts[text_tokens], char_ends[text_tokens]

    def token_at(char: int) -> int:
        i = int(np.searchsorted(text_starts, char, side="left"))
        return int(text_tokens[i]) if i < len(text_tokens) and text_starts[i] == char else -1

    repeats = np.ones(len(ids), dtype=np.int64)
    first, block = [], []
    for k, (expansion, start) in enumerate(zip(r.expansions, r.starts, strict=True)):
        end = start + len(expansion.text)  # the first and the last token meeting [start, end)
        block.append((text_tokens[np.searchsorted(text_ends, start, side="right")],
                      text_tokens[np.searchsorted(text_starts, end, side="left") - 1]))  # fmt: skip
        for at, token, count in expansion.runs:
            i = token_at(start + at)
            if i < 0 or ids[i] != token:
                raise _not_as_written(r, k)
            repeats[i] = count
        i = token_at(start + expansion.span_start)
        m = len(expansion.span_ids)
        if i < 0 or not (
            np.array_equal(ids[i : i + m], expansion.span_ids)
            and np.array_equal(repeats[i : i + m], expansion.span_counts)
        ):
            raise _not_as_written(r, k)
        first.append(i)
    ends = np.cumsum(repeats)
    offsets_k = (ends[first] - repeats[first]).astype(np.int64) if first else np.zeros(0, dtype=np.int64)
    lengths = np.array([e.span_length for e in r.expansions], dtype=np.int64)
    block_of = np.array(block, dtype=np.int64).reshape(-1, 2)
    blocks = np.stack([ends[block_of[:, 0]] - repeats[block_of[:, 0]], ends[block_of[:, 1]]], axis=1)
    if per_sample and len(blocks):  # what it writes for an image depends on the others: one block for all
        blocks[:] = (blocks[:, 0].min(), blocks[:, 1].max())
    for k in range(1, len(blocks)):  # images that share a token (a merged line break): one block
        if blocks[k, 0] < blocks[k - 1, 1]:
            first = int(np.flatnonzero(blocks[:, 0] == blocks[k - 1, 0])[0])
            blocks[first : k + 1] = (blocks[first, 0], max(blocks[k, 1], blocks[k - 1, 1]))
    trained = np.zeros(len(ids), dtype=bool)
    for a, b in r.spans:  # tokens whose first character lies in [a, b)
        trained |= (starts >= a) & (starts < b)
    trained = np.repeat(trained & in_text, repeats)
    for a, n in zip(offsets_k.tolist(), lengths.tolist(), strict=True):
        trained[a : a + n] = False
    return VisionSequence(
        np.repeat(ids, repeats).astype(np.int32), trained, offsets_k, lengths, r.sizes, blocks.reshape(-1, 2)
    )


def _not_as_written(r: _Rendered, k: int) -> InputError:
    """An image whose tokens in its sample are not the processor's for its size (text around it merged
    with them): refused rather than packed different from the processor."""
    return r.sample.error(
        f"image {k} ({r.sample.images[k].name}): its tokens in the sample are not the processor's for its "
        "size (the text around it merges with them)",
        _field(r.sample),
    )


def encode_sample(
    processor: VisionProcessor, sample: VisionSample, documents: Documents | None = None
) -> VisionSequence:
    """The tokens of ``sample`` as the model sees them (see the module docstring; ``documents``: how an
    interleaved document becomes text, ``Documents()`` if not given).

    Raises ``InputError`` naming the sample's file, row and image: a bad image, a template that fails, or a
    rendered text whose image tokens are not one per image (an image token typed in the text).
    """
    return encode_samples(processor, [sample], documents=documents)[1][0]


def encode_samples(
    processor: VisionProcessor,
    samples: Iterable[VisionSample],
    sink: ErrorSink | None = None,
    chunk_size: int = CHUNK_SIZE,
    documents: Documents | None = None,
) -> tuple[list[VisionSample], list[VisionSequence]]:
    """``encode_sample`` over ``samples``, tokenizing ``chunk_size`` rendered texts in one call; the samples
    kept and their sequences, in input order. A sample whose encoding fails (a bad image, a template
    error, ...) goes to ``sink`` (``--on-error skip`` counts it and leaves it out; ``fail`` raises); without
    a sink the error raises."""
    kept: list[VisionSample] = []
    sequences: list[VisionSequence] = []
    rendered: list[_Rendered] = []

    def flush() -> None:
        encoded = processor.encode_rendered([r.text for r in rendered], [r.special for r in rendered])
        for r, (ids, offsets, in_text) in zip(rendered, encoded, strict=True):
            try:
                sequences.append(_expand(r, ids, offsets, in_text, processor.expander.per_image_count))
            except InputError as e:
                report(sink, e)
                continue
            kept.append(r.sample)
        rendered.clear()

    for part in _batched(samples, chunk_size):
        processor.prefetch([(s.height, s.width) for s in _sizes(part)])  # the counts in one call
        for sample in part:
            try:
                rendered.append(_render(processor, sample, documents))
            except InputError as e:
                report(sink, e)
        if rendered:
            flush()
    return kept, sequences


def _batched(samples: Iterable[VisionSample], n: int) -> Iterator[list[VisionSample]]:
    it = iter(samples)
    while part := list(itertools.islice(it, n)):
        yield part


def _sizes(samples: list[VisionSample]) -> list[ImageSize]:
    """The sizes of the images of ``samples`` that can be read (a bad image is named by ``_render``)."""
    out = []
    for sample in samples:
        try:
            out += sample.image_sizes()
        except InputError:
            continue
    return out


def sample_lengths(sequences: list[VisionSequence]) -> np.ndarray:
    """``(num_samples,)`` int64 token counts, for ``packtool.packing.planner.make_plan``."""
    return np.array([len(s) for s in sequences], dtype=np.int64)


def check_plannable(split_across_pack: bool, long_samples: str) -> None:
    """An image is never split across packs and never truncated through: a vision sample is packed whole
    or, when longer than the pack, refused (``long_samples=error``) or dropped (``drop``)."""
    if split_across_pack:
        raise ConfigError("split_across_pack would cut images between packs: not available with images")
    if long_samples not in ("error", "drop"):
        raise ConfigError(f"long_samples {long_samples} would cut through images: use error or drop")
