"""Every sample not packed whole is counted and said: in the pack summary, in ``inspect`` and in
``inspect --json``'s ``warnings``, with counts that add up to the input; ``--strict`` makes any loss an
error before a shard is written.

The input is pretokenized JSON Lines with lengths chosen by hand, so every figure below is exact:
10 samples of 5 tokens, 3 of 20 (longer than N = 16), 2 empty ones and 1 line that is not JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packtool.errors import EXIT_PROBLEMS
from packtool.reading import read_packs
from tests.conftest import DEMO_TOKENIZER, run_cli, write_jsonl

N = 16
SHORT, LONG, EMPTY = 10, 3, 2
INPUT_SAMPLES = SHORT + LONG + EMPTY + 1  # + the bad line
INPUT_TOKENS = SHORT * 5 + LONG * 20  # the bad line is never tokenized


@pytest.fixture
def source(tmp_path: Path) -> Path:
    rows = [{"input_ids": list(range(1, 6))} for _ in range(SHORT)]
    rows += [{"input_ids": list(range(1, 21))} for _ in range(LONG)]
    rows += [{"input_ids": []} for _ in range(EMPTY)]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    with open(path, "a") as f:
        f.write("{not json\n")
    return path


def pack(tmp_path: Path, source: Path, *flags: str, check: bool = True):
    out = tmp_path / "out"
    proc = run_cli(
        "pack",
        source,
        "-o",
        out,
        "--packed-sequence-size",
        N,
        "--on-error",
        "skip",
        "-q",
        *flags,
        check=check,
    )
    return proc, out


def warnings_of(proc) -> list[str]:
    """The run's warnings; with -q the only other lines are the result (``packed ... -> OUT``, tokens)."""
    lines = proc.stderr.splitlines()
    assert all(line.startswith(("packtool: warning: ", "packed ", "tokens: ")) for line in lines), lines
    warning = "packtool: warning: "
    return [line.removeprefix(warning) for line in lines if line.startswith(warning)]


def report(out: Path) -> dict:
    return json.loads(run_cli("inspect", out, "--json").stdout)


def assert_adds_up(r: dict, fates: dict[str, int], tokens: dict[str, int]) -> None:
    """The fates are exactly ``fates`` (the rest 0) and add up to the input; same for the tokens."""
    assert {k: v for k, v in r["sample_fates"].items() if v} == fates
    assert sum(r["sample_fates"].values()) == r["input_samples"] == INPUT_SAMPLES
    assert {k: v for k, v in r["token_fates"].items() if v} == tokens
    assert sum(r["token_fates"].values()) == r["input_tokens"] == INPUT_TOKENS


EMPTY_LINE = f"{EMPTY} of {INPUT_SAMPLES} samples were empty (no tokens) and left out"
SKIPPED_LINE = (
    f"1 of {INPUT_SAMPLES} records were bad and skipped (malformed_json 1; on_error=skip, first ones in "
    "errors.jsonl)"
)


def test_truncate_is_said(tmp_path, source):
    proc, out = pack(tmp_path, source, "--long-samples", "truncate")
    said = warnings_of(proc)
    truncated = (
        f"{LONG} of {INPUT_SAMPLES} samples were truncated to {N} tokens "
        "(12 tokens cut; long_samples=truncate)"
    )
    assert said == [
        truncated,
        EMPTY_LINE,
        SKIPPED_LINE,
        f"in all 6 of {INPUT_SAMPLES} samples were not packed whole and 12 of {INPUT_TOKENS} tokens are not "
        "in the packs, and 1 bad record was skipped (its tokens not known: never encoded) (--strict makes "
        "this an error)",
    ]
    r = report(out)
    assert_adds_up(
        r,
        {"packed whole": SHORT, "truncated": LONG, "empty, left out": EMPTY, "bad record, skipped": 1},
        {"packed": INPUT_TOKENS - 12, "cut by truncation": 12},
    )
    assert r["warnings"] == [f"lost: {line}" for line in said[:-1]]


def test_drop_is_said(tmp_path, source):
    proc, out = pack(tmp_path, source, "--long-samples", "drop")
    dropped = (
        f"{LONG} of {INPUT_SAMPLES} samples longer than {N} tokens were dropped "
        "(60 tokens; long_samples=drop)"
    )
    assert warnings_of(proc)[0] == dropped
    r = report(out)
    assert_adds_up(
        r,
        {
            "packed whole": SHORT,
            "too long, dropped": LONG,
            "empty, left out": EMPTY,
            "bad record, skipped": 1,
        },
        {"packed": 50, "in dropped samples": 60},
    )
    assert f"lost: {dropped}" in r["warnings"]


def test_max_packs_is_said(tmp_path, source):
    # split: 110 tokens in 7 packs of 16 (sequential keeps the input order); 2 packs keep 32 tokens:
    # samples 0-5 (30 tokens, sample 3 split over the two) and 2 tokens of sample 6; 3 short and the 3
    # long samples are left out
    proc, out = pack(tmp_path, source, "--split-across-pack", "--strategy", "sequential", "--max-packs", "2")
    line = f"6 of {INPUT_SAMPLES} samples were left out by max_packs 2, 1 more cut short (78 tokens)"
    assert line in warnings_of(proc)
    r = report(out)
    assert_adds_up(
        r,
        {
            "packed whole": 5,
            "split across packs": 1,
            "partly cut by max_packs": 1,
            "left out by max_packs": 3 + LONG,
            "empty, left out": EMPTY,
            "bad record, skipped": 1,
        },
        {"packed": 32, "cut by max_packs": 78},
    )
    assert f"lost: {line}" in r["warnings"]


def test_truncate_with_max_packs_pairs_each_fate_with_its_own_tokens(tmp_path):
    """Truncated samples that --max-packs then leaves out are max_packs' fate, with every token they lost
    (their truncated tail too): "N samples were truncated (T tokens cut)" counts only the truncated
    samples in the packs, whose cut is T. The expected figures come from the input's lengths and the
    samples the packs hold, not from packtool's accounting."""
    lengths = [20, 5, 30, 7, 40, 5, 25, 3, 50, 6]
    src = write_jsonl(tmp_path / "in.jsonl", [{"input_ids": list(range(1, n + 1))} for n in lengths])
    out = tmp_path / "out"
    proc = run_cli("pack", src, "-o", out, "--packed-sequence-size", N, "--long-samples", "truncate",
                   "--strategy", "sequential", "--max-packs", 3, "-q")  # fmt: skip
    present = {int(i) for p in read_packs(out, with_sample_index=True) for i in p["sample_index"]}
    absent = set(range(len(lengths))) - present
    truncated = [s for s in present if lengths[s] > N]
    cut = sum(lengths[s] - N for s in truncated)
    over_tokens = sum(lengths[s] for s in absent)
    assert truncated and cut and any(lengths[s] > N for s in absent)  # the case the pairs were wrong in
    total = len(lengths)
    assert warnings_of(proc)[:2] == [
        f"{len(truncated)} of {total} samples were truncated to {N} tokens ({cut} tokens cut; "
        "long_samples=truncate)",
        f"{len(absent)} of {total} samples were left out by max_packs 3 ({over_tokens} tokens)",
    ]
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert (stats["truncated_samples"], stats["truncated_tokens"]) == (len(truncated), cut)
    assert (stats["samples_over_max_packs"], stats["tokens_over_max_packs"]) == (len(absent), over_tokens)
    r = report(out)
    packed = sum(min(lengths[s], N) for s in present)
    assert {k: v for k, v in r["token_fates"].items() if v} == {
        "packed": packed,
        "cut by truncation": cut,
        "cut by max_packs": over_tokens,
    }
    assert packed + cut + over_tokens == sum(lengths)


def test_nothing_to_learn_is_said(tmp_path):
    rows = [{"prompt": f"say {i}", "completion": " ok" if i % 4 else ""} for i in range(12)]
    src = write_jsonl(tmp_path / "sft.jsonl", rows)
    proc = run_cli(
        "pack", src, "-o", tmp_path / "out", "--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", 64, "-q"
    )
    (line, total) = warnings_of(proc)
    assert line.startswith("3 of 12 samples had nothing to learn (every label -100) and were left out (")
    assert line.endswith("tokens; empty_loss=drop)")
    r = json.loads(run_cli("inspect", tmp_path / "out", "--json").stdout)
    assert {k: v for k, v in r["sample_fates"].items() if v} == {
        "packed whole": 9,
        "nothing to learn, left out": 3,
    }
    assert sum(r["token_fates"].values()) == r["input_tokens"]
    assert r["token_fates"]["in samples with nothing to learn"] > 0
    assert r["warnings"] == [f"lost: {line}"]
    assert total.startswith("in all 3 of 12 samples were not packed whole")


def test_strict_refuses_any_loss_before_writing(tmp_path, source):
    proc, out = pack(tmp_path, source, "--long-samples", "drop", "--strict", check=False)
    assert proc.returncode == EXIT_PROBLEMS
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("packtool: error: --strict: not every sample would be packed whole")
    assert "were dropped (60 tokens" in line and "were empty" in line and "were bad and skipped" in line
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_strict_passes_when_nothing_is_lost(tmp_path):
    src = write_jsonl(tmp_path / "ok.jsonl", [{"input_ids": [1, 2, 3]} for _ in range(8)])
    proc = run_cli("pack", src, "-o", tmp_path / "out", "--packed-sequence-size", 8, "--strict", "-q")
    assert [line.split(" -> ")[0] for line in proc.stderr.splitlines()] == [
        "packed 8 of 8 samples whole into 4 packs of 8 tokens (fill rate 75.00%, lower bound 3 packs)"
    ]
    r = json.loads(run_cli("inspect", tmp_path / "out", "--json").stdout)
    assert r["warnings"] == [] and r["losses"] == []
    assert r["sample_fates"]["packed whole"] == 8


def test_summary_line_counts_whole_and_split(tmp_path):
    src = write_jsonl(tmp_path / "s.jsonl", [{"input_ids": list(range(1, 11))} for _ in range(4)])
    proc = run_cli("pack", src, "-o", tmp_path / "out", "--packed-sequence-size", 16, "--split-across-pack")
    (summary,) = [line for line in proc.stderr.splitlines() if line.startswith("packed ")]
    r = json.loads(run_cli("inspect", tmp_path / "out", "--json").stdout)
    whole, split = r["sample_fates"]["packed whole"], r["sample_fates"]["split across packs"]
    assert split >= 1 and whole + split == 4
    # a split sample is not counted as packed whole (inspect's "packed whole" and the summary agree)
    expected = f"packed {whole} of 4 samples whole and {split} split across packs into 3 packs"
    assert summary.startswith(expected)
    assert "warning" not in proc.stderr


def test_summary_line_under_max_packs(tmp_path):
    """--max-packs with --split-across-pack: the summary counts only the samples in one pack as whole;
    the ones cut short or left out are said by the warnings."""
    src = write_jsonl(tmp_path / "s.jsonl", [{"input_ids": list(range(1, 11))} for _ in range(8)])
    proc = run_cli("pack", src, "-o", tmp_path / "out", "--packed-sequence-size", 16, "--split-across-pack",
                   "--max-packs", 3)  # fmt: skip
    (summary,) = [line for line in proc.stderr.splitlines() if line.startswith("packed ")]
    r = json.loads(run_cli("inspect", tmp_path / "out", "--json").stdout)
    whole, split = r["sample_fates"]["packed whole"], r["sample_fates"]["split across packs"]
    assert whole + split < 8 and summary.startswith(f"packed {whole} of 8 samples whole and {split} split")
    assert "left out by max_packs" in proc.stderr
