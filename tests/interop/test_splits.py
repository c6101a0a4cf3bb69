"""What other readers see of a packtool output with a validation split (``--val-fraction``) and with
context-parallel padding (``--cp-size``): the same packs and fields as ``packtool.loader``."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

from packtool import read_packs, run_pack
from packtool.loader import PackedDataset, collate_packs, get_loader
from packtool.options import PackOptions
from tests.conftest import masked_rows, run_cli, write_jsonl

N = 64


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    """Tar shards of 30 packs, 20% of the packs held out for validation."""
    tmp = tmp_path_factory.mktemp("splits")
    src = write_jsonl(tmp / "in.jsonl", masked_rows(200, 3, 60, 1000, seed=2))
    out = tmp / "wds"
    config = PackOptions.of(
        inputs=[str(src)], output=str(out), packed_sequence_size=N, format="webdataset", shard_size=30,
        val_fraction=0.2, quiet=True,
    )  # fmt: skip
    run_pack(config)
    return out


def test_wids_json_lists_the_training_shards_only(held_out, tmp_path):
    import wids
    from wids.wids_decode import default_decoder

    train = PackedDataset(held_out, batch_size=1, shuffle=False).num_packs
    val = PackedDataset(held_out, batch_size=1, shuffle=False, split="val").num_packs
    assert val > 0
    for name, want in (("wids.json", train), ("wids-val.json", val)):
        index = json.loads((held_out / name).read_text())
        assert sum(s["nsamples"] for s in index["shardlist"]) == want
        ds = wids.ShardListDataset(
            str(held_out / name),
            cache_dir=str(tmp_path / name),
            transformations=[functools.partial(default_decoder, format="numpy")],
        )
        assert len(ds) == want
        split = "train" if name == "wids.json" else "val"
        first = next(iter(read_packs(held_out, split=split)))
        assert np.array_equal(ds[0][".input_ids.npy"], first["input_ids"])
        ds.close()
    run_cli("verify", held_out)  # the index files say what the manifest says


def test_val_pack_index_is_the_index_in_the_output_directory(held_out):
    every = list(read_packs(held_out, split=None))
    shards = json.loads((held_out / "manifest.json").read_text())["shards"]
    first_val = min(s["first_pack"] for s in shards if s.get("split") == "val")
    ds = PackedDataset(held_out, batch_size=4, shuffle=False, split="val", drop_last=False)
    seen = []
    for batch in get_loader(ds, num_workers=0):
        for row, index in enumerate(batch.pack_index.tolist()):
            assert np.array_equal(batch.input_ids[row].numpy(), every[index]["input_ids"])
            seen.append(index)
    assert seen == list(range(first_val, len(every)))


@pytest.mark.parametrize("reader", ["webdataset", "wids"])
def test_collate_packs_keeps_the_context_parallel_padding(tmp_path, reader):
    import webdataset as wds
    import wids
    from wids.wids_decode import default_decoder

    src = write_jsonl(tmp_path / "in.jsonl", masked_rows(60, 3, 60, 1000, seed=4))
    out = tmp_path / "cp"
    run_pack(
        PackOptions.of(
            inputs=[str(src)], output=str(out), packed_sequence_size=N, cp_size=4, format="webdataset",
            quiet=True,
        )
    )  # fmt: skip
    want = {}
    for batch in get_loader(PackedDataset(out, batch_size=4, shuffle=False, drop_last=False), num_workers=0):
        for row, index in enumerate(batch.pack_index.tolist()):
            want[index] = (batch.cp_padding[row], batch.seq_lens[row])
    assert any(cp.any() for cp, _ in want.values())
    if reader == "webdataset":
        urls = [str(out / s["path"]) for s in json.loads((out / "manifest.json").read_text())["shards"]]
        batches = wds.WebDataset(urls, shardshuffle=False).decode().batched(4, collation_fn=collate_packs)
    else:
        ds = wids.ShardListDataset(
            str(out / "wids.json"),
            cache_dir=str(tmp_path / "wids"),
            transformations=[functools.partial(default_decoder, format="numpy")],
        )
        batches = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate_packs)
    seen = 0
    for batch in batches:
        assert batch.cp_padding is not None and batch.cu_seqlens_unpadded is not None
        for row in range(len(batch)):
            cp, seq_lens = want[seen]
            width = int((seq_lens > 0).sum())
            assert batch.cp_padding[row, :width].tolist() == cp[:width].tolist()
            seen += 1
    assert seen == len(want)
