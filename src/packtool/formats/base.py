"""What a shard format implements, by role: ``ShardWriter``, ``ShardReader``, ``ShardChecker``; a
``ShardFormat`` is the registry entry (``formats.FORMATS``) holding one of each.

A shard holds a run of consecutive packs. A format says how to

* **write** one (``ShardWriter``): ``shard_ranges`` cuts the plan into shards, ``write`` writes one
  shard from ``PackArrays`` blocks and returns the fields of its ``ShardEntry`` that the format owns,
  ``ShardEntry.fields``: the format's module alone parses them, leniently, e.g.
  ``parquet.ParquetFields``, ``tar.TarFields``;
* **read** one (``ShardReader``): a shard is read in *units* (``units``: packs per unit, e.g. Parquet
  row groups; the loader decodes one unit at a time), ``open_reader`` gives a ``UnitReader`` of units,
  ``read_pack`` one pack alone; a format reads the columns its shards store, and ``UnitReader.read`` /
  ``ShardReader.read_pack`` turn them into the packs readers give (``packtool.layout.rebuild``: the
  columns the ``minimal`` layout leaves out), so no format rebuilds a column (a format may still store a
  layout's columns its own way: a ``minimal`` tar pack's small columns are one member,
  ``formats.tar.pack_members``);
* **summarize** one (``ShardReader.summary``) from its own metadata, without reading packs
  (``inspect``'s fast path);
* **check** one for ``verify`` (``ShardChecker``): parse it, report what is wrong on a ``ProblemSink``
  and yield the packs it could read; and check the dataset-level index files, if the format writes any.

Nothing outside a format's module knows its file layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.conventions import MAX_IMAGE_BYTES
from packtool.errors import InputError, PacktoolError
from packtool.formats.options import OutputOptions
from packtool.layout import rebuild, stored_columns
from packtool.manifest import BASE_FORMAT_VERSION, SHARD_PREFIXES, Manifest, ShardEntry
from packtool.packing.plan import PackPlan
from packtool.packs import PackArrays

# where a written shard can be read back by name, when not in the output's local folder (a shard already
# uploaded to a store): a context holding a local copy (``StoreOutput.fetch_shard``); None: in the folder
FetchShard = Callable[[str], AbstractContextManager[Path]] | None

# errors that mean "this unit cannot be read": a damaged or foreign file (anything else is a bug)
UNIT_ERRORS: tuple[type[BaseException], ...] = (
    OSError, ValueError, KeyError, IndexError, EOFError, PacktoolError, pa.ArrowException,
)  # fmt: skip


def oversized_image(images: pa.StructArray) -> tuple[int, str | None, int] | None:
    """The first image of ``images`` (``struct<bytes, path>``, as ``PackArrays.images`` holds them) over
    ``MAX_IMAGE_BYTES``, as ``(index, path, bytes)``; None when none is."""
    if not len(images):
        return None
    sizes = pc.binary_length(images.field("bytes")).to_numpy(zero_copy_only=False)
    over = np.flatnonzero(np.nan_to_num(sizes.astype(np.float64)) > MAX_IMAGE_BYTES)
    if not len(over):
        return None
    k = int(over[0])
    return k, images.field("path")[k].as_py(), int(sizes[k])


def refuse_oversized_images(images: pa.StructArray | None) -> None:
    """``InputError`` naming the first image of ``images`` over ``MAX_IMAGE_BYTES`` (what a writer checks
    before storing them: a reader refuses such a shard)."""
    found = oversized_image(images) if images is not None else None
    if found is not None:
        _, name, size = found
        raise InputError(
            f"image {name or '(bytes of a record)'}: {size:,} bytes, over the {MAX_IMAGE_BYTES:,} an image "
            "may take in a shard"
        )


def output_root(path: Path, entry: ShardEntry) -> Path:
    """The output directory of shard file ``path`` (``directory / entry.path``).

    >>> output_root(Path("out/sub/a.tar"), ShardEntry("sub/a.tar", 0, 1, 1, 1, "")).as_posix()
    'out'
    """
    return path.parents[len(Path(entry.path).parts) - 1]


class ShardMismatch(ValueError):
    """A shard that reads, but is not the one the manifest describes (another run's, another pack count)."""


class ProblemSink(Protocol):
    """Where a check reports what it finds (``verify.VerifyReport`` is one)."""

    def add(
        self,
        kind: str,
        message: str,
        *,
        shard: str | None = None,
        pack: int | None = None,
        field: str | None = None,
    ) -> None: ...

    def add_many(
        self,
        kind: str,
        count: int,
        problems: Iterable[tuple[str, int | None]],
        *,
        shard: str | None = None,
        field: str | None = None,
    ) -> None: ...


@dataclass(frozen=True)
class ShardMeta:
    """What every shard records about itself, so that it can be matched to its manifest."""

    run_id: str
    shard: int  # the shard's number in the manifest
    first_pack: int  # global index of its first pack
    packed_sequence_size: int


def shard_meta_problems(
    meta: dict | None, manifest: Manifest, index: int, report: ProblemSink, name: str
) -> None:
    """Compare a shard's own ``packtool`` metadata (any format) with the manifest."""
    if meta is None:
        report.add("run_id", "shard carries no packtool metadata (not written by packtool?)", shard=name)
        return
    if meta.get("run_id") != manifest.run_id:
        report.add(
            "run_id",
            f"shard belongs to run {meta.get('run_id')}, the manifest to run {manifest.run_id} "
            "(a manifest or shard from another run)",
            shard=name,
            field="run_id",
        )
    if meta.get("shard") is not None and meta.get("shard") != index:
        report.add(
            "shard",
            f"shard metadata says shard {meta.get('shard')}, manifest lists it as {index}",
            shard=name,
            field="shard",
        )
    n = manifest.packed_sequence_size
    if meta.get("packed_sequence_size") not in (None, n):
        report.add(
            "packed_sequence_size",
            f"shard has packed_sequence_size {meta.get('packed_sequence_size')}, manifest {n}",
            shard=name,
            field="packed_sequence_size",
        )


class UnitReader(ABC):
    """Reads units of one output's shards (keeping files open between calls, as the format likes)."""

    manifest: Manifest

    def read(self, shard: int, part: int, columns: list[str]) -> PackArrays:
        """Unit ``part`` of shard ``shard`` (positions in the manifest), with ``columns`` as readers give
        them (the training columns always; ``loss_mask``, ``sample_index``/``sample_offset`` and a
        vision-language output's image columns, ``schema.IMAGE_COLUMNS``, when named), whatever the layout
        stores (``packtool.layout``). Raises one of ``UNIT_ERRORS`` or
        ``PacktoolError`` when the unit cannot be read as the manifest describes it."""
        images = [c for c in self.manifest.image_columns or () if c in columns]  # stored as they are
        stored = self.read_stored(shard, part, stored_columns(self.manifest.columns, columns) + images)
        return rebuild(stored, self.manifest, columns)

    @abstractmethod
    def read_stored(self, shard: int, part: int, columns: list[str]) -> PackArrays:
        """Unit ``part`` of shard ``shard`` with the stored ``columns`` named (as the shard holds them);
        raises as ``read`` does."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release open files."""


class ShardWriter(ABC):
    """Writes one format's shards: cuts the plan into shards, writes each, and any dataset-level index."""

    suffix: str  # of the shard files, e.g. ".parquet"

    def shard_name(self, index: int, split: str = "train") -> str:
        """``packs-NNNNNN`` for training packs, ``val-NNNNNN`` for held-out ones (``index``: the shard's
        number in the manifest)."""
        return f"{SHARD_PREFIXES[split]}{index:06d}{self.suffix}"

    def shard_ranges(
        self, plan: PackPlan, options: OutputOptions, columns: list[str]
    ) -> list[tuple[int, int]]:
        """Pack ranges ``[(first, end), ...]`` of the shards (storing ``columns``): ``shard_size`` packs
        each by default."""
        k, size = plan.num_packs, options.shard_size
        return [(a, min(a + size, k)) for a in range(0, k, size)]

    def block_packs(self, options: OutputOptions, packed_sequence_size: int) -> int | None:
        """Packs per block of ``packed_sequence_size`` tokens handed to ``write`` (None: the whole shard in
        one block)."""
        return None

    @abstractmethod
    def write(
        self, path: Path, blocks: Iterable[PackArrays], meta: ShardMeta, options: OutputOptions
    ) -> dict:
        """Write the packs of ``blocks`` (consecutive) as shard ``path``, atomically; return the
        ``ShardEntry`` fields the format owns (``ShardEntry.fields``, e.g. ``{"row_groups": [...]}``)."""

    def format_major(self, fields: dict) -> int:
        """The lowest manifest ``format_version`` whose readers read a shard this writer wrote with
        ``fields`` (the ``ShardEntry`` fields ``write`` returned)."""
        return BASE_FORMAT_VERSION

    def write_dataset_index(
        self, directory: Path, manifest: Manifest, options: OutputOptions, fetch_shard: FetchShard = None
    ) -> list[str] | None:
        """Write the dataset-level index files, if the format has any; return their names."""
        return None


class ShardReader(ABC):
    """Reads one format's shards: their read units, a pack alone, a summary from the shard's own metadata,
    and the format's own ``ShardEntry`` fields (a manifest is untrusted: ``entry_fields`` types them)."""

    unit_kind: str | None = None  # what a read unit is called in messages ("row group"); None: the shard

    @abstractmethod
    def units(self, entry: ShardEntry) -> list[int]:
        """Packs in each read unit of the shard, in order."""

    @abstractmethod
    def open_reader(self, directory: Path, manifest: Manifest, verify_checksums: bool = True) -> UnitReader:
        """A reader of the output's units; ``verify_checksums`` checks every unit against the checksums
        written with it (a mismatch raises one of ``UNIT_ERRORS``)."""

    def read_pack(self, path: Path, entry: ShardEntry, row: int, manifest: Manifest) -> dict | None:
        """Pack ``row`` of the shard read alone (with ``sample_index``/``sample_offset``), or None when the
        shard cannot be read that way (the caller then reads it in order with ``ShardChecker.check``)."""
        packs = self.read_stored_pack(path, entry, row, manifest)
        if packs is None or packs.num_packs != 1:
            return None
        try:
            return rebuild(packs, manifest).pack(0, with_sample_index=True)
        except UNIT_ERRORS:  # a damaged layout: reading in order says what is wrong
            return None

    @abstractmethod
    def read_stored_pack(
        self, path: Path, entry: ShardEntry, row: int, manifest: Manifest
    ) -> PackArrays | None:
        """Pack ``row`` of the shard read alone with every stored column (one pack), or None when the
        shard cannot be read that way."""

    @abstractmethod
    def summary(self, path: Path) -> dict[str, Any]:
        """Figures from the shard's own metadata: ``run_id``, ``shard`` and any ``ShardEntry`` field (the
        common ones or the format's own)."""

    def index_files(self, entry: ShardEntry) -> list[str]:
        """Files beside the shard that belong to it (e.g. a tar's ``.tar.idx``)."""
        return []

    def entry_fields(self, entry: ShardEntry) -> Any:
        """The format's own fields of ``entry`` (``ShardEntry.fields``) as its typed record (a dataclass
        whose field types ``binding.type_problem`` checks: a manifest is untrusted), or None if it has
        none."""
        return None


class ShardChecker(ABC):
    """``verify``'s side of one format: checks a shard, and the dataset-level index files if any."""

    @abstractmethod
    def check(
        self, path: Path, entry: ShardEntry, manifest: Manifest, report: ProblemSink, index: int, base: int
    ) -> Iterator[tuple[int, PackArrays]]:
        """Parse shard ``path`` (number ``index``, first pack ``base``) and report what is wrong with it
        (parsing, ``run_id``, pack count, its own index, per-pack layout); yield ``(first pack in the shard,
        PackArrays)`` for the packs it could read, every stored column as stored (``verify`` checks them,
        then ``layout.rebuild`` gives the packs)."""

    def check_dataset_index(self, directory: Path, manifest: Manifest, report: ProblemSink) -> None:  # noqa: B027
        """Compare the dataset-level index files with the manifest (none by default)."""


@dataclass(frozen=True)
class ShardFormat:
    """A registry entry (``formats.FORMATS``): a format's name, as the manifest's ``shard_format`` and the
    ``--format`` option spell it, and its three roles. Code that only reads depends on ``reader``.

    >>> from packtool.formats.registry import get_format
    >>> fmt = get_format("parquet")
    >>> fmt.suffix, fmt.reader.unit_kind
    ('.parquet', 'row group')
    """

    name: str
    writer: ShardWriter
    reader: ShardReader
    checker: ShardChecker

    @property
    def suffix(self) -> str:
        """The shard files' suffix (the writer's), e.g. ``".parquet"``."""
        return self.writer.suffix
