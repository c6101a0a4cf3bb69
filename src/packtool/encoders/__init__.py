"""Encoders: raw records -> ``input_ids``/``labels``, one module per sample format.

``registry.build_encoder(options, sample_format)`` picks one; ``base`` is the protocol; ``options`` the
stage's ``EncodingOptions``. This file imports nothing, so that reading the stage's options (``packtool
pack --help``) does not import numpy, pyarrow or tokenizers.
"""
