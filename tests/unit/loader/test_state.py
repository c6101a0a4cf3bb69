"""A loader state is checked field by field, and resumes only the run (and split) it was saved from."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from packtool.loader import PackedDataset, get_loader
from packtool.manifest import MANIFEST
from tests.fixtures.loader_outputs import packed  # noqa: F401 - fixtures


def _loader(directory, **kw):
    return get_loader(PackedDataset(directory, batch_size=4, seed=0, **kw), num_workers=0)


# (field, bad value, what the error says)
BAD = [
    ("batch", 1.5, "field 'batch' must be int, got 1.5"),
    ("batch", "3", "field 'batch' must be int, got '3'"),
    ("batch", True, "field 'batch' must be int, got True"),
    ("batch", 10**6, "field 'batch' must be below the batches per epoch"),
    ("epoch", -1, "field 'epoch' must be non-negative, got -1"),
    ("lanes", 0, "field 'lanes' must be positive, got 0"),
    ("seed", None, "field 'seed' must be int, got None"),
    ("shuffle", 1, "field 'shuffle' must be bool, got 1"),
    ("stats", [], "field 'stats' must be dict, got []"),
    ("stats", {"bad_packs": -2}, "field 'stats.bad_packs' must be a non-negative int, got -2"),
    ("stats", {"bad_packs": "x"}, "field 'stats.bad_packs' must be a non-negative int, got 'x'"),
    ("stats", {"bad_units": "a"}, "field 'stats.bad_units' must be a list of strings, got 'a'"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_a_bad_field_is_named(packed, key, value, message):
    state = _loader(packed).state_dict()
    state[key] = value
    loader = _loader(packed)
    with pytest.raises(ValueError, match=re.escape("loader state: " + message)):
        loader.load_state_dict(state)
    assert (loader.epoch, loader.batch) == (0, 0)


@pytest.mark.parametrize("key", ["epoch", "batch", "lanes", "run_id", "shards", "stats", "seed"])
def test_a_missing_field_is_named(packed, key):
    state = _loader(packed).state_dict()
    del state[key]
    with pytest.raises(ValueError, match=f"loader state: field '{key}' is missing"):
        _loader(packed).load_state_dict(state)


def test_a_state_is_not_a_dict(packed):
    with pytest.raises(ValueError, match="loader state: must be a dict"):
        _loader(packed).load_state_dict([1, 2])


def test_the_state_of_another_run_with_the_same_run_id_is_refused(packed, tmp_path):
    """Another output whose manifest has the same run_id (re-packed from other content that the run_id
    does not see) but other shards: the state is bound to the shards' sha256s too."""
    other = tmp_path / "other"
    shutil.copytree(packed, other)
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["shards"][0]["sha256"] = "0" * 64  # what a shard of other content has
    (other / MANIFEST).write_text(json.dumps(manifest))
    first = _loader(packed)
    next(iter(first))
    state = json.loads(json.dumps(first.state_dict()))
    again = _loader(packed)
    again.load_state_dict(state)  # the same run resumes
    assert (again.epoch, again.batch) == (0, 1)
    with pytest.raises(ValueError, match="loader state does not match this dataset: shards: saved"):
        _loader(other, verify_checksums=False).load_state_dict(state)
