"""packtool: pack LLM training samples offline into fixed-length sequences, and stream them back.

Python API::

    from packtool import read_packs
    for pack in read_packs("out/"):
        pack["input_ids"], pack["labels"], pack["position_ids"], pack["seq_lens"]

``run_pack(PackOptions.from_dict({...}))`` packs (what ``packtool pack`` runs; ``packtool.options``),
``load_manifest(DIR)`` reads an output's typed manifest; the loader is ``packtool.loader``, the masks
``packtool.masks``.
"""

from __future__ import annotations

from typing import Any

from packtool.version import __version__

__all__ = ["__version__", "load_manifest", "read_packs", "run_pack"]


def __getattr__(name: str) -> Any:
    """The public API, imported on first use so that ``import packtool`` stays light: ``packtool pack``
    starts its workers' forkserver before numpy and pyarrow are imported (the two processes then import
    them side by side)."""
    if name in ("load_manifest", "read_packs"):
        from packtool import reading  # deferred: see above

        return getattr(reading, name)
    if name == "run_pack":
        from packtool.pipeline.run import run_pack  # deferred: see above

        return run_pack
    raise AttributeError(f"module 'packtool' has no attribute {name!r}")
