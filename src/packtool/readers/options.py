"""The input reading stage's options (``packtool pack --help``: Input)."""

from __future__ import annotations

from packtool.option_types import OptionGroup, option


class ReadingOptions(OptionGroup):
    """What to read: the inputs, and the split of a Hugging Face dataset."""

    section = "input"

    inputs: option(
        list[str], "Input files, globs, directories, or hf:NAME[:CONFIG].", flag=False, required=True
    ) = []
    split: option(str, "Split of a Hugging Face dataset.") = "train"
