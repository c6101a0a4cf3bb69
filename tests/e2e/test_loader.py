"""packtool.loader on real packtool output (built with the CLI): sharding, order, resume, faults, stages.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from packtool.errors import InputError
from packtool.loader import (
    PackedDataset,
    get_loader,
)
from tests.conftest import rewrite_tar_json, run_cli
from tests.fixtures.loader_outputs import packed, packs  # noqa: F401 - fixtures

N = 64
# more workers than this machine's cores is what the layout tests need, not a mistake
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def stream(loader, limit: int | None = None) -> list[np.ndarray]:
    """The pack_index rows of the batches the loader yields (up to ``limit`` batches)."""
    out = []
    for batch in loader:
        out.append(batch.pack_index.numpy().copy())
        if limit is not None and len(out) == limit:
            break
    return out


def flat(batches: list[np.ndarray]) -> list[int]:
    return [int(p) for b in batches for p in b]


def test_webdataset_shards_stream_the_same_packs(packed, packs, tmp_path):
    src = packed.parent / "in.jsonl"
    out = tmp_path / "wds"
    run_cli(
        "pack",
        src,
        "-o",
        out,
        "--packed-sequence-size",
        N,
        "--shard-size",
        40,
        "--format",
        "webdataset",
        "-q",
    )
    ds = PackedDataset(out, batch_size=4, shuffle=True, seed=3)
    seen = []
    for batch in get_loader(ds, num_workers=2):
        for row, p in enumerate(batch.pack_index.tolist()):
            seen.append(p)
            assert torch.equal(batch.input_ids[row], torch.from_numpy(packs[p]["input_ids"]))
            assert torch.equal(batch.loss_mask[row], torch.from_numpy(packs[p]["loss_mask"]))
    assert len(seen) == len(set(seen)) >= len(packs) - 4


def test_webdataset_json_members_with_more_keys_are_read_alike(packed, packs, tmp_path):
    """Other tools (and later packtool versions) may put more keys in each pack's ``.json`` member: the
    loader reads the ``.npy`` members and must not care."""

    out = tmp_path / "wds"
    src = packed.parent / "in.jsonl"
    run_cli("pack", src, "-o", out, "--packed-sequence-size", N, "--format", "webdataset", "-q")
    shards = sorted(out.glob("*.tar"))
    assert shards
    for shard in shards:

        def more_keys(meta: dict, name: str = shard.name) -> dict:
            assert "pack_index" in meta
            return {**meta, "shard": name, "note": {"nested": [1, 2]}}  # run_id kept: checked

        rewrite_tar_json(shard, more_keys)
    # the members were rewritten after the run, so the shard's checksum no longer holds: read unchecked
    ds = PackedDataset(out, batch_size=4, shuffle=False, seed=0, verify_checksums=False)
    seen = []
    for batch in get_loader(ds, num_workers=1):
        for row, p in enumerate(batch.pack_index.tolist()):
            seen.append(p)
            assert torch.equal(batch.input_ids[row], torch.from_numpy(packs[p]["input_ids"]))
    assert len(seen) == len(set(seen)) >= len(packs) - 4


def pack_formats(packed: Path, tmp_path: Path, fmt: str, *extra) -> Path:
    """The ``packed`` fixture's input packed again, as ``fmt``, into ``tmp_path / name``."""
    out = tmp_path / "-".join([fmt, *map(str, extra)])
    run_cli("pack", packed.parent / "in.jsonl", "-o", out, "--packed-sequence-size", N, "--shard-size", 40,
            "--format", fmt, *extra, "-q")  # fmt: skip
    return out


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_shard_of_another_run_is_refused(packed, tmp_path, fmt):
    ours, other = pack_formats(packed, tmp_path, fmt), pack_formats(packed, tmp_path, fmt, "--seed", "1")
    name = json.loads((ours / "manifest.json").read_text())["shards"][1]["path"]
    shutil.copy(other / name, ours / name)  # same name and pack count, another run (seed)
    # caught before the first batch when its size differs; else by its checksum or its run_id
    with pytest.raises(InputError, match=rf"{name}.*(bytes on disk|checksum mismatch|shard of run \w+)"):
        stream(get_loader(PackedDataset(ours, batch_size=4, shuffle=False), num_workers=0))
    # unchecked, the run_id still tells
    unchecked = PackedDataset(ours, batch_size=4, shuffle=False, verify_checksums=False, on_error="skip")
    stream(get_loader(unchecked, num_workers=0))


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_corrupt_tar_shard_follows_the_policy(packed, tmp_path, on_error):
    out = pack_formats(packed, tmp_path, "webdataset")
    shards = json.loads((out / "manifest.json").read_text())["shards"]
    path = out / shards[1]["path"]
    data = bytearray(path.read_bytes())
    data[600:1100] = bytes(500)  # the second member's header: the tar no longer parses there
    path.write_bytes(bytes(data))
    ds = PackedDataset(out, batch_size=4, shuffle=False, on_error=on_error)
    loader = get_loader(ds, num_workers=0)
    if on_error == "fail":
        with pytest.raises(InputError, match=rf"{shards[1]['path']}.*cannot read packs"):
            stream(loader)
        return
    got = flat(stream(loader))
    first = shards[0]["num_packs"]
    bad = set(range(first, first + shards[1]["num_packs"]))
    assert len(got) == len(set(got)) and not bad & set(got)
    assert loader.stats["bad_packs"] == len(bad & set(ds.plan(0).reshape(-1).tolist())) > 0
