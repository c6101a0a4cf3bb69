"""packtool: pack LLM training samples offline into fixed-length sequences, and stream them back.

Python API::

    from packtool import read_packs
    for pack in read_packs("out/"):
        pack["input_ids"], pack["labels"], pack["position_ids"], pack["seq_lens"]
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "load_manifest", "read_packs"]


def __getattr__(name: str) -> Any:
    # imported on first use: ``packtool pack`` starts its workers' forkserver before numpy and pyarrow
    # are imported, so that the two processes import them at the same time (packtool.cli)
    if name in ("load_manifest", "read_packs"):
        from packtool import reading

        return getattr(reading, name)
    raise AttributeError(f"module 'packtool' has no attribute {name!r}")
