"""``--strategy bfd``: invariants of the packs through the real CLI, and the planner against a naive BFD.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.reading import read_packs
from tests.conftest import manifest_json, run_cli

N = 512


def lognormal_lengths(count: int, mean: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sigma = 1.0
    return np.maximum(1, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, count)).astype(np.int64)


def write_tokens(path: Path, lengths: np.ndarray) -> Path:
    """Samples whose token ids are a global counter: every token says which sample and position it is.

    ``large_list<int32>``, the packtool layout itself: no cast on the way in, so sliced batches reach the
    chunk writer as slices (their ``.values`` is the whole batch's).
    """
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = pa.array(np.arange(offsets[-1], dtype=np.int32) + 1)
    pq.write_table(pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), ids)}), path)
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, np.ndarray]:
    lengths = np.minimum(lognormal_lengths(3000, 60, seed=3), N)
    lengths[[5, 700, 2999]] = [N + 1, 3 * N + 17, 2 * N]  # a tail past N
    return write_tokens(tmp_path_factory.mktemp("bfd") / "tokens.parquet", lengths), lengths


def pack(inp: Path, out: Path, *flags: str) -> dict:
    run_cli("pack", inp, "-o", out, "--packed-sequence-size", N, "-q", "--overwrite", *flags)
    return manifest_json(out)


def check_packs(out: Path, lengths: np.ndarray, kept: np.ndarray) -> None:
    """Every token of every kept sample exactly once, runs in order, labels and positions aligned."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    seen = np.zeros(offsets[-1] + 1, dtype=np.int64)
    for p in read_packs(out, with_sample_index=True):
        ids, labels, pos, seq = p["input_ids"], p["labels"], p["position_ids"], p["seq_lens"]
        assert len(ids) == len(labels) == len(pos) == N and seq.sum() == N
        used = int(seq[: len(p["sample_index"])].sum())
        assert np.all(ids[used:] == 0) and np.all(labels[used:] == -100)
        at = 0
        for s, ln in zip(p["sample_index"].tolist(), seq.tolist(), strict=False):
            piece = ids[at : at + ln].astype(np.int64)
            # consecutive ids inside sample s: the piece is a run of the sample, in order
            assert np.all(np.diff(piece) == 1)
            assert offsets[s] < piece[0] and piece[-1] <= offsets[s + 1]
            # shifted labels: the next token of the same sample, -100 after the sample's last token
            expect = piece + 1
            expect[piece == offsets[s + 1]] = -100
            assert np.array_equal(labels[at : at + ln], expect)
            assert np.array_equal(pos[at : at + ln], np.arange(ln))  # restart at every piece
            seen[piece] += 1
            at += ln
    want = np.zeros_like(seen)
    for s in kept.tolist():
        want[offsets[s] + 1 : offsets[s + 1] + 1] = 1
    assert np.array_equal(seen, want)


def test_bfd_is_the_default_and_keeps_every_token(dataset, tmp_path):
    inp, lengths = dataset
    m = pack(inp, tmp_path / "o", "--long-samples", "drop")
    assert m["provenance"]["strategy"] == "bfd" and m["position_ids"] == "restart"
    kept = np.flatnonzero(lengths <= N)
    check_packs(tmp_path / "o", lengths, kept)
    s = m["stats"]
    assert s["dropped_samples"] == 3 and s["split_samples"] == 0
    # BFD on a lognormal set lands on (or one pack above) the lower bound
    assert s["num_packs"] <= s["lower_bound_packs"] + 1


def test_split_reaches_the_lower_bound_exactly(dataset, tmp_path):
    inp, lengths = dataset
    m = pack(inp, tmp_path / "o", "--split-across-pack")
    check_packs(tmp_path / "o", lengths, np.arange(len(lengths)))
    s = m["stats"]
    assert s["num_tokens"] == int(lengths.sum())
    assert s["num_packs"] == s["lower_bound_packs"] == -(-int(lengths.sum()) // N)
    assert s["split_samples"] >= 3  # at least the samples longer than N


def test_truncate_keeps_the_head_of_long_samples(dataset, tmp_path):
    inp, lengths = dataset
    m = pack(inp, tmp_path / "o", "--long-samples", "truncate", "--packing-buffer-size", "1000")
    s = m["stats"]
    assert s["truncated_samples"] == 3 and s["truncated_tokens"] == 1 + (2 * N + 17) + N
    assert s["num_tokens"] == int(np.minimum(lengths, N).sum())
    assert m["provenance"]["packing_buffer_size"] == 1000


def test_long_sample_error_names_file_and_row(dataset, tmp_path):
    inp, _ = dataset
    proc = run_cli("pack", inp, "-o", tmp_path / "o", "--packed-sequence-size", N, "-q", check=False)
    assert proc.returncode == 3
    assert f"{inp}, row 5, field 'input_ids'" in proc.stderr and not (tmp_path / "o").exists()


def shard_hashes(m: dict) -> list[str]:
    return [s["sha256"] for s in m["shards"]]


def test_same_bytes_for_any_num_proc_and_same_seed(dataset, tmp_path):
    inp, _ = dataset
    out = tmp_path / "o"
    flags = ("--split-across-pack", "--shard-size", "40", "--chunk-size", "500")
    one = pack(inp, out, *flags, "--num-proc", "1")
    two = pack(inp, out, *flags, "--num-proc", "2")
    again = pack(inp, out, *flags, "--num-proc", "1", "--seed", "0")
    assert len(one["shards"]) > 1
    assert shard_hashes(one) == shard_hashes(two) == shard_hashes(again)
    check_packs(out, dataset[1], np.arange(len(dataset[1])))  # chunks of 500 rows slice the input batches


def test_different_seed_different_order(dataset, tmp_path):
    inp, _ = dataset
    a = pack(inp, tmp_path / "a", "--long-samples", "drop", "--seed", "1")
    b = pack(inp, tmp_path / "b", "--long-samples", "drop", "--seed", "2")
    order_a = [tuple(p["sample_index"]) for p in read_packs(tmp_path / "a", with_sample_index=True)]
    order_b = [tuple(p["sample_index"]) for p in read_packs(tmp_path / "b", with_sample_index=True)]
    assert order_a != order_b and sorted(order_a) == sorted(order_b)
    assert a["stats"]["num_packs"] == b["stats"]["num_packs"]


def test_sequential_keeps_input_order_and_nemo_positions(dataset, tmp_path):
    inp, _ = dataset
    m = pack(inp, tmp_path / "o", "--strategy", "sequential", "--long-samples", "drop")
    assert m["position_ids"] == "nemo"
    first = np.concatenate([p["sample_index"] for p in read_packs(tmp_path / "o", with_sample_index=True)])
    assert np.all(np.diff(first) > 0)


def test_config_file_keys(dataset, tmp_path):
    inp, lengths = dataset
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        json.dumps(
            {
                "inputs": [str(inp)],
                "output": str(tmp_path / "o"),
                "packed_sequence_size": N,
                "strategy": "bfd",
                "packing_buffer_size": 500,
                "seed": 7,
                "long_samples": "drop",
            }
        )
    )
    run_cli("pack", "--config", cfg, "-q")
    check_packs(tmp_path / "o", lengths, np.flatnonzero(lengths <= N))
    bad = run_cli("pack", "--config", cfg, "--packing-buffer-size", "0", "--overwrite", "-q", check=False)
    assert bad.returncode == 2 and "packing_buffer_size" in bad.stderr
