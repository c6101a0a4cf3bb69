"""packtool: pack LLM training samples offline into fixed-length sequences, and stream them back.

Python API::

    from packtool import read_packs
    for pack in read_packs("out/"):
        pack["input_ids"], pack["labels"], pack["position_ids"], pack["seq_lens"]
"""

__version__ = "0.1.0"

from packtool.reading import load_manifest, read_packs  # noqa: E402

__all__ = ["__version__", "load_manifest", "read_packs"]
