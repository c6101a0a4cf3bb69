"""Training and reading from a bucket (storage.outputs): an output in a real S3-protocol server read through
a bounded local cache, as the same output on local disk is read."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from packtool.errors import InputError
from packtool.loader import PackedDataset, get_loader
from packtool.reading import read_packs
from packtool.storage import outputs
from packtool.storage.outputs import output_dir, view_of
from tests.fixtures.loader_outputs import packed, packs  # noqa: F401 - fixtures
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures


@pytest.fixture
def remote(s3, packed, tmp_path, monkeypatch):
    """The loader fixtures' output (4 Parquet shards) in a bucket, its cache in ``tmp_path``."""
    monkeypatch.setenv("PACKTOOL_CACHE", str(tmp_path / "cache"))
    return s3.put_tree("runs/out", packed)


def _same(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in ("input_ids", "labels", "seq_lens", "position_ids"))


def _batches(loader) -> list[tuple]:
    return [(b.input_ids.clone(), b.labels.clone(), b.pack_index.clone()) for b in loader]


def test_read_packs_from_a_bucket_fetches_each_shard_once_when_read(remote, packed, packs):
    root = output_dir(remote)
    assert sorted(p.name for p in root.iterdir()) == ["manifest.json"]  # nothing else until read
    got = list(read_packs(remote))
    assert len(got) == len(packs) and all(_same(a, b) for a, b in zip(got, packs, strict=True))
    assert sorted(p.name for p in root.glob("packs-*")) == sorted(p.name for p in packed.glob("packs-*"))


@pytest.mark.parametrize("context", [None, pytest.param("spawn", marks=pytest.mark.slow)])
def test_the_loader_over_a_bucket_equals_local_disk_with_workers(remote, packed, context):
    """2 workers, forked, or spawned (a spawned worker gets the output's view with the dataset)."""

    def run(source, **kw):
        ds = PackedDataset(source, batch_size=4, seed=3, attention="causal")
        return _batches(get_loader(ds, num_workers=2, **kw))

    local = run(packed)
    got = run(remote, multiprocessing_context=context) if context else run(remote)
    assert len(got) == len(local)
    assert all(
        all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) for a, b in zip(got, local, strict=True)
    )


def test_ranks_read_the_bucket_and_resume_exactly(remote, packed):
    """Two ranks, 2 workers each; a state saved after 3 batches resumes to the same batches."""
    for rank in (0, 1):
        ds = PackedDataset(remote, batch_size=4, seed=1, rank=rank, world_size=2, attention="causal")
        whole = _batches(get_loader(ds, num_workers=2))
        loader = get_loader(PackedDataset(remote, batch_size=4, seed=1, rank=rank, world_size=2,
                                          attention="causal"), num_workers=2)  # fmt: skip
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state_dict()
        resumed = get_loader(PackedDataset(remote, batch_size=4, seed=1, rank=rank, world_size=2,
                                           attention="causal"), num_workers=2)  # fmt: skip
        resumed.load_state_dict(state)
        rest = _batches(resumed)
        assert len(rest) == len(whole) - 3
        assert all(torch.equal(a[2], b[2]) for a, b in zip(rest, whole[3:], strict=True))


def test_the_cache_holds_at_most_its_limit(remote, packed, tmp_path):
    sizes = sorted(p.stat().st_size for p in packed.glob("packs-*.parquet"))
    limit = sizes[-1] + sizes[-2]  # two shards at most
    root = output_dir(remote, cache_dir=tmp_path / "small", cache_limit=limit)
    for _ in read_packs(remote):  # (a second view of the same URL and manifest: the same folder)
        held = sum(p.stat().st_size for p in root.glob("packs-*"))
        assert held <= limit
    assert view_of(root).cache_limit == limit


def test_a_shard_removed_or_replaced_in_the_store_is_named(remote, s3, packed):
    ds = PackedDataset(remote, batch_size=4, seed=0, attention="causal", shuffle=False)
    s3.fs.rm(f"{s3.name}/runs/out/packs-000002.parquet")  # once the loader checked the shards
    with pytest.raises(InputError, match=r"runs/out/packs-000002.parquet.*missing"):
        list(get_loader(ds, num_workers=0))
    other = (packed / "packs-000001.parquet").read_bytes()  # another shard's bytes in its place
    s3.put("runs/out/packs-000002.parquet", other)
    ds = PackedDataset(remote, batch_size=4, seed=0, attention="causal", shuffle=False, on_error="skip")
    loader = get_loader(ds, num_workers=0)
    got = _batches(loader)
    assert loader.stats["bad_units"] and len(got) < 50
    assert all("packs-000002" in u for u in loader.stats["bad_units"])


def test_a_bucket_without_a_manifest_is_no_output(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKTOOL_CACHE", str(tmp_path))
    s3.put("half/packs-000000.parquet", b"PAR1")
    with pytest.raises(
        InputError, match=r"half: no manifest.json \(not packtool output, or an unfinished run\)"
    ):
        read_packs(f"{s3.url}/half").__next__()


def test_a_shard_larger_in_the_store_than_its_manifest_says_is_refused_before_download(remote, s3, packed):
    s3.put("runs/out/packs-000000.parquet", os.urandom((packed / "packs-000000.parquet").stat().st_size + 1))
    with pytest.raises(
        InputError, match=rf"{remote}/packs-000000.parquet: [\d,]+ bytes on disk, manifest says"
    ):
        list(read_packs(remote))  # from the store's listing: before any download
    assert not (output_dir(remote) / "packs-000000.parquet").exists()
    with pytest.raises(InputError, match=r"bytes in the store, the manifest says"):
        outputs.view_of(output_dir(remote)).fetch("packs-000000.parquet")  # and so is a download
