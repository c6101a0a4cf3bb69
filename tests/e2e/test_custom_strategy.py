"""``--strategy module:callable``: Energon-style custom packing policies through the real CLI."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.errors import EXIT_INPUT, EXIT_USAGE
from packtool.reading import read_packs
from tests.conftest import ROOT, manifest_json, run_cli

N = 256
EXAMPLE = ROOT / "configs" / "custom_policy.py"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(5)
    lengths = np.clip(rng.lognormal(np.log(40), 0.9, 600).astype(np.int64), 1, N)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = pa.array(np.arange(offsets[-1], dtype=np.int64) + 1)
    path = tmp_path_factory.mktemp("custom") / "tokens.parquet"
    pq.write_table(pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), ids)}), path)
    return path, lengths


def policy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "policy.py"
    path.write_text("import numpy as np\n\n" + textwrap.dedent(body))
    return f"{path}:select_samples_to_pack"


def pack(inp: Path, out: Path, strategy: str, *flags: str, check: bool = True):
    return run_cli(
        "pack", inp, "-o", out, "--packed-sequence-size", N, "--strategy", strategy, "-q", "--overwrite",
        *flags, check=check,
    )  # fmt: skip


def first_fit(lengths: np.ndarray, start: int = 0) -> list[list[int]]:
    groups, room = [], []
    for i, length in enumerate(lengths.tolist()):
        for g, r in enumerate(room):
            if length <= r:
                groups[g].append(start + i)
                room[g] -= length
                break
        else:
            groups.append([start + i])
            room.append(N - length)
    return groups


def test_example_policy_packs_its_groups_in_order(dataset, tmp_path):
    inp, lengths = dataset
    pack(inp, tmp_path / "o", f"{EXAMPLE}:select_samples_to_pack", "--packing-buffer-size", "250")
    got = [p["sample_index"].tolist() for p in read_packs(tmp_path / "o", with_sample_index=True)]
    want = [g for a in range(0, len(lengths), 250) for g in first_fit(lengths[a : a + 250], a)]
    assert got == want  # one pack per group, group order, sample order inside a group
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for p in read_packs(tmp_path / "o", with_sample_index=True):
        at = 0
        for s, ln in zip(p["sample_index"].tolist(), p["seq_lens"].tolist(), strict=False):
            assert np.array_equal(p["input_ids"][at : at + ln], np.arange(offsets[s], offsets[s + 1]) + 1)
            assert np.array_equal(p["position_ids"][at : at + ln], np.arange(ln))
            at += ln
        assert p["seq_lens"].sum() == N
    m = manifest_json(tmp_path / "o")
    assert m["stats"]["num_tokens"] == int(lengths.sum())


def test_policy_is_given_the_runs_n_and_seed(dataset, tmp_path):
    """The example policy packs to --packed-sequence-size (it read N from the environment before: 1024
    by default, whatever the run's N); a policy naming seed gets --seed; one of one argument still runs."""
    inp, lengths = dataset
    run_cli("pack", inp, "-o", tmp_path / "o", "--packed-sequence-size", 2 * N, "-q",
            "--strategy", f"{EXAMPLE}:select_samples_to_pack")  # fmt: skip
    got = [p["sample_index"].tolist() for p in read_packs(tmp_path / "o", with_sample_index=True)]
    groups, room = [], []
    for i, length in enumerate(lengths.tolist()):  # first-fit at 2N
        g = next((g for g, r in enumerate(room) if length <= r), None)
        if g is None:
            groups.append([i])
            room.append(2 * N - length)
        else:
            groups[g].append(i)
            room[g] -= length
    assert got == groups
    spec = policy(
        tmp_path,
        """
        def select_samples_to_pack(samples, seed):
            rng = np.random.default_rng(seed)
            assert seed == 7
            return [[s] for s in rng.permutation(samples)]
        """,
    )
    pack(inp, tmp_path / "s", spec, "--seed", "7")
    one = policy(tmp_path, "def select_samples_to_pack(samples):\n    return [[s] for s in samples]\n")
    pack(inp, tmp_path / "one", one)


def test_sample_left_out_is_an_error_naming_it(dataset, tmp_path):
    inp, _ = dataset
    spec = policy(
        tmp_path,
        """
        def select_samples_to_pack(samples):
            return [[s] for s in samples if s["index"] != 17]
        """,
    )
    proc = pack(inp, tmp_path / "o", spec, check=False)
    assert proc.returncode == EXIT_INPUT
    assert f"{inp}, row 17, field 'input_ids'" in proc.stderr and "left out of every group" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_sample_in_two_groups_is_an_error(dataset, tmp_path):
    inp, _ = dataset
    spec = policy(
        tmp_path,
        """
        def select_samples_to_pack(samples):
            return [[s] for s in samples] + [[samples[3]]]
        """,
    )
    proc = pack(inp, tmp_path / "o", spec, check=False)
    assert proc.returncode == EXIT_INPUT and f"{inp}, row 3" in proc.stderr and "two groups" in proc.stderr


def test_group_longer_than_n_is_an_error(dataset, tmp_path):
    inp, _ = dataset
    spec = policy(
        tmp_path,
        """
        def select_samples_to_pack(samples):
            return [samples]
        """,
    )
    proc = pack(inp, tmp_path / "o", spec, check=False)
    assert proc.returncode == EXIT_INPUT and "more than packed_sequence_size 256" in proc.stderr
    assert f"{inp}, row 0" in proc.stderr


def test_not_a_list_of_groups_and_split_are_rejected(dataset, tmp_path):
    inp, _ = dataset
    spec = policy(tmp_path, "def select_samples_to_pack(samples):\n    return None\n")
    proc = pack(inp, tmp_path / "o", spec, check=False)
    assert proc.returncode == 2 and "must return a list of groups" in proc.stderr
    proc = pack(inp, tmp_path / "o", f"{EXAMPLE}:select_samples_to_pack", "--split-across-pack", check=False)
    assert proc.returncode == EXIT_USAGE and "--split-across-pack on and --strategy" in proc.stderr
    proc = pack(inp, tmp_path / "o", f"{tmp_path}/nothere.py:f", check=False)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_pack_selected_samples_output_is_written(dataset, tmp_path):
    """A pack_selected_samples that reverses each group and marks tokens: its packs are what is written."""
    inp, lengths = dataset
    spec = policy(
        tmp_path,
        f"""
        def select_samples_to_pack(samples):
            groups, room = [], 0
            for s in samples:
                if not groups or s["length"] > room:
                    groups.append([])
                    room = {N}
                groups[-1].append(s)
                room -= s["length"]
            return groups

        def pack_selected_samples(group):
            group = group[::-1]
            return {{
                "input_ids": np.concatenate([s["input_ids"] for s in group]) * 2,
                "labels": np.concatenate([s["labels"] for s in group]),
                "seq_lens": [s["length"] for s in group],
                "sample_index": [s["index"] for s in group],
            }}
        """,
    )
    one = tmp_path / "one"
    pack(inp, one, spec, "--num-proc", "1", "--shard-size", "16")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    packs = list(read_packs(one, with_sample_index=True))
    order = np.concatenate([p["sample_index"][::-1] for p in packs])
    assert np.array_equal(order, np.arange(len(lengths)))  # in-order groups, reversed inside a pack
    for p in packs:
        at = 0
        for s, ln in zip(p["sample_index"].tolist(), p["seq_lens"].tolist(), strict=False):
            want = 2 * (np.arange(offsets[s], offsets[s + 1]) + 1)
            assert np.array_equal(p["input_ids"][at : at + ln], want)
            at += ln
        assert np.all(p["input_ids"][at:] == 0) and np.all(p["labels"][at:] == -100)
    m1 = manifest_json(one)
    pack(inp, one, spec, "--num-proc", "2", "--shard-size", "16")
    m2 = manifest_json(one)
    assert len(m1["shards"]) > 1
    assert [s["sha256"] for s in m1["shards"]] == [s["sha256"] for s in m2["shards"]]


def test_bad_pack_from_pack_selected_samples(dataset, tmp_path):
    inp, _ = dataset
    spec = policy(
        tmp_path,
        """
        def select_samples_to_pack(samples):
            return [[s] for s in samples]

        def pack_selected_samples(group):
            return {"input_ids": group[0]["input_ids"], "labels": group[0]["labels"][:-1]}
        """,
    )
    proc = pack(inp, tmp_path / "o", spec, check=False)
    assert proc.returncode == 2 and "must be the same length" in proc.stderr


def test_the_examples_merging_pack_selected_samples_is_accounted_for(dataset, tmp_path):
    """``configs/custom_policy.py``'s ``pack_with_separator``, used as its docstring says (renamed to
    ``pack_selected_samples``): one sequence per group, naming only the group's first sample. Every
    sample of a group is packed whole by the policy, the fates add up, and ``verify --source`` says it
    cannot compare the policy's tokens with the source instead of reporting false losses."""
    inp, lengths = dataset
    source = EXAMPLE.read_text().replace("def pack_with_separator(", "def pack_selected_samples(")
    (tmp_path / "merge.py").write_text(source)
    out = tmp_path / "out"
    proc = pack(inp, out, f"{tmp_path / 'merge.py'}:select_samples_to_pack")
    assert "warning" not in proc.stderr
    stats = manifest_json(out)["stats"]
    assert stats["whole_samples"] == stats["packed_samples"] == len(lengths)
    assert stats["policy_packs"] == stats["num_packs"] and stats["num_tokens"] == int(np.sum(lengths))
    packs = list(read_packs(out, with_sample_index=True))
    assert all(len(p["seq_lens"]) <= 2 and len(p["sample_index"]) == 1 for p in packs)
    assert run_cli("verify", out).returncode == 0
    proc = run_cli("verify", out, "--source", inp, check=False)
    assert proc.returncode == EXIT_USAGE
    assert "--source cannot check this output: its" in proc.stderr
    assert "pack_selected_samples returned" in proc.stderr
