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

from packtool.errors import InputError, PacktoolError
from packtool.formats import get_format
from packtool.formats.base import UNIT_ERRORS, ShardMismatch
from packtool.manifest import TRAINING_COLUMNS, Manifest


def load_manifest(directory: str | Path) -> Manifest:
    """The output's manifest, typed (``packtool.manifest.Manifest``); ``InputError`` if ``directory``
    is not a finished packtool output. ``.to_dict()`` gives ``manifest.json`` as a dict."""
    return Manifest.load(directory)


def read_packs(directory: str | Path, *, with_sample_index: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Yield every pack of a packtool output directory, in shard order.

    Each pack is a dict of NumPy arrays in NeMo AutoModel ``PackedSequence`` layout: ``input_ids``,
    ``labels``, ``position_ids`` ``(N,)`` int32, ``seq_lens`` ``(num_samples_in_pack [+1 padding],)``
    int32, and ``loss_mask`` ``(N,)`` int8 when the input had one. ``with_sample_index`` adds
    ``sample_index`` (the input index of each piece's sample) and ``sample_offset`` (where each piece
    starts inside its sample).

    A shard that is not the manifest's (another run's, one that does not parse, one holding another number
    of packs) raises ``InputError`` naming it, once the packs before it are out.
    """
    directory = Path(directory)
    manifest = Manifest.load(directory)
    fmt = get_format(manifest.shard_format)
    columns = [*TRAINING_COLUMNS, "loss_mask"] + (
        ["sample_index", "sample_offset"] if with_sample_index else []
    )
    reader = fmt.open_reader(directory, manifest)
    try:
        for s, entry in enumerate(manifest.shards):
            path = directory / entry.path
            for part, _ in enumerate(fmt.units(entry)):
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
