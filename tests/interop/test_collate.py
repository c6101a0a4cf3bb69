"""``collate_packs`` as the collate function of other readers: torch's ``DataLoader``, webdataset's
``.batched()``, ``wids`` and Hugging Face ``datasets``. Their own collation fails on ``seq_lens`` (ragged),
and int32 labels fail ``F.cross_entropy``; with ``collate_packs`` every batch equals the packs it holds.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packtool.loader import PackedBatch, collate_packs
from packtool.masks import block_causal_mask
from tests.conftest import manifest_json
from tests.fixtures.interop_outputs import interop_parquet, interop_wds, reference  # noqa: F401 - fixtures

B = 8


def check_batches(batches, want: list[dict], with_index: bool = True) -> None:
    seen = 0
    for batch in batches:
        assert isinstance(batch, PackedBatch)
        assert batch.input_ids.dtype == batch.labels.dtype == torch.int64
        for j in range(len(batch)):
            pack = want[seen + j]
            assert np.array_equal(batch.input_ids[j].numpy(), pack["input_ids"])
            assert np.array_equal(batch.labels[j].numpy(), pack["labels"])
            assert np.array_equal(batch.position_ids[j].numpy(), pack["position_ids"])
            n = len(pack["seq_lens"])
            assert np.array_equal(batch.seq_lens[j, :n].numpy(), pack["seq_lens"])
            assert not batch.seq_lens[j, n:].any()
            if with_index:
                assert int(batch.pack_index[j]) == seen + j
        seen += len(batch)
        logits = torch.zeros(*batch.input_ids.shape, 2000, dtype=torch.float64)
        F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100)  # int64 targets
    assert seen == len(want)


def test_torch_default_collate_fails_where_collate_packs_does_not(interop_parquet):
    want = reference(interop_parquet)
    with pytest.raises(RuntimeError):
        next(iter(torch.utils.data.DataLoader(want, batch_size=B)))
    check_batches(torch.utils.data.DataLoader(want, batch_size=B, collate_fn=collate_packs), want, False)


def test_webdataset_batched(interop_wds):
    import webdataset as wds

    urls = [str(interop_wds / s["path"]) for s in manifest_json(interop_wds)["shards"]]
    ds = wds.WebDataset(urls, shardshuffle=False).decode().batched(B, collation_fn=collate_packs)
    check_batches(torch.utils.data.DataLoader(ds, batch_size=None), reference(interop_wds))


def test_wids_with_a_torch_dataloader(interop_wds, tmp_path):
    import wids
    from wids.wids_decode import default_decoder

    ds = wids.ShardListDataset(
        str(interop_wds / "wids.json"),
        cache_dir=str(tmp_path / "wids-cache"),
        transformations=[functools.partial(default_decoder, format="numpy")],
    )
    check_batches(
        torch.utils.data.DataLoader(ds, batch_size=B, collate_fn=collate_packs), reference(interop_wds)
    )
    ds.close()


def test_hf_datasets_rows_and_the_dense_mask(interop_parquet, tmp_path):
    import datasets

    ds = datasets.load_dataset(str(interop_parquet), split="train", cache_dir=str(tmp_path / "hf"))
    want = reference(interop_parquet)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=B, collate_fn=functools.partial(collate_packs, mask="dense", attention="causal")
    )
    check_batches(loader, want, False)
    batch = next(iter(loader))
    assert torch.equal(batch.attention_mask, block_causal_mask(batch.seq_lens, batch.input_ids.shape[1]))


def test_int64_false_keeps_the_stored_dtypes(interop_parquet):
    batch = collate_packs(reference(interop_parquet)[:3], int64=False)
    assert batch.input_ids.dtype == torch.int32 and batch.to("cpu").input_ids.dtype == torch.int64
