"""The input reading stage's options (``packtool pack --help``: Input)."""

from __future__ import annotations

from typing import Literal

import msgspec

from packtool.option_types import OptionGroup, option

# how input files are read: by their names, or every file as one format (readers.inputs)
INPUT_FORMATS = ("auto", "jsonl", "parquet", "text")


class FileOptions(OptionGroup):
    """How the input files are read, whatever the sample format."""

    section = "input"

    input_format: option(
        Literal[INPUT_FORMATS],
        "How input files are read: auto (by name: .jsonl .json .ndjson .parquet .txt .tar, compressed or "
        "not; a directory's other files are left out, and said) or every file as that format (text: a file "
        "gives a sample per line, a directory a sample per file). Compression is told by content.",
    ) = "auto"


class ReadingOptions(OptionGroup):
    """What to read: the inputs, how their files are read, and the split of a Hugging Face dataset."""

    section = "input"

    inputs: option(
        list[str],
        "Input files, globs (** goes into subdirectories), directories (read with their subdirectories), "
        "or hf:NAME[:CONFIG].",
        flag=False,
        required=True,
    ) = []
    split: option(str, "Split of a Hugging Face dataset.") = "train"
    files: FileOptions = msgspec.field(default_factory=FileOptions)
