"""Readers: raw files and Hugging Face datasets -> ``SourceBatch`` streams, one module per input kind.

``inputs.read_inputs`` expands the inputs and picks a reader per file; ``options`` is the stage's
``ReadingOptions``. This file imports nothing, so that reading the stage's options (``packtool pack
--help``) does not import pyarrow.
"""
