"""Read packtool output back from Python: ``read_packs(DIR)`` and ``load_manifest(DIR)``.

Example::

    >>> from packtool import read_packs
    >>> for pack in read_packs("out/"):  # doctest: +SKIP
    ...     assert pack["seq_lens"].sum() == len(pack["input_ids"])
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from packtool.binding import fields_problem, manifest_problem
from packtool.errors import InputError, PacktoolError
from packtool.formats.base import UNIT_ERRORS, ShardMismatch
from packtool.formats.registry import get_format
from packtool.manifest import MANIFEST, TRAINING_COLUMNS, Manifest, ShardEntry
from packtool.safepath import output_file_problem, output_file_size
from packtool.storage.outputs import output_dir, source_name


def load_manifest(directory: str | Path) -> Manifest:
    """The output's manifest, typed (``packtool.manifest.Manifest``); ``InputError`` if ``directory``
    is not a finished packtool output or a field is not of its type (``binding.fields_problem``: the
    figures of the manifest can be computed with). ``.to_dict()`` gives ``manifest.json`` as a dict."""
    directory = output_dir(directory)  # an output in a store: read through its local view
    manifest = Manifest.load(directory)
    if (problem := fields_problem(manifest)) is not None:
        raise InputError(f"{Path(directory) / MANIFEST}: {problem}; run packtool verify")
    return manifest


def shard_file_problem(directory: str | Path, entry: ShardEntry) -> str | None:
    """What is wrong with shard ``entry``'s file at a glance (a ``realpath`` and a ``stat``): it may not be
    opened (``safepath.output_file_problem``: outside the directory, not a regular file, ``missing``), or
    its size is not the recorded one; ``None`` when neither."""
    problem, size = output_file_size(directory, entry.path)
    if problem is not None:
        return problem
    return None if size == entry.bytes else f"{size:,} bytes on disk, manifest says {entry.bytes:,}"


def check_shard_files(directory: str | Path, manifest: Manifest) -> list[tuple[str, str]]:
    """What is wrong with the output's shard set, cheaply (a ``realpath`` and a ``stat`` per file, no
    read): the manifest's fields must be readable (``binding.fields_problem``), the shard entries must hold
    the packs the stats count, every shard must pass ``shard_file_problem`` and every index file be a
    regular file inside the directory, and the manifest must give its own ``run_id``
    (``binding.manifest_problem``). Returns ``[(path, problem)]``; empty when all is well. Readers check
    this before the first pack.

    >>> check_shard_files("out/demo", load_manifest("out/demo"))  # doctest: +SKIP
    []
    """
    if (problem := fields_problem(manifest)) is not None:  # nothing below can be trusted to compute
        return [("manifest.json", problem)]
    problems = []
    listed = manifest.num_packs
    counted = manifest.stats.num_packs
    if listed != counted:
        why = f"its shards hold {listed:,} packs, its stats count {counted:,} (a shard entry removed/added)"
        problems.append(("manifest.json", why))
    shard_reader = get_format(manifest.shard_format).reader
    for entry in manifest.shards:
        if (problem := shard_file_problem(directory, entry)) is not None:
            problems.append((entry.path, problem))
        for name in shard_reader.index_files(entry):  # e.g. a tar's .tar.idx: opened by readers too
            if (problem := output_file_problem(directory, name)) not in (None, "missing"):
                problems.append((name, problem))
    if (problem := manifest_problem(manifest)) is not None:  # after the files: theirs are more specific
        problems.append(("manifest.json", problem))
    return problems


def require_shard_files(directory: str | Path, manifest: Manifest) -> None:
    """``InputError`` naming the first problem ``check_shard_files`` finds (what readers do before their
    first pack)."""
    for path, problem in check_shard_files(directory, manifest)[:1]:
        raise InputError(f"{source_name(directory).rstrip('/')}/{path}: {problem}; run packtool verify")


def read_packs(
    directory: str | Path,
    *,
    with_sample_index: bool = False,
    verify_checksums: bool = True,
    split: str | None = "train",
) -> Iterator[dict[str, np.ndarray]]:
    """Yield every pack of ``split`` of a packtool output directory, in shard order: ``train`` (every
    pack, unless the run held some out with ``val_fraction``), ``val`` (those held out) or ``None`` (all).

    Each pack is a dict of NumPy arrays in NeMo AutoModel ``PackedSequence`` layout: ``input_ids``,
    ``labels``, ``position_ids`` ``(N,)`` int32, ``seq_lens`` ``(num_samples_in_pack [+1 padding],)``
    int32, and ``loss_mask`` ``(N,)`` int8 when the input had one. ``with_sample_index`` adds
    ``sample_index`` (the input index of each piece's sample) and ``sample_offset`` (where each piece
    starts inside its sample). A vision-language output's packs (docs/vision.md) also hold ``images``,
    a list of ``{"bytes", "path"}`` (each image's encoded bytes as read, and its name), and the
    ``(num_images,)`` int32 ``image_sample``, ``image_offset``, ``image_length``, ``image_height`` and
    ``image_width``, in pack order.

    The output is untrusted input (docs/errors.md, threat model). Before the first pack, the shard set is
    checked against the manifest (``check_shard_files``: files confined to the directory, the run_id
    recomputed from the manifest's reading fields); every shard must carry the run_id and its own place
    (shard number, first pack); every unit read is checked against the checksums written with it
    (``verify_checksums``: Parquet page CRCs, a tar shard's CRC-32). A shard that is not the manifest's
    (another run's, a damaged one, one that does not parse or holds another number of packs) raises
    ``InputError`` naming it, once the packs before it are out.
    """
    directory = output_dir(directory)  # an output in a store: read through its local view
    manifest = Manifest.load(directory)
    shard_reader = get_format(manifest.shard_format).reader
    columns = [*TRAINING_COLUMNS, "loss_mask", "cp_padding", *(manifest.image_columns or ())] + (
        ["sample_index", "sample_offset"] if with_sample_index else []
    )
    require_shard_files(directory, manifest)
    reader = shard_reader.open_reader(directory, manifest, verify_checksums=verify_checksums)
    try:
        for s, entry in manifest.split_shards(split):
            path = directory / entry.path
            for part, _ in enumerate(shard_reader.units(entry)):
                try:
                    packs = reader.read(s, part, columns)
                except PacktoolError as e:  # names the shard already
                    raise InputError(f"{e}; run packtool verify") from None
                except ShardMismatch as e:  # it reads, but it is not the manifest's shard
                    raise InputError(f"{path}: {e}; run packtool verify") from None
                except UNIT_ERRORS as e:
                    raise InputError(f"{path}: cannot be read ({e}); run packtool verify") from None
                yield from packs.packs(with_sample_index)
    finally:
        reader.close()
