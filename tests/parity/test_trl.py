"""Parity with TRL 1.16.0's ``pack_dataset`` (its ``data_utils.py`` loaded from the wheel, as the NeMo parity
tests load NeMo's): ``--long-samples split`` is its ``bfd_split`` and ``bfd`` with ``--long-samples
truncate`` its ``bfd``.

What agrees exactly: the number of packs, the sequences packed (every piece, token for token: the same
cuts of the long samples, the same truncation), and how full each pack is (the multiset of fills). What
does not: which sequences share a pack. Both place longest first into the fullest pack with room, but
break ties between packs of equal room differently (TRL takes the oldest such pack, packtool fills one
pack of a room class before the next), so equally good packings differ in composition. TRL keeps its packs
in fill order and packtool's ``bfd`` shuffles them by ``--seed``, so everything is compared as multisets.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset

from packtool import read_packs
from tests.conftest import run_cli, write_jsonl
from tests.nemo_reference import load_trl_data_utils

N = 64


@pytest.fixture(scope="module")
def samples() -> list[list[int]]:
    """600 token lists, lengths 1..200 (a third longer than N), ids distinct per sample so no two agree."""
    rng = np.random.default_rng(11)
    lengths = np.where(rng.random(600) < 0.3, rng.integers(N + 1, 200, 600), rng.integers(1, N + 1, 600))
    return [(rng.integers(1, 30_000, int(n))).tolist() for n in lengths]


def trl_packs(samples: list[list[int]], strategy: str) -> list[tuple]:
    trl = load_trl_data_utils()
    packed = trl.pack_dataset(Dataset.from_dict({"input_ids": samples}), seq_length=N, strategy=strategy)
    out = []
    for row in packed:
        ids, lengths = row["input_ids"], row["seq_lengths"]
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        out.append(tuple(tuple(ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)))
    return out


def packtool_packs(tmp_path: Path, samples: list[list[int]], *flags: str) -> list[tuple]:
    src = write_jsonl(tmp_path / "in.jsonl", [{"input_ids": s} for s in samples])
    run_cli(
        "pack", src, "-o", tmp_path / "out", "--packed-sequence-size", N, "--strategy", "bfd", "-q", *flags
    )
    out = []
    for pack in read_packs(tmp_path / "out", with_sample_index=True):
        ids, lengths = pack["input_ids"], pack["seq_lens"][: len(pack["sample_index"])]
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        out.append(tuple(tuple(ids[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)))
    return out


@pytest.mark.parametrize(("trl_strategy", "flags"), [("bfd_split", ["--long-samples", "split"]),
                                                     ("bfd", ["--long-samples", "truncate"])])  # fmt: skip
def test_same_packing_as_trl(tmp_path, samples, trl_strategy, flags):
    ours = packtool_packs(tmp_path, samples, *flags)
    theirs = trl_packs(samples, trl_strategy)
    assert len(ours) == len(theirs)
    assert sorted(seq for pack in ours for seq in pack) == sorted(seq for pack in theirs for seq in pack)
    assert sorted(sum(map(len, pack)) for pack in ours) == sorted(sum(map(len, pack)) for pack in theirs)


def test_split_keeps_every_fitting_sample_whole(tmp_path, samples):
    """Only the samples longer than N are cut: every other sample is one piece, and no token is lost."""
    packtool_packs(tmp_path, samples, "--long-samples", "split")
    stats = json.loads((tmp_path / "out" / "manifest.json").read_text())["stats"]
    long = sum(len(s) > N for s in samples)
    assert (stats["split_samples"], stats["whole_samples"]) == (long, len(samples) - long)
    assert stats["num_tokens"] == stats["input_tokens"] == sum(map(len, samples))


def test_no_shuffle_packs_keeps_trls_fill_order(tmp_path, samples):
    """--no-shuffle-packs keeps bfd's packs in the order they were opened, as TRL keeps them: each pack is
    opened by a sequence of the same length as TRL's pack at that place (what they are filled with
    afterwards differs where the two break ties, see the module docstring)."""
    ours = packtool_packs(tmp_path, samples, "--long-samples", "split", "--no-shuffle-packs")
    theirs = trl_packs(samples, "bfd_split")
    assert [len(p[0]) for p in ours] == [len(p[0]) for p in theirs]
    shuffled = packtool_packs(tmp_path / "s", samples, "--long-samples", "split")
    assert [len(p[0]) for p in shuffled] != [len(p[0]) for p in theirs]
