"""Shard formats: one module per format with its writer, reader and checker roles (``base``), and one
registry (``registry.get_format``). This file imports nothing, so that reading the stage's options
(``packtool pack --help``) does not import pyarrow.
"""
