"""packtool output read by the libraries people train with, as they are (no conversion, no prepare step):
``webdataset.WebDataset``, ``wids.ShardListDataset`` and Megatron-Energon (Hugging Face ``datasets``:
test_hf_datasets.py).

Every library is a dev dependency: these tests never skip.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from packtool.formats.tar import pack_key
from tests.conftest import manifest_json
from tests.fixtures.interop_outputs import (  # noqa: F401 - fixtures
    FIELDS,
    N,
    assert_pack_equal,
    interop_masked,
    interop_wds,
    member_suffix,
    reference,
)


@pytest.mark.parametrize("which", ["interop_wds", "interop_masked"])  # .npy, and .npy.gz members
def test_webdataset_yields_every_pack(which, request):
    import webdataset as wds

    directory = request.getfixturevalue(which)
    m = manifest_json(directory)
    urls = [str(directory / s["path"]) for s in m["shards"]]
    shard_of = np.repeat(np.arange(len(m["shards"])), [s["num_packs"] for s in m["shards"]])
    want = reference(directory)
    npy = member_suffix(directory)
    got = list(wds.WebDataset(urls, shardshuffle=False).decode())  # its gzfilter decompresses .npy.gz
    assert len(got) == len(want) > 40
    for i, (sample, pack) in enumerate(zip(got, want, strict=True)):
        assert sample["__key__"] == pack_key(i)
        assert_pack_equal({f: sample[f"{f}{npy}"] for f in pack}, pack)
        assert sample["json"] == {
            "pack_index": i,
            "num_tokens": int(pack["seq_lens"][: len(pack["sample_index"])].sum()),
            "num_samples": len(pack["sample_index"]),
            "run_id": m["run_id"],
            "shard": int(shard_of[i]),
        }


@pytest.mark.parametrize("which", ["interop_wds", "interop_masked"])
def test_wids_random_access(which, request, tmp_path):
    import wids
    from wids.wids_decode import default_decoder

    directory = request.getfixturevalue(which)
    want = reference(directory)
    npy = member_suffix(directory)
    ds = wids.ShardListDataset(
        str(directory / "wids.json"),
        cache_dir=str(tmp_path / "wids-cache"),
        transformations=[functools.partial(default_decoder, format="numpy")],
    )
    assert len(ds) == len(want)
    order = np.random.default_rng(0).permutation(len(want))
    for i in [*order[:25].tolist(), 0, len(want) - 1]:
        sample = ds[i]
        assert sample["__key__"] == pack_key(i)
        assert_pack_equal({f: sample[f".{f}{npy}"] for f in want[i]}, want[i])
    ds.close()


def _energon_packs(directory: Path, batch_size: int) -> dict[str, dict[str, np.ndarray]]:
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from packtool.energon import PackBatch, PackTaskEncoder

    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=1)
    ds = get_train_dataset(
        directory,
        batch_size=batch_size,
        shuffle_buffer_size=8,
        max_samples_per_sequence=16,
        worker_config=worker_config,
        task_encoder=PackTaskEncoder(),
        repeat=False,
    )
    got: dict[str, dict[str, np.ndarray]] = {}
    for batch in get_loader(ds):
        assert isinstance(batch, PackBatch)
        assert batch.input_ids.shape[1:] == (N,) and batch.input_ids.shape[0] <= batch_size
        for j, key in enumerate(batch.__key__):
            assert key not in got, f"pack {key} seen twice in one epoch"
            pack = {f: getattr(batch, f)[j].numpy() for f in FIELDS}
            if batch.loss_mask is not None:
                pack["loss_mask"] = batch.loss_mask[j].numpy()
            got[key] = pack
    return got


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
@pytest.mark.parametrize("which", ["interop_wds", "interop_masked"])
def test_energon_get_train_dataset_streams_every_pack(which, request):
    directory = request.getfixturevalue(which)
    want = reference(directory)
    before = sorted(p.relative_to(directory) for p in directory.rglob("*"))
    got = _energon_packs(directory, batch_size=6)
    assert sorted(p.relative_to(directory) for p in directory.rglob("*")) == before  # nothing prepared
    assert sorted(got) == [pack_key(i) for i in range(len(want))]
    for i, pack in enumerate(want):
        assert_pack_equal(got[pack_key(i)], pack)
    assert ("loss_mask" in want[0]) == (which == "interop_masked")
