"""Vision-language samples from a Hugging Face ``save_to_disk`` dataset (its own module: ``datasets`` is slow
to import, and only this reader needs it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets

from packtool.errors import ErrorSink, InputError
from packtool.vision.samples import VisionSample, report, sample_from_record


def read_hf_samples(directory: str | Path, sink: ErrorSink | None = None) -> Iterator[VisionSample]:
    """The samples of a ``save_to_disk`` dataset directory; ``Image`` columns are read undecoded."""
    dataset = datasets.load_from_disk(str(directory))
    features = dataset.features.copy()

    def undecoded(feature: Any) -> None:
        if isinstance(feature, datasets.Image):
            feature.decode = False
        for inner in (
            feature.values() if isinstance(feature, dict) else feature if isinstance(feature, list) else []
        ):
            undecoded(inner)
        if hasattr(feature, "feature"):  # Sequence / List / LargeList of images
            undecoded(feature.feature)

    undecoded(features)
    dataset = dataset.cast(features)
    source = str(Path(directory) / "dataset")
    for i, record in enumerate(dataset):
        try:
            yield sample_from_record(record, source, i, "row")
        except InputError as e:
            report(sink, e)
