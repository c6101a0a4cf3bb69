"""The images of a run's samples, flat, and laid out per pack for the shard writers.

``ImageTable.of(samples, sequences)`` holds every image of the kept samples in sample order: where its run
of image tokens starts in its sample, its length (the processor's count), its size from its header, and
where its bytes are (``ImageRef``: a file or bytes of the record). ``pack_columns(plan)`` gives, for the
packs of a plan of whole samples, the per-image columns of ``packtool.packs.PackArrays``
(``image_sample``, ``image_offset``, ``image_length``, ``image_height``, ``image_width`` and their
``image_sample_offsets``) with NumPy, and ``read(index)`` the images' encoded bytes, unchanged, as the
``images`` struct array (``{"bytes", "path"}``): read when a shard is written, so a run holds the bytes
of one block of packs at a time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from packtool.arrays import ranges
from packtool.errors import InputError
from packtool.packing.plan import PackPlan
from packtool.schema import pack_of_piece, per_pack_sum, piece_starts
from packtool.vision.images import image_size
from packtool.vision.samples import ImageRef, VisionSample
from packtool.vision.sequences import VisionSequence

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets.Image's storage


@dataclass
class ImageTable:
    """Every image of the kept samples, in sample order.

    Attributes:
        first: ``(num_samples + 1,)`` int64, sample ``s``'s images are ``first[s]:first[s + 1]``.
        offset: ``(num_images,)`` int64, where its run of image tokens starts in its sample.
        length: ``(num_images,)`` int64, its image tokens.
        height, width: ``(num_images,)`` int64, its size from its header.
        refs: ``num_images`` ``ImageRef``: where its bytes are.
        where: per image, ``(sample, index in the sample)`` of the ``samples`` list, for errors.
    """

    first: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    height: np.ndarray
    width: np.ndarray
    refs: list[ImageRef]
    samples: list[VisionSample]

    @classmethod
    def of(cls, samples: list[VisionSample], sequences: list[VisionSequence]) -> ImageTable:
        """The images of ``samples`` (kept) and their ``sequences``.

        >>> seq = VisionSequence(np.zeros(6, np.int32), np.zeros(6, bool), np.array([1]), np.array([3]),
        ...                      np.array([[30, 40]]))
        >>> t = ImageTable.of([VisionSample([], [ImageRef(path="a.png")])], [seq])
        >>> t.first.tolist(), t.length.tolist(), t.height.tolist()
        ([0, 1], [3], [30])
        """
        counts = np.array([len(s.image_lengths) for s in sequences], dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

        def flat(name: str) -> np.ndarray:
            parts = [np.asarray(getattr(s, name), dtype=np.int64).reshape(-1) for s in sequences]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        sizes = flat("image_sizes").reshape(-1, 2)
        refs = [ref for sample in samples for ref in sample.images]
        return cls(
            first, flat("image_offsets"), flat("image_lengths"), sizes[:, 0], sizes[:, 1], refs, samples
        )

    @property
    def num_images(self) -> int:
        return len(self.length)

    def tokens_per_sample(self) -> np.ndarray:
        """``(num_samples,)`` int64: the image tokens of each sample."""
        cum = np.concatenate([[0], np.cumsum(self.length)])
        return cum[self.first[1:]] - cum[self.first[:-1]]

    def digest(self) -> str:
        """A SHA-256 over every image's span and size, for the run's content key (the bytes themselves are
        in the shards' digests)."""
        h = hashlib.sha256()
        for a in (self.first, self.offset, self.length, self.height, self.width):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        return h.hexdigest()

    def pack_columns(self, plan: PackPlan) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The per-image columns of the packs of ``plan`` (whole samples: every piece starts at 0, no
        context-parallel padding), and the flat indices of their images in this table, in pack order.

        >>> seq = VisionSequence(np.zeros(6, np.int32), np.zeros(6, bool), np.array([1, 4]),
        ...                      np.array([2, 1]), np.array([[3, 4], [5, 6]]))
        >>> t = ImageTable.of([VisionSample([], [ImageRef(path="a"), ImageRef(path="b")])] * 2, [seq, seq])
        >>> plan = PackPlan(16, np.array([0, 2]), np.array([1, 0]), np.zeros(2, int), np.array([6, 6]))
        >>> cols, index = t.pack_columns(plan)
        >>> cols["image_offset"].tolist(), cols["image_sample"].tolist(), index.tolist()
        ([1, 4, 7, 10], [0, 0, 1, 1], [2, 3, 0, 1])
        """
        pieces = plan.sample
        counts = self.first[pieces + 1] - self.first[pieces]
        index = ranges(self.first[pieces], counts)
        piece_pack = pack_of_piece(plan.pack_offsets)
        piece_in_pack = np.arange(len(pieces), dtype=np.int64) - plan.pack_offsets[piece_pack]
        starts = piece_starts(plan.length, plan.pack_offsets)
        per_pack = per_pack_sum(counts, plan.pack_offsets)
        columns = {
            "image_sample": np.repeat(piece_in_pack, counts).astype(np.int32),
            "image_offset": (self.offset[index] + np.repeat(starts, counts)).astype(np.int32),
            "image_length": self.length[index].astype(np.int32),
            "image_height": self.height[index].astype(np.int32),
            "image_width": self.width[index].astype(np.int32),
            "image_sample_offsets": np.concatenate([[0], np.cumsum(per_pack)]).astype(np.int64),
        }
        return columns, index

    def read(self, index: np.ndarray) -> pa.StructArray:
        """The images ``index`` as ``struct<bytes, path>``: each one's encoded bytes as read (no
        re-encode) and its name. The header is read again from those bytes: an image file changed since
        its tokens were counted is an ``InputError`` naming its sample and image, not a wrong count."""
        data, names = [], []
        sample_of = np.searchsorted(self.first, index, side="right") - 1
        for i, s in zip(index.tolist(), sample_of.tolist(), strict=True):
            ref, k = self.refs[i], i - int(self.first[s])
            try:
                raw = ref.read_bytes()
                size = image_size(raw, ref.name)
            except (OSError, InputError) as e:
                reason = e.reason if isinstance(e, InputError) else (e.strerror or str(e))
                raise self.samples[s].error(
                    f"image {k} ({ref.name}): {reason}", "image", "bad_image"
                ) from None
            if (size.height, size.width) != (int(self.height[i]), int(self.width[i])):
                raise self.samples[s].error(
                    f"image {k} ({ref.name}): changed while packing ({self.height[i]}x{self.width[i]} when "
                    f"counted, {size.height}x{size.width} now); nothing was written",
                    "image",
                    "input_changed",
                )
            data.append(raw)
            names.append(ref.name)
        return pa.StructArray.from_arrays(
            [pa.array(data, type=pa.binary()), pa.array(names, type=pa.string())], fields=list(IMAGE)
        )


def pack_image_tokens(table: ImageTable, plan: PackPlan) -> np.ndarray:
    """``(num_packs,)`` int64: the image tokens of each pack of ``plan`` (for ``--balance-visual-tokens``).

    >>> seq = VisionSequence(np.zeros(6, np.int32), np.zeros(6, bool), np.array([1]), np.array([2]),
    ...                      np.array([[3, 4]]))
    >>> t = ImageTable.of([VisionSample([], [ImageRef(path="a")])] * 2, [seq, seq])
    >>> pack_image_tokens(t, PackPlan(16, np.array([0, 2, 3]), np.array([1, 0, 1]), np.zeros(3, int),
    ...                                np.array([6, 6, 6]))).tolist()
    [4, 2]
    """
    return per_pack_sum(table.tokens_per_sample()[plan.sample], plan.pack_offsets)
