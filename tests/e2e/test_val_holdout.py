"""``--val-fraction``: a fraction of the packs, chosen by the seed, held out in their own shards as the
validation split, which every consumer sees as one: ``read_packs`` and the loader (train by default),
Hugging Face ``datasets`` (the card's ``validation`` split), Energon (``split.yaml``'s ``val``, ``energon
lint``); ``verify --source`` accounts for both splits together."""

from __future__ import annotations

from pathlib import Path

import pytest

from packtool import read_packs
from packtool.errors import EXIT_USAGE
from packtool.loader import PackedDataset
from tests.conftest import DEMO, DEMO_TOKENIZER, run_cli

TRAIN = DEMO / "train.jsonl"
ARGS = ["--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", "512", "--long-samples", "split", "-q"]


def pack(out: Path, *extra: str, check: bool = True):
    return run_cli("pack", TRAIN, "-o", out, *ARGS, *extra, check=check)


def keys(directory: Path, split: str | None) -> list[bytes]:
    """Each pack of ``split`` as bytes (its tokens and where they come from)."""
    return [
        p["input_ids"].tobytes() + p["sample_index"].tobytes()
        for p in read_packs(directory, with_sample_index=True, split=split)
    ]


@pytest.fixture(scope="module", params=["parquet", "webdataset"])
def held(request, tmp_path_factory) -> tuple[Path, Path]:
    """The demo packed twice in one format: with a tenth of the packs held out, and without."""
    base = tmp_path_factory.mktemp(f"val-{request.param}")
    fmt = ["--format", request.param, "--shard-size", "40"]
    summary = run_cli("pack", TRAIN, "-o", base / "held", *ARGS[:-1], *fmt, "--val-fraction", "0.1").stderr
    pack(base / "all", *fmt)
    val = sum(1 for _ in read_packs(base / "held", split="val"))
    assert f"; {val:,} of them held out as validation in val-* shards)" in summary
    return base / "held", base / "all"


def test_the_held_out_packs_are_a_tenth_of_the_same_packs_in_their_own_shards(held):
    out, plain = held
    train, val, every = keys(out, "train"), keys(out, "val"), keys(plain, None)
    assert len(val) == round(0.1 * len(every))
    assert sorted(train + val) == sorted(every)  # the same packs, each once
    assert len(list(read_packs(out))) == len(train)  # readers take the train split by default
    names = sorted(p.name for p in out.iterdir() if p.suffix in (".parquet", ".tar"))
    assert any(n.startswith("val-") for n in names) and any(n.startswith("packs-") for n in names)
    for prefix in ("packs-", "val-"):  # each split's shards numbered from 000000
        numbers = sorted(int(n[len(prefix) :].split(".")[0]) for n in names if n.startswith(prefix))
        assert numbers == list(range(len(numbers))), names
    code = run_cli("verify", out, "--source", TRAIN, check=False)
    assert code.returncode == 0, code.stdout + code.stderr
    assert "held out as validation" in run_cli("inspect", out).stdout


def test_the_loader_reads_one_split(held):
    out, _ = held
    val = PackedDataset(out, batch_size=1, shuffle=False, split="val")
    train = PackedDataset(out, batch_size=1, shuffle=False)
    assert val.num_packs == len(keys(out, "val")) and train.num_packs == len(keys(out, "train"))
    with pytest.raises(ValueError, match="split must be one of train, val or None"):
        PackedDataset(out, split="test")


def test_hugging_face_datasets_see_a_validation_split(held):
    datasets = pytest.importorskip("datasets")
    out, _ = held
    loaded = datasets.load_dataset(str(out))
    assert {k: len(v) for k, v in loaded.items()} == {
        "train": len(keys(out, "train")),
        "validation": len(keys(out, "val")),
    }


def test_energon_sees_the_val_split(held):
    out, _ = held
    if not (out / ".nv-meta").exists():
        pytest.skip("Energon reads the webdataset format")
    pytest.importorskip("megatron.energon")
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from packtool.energon import PackTaskEncoder
    from tests.interop.test_energon_prepared import energon

    energon("lint", str(out), "--parallel", "0")
    ds = get_val_dataset(
        out, batch_size=1, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        task_encoder=PackTaskEncoder(),
    )  # fmt: skip
    got = sorted(b.input_ids[0].numpy().tobytes() for b in get_loader(ds))
    want = sorted(p["input_ids"].tobytes() for p in read_packs(out, split="val"))
    assert got == want


def test_the_seed_chooses_the_packs_and_any_worker_count_writes_the_same_bytes(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    pack(a, "--val-fraction", "0.2", "--strategy", "sequential")
    pack(b, "--val-fraction", "0.2", "--strategy", "sequential", "--seed", "1")
    pack(c, "--val-fraction", "0.2", "--strategy", "sequential", "--num-proc", "2")
    assert keys(a, "val") != keys(b, "val")
    for f in sorted(p.name for p in a.iterdir() if p.is_file()):
        assert (a / f).read_bytes() == (c / f).read_bytes(), f
    # sequential keeps the input order in each split
    firsts = [int(p["sample_index"][0]) for p in read_packs(a, with_sample_index=True, split="val")]
    assert firsts == sorted(firsts)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1", "val_fraction must be at least 0 and below 1, got 1.0"),
        ("0.9999", "val_fraction 0.9999 of 264 packs leaves no training pack"),
    ],
)
def test_a_holdout_without_training_packs_is_a_usage_error(tmp_path, value, message):
    proc = pack(tmp_path / "out", "--val-fraction", value, check=False)
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.strip().splitlines()[-1] == f"packtool: error: {message}"
    assert not (tmp_path / "out").exists()
