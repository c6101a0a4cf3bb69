"""A webdataset output is what ``energon prepare`` would make of it, through Energon's own API and CLI:
``energon lint`` passes, the splits behave as on a prepared dataset, ``index.sqlite`` holds prepare's rows
(access by key with ``WebdatasetFileStore``), the packs load without packtool (``crude.yaml``), and
``PackTaskEncoder`` refuses Energon's packing with a message that says why.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from packtool.formats.tar import pack_key
from tests.conftest import run_cli
from tests.fixtures.interop_outputs import (  # noqa: F401 - fixtures
    FIELDS,
    assert_pack_equal,
    interop_masked,
    interop_wds,
    member_suffix,
    reference,
)


def energon(*args: str) -> None:
    """Energon's own CLI command (``energon ARGS``), run in this process; fails on a non-zero exit."""
    from click.testing import CliRunner
    from megatron.energon.cli.main import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output


def _rows(db: Path) -> dict[str, list]:
    """The index's rows, and its schema as SQLite keeps it (every table's and index's SQL)."""
    with sqlite3.connect(db) as c:
        return {
            **{
                t: c.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall()
                for t in ("samples", "sample_parts")
            },
            "schema": c.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall(),
        }


@pytest.fixture(scope="module")
def prepared(interop_wds, tmp_path_factory) -> Path:
    """A copy of the output that ``energon prepare`` prepared again (its own index, split and info)."""
    copy = tmp_path_factory.mktemp("prepared") / "wds"
    shutil.copytree(interop_wds, copy)
    (copy / ".nv-meta" / "index.sqlite").unlink()
    energon(
        "prepare", str(copy), "--non-interactive", "--split-ratio", "1,0,0", "--skip-dataset-yaml",
        "--force-overwrite", "--num-workers", "1", "--no-progress",
    )  # fmt: skip
    return copy


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_energon_lint_passes(interop_wds):
    energon("lint", str(interop_wds), "--parallel", "0")  # every split, every pack; in this process


def test_index_and_splits_are_what_prepare_writes(interop_wds, prepared):
    assert _rows(interop_wds / ".nv-meta" / "index.sqlite") == _rows(prepared / ".nv-meta" / "index.sqlite")
    for idx in sorted(interop_wds.glob("*.tar.idx")):
        assert idx.read_bytes() == (prepared / idx.name).read_bytes()
    ours = yaml.safe_load((interop_wds / ".nv-meta" / "split.yaml").read_text())
    theirs = yaml.safe_load((prepared / ".nv-meta" / "split.yaml").read_text())
    assert ours["split_parts"]["val"] == theirs["split_parts"]["val"] == []
    assert ours["split_parts"]["test"] == theirs["split_parts"]["test"] == []
    info = json.loads((prepared / ".nv-meta" / ".info.json").read_text())
    assert list(info["shard_counts"]) == ours["split_parts"]["train"]


@pytest.mark.parametrize("split_part", ["val", "test"])
def test_val_and_test_splits_behave_as_on_a_prepared_dataset(split_part, interop_wds, prepared):
    from megatron.energon import WorkerConfig, get_val_dataset
    from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError

    for directory in (interop_wds, prepared):
        with pytest.raises(EmptyDatasetError, match=f"split part '{split_part}'"):
            get_val_dataset(
                directory, split_part=split_part, batch_size=2,
                worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            )  # fmt: skip


@pytest.mark.parametrize("which", ["interop_wds", "interop_masked"])  # .npy, and .npy.gz members
def test_random_access_by_key(which, request):
    from megatron.energon.cache.file_store import WebdatasetFileStore
    from megatron.energon.epathlib import EPath

    directory = request.getfixturevalue(which)
    want = reference(directory)
    npy = member_suffix(directory)
    store = WebdatasetFileStore(EPath(directory))  # the member's bytes, by the byte range index.sqlite holds
    raw = gzip.decompress if npy.endswith(".gz") else bytes
    for i in np.random.default_rng(0).permutation(len(want))[:20].tolist() + [0, len(want) - 1]:
        data, _source = store[f"{pack_key(i)}.input_ids{npy}"]
        assert np.array_equal(np.load(io.BytesIO(raw(data))), want[i]["input_ids"])
        data, _source = store[f"{pack_key(i)}.seq_lens{npy}"]
        assert np.array_equal(np.load(io.BytesIO(raw(data))), want[i]["seq_lens"])


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_loads_without_packtool_through_crude_yaml(interop_wds, monkeypatch):
    """Energon's own classes and a cooker of the user's, with every packtool import failing."""
    for name in [m for m in sys.modules if m == "packtool" or m.startswith("packtool.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import packtool...` raises ImportError now
    from megatron.energon import (
        Cooker,
        DefaultTaskEncoder,
        Sample,
        WorkerConfig,
        basic_sample_keys,
        edataclass,
        get_loader,
        get_train_dataset,
        stateless,
    )  # fmt: skip

    @edataclass
    class Pack(Sample):
        input_ids: np.ndarray
        labels: np.ndarray
        position_ids: np.ndarray
        seq_lens: np.ndarray

    fields = ("input_ids", "labels", "position_ids", "seq_lens")

    @stateless
    def cook(raw: dict) -> Pack:
        return Pack(**basic_sample_keys(raw), **{f: raw[f + ".npy"] for f in fields})

    class Encoder(DefaultTaskEncoder):
        cookers = [Cooker(cook, has_subflavors={"packtool": "pack"})]

        def batch(self, samples):
            return samples

    ds = get_train_dataset(
        interop_wds, dataset_config="crude.yaml", batch_size=4, shuffle_buffer_size=None,
        max_samples_per_sequence=None, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=Encoder(), repeat=False,
    )  # fmt: skip
    got = {s.__key__: s for batch in get_loader(ds) for s in batch}
    monkeypatch.undo()
    want = reference(interop_wds)
    assert sorted(got) == [pack_key(i) for i in range(len(want))]
    for i, pack in enumerate(want):
        for f in fields:
            assert np.array_equal(getattr(got[pack_key(i)], f), pack[f]), (i, f)


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_pack_task_encoder_reads_crude_yaml_too(interop_masked):
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from packtool.energon import PackBatch, PackTaskEncoder

    ds = get_train_dataset(
        interop_masked, dataset_config="crude.yaml", batch_size=5, shuffle_buffer_size=None,
        max_samples_per_sequence=None, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=PackTaskEncoder(), repeat=False,
    )  # fmt: skip
    want = reference(interop_masked)
    seen = 0
    for batch in get_loader(ds):
        assert isinstance(batch, PackBatch) and batch.loss_mask is not None
        for j, key in enumerate(batch.__key__):
            pack = {f: getattr(batch, f)[j].numpy() for f in FIELDS}
            pack["loss_mask"] = batch.loss_mask[j].numpy()
            assert_pack_equal(pack, want[int(key)])
            seen += 1
    assert seen == len(want)


def test_pack_task_encoder_refuses_energon_packing(interop_wds):
    from megatron.energon import WorkerConfig, get_train_dataset

    from packtool.energon import PackTaskEncoder

    with pytest.raises(ValueError, match="already packed"):
        get_train_dataset(
            interop_wds, batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            task_encoder=PackTaskEncoder(), packing_buffer_size=8,
        )  # fmt: skip


def test_verify_checks_the_key_index(interop_wds, tmp_path):
    copy = tmp_path / "wds"
    shutil.copytree(interop_wds, copy)  # the output itself verifies: test_hf_datasets.py
    with sqlite3.connect(copy / ".nv-meta" / "index.sqlite") as c:
        c.execute("DELETE FROM samples WHERE sample_index = 0")
    proc = run_cli("verify", copy, check=False)
    assert proc.returncode == 1 and "stale index" in proc.stdout + proc.stderr
    (copy / ".nv-meta" / "index.sqlite").unlink()
    proc = run_cli("verify", copy, check=False)
    assert proc.returncode == 1 and "index file is missing" in proc.stdout + proc.stderr
