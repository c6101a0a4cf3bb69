"""``Manifest.load`` on an untrusted directory (issue 27): the manifest itself is opened like a shard, only as
a regular file inside the directory, bounded in size and nesting, and every refusal is one ``InputError``."""

from __future__ import annotations

import os

import pytest

from packtool.errors import InputError
from packtool.manifest import MANIFEST, MAX_MANIFEST_BYTES, Manifest


def test_a_fifo_named_manifest_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / MANIFEST)  # opening it for reading would wait for a writer forever
    with pytest.raises(InputError, match="a FIFO, not a regular file"):
        Manifest.load(tmp_path)


def test_a_manifest_symlink_leading_outside_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / MANIFEST).symlink_to(outside)
    with pytest.raises(InputError, match="symlink leading outside"):
        Manifest.load(tmp_path / "out")


def test_an_oversized_manifest_is_refused_before_it_is_read(tmp_path):
    with open(tmp_path / MANIFEST, "wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: no disk used
    with pytest.raises(InputError, match="over 67,108,864 bytes"):
        Manifest.load(tmp_path)


def test_json_nested_too_deep_is_bad_input_not_an_internal_error(tmp_path):
    (tmp_path / MANIFEST).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(InputError, match="nested too deep"):
        Manifest.load(tmp_path)


def test_no_manifest_says_so(tmp_path):
    with pytest.raises(InputError, match="no manifest.json"):
        Manifest.load(tmp_path)
