"""``vision`` and ``interleaved`` encoders: vision-language records -> tokens, labels and each image's span
and bytes' reference.

A record of any input kind (LLaVA ``conversations`` + ``image``, chat ``messages`` with image parts, a
WebDataset captioning sample: ``packtool.vision.samples``) becomes the tokens the model's own processor
writes for it (``packtool.vision.sequences.encode_samples``), with the labels and ``loss_mask`` of its
trained turns (``--loss-on``, ``--chat-template``, ``--empty-loss`` as for ``chat``). An interleaved
document (``texts`` and ``images``: ``--sample-format interleaved``) becomes the processor's tokens for its
texts joined with the processor's placeholder at each image, with the BOS and EOS of ``--add-bos`` /
``--add-eos`` (``DocumentTokens``), trained on its texts. Each image is read once, here
(``ImageRef.load``): its bytes' XXH3-128 digest, its size from its header.

Besides ``input_ids``, ``labels`` and ``loss_mask``, the output has ``images``
(``encoders.base.IMAGE_STRUCT``), a list per sample, one entry per image in order: where its span of
tokens starts in the sample and how long it is, its height and width, its digest and name, where its
bytes are: ``path`` and ``stamp`` fields for a file (read again when its pack is written, and checked
against the digest), or ``data`` for bytes the record held, and its block (``block_start``, ``block_end``:
the tokens of all the processor wrote for it, where a long document is never cut). An image that alone
takes more than ``packed_sequence_size`` tokens makes its record a bad one (``image_too_large``): no
long-sample policy packs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

# imported at the top, not when the first processor loads: a local run's forkserver imports this module
# (engines.worker_preload), so transformers' processor classes (seconds) are imported once, and every
# worker forked from it has them
from transformers import AutoImageProcessor, AutoProcessor  # noqa: F401

from packtool.arrays import array_lists, arrow_array, bytes_array, concat_ragged, int_array, np_view
from packtool.encoders.base import IMAGE_STRUCT
from packtool.encoders.masking import apply_empty_loss, loss_columns
from packtool.encoders.text import special_text, token_of
from packtool.readers.base import SourceBatch
from packtool.schema import IMAGES
from packtool.tokenizing.tokenizer import HFTokenizer
from packtool.vision.processor import VisionProcessor, load_processor
from packtool.vision.samples import VisionSample, batch_samples
from packtool.vision.sequences import Documents, VisionSequence, encode_samples


@dataclass(frozen=True)
class DocumentTokens:
    """What an interleaved document's text gets besides its texts: the BOS and EOS of ``--add-bos`` /
    ``--add-eos`` (the token named by ``--bos-token`` / ``--bos-token-id``, else the processor's
    tokenizer's own), and ``loss_on`` (``all``: every token but the images' spans; else its texts)."""

    add_bos: bool = False
    add_eos: bool = False
    bos_token: str | None = None
    eos_token: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    loss_on: str = "assistant"

    @classmethod
    def of(cls, tokens: Any, loss_on: str) -> DocumentTokens:
        """From the encoding stage's ``SpecialTokenOptions`` and ``--loss-on``."""
        names = ("add_bos", "add_eos", "bos_token", "eos_token", "bos_token_id", "eos_token_id")
        return cls(**{name: getattr(tokens, name) for name in names}, loss_on=loss_on)

    def documents(self, tokenizer: HFTokenizer) -> Documents:
        """``Documents`` with the tokens' texts in ``tokenizer``; ``ConfigError`` for one it lacks."""
        ends = {}
        for kind in ("bos", "eos"):
            if getattr(self, f"add_{kind}"):
                named = token_of(
                    tokenizer, kind, getattr(self, f"{kind}_token"), getattr(self, f"{kind}_token_id")
                )
                ends[kind] = special_text(tokenizer, kind, named)
        return Documents(ends.get("bos"), ends.get("eos"), "all" if self.loss_on == "all" else "texts")


class VisionEncoder:
    """Encodes vision-language records with a model's processor (module docstring).

    Args:
        processor: the model's processor directory (``--processor``), loaded once per process.
        packed_sequence_size: N, the most tokens one image may take.
        chat_template: a Jinja file rendering the conversations instead of the directory's own.
        loss_on: ``assistant``, ``last`` or ``all`` (``packtool.tokenizing.chat_template``).
        labels: the labels convention (``shifted`` or ``unshifted``).
        empty_loss: samples with nothing to learn: ``drop``, ``keep`` or ``error``.
        fields: the record fields it reads (``encoders.registry.VISION_FIELDS``).
        proven: the run driver's ``state()`` of the same encoder: its processor's probes, not run again.
        documents: for interleaved documents, what their text gets besides their texts (``None``: the
            records are conversations).
    """

    def __init__(
        self,
        processor: str,
        packed_sequence_size: int,
        chat_template: str | None = None,
        loss_on: str = "assistant",
        labels: str = "shifted",
        empty_loss: str = "drop",
        fields: frozenset[str] = frozenset(),
        proven: dict[str, Any] | None = None,
        documents: DocumentTokens | None = None,
    ) -> None:
        self.fields = fields
        self.processor: VisionProcessor = load_processor(
            processor, chat_template=chat_template, loss_on=loss_on, proven=proven,
            conversations=documents is None,
        )  # fmt: skip
        self.n, self.labels, self.empty_loss = packed_sequence_size, labels, empty_loss
        self.documents = None if documents is None else documents.documents(self.processor.tokenizer)

    def __call__(self, batch: SourceBatch) -> pa.RecordBatch:
        samples = batch_samples(batch, self.fields, interleaved=self.documents is not None)
        # raises on the first bad record
        _, sequences = encode_samples(self.processor, samples, documents=self.documents)
        for sample, seq in zip(samples, sequences, strict=True):
            over = np.flatnonzero(seq.image_lengths > self.n)
            if len(over):
                k = int(over[0])
                raise sample.error(
                    f"image {k} ({sample.images[k].name}) alone takes {int(seq.image_lengths[k])} tokens, "
                    f"more than packed_sequence_size {self.n}",
                    "image" if self.documents is None else "images",
                    "image_too_large",
                )
            blocks = np.diff(seq.blocks(), axis=1).reshape(-1)
            if self.documents is not None and (blocks > self.n).any():  # no piece of it could hold one
                k = int(np.flatnonzero(blocks > self.n)[0])
                raise sample.error(
                    f"image {k} ({sample.images[k].name}) takes {int(blocks[k])} tokens with what goes with "
                    "it (what the processor writes around it, or all the images of a processor that writes "
                    f"one by the others), more than packed_sequence_size {self.n}",
                    "images",
                    "image_too_large",
                )
        ids = array_lists([s.input_ids for s in sequences])
        trained = np.concatenate([s.trained for s in sequences]) if sequences else np.zeros(0, bool)
        labels, loss_mask = loss_columns(ids, trained, self.labels)
        field = "conversations" if "conversations" in batch.schema.names else "messages"
        fields = ["texts" if self.documents is not None else field] * len(samples)
        rb = apply_empty_loss(batch, ids, labels, loss_mask, self.empty_loss, fields)
        # a sample dropped for having nothing to learn leaves with its images
        kept = np.diff(np_view(rb.column("input_ids").offsets)) > 0
        images = image_column(samples, sequences, kept)
        return rb.append_column(pa.field(IMAGES, images.type), images)

    def state(self) -> dict[str, Any]:
        """What a worker building the same encoder may take from this one (``proven``): the processor's
        probe results."""
        return self.processor.proofs()

    def identity(self) -> dict[str, Any]:
        """The tokenizer's identity, named by the processor directory, with the processor's and the chat
        template's, or an interleaved document's tokens and loss rule (the run's identity and the
        manifest's ``tokenizer``)."""
        chat, tokenizer = self.processor.chat, self.processor.tokenizer
        own = {"name": self.processor.path, "processor": self.processor.identity()}
        if chat is not None:
            own.update(chat_template=chat.template_source,
                       chat_template_sha256=chat.identity()["chat_template_sha256"])  # fmt: skip
            return {**tokenizer.identity(), **own}
        own["documents"] = {"loss_on": self.documents.loss_on}
        for kind in ("bos", "eos"):  # (named as the text encoder's: the summary line says them)
            if (token := getattr(self.documents, kind)) is not None:
                own.update({f"{kind}_token": token, f"{kind}_token_id": tokenizer.token_to_id(token)})
        return {**tokenizer.identity(), **own}


def image_column(
    samples: list[VisionSample], sequences: list[VisionSequence], kept: np.ndarray
) -> pa.LargeListArray:
    """``large_list<IMAGE_STRUCT>``: each kept sample's images (an empty list for the others), built column
    by column (``pa.array`` over dicts would import pandas in every worker: half a second each)."""
    images, offsets, lengths = [], [], []
    for sample, seq, keep in zip(samples, sequences, kept.tolist(), strict=True):
        loaded = sample.load_images() if keep else []
        images += loaded
        offsets.append(seq.image_offsets[: len(loaded)])
        lengths.append(seq.image_lengths[: len(loaded)])
    image_offsets, list_offsets = concat_ragged(offsets, np.int64)  # list_offsets: each sample's images
    image_lengths, _ = concat_ragged(lengths, np.int64)
    stamps = [image.stamp for image in images]
    digests = b"".join(image.digest for image in images)
    if len(digests) != 16 * len(images):
        raise ValueError("an image digest is not the 16 bytes of XXH3-128")
    columns = [
        arrow_array(image_offsets, pa.int64()),
        arrow_array(image_lengths, pa.int64()),
        int_array([image.size.height for image in images], pa.int32()),
        int_array([image.size.width for image in images], pa.int32()),
        pa.Array.from_buffers(pa.binary(16), len(images), [None, pa.py_buffer(digests)]),
        bytes_array([image.name for image in images], pa.string()),
        bytes_array([image.path for image in images], pa.string()),
        bytes_array([image.data if image.path is None else None for image in images], pa.large_binary()),
    ]
    for name in ("size", "mtime_ns", "ctime_ns", "inode"):  # the file's stamp (null for bytes)
        columns.append(int_array([None if st is None else getattr(st, name) for st in stamps], pa.int64()))
    kept_blocks = [seq.blocks()[: len(o)] for seq, o in zip(sequences, offsets, strict=True)]
    blocks = np.concatenate(kept_blocks).reshape(-1, 2) if kept_blocks else np.zeros((0, 2), np.int64)
    columns += [arrow_array(blocks[:, 0], pa.int64()), arrow_array(blocks[:, 1], pa.int64())]
    struct = pa.StructArray.from_arrays(columns, fields=list(IMAGE_STRUCT))
    return pa.LargeListArray.from_arrays(arrow_array(list_offsets, pa.int64()), struct)
