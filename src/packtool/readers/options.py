"""The input reading stage's options (``packtool pack --help``: Input)."""

from __future__ import annotations

from typing import Literal

import msgspec

from packtool.errors import ConfigError
from packtool.option_types import OptionGroup, option
from packtool.readers.decode import check_decode

# how input files are read: by their names, or every file as one format (readers.inputs)
INPUT_FORMATS = ("auto", "jsonl", "parquet", "text")


class FileOptions(OptionGroup):
    """How the input files are listed and read, whatever the sample format."""

    section = "input"

    input_format: option(
        Literal[INPUT_FORMATS],
        "How input files are read: auto (by name: .jsonl .json .ndjson .parquet .txt .tar, compressed or "
        "not; a directory's other files are left out, and said) or every file as that format (text: a file "
        "gives a sample per line, a directory a sample per file). Compression is told by content.",
    ) = "auto"
    include: option(
        list[str],
        "Read only the files of a directory, prefix or glob input that match one of these patterns, by "
        "their path below it (repeatable; * ? [...] within a name, ** any depth; a pattern without / "
        "matches a name at any depth, one that matches a directory everything in it).",
    ) = []
    exclude: option(
        list[str],
        "Leave out the files (and directories, not gone into) that match one of these patterns, as "
        "--include matches them (repeatable); counted and said.",
    ) = []
    follow_symlinks: option(
        bool,
        "Follow symbolic links to directories inside directory and glob inputs, each real directory once "
        "(a link back into the tree, or to a directory read already, is not followed, and said).",
    ) = False
    decode: option(
        str,
        "Text that is not UTF-8: strict (a bad record: --on-error decides), replace (each bad byte "
        "sequence becomes U+FFFD), or an encoding it is read as, e.g. latin-1 or cp1252 (UTF-8 text stays "
        "UTF-8); the records read so are counted.",
    ) = "strict"

    def check(self) -> None:
        """``ConfigError`` for a ``--decode`` no codec serves, or a pattern that can match nothing."""
        check_decode(self.decode)
        for flag, patterns in (("include", self.include), ("exclude", self.exclude)):
            for p in patterns:
                if not p.strip("/") or p.startswith("/") or ".." in p.split("/"):
                    raise ConfigError(
                        f"--{flag} {p!r}: patterns match paths below each input (a directory, a prefix, "
                        "a glob's folder), e.g. 'sub/*.h' or '*.md'; not an absolute path, '..' or nothing"
                    )


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

    def check(self) -> None:
        self.files.check()
