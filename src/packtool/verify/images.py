"""``verify``'s checks of a vision-language output's images (``packtool.verify`` runs them when the
manifest lists ``image_columns``).

``ImageCheck`` looks at every batch of packs as readers give them: each pack holds one image per
``image_*`` value; each image's span (``packtool.vision.sequences``: from the first to the last image
token written for it) lies inside its sample and no label is trained on its tokens; each image's bytes are
there and their header, read again under Pillow's decompression-bomb limit (``images.image_size``: the
bytes of an output are untrusted), gives the stored height and width; and with the model's processor
(``verify --processor DIR``, loaded with the run's chat template and loss rule; ``--source`` takes the
run's recorded one) the span's tokens are the processor's for that size (``VisionProcessor.expansion``).
Without a processor only the spans' first tokens are compared (one image token for all), and a note says
so. ``finish`` compares the images read with the manifest's ``vision.packed_images``.

``VisionSourceCheck`` is ``verify --source`` for such outputs: the inputs read and encoded again with the
run's processor and options (the pipeline's readers, vision encoder and bad-record rules), every piece
compared token by token (``verify.source.SourceCheck``), and every image of every packed sample found in
its pack with the source's bytes (their digests), every image accounted for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packtool.arrays import ranges
from packtool.errors import InputError
from packtool.manifest import IGNORE_INDEX, MANIFEST, Manifest
from packtool.packs import PackArrays
from packtool.schema import piece_starts
from packtool.verify.report import VerifyReport
from packtool.verify.source import SourceCheck
from packtool.vision.files import image_digest
from packtool.vision.images import image_size
from packtool.vision.processor import VisionProcessor, load_processor


def recorded_processor(manifest: Manifest) -> dict:
    """The manifest's record of the run's processor (``VisionProcessor.identity()``), or ``{}``."""
    vision = manifest.vision if isinstance(manifest.vision, dict) else {}
    processor = vision.get("processor")
    return processor if isinstance(processor, dict) else {}


def open_processor(manifest: Manifest, report: VerifyReport, directory: str | None) -> VisionProcessor | None:
    """The processor of ``directory`` (``None``: no counts checked, a note says so), with the run's chat
    template and loss rule (``--chat-template``, ``--loss-on``: the manifest's record; none for a run of
    interleaved documents), a problem reported when it is not the run's (its config files' or template's
    hash differs from the manifest's)."""
    recorded = recorded_processor(manifest)
    if directory is None:
        report.notes.append(
            "image spans not checked against the processor's tokens: pass --processor DIR (the run's: "
            f"{recorded.get('path', 'not recorded')})"
        )
        return None
    template = recorded.get("chat_template")
    own = (
        isinstance(template, str)
        and Path(template).is_file()
        and Path(directory) not in Path(template).parents
    )
    documents = "chat_template" in recorded and template is None  # interleaved documents: no template
    processor = load_processor(
        directory, chat_template=template if own else None, loss_on=str(recorded.get("loss_on", "assistant")),
        conversations=not documents,
    )  # fmt: skip
    identity = processor.identity()
    for key in ("config_sha256", "chat_template_sha256"):
        if key in recorded and identity[key] != recorded[key]:
            report.add(
                "processor",
                f"processor {directory} is not the run's ({key} {identity[key][:12]}, the manifest's "
                f"{str(recorded.get(key))[:12]})",
                shard=MANIFEST,
                field="vision.processor",
            )
    return processor


@dataclass
class ImageCheck:
    """The image checks of one ``verify`` run (module docstring)."""

    manifest: Manifest
    report: VerifyReport
    processor: VisionProcessor | None = None
    images: int = 0  # images read so far
    token_id: int | None = None  # the image token id: the processor's, else the first span's

    def add(self, packs: PackArrays, first: int, name: str) -> None:
        """Check the images of a batch of packs (``first``: the global index of its first pack)."""
        report = self.report
        if packs.image_sample_offsets is None or packs.images is None:
            report.add(
                "images", "the packs hold no images, or not one per image_* value", shard=name, pack=first
            )
            return
        k, n = packs.input_ids.shape
        offsets = packs.image_sample_offsets
        pack = np.repeat(np.arange(k), np.diff(offsets))
        self.images += len(pack)
        sample = packs.image_sample.astype(np.int64)
        start = packs.image_offset.astype(np.int64)
        length = packs.image_length.astype(np.int64)
        spans = packs.piece_spans()
        piece_offsets = packs.sample_index_offsets
        lo_of_piece = piece_starts(spans, piece_offsets)
        outside = (sample < 0) | (sample >= np.diff(piece_offsets)[pack])
        piece = piece_offsets[pack] + np.where(outside, 0, sample)
        lo, hi = lo_of_piece[piece], lo_of_piece[piece] + spans[piece]
        outside |= (length <= 0) | (start < lo) | (start + length > hi)
        index = np.arange(len(pack)) - offsets[pack]
        problems = (
            (f"image {index[j]}: its tokens [{start[j]}, {start[j] + length[j]}) are not inside its sample "
             f"{sample[j]} of the pack", first + int(pack[j]))
            for j in np.flatnonzero(outside)
        )  # fmt: skip
        report.add_many("image span", int(outside.sum()), problems, shard=name, field="image_offset")
        inside = np.flatnonzero(~outside)
        cells = ranges(pack[inside] * n + start[inside], length[inside])
        of_cell = np.repeat(inside, length[inside])
        firsts = packs.input_ids.reshape(-1)[pack[inside] * n + start[inside]]
        if self.token_id is None and len(firsts):
            self.token_id = int(firsts[0])
        # the labels whose targets are the span's tokens: shifted, each one's the token before it (in its
        # piece); the last span token's label is the token after the span's, which may be trained text
        shift = int(self.manifest.labels == "shifted")
        targets = cells - shift
        kept = targets >= np.repeat(pack[inside] * n + lo[inside], length[inside])
        checks = [("image labels", of_cell[kept][packs.labels.reshape(-1)[targets[kept]] != IGNORE_INDEX],
                   "are trained on (labels not -100)")]  # fmt: skip
        if self.processor is None:  # without it: every span starts with the same token
            what = f"do not start with the image token of the others (id {self.token_id})"
            checks.append(("image tokens", inside[firsts != self.token_id], what))
        for kind, wrong, what in checks:
            bad = np.unique(wrong)
            problems = ((f"image {index[j]}: its tokens {what}", first + int(pack[j])) for j in bad)
            report.add_many(kind, len(bad), problems, shard=name, field="input_ids")
        per_sample = np.unique(pack * (k + 1) + sample, return_inverse=True, return_counts=True)
        in_sample = per_sample[2][per_sample[1]]  # images of each image's sample
        self._headers(packs, pack, index, start, length, in_sample, ~outside, first, name)

    def _headers(self, packs, pack, index, start, length, in_sample, inside, first: int, name: str) -> None:
        """Each image's header read again from its bytes: present, intact, the stored size; with the
        processor, its span the processor's tokens for that size."""
        data = packs.images.field("bytes").to_pylist()
        paths = packs.images.field("path").to_pylist()
        for j, (raw, path) in enumerate(zip(data, paths, strict=True)):
            at = first + int(pack[j])
            try:
                size = image_size(raw if raw is not None else b"", path or f"image {index[j]}")
            except InputError as e:
                self.report.add("image", f"image {index[j]}: {e}", shard=name, pack=at, field="images")
                continue
            stored = (int(packs.image_height[j]), int(packs.image_width[j]))
            if (size.height, size.width) != stored:
                message = (
                    f"image {index[j]} is {size.height}x{size.width}, the pack says {stored[0]}x{stored[1]}"
                )
                self.report.add("image size", message, shard=name, pack=at, field="image_height")
            elif self.processor is not None and inside[j]:
                self._span(packs, j, stored, int(in_sample[j]), pack, index, start, length, at, name)

    def _span(self, packs, j, stored, images, pack, index, start, length, at: int, name: str) -> None:
        """Image ``j``'s span against the processor's tokens for its size (in a sample of ``images``)."""
        where = f"image {index[j]} ({stored[0]}x{stored[1]})"
        try:
            want = self.processor.expansion(*stored, images)
        except ValueError as e:
            self.report.add("image", f"{where}: the processor refuses it: {e}", shard=name, pack=at)
            return
        if length[j] != want.span_length:
            message = f"{where} has image_length {length[j]}, the processor writes {want.span_length}"
            self.report.add("image length", message, shard=name, pack=at, field="image_length")
        got = packs.input_ids[pack[j], start[j] : start[j] + length[j]]
        if not np.array_equal(got, want.span()):
            message = f"{where}: its tokens are not the processor's for its size"
            self.report.add("image tokens", message, shard=name, pack=at, field="input_ids")

    def finish(self, all_read: bool) -> None:
        """The images read against the manifest's count (when every shard was read)."""
        vision = self.manifest.vision if isinstance(self.manifest.vision, dict) else {}
        packed = vision.get("packed_images")
        if all_read and packed != self.images:
            message = f"the packs hold {self.images:,} images, the manifest says {packed}"
            self.report.add("images", message, shard=MANIFEST, field="vision.packed_images")
        self.report.checked["images"] = self.images


@dataclass
class VisionSourceCheck(SourceCheck):
    """``verify --source`` of a vision-language output (module docstring): the source encoded again by
    the pipeline's own readers and vision encoder (``SourceCheck.start``), whose chunks keep each image's
    digest, so the packs' images are compared with the source's without reading an image twice."""

    images_seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def begin(
        cls, manifest: Manifest, inputs: list[str], report: VerifyReport, processor: VisionProcessor
    ) -> VisionSourceCheck:
        """Read and encode the source again as the run did (its options from the provenance)."""
        check = cls.start(manifest, inputs, report, progress=False, processor=processor.path)
        check.images_seen = np.zeros(len(check.lengths), dtype=np.int64)
        return check

    def add(self, packs: PackArrays, used: np.ndarray, first: int, name: str) -> None:
        """The tokens (``SourceCheck.add``), then every image against its source image's digest."""
        super().add(packs, used, first, name)
        if packs.images is None or packs.image_sample_offsets is None or self.store.images is None:
            return  # (ImageCheck reports it)
        offsets = packs.image_sample_offsets
        pack = np.repeat(np.arange(packs.num_packs), np.diff(offsets))
        piece = packs.sample_index_offsets[pack] + packs.image_sample.astype(np.int64)
        if len(piece) and (piece.max() >= len(packs.sample_index) or piece.min() < 0):
            return  # (ImageCheck reports the spans)
        sample = packs.sample_index.astype(np.int64)[piece]
        group = np.flatnonzero(np.r_[True, piece[1:] != piece[:-1]]) if len(piece) else np.zeros(0, int)
        index = np.arange(len(piece)) - np.repeat(group, np.diff(np.r_[group, len(piece)]))
        inside = (sample >= 0) & (sample < len(self.lengths))
        if packs.sample_offset is not None:  # a piece of a cut document: its sample's images before it
            at = np.where(inside, packs.sample_offset.astype(np.int64)[piece], 0)
            index = index + self.store.images.images_before(np.where(inside, sample, 0), at)
        source = self.store.images.digests(np.where(inside, sample, 0), index)
        data = packs.images.field("bytes").to_pylist()
        for j, (s, k) in enumerate(zip(sample.tolist(), index.tolist(), strict=True)):
            if not inside[j] or source[j] is None:
                message = f"image {k} of sample {s} is not an image of the source"
                self.report.add("source", message, shard=name, pack=first + int(pack[j]), field="images")
                continue
            self.images_seen[s] += 1
            digest, image = source[j]
            if image_digest(data[j] or b"") != digest:
                message = f"image {k} of sample {s} ({self.where(s)}): bytes differ from {image}'s"
                self.report.add("source", message, shard=name, pack=first + int(pack[j]), field="images")

    def finish(self) -> None:
        """Every sample (``SourceCheck.finish``), and every image of a packed sample found once."""
        super().finish()
        per_sample = self.store.images.counts() if self.store.images is not None else self.images_seen * 0
        packed = self.seen > 0
        wrong = np.flatnonzero(packed & (self.images_seen != per_sample))
        problems = (
            (f"sample {s} ({self.where(int(s))}) has {self.images_seen[s]} of its {per_sample[s]} images "
             "in the packs", None)
            for s in wrong
        )  # fmt: skip
        self.report.add_many("source", len(wrong), problems, field="images")
        self.report.checked["source images"] = int(per_sample.sum())
