"""packtool output read by the libraries people train with, as they are (no conversion, no prepare step):
``webdataset.WebDataset``, ``wids.ShardListDataset``, Megatron-Energon and Hugging Face ``datasets``.

Every library is a dev dependency: these tests never skip.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from packtool import read_packs
from packtool.formats.tar import pack_key
from tests.conftest import DEMO, DEMO_TOKENIZER, manifest_json, run_cli, write_jsonl

N = 256
FIELDS = ("input_ids", "labels", "position_ids", "seq_lens", "sample_index", "sample_offset")


def _pack(out: Path, src: Path, *args: str) -> Path:
    run_cli("pack", src, "--output", out, "--packed-sequence-size", N, "--shard-size", 40, "--quiet", *args)
    return out


@pytest.fixture(scope="module")
def wds_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("interop") / "wds"
    return _pack(
        out, DEMO / "train.jsonl", "--tokenizer", DEMO_TOKENIZER, "--long-samples", "truncate",
        "--format", "webdataset",
    )  # fmt: skip


@pytest.fixture(scope="module")
def masked_out(tmp_path_factory) -> Path:
    """Pretokenized input with a loss mask: the optional ``loss_mask`` member."""
    tmp = tmp_path_factory.mktemp("interop-mask")
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(150):
        n = int(rng.integers(3, 200))
        rows.append(
            {"input_ids": rng.integers(1, 1000, n).tolist(), "loss_mask": rng.integers(0, 2, n).tolist()}
        )
    src = write_jsonl(tmp / "tok.jsonl", rows)
    return _pack(tmp / "wds", src, "--format", "webdataset")


def reference(directory: Path) -> list[dict[str, np.ndarray]]:
    return list(read_packs(directory, with_sample_index=True))


def assert_pack_equal(got: dict, want: dict, check_dtype: bool = True) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        assert np.array_equal(got[k], v), k
        assert got[k].dtype == v.dtype or not check_dtype, k


def hf_value_types(ds, suffix: str = "") -> dict[str, str]:
    """The Arrow value type of each pack field as ``datasets`` sees it (rows come back as int64 lists)."""
    return {f: ds.features[f + suffix].feature.dtype for f in FIELDS}


def test_webdataset_yields_every_pack(wds_out):
    import webdataset as wds

    m = manifest_json(wds_out)
    urls = [str(wds_out / s["path"]) for s in m["shards"]]
    shard_of = np.repeat(np.arange(len(m["shards"])), [s["num_packs"] for s in m["shards"]])
    want = reference(wds_out)
    got = list(wds.WebDataset(urls, shardshuffle=False).decode())
    assert len(got) == len(want) > 40
    for i, (sample, pack) in enumerate(zip(got, want, strict=True)):
        assert sample["__key__"] == pack_key(i)
        assert_pack_equal({f: sample[f"{f}.npy"] for f in FIELDS}, pack)
        assert sample["json"] == {
            "pack_index": i,
            "num_tokens": int(pack["seq_lens"][: len(pack["sample_index"])].sum()),
            "num_samples": len(pack["sample_index"]),
            "run_id": m["run_id"],
            "shard": int(shard_of[i]),
        }


def test_wids_random_access(wds_out, tmp_path):
    import wids
    from wids.wids_decode import default_decoder

    want = reference(wds_out)
    ds = wids.ShardListDataset(
        str(wds_out / "wids.json"),
        cache_dir=str(tmp_path / "wids-cache"),
        transformations=[functools.partial(default_decoder, format="numpy")],
    )
    assert len(ds) == len(want)
    order = np.random.default_rng(0).permutation(len(want))
    for i in [*order[:25].tolist(), 0, len(want) - 1]:
        sample = ds[i]
        assert sample["__key__"] == pack_key(i)
        assert_pack_equal({f: sample[f".{f}.npy"] for f in FIELDS}, want[i])
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
@pytest.mark.parametrize("which", ["wds_out", "masked_out"])
def test_energon_get_train_dataset_streams_every_pack(which, request):
    directory = request.getfixturevalue(which)
    want = reference(directory)
    before = sorted(p.relative_to(directory) for p in directory.rglob("*"))
    got = _energon_packs(directory, batch_size=6)
    assert sorted(p.relative_to(directory) for p in directory.rglob("*")) == before  # nothing prepared
    assert sorted(got) == [pack_key(i) for i in range(len(want))]
    for i, pack in enumerate(want):
        assert_pack_equal(got[pack_key(i)], pack)
    assert ("loss_mask" in want[0]) == (which == "masked_out")


def test_hf_datasets_loads_parquet_output(tmp_path):
    import datasets

    out = _pack(
        tmp_path / "pq", DEMO / "train.jsonl", "--tokenizer", DEMO_TOKENIZER, "--long-samples", "truncate"
    )
    files = [str(out / s["path"]) for s in manifest_json(out)["shards"]]
    assert len(files) > 1
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
    want = reference(out)
    assert ds.num_rows == len(want)
    assert hf_value_types(ds) == {f: str(want[0][f].dtype) for f in FIELDS}
    for i, row in enumerate(ds.with_format("numpy")):
        assert_pack_equal({f: row[f] for f in FIELDS}, want[i], check_dtype=False)


def test_hf_datasets_loads_webdataset_output(wds_out, tmp_path):
    import datasets

    files = [str(wds_out / s["path"]) for s in manifest_json(wds_out)["shards"]]
    ds = datasets.load_dataset("webdataset", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
    want = reference(wds_out)
    assert ds.num_rows == len(want)
    assert hf_value_types(ds, ".npy") == {f: str(want[0][f].dtype) for f in FIELDS}
    for i, row in enumerate(ds.with_format("numpy")):
        assert row["__key__"] == pack_key(i)
        assert_pack_equal({f: row[f"{f}.npy"] for f in FIELDS}, want[i], check_dtype=False)
