"""Hugging Face ``datasets`` loads a packtool output directory as it is: ``load_dataset(DIR)``, no glob,
no builder name, plain and ``streaming=True``, both formats. The dataset card ``README.md`` that
``packtool pack`` writes (``packtool.formats.card``) names the shards; without it the builder took
``manifest.json`` and the ``.tar.idx`` files for data.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from packtool.formats.card import CARD
from packtool.formats.tar import pack_key
from packtool.manifest import PACK_COLUMNS
from tests.conftest import run_cli
from tests.fixtures.interop_outputs import (  # noqa: F401 - fixtures
    FIELDS,
    assert_pack_equal,
    interop_masked,
    interop_parquet,
    interop_wds,
    reference,
)


def _rows(directory, cache, streaming: bool):
    import datasets

    if streaming:
        ds = datasets.load_dataset(str(directory), split="train", streaming=True)
        return list(ds.with_format("numpy")), ds
    ds = datasets.load_dataset(str(directory), split="train", cache_dir=str(cache))
    return list(ds.with_format("numpy")), ds


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streaming"])
@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_load_dataset_directory(fmt, streaming, request, tmp_path):
    directory = request.getfixturevalue("interop_parquet" if fmt == "parquet" else "interop_wds")
    rows, ds = _rows(directory, tmp_path / "hf", streaming)
    want = reference(directory)
    assert len(rows) == len(want) > 40
    suffix = ".npy" if fmt == "webdataset" else ""
    if not streaming:  # the stored integer widths come through (rows are read back as NumPy)
        assert {f: ds.features[f + suffix].feature.dtype for f in FIELDS} == {
            f: str(want[0][f].dtype) for f in FIELDS
        }
    for i, row in enumerate(rows):
        if fmt == "webdataset":
            assert row["__key__"] == pack_key(i)
        assert_pack_equal({f: np.asarray(row[f + suffix]) for f in FIELDS}, want[i], check_dtype=False)


@pytest.mark.parametrize("fixture", ["interop_parquet", "interop_wds"])
def test_card_says_what_every_column_holds_and_verify_accepts_it(fixture, request):
    directory = request.getfixturevalue(fixture)
    text = (directory / CARD).read_text()
    header = yaml.safe_load(text.split("---")[1])
    suffix = ".tar" if fixture == "interop_wds" else ".parquet"
    assert header["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": f"packs-*{suffix}"}]}
    ]
    for column in PACK_COLUMNS:
        if not column.optional:  # loss_mask (no mask here), and the minimal layout's own columns
            assert column.meaning in text
    run_cli("verify", directory)  # the card is no stray file


def test_load_dataset_decompresses_gzip_members(interop_masked):
    """``--tar-compression gzip``: the builder decompresses ``NAME.npy.gz`` and keeps the name; the card
    names the members so."""
    import itertools

    import datasets

    ds = datasets.load_dataset(str(interop_masked), split="train", streaming=True)
    want = reference(interop_masked)
    for i, row in enumerate(itertools.islice(ds.with_format("numpy"), 5)):
        assert row["__key__"] == pack_key(i)
        assert_pack_equal({f: np.asarray(row[f"{f}.npy.gz"]) for f in want[i]}, want[i], check_dtype=False)
    assert "`input_ids.npy.gz`" in (interop_masked / CARD).read_text()
