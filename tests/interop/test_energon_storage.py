"""Energon reads a packtool output in a bucket through its own storage client (``msc://``, the
multi-storage client Energon uses), with packtool's ``PackTaskEncoder``: every pack, as on disk."""

from __future__ import annotations

import json

import numpy as np
import pytest

from packtool import read_packs
from tests.conftest import DEMO, DEMO_TOKENIZER, run_cli
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_energon_streams_every_pack_of_an_output_in_a_bucket(s3, s3_server, tmp_path, monkeypatch):
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from packtool.energon import PackBatch, PackTaskEncoder

    args = [DEMO / "train.jsonl", "--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", "512",
            "--long-samples", "truncate", "--format", "webdataset", "--shard-size", "40", "-q"]  # fmt: skip
    run_cli("pack", *args, "-o", f"{s3.url}/out")
    provider = {"base_path": s3.name, "endpoint_url": s3_server, "region_name": "us-east-1"}
    keys = {"access_key": "testing", "secret_key": "testing"}
    profile = {"storage_provider": {"type": "s3", "options": provider},
               "credentials_provider": {"type": "S3Credentials", "options": keys}}  # fmt: skip
    (tmp_path / "msc.json").write_text(json.dumps({"profiles": {"packed": profile}}))
    monkeypatch.setenv("MSC_CONFIG", str(tmp_path / "msc.json"))
    ds = get_train_dataset(
        "msc://packed/out", batch_size=4, shuffle_buffer_size=8, max_samples_per_sequence=16,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1), task_encoder=PackTaskEncoder(),
        repeat=False,
    )  # fmt: skip
    got = {}
    for batch in get_loader(ds):
        assert isinstance(batch, PackBatch)
        for j, key in enumerate(batch.__key__):
            got[key] = batch.input_ids[j].numpy()
    monkeypatch.setenv("PACKTOOL_CACHE", str(tmp_path / "cache"))
    want = [p["input_ids"] for p in read_packs(f"{s3.url}/out")]  # (packtool's own reading of the bucket)
    assert len(got) == len(want)
    assert all(np.array_equal(got[k], w) for k, w in zip(sorted(got), want, strict=True))
