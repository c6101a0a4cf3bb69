"""One entry for every vision-language input: ``read_vision_samples(paths)``.

By what each path is: a ``.jsonl`` / ``.json`` file (LLaVA or chat records, ``samples.read_json_samples``),
a ``.tar`` WebDataset shard (captioning samples, ``samples.read_webdataset_samples``), or a directory that
``datasets.save_to_disk`` wrote (``hf_samples.read_hf_samples``). Inputs are read in the order given.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from packtool.errors import ConfigError, ErrorSink, InputError
from packtool.vision.hf_samples import read_hf_samples
from packtool.vision.samples import VisionSample, read_json_samples, read_webdataset_samples


def expand_vision_inputs(paths: list[str]) -> list[tuple[str, str, list[str]]]:
    """``[(kind, source, [])]`` of the inputs (``hf_disk``, ``webdataset``, or the file's suffix), as
    ``pipeline.identity`` stamps them (a folder: every file under it); ``InputError`` for an input that
    does not exist."""
    out = []
    for source in paths:
        path = Path(source)
        if not path.exists():
            raise InputError("no such file or directory", source=source)
        kind = "hf_disk" if path.is_dir() else "webdataset" if path.suffix == ".tar" else path.suffix[1:]
        out.append((kind, source, []))
    return out


def read_vision_samples(paths: list[str | Path], sink: ErrorSink | None = None) -> Iterator[VisionSample]:
    """The samples of every input, in order; ``ConfigError`` for a path that is none of the kinds above.
    Bad records go to ``sink`` when one is given (``--on-error``), else raise."""
    for path in map(Path, paths):
        if path.is_dir() and (path / "dataset_info.json").is_file():
            yield from read_hf_samples(path, sink)
        elif path.is_file() and path.suffix in (".jsonl", ".json"):
            yield from read_json_samples(path, sink)
        elif path.is_file() and path.suffix == ".tar":
            yield from read_webdataset_samples(path, sink)
        else:
            raise ConfigError(
                f"vision input {path}: expected a .jsonl/.json file, a WebDataset .tar shard, or a "
                "save_to_disk dataset directory"
            )
