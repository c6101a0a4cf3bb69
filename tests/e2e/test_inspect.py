"""``packtool inspect`` on real outputs made by the CLI from the demo data.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from packtool.errors import EXIT_INPUT
from packtool.manifest import Manifest
from tests.conftest import DEMO, DEMO_TOKENIZER, rewrite_tar_json, run_cli
from tests.fixtures.inspect_outputs import out, tar_out  # noqa: F401 - fixtures

TRAIN = DEMO / "train.jsonl"
TEXTS = [json.loads(line)["text"] for line in TRAIN.read_text().splitlines()]


def inspect_json(*args) -> dict:
    return json.loads(run_cli("inspect", *args, "--json").stdout)


def test_json_has_the_figures_of_the_manifest(out: Path):
    r = inspect_json(out)
    m = json.loads((out / "manifest.json").read_text())
    s = m["stats"]
    for key in ("num_samples", "num_packs", "fill_rate", "packed_sequence_size", "lower_bound_packs",
                "dropped_samples", "padding_tokens", "split_samples", "truncated_samples"):  # fmt: skip
        assert key in r
    assert r["num_samples"] == 1000 and r["num_packs"] == s["num_packs"]
    assert r["padding_tokens"] == r["num_packs"] * 512 - r["num_tokens"]
    assert r["lower_bound_packs"] == -(-r["num_tokens"] // 512)
    assert r["split_samples"] > 0  # split_across_pack on long demo samples
    assert r["tokenizer"]["vocab_size"] == 1300 and r["tokenizer"]["eos_token_id"] == 1
    assert r["provenance"]["split_across_pack"] is True and r["strategy"] == "sequential"
    assert [sh["path"] for sh in r["shards"]] == ["packs-000000.parquet", "packs-000001.parquet",
                                                  "packs-000002.parquet"]  # fmt: skip
    assert sum(sh["num_packs"] for sh in r["shards"]) == r["num_packs"]
    assert r["shards"][0]["row_groups"] == [32, 32, 32, 4]
    assert r["shards"][0]["fill_rate"] == round(r["shards"][0]["num_tokens"] / (100 * 512), 6)
    h = r["histograms"]
    assert sum(h["sample_lengths"]["counts"]) == 1000
    assert sum(h["pack_fill"]["counts"]) == r["num_packs"]
    assert sum(h["samples_per_pack"]["counts"]) == r["num_packs"]
    assert r["warnings"] == []


def test_terminal_report(out: Path):
    text = run_cli("inspect", out, env={"COLUMNS": "120"}).stdout
    r = inspect_json(out)
    for needle in ("input samples", "packed whole", "split across packs", "input tokens", "fill rate",
                   f"{r['fill_rate']:.2%}", "padding tokens", "packs over lower bound",
                   "samples per pack mean / min / max", "split_across_pack", r["position_ids"],
                   "bos_token_id", "tokenizer sha256", "packs-000002.parquet",
                   "sample lengths (tokens, as read)", "pack fill (real tokens per pack)", "█"):  # fmt: skip
        assert needle in text, needle


def test_full_recomputes_the_same_figures_from_the_data(out: Path):
    r = inspect_json(out, "--full")
    rec = r["recomputed"]
    for key in ("num_packs", "num_tokens", "packed_samples", "padding_tokens", "fill_rate",
                "lower_bound_packs", "samples_per_pack", "split_samples"):  # fmt: skip
        assert rec[key] == r[key], key
    assert rec["histograms"]["pack_fill"] == r["histograms"]["pack_fill"]
    assert rec["histograms"]["samples_per_pack"] == r["histograms"]["samples_per_pack"]
    assert sum(rec["histograms"]["packed_sample_lengths"]["counts"]) == 1000
    assert r["warnings"] == []
    assert "recomputed from the data (--full)" in run_cli("inspect", out, "--full").stdout


def test_full_and_fast_notice_a_manifest_that_lies(out: Path, tmp_path: Path):
    bad = Path(shutil.copytree(out, tmp_path / "bad"))
    m = json.loads((bad / "manifest.json").read_text())
    m["stats"]["num_tokens"] += 5
    m["shards"][1]["num_packs"] += 1
    (bad / "manifest.json").write_text(json.dumps(m))
    r = inspect_json(bad, "--full")
    assert "packs-000001.parquet: num_packs 100 in the file, 101 in the manifest" in r["warnings"]
    assert "packs-000001.parquet, field 'num_packs': holds 100 packs, manifest says 101" in r["warnings"]
    assert any(w.startswith("num_tokens:") for w in r["warnings"])
    # the fast path reads the footer only, and still sees the pack count and tokens that do not add up
    assert inspect_json(bad)["warnings"] == [
        "manifest: token fates add up to 136,006, not the 136,001 input tokens",
        "packs-000001.parquet: num_packs 100 in the file, 101 in the manifest",
    ]


def test_fast_path_notices_a_manifest_from_another_run(out: Path, tmp_path: Path):
    bad = Path(shutil.copytree(out, tmp_path / "bad"))
    m = json.loads((bad / "manifest.json").read_text())
    real, m["run_id"] = m["run_id"], "0123456789abcdef"
    (bad / "manifest.json").write_text(json.dumps(m))
    warnings = inspect_json(bad)["warnings"]
    assert f"packs-000000.parquet: run_id {real} in the file, 0123456789abcdef in the manifest" in warnings
    assert len(warnings) == 3  # one per shard
    assert "warning:" in run_cli("inspect", bad).stdout


def test_plot_writes_a_png(out: Path, tmp_path: Path):
    png = tmp_path / "hist.png"
    proc = run_cli("inspect", out, "--plot", png)
    assert "histograms written to" in proc.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_one_pack_decoded_at_sample_boundaries(out: Path):
    r = inspect_json(out)
    last = r["num_packs"] - 1
    for i in (0, 150, last):
        p = inspect_json(out, "--pack", str(i), "--decode")
        assert sum(p["seq_lens"]) == 512
        assert [q["sample_index"] for q in p["pieces"]] == p["sample_index"]
        assert p["padding_tokens"] == 512 - sum(q["length"] for q in p["pieces"])
        for q in p["pieces"]:
            full = TEXTS[q["sample_index"]] + "<|endoftext|>"
            assert q["text"] and q["text"] in full  # a piece of a split sample is part of its text
        whole = [q for q in p["pieces"][1:-1]]  # inner pieces are whole samples
        for q in whole:
            assert q["text"] == TEXTS[q["sample_index"]] + "<|endoftext|>"
    assert p["pack"] == last and p["shard"] == "packs-000002.parquet"
    text = run_cli("inspect", out, "--pack", "0", "--decode", env={"COLUMNS": "120"}).stdout
    assert "seq_lens: [" in text and "piece 0: sample 0" in text and TEXTS[0][:40] in text


def test_pack_errors(out: Path, tmp_path: Path):
    r = inspect_json(out)
    proc = run_cli("inspect", out, "--pack", str(r["num_packs"]), check=False)
    assert proc.returncode == 2 and f"the output has {r['num_packs']:,} packs" in proc.stderr
    proc = run_cli("inspect", out, "--decode", check=False)
    assert proc.returncode == 2 and "--pack" in proc.stderr
    # a manifest whose tokenizer is not here: say so, and --tokenizer decodes anyway
    moved = Path(shutil.copytree(out, tmp_path / "moved"))
    m = json.loads((moved / "manifest.json").read_text())
    m["tokenizer"]["name"] = str(tmp_path / "gone" / "tokenizer.json")
    m["tokenizer"]["path"] = str(tmp_path / "gone2" / "tokenizer.json")
    (moved / "manifest.json").write_text(json.dumps(m))
    proc = run_cli("inspect", moved, "--pack", "0", "--decode", check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"packtool: error: tokenizer of the run not found: tried {tmp_path / 'gone' / 'tokenizer.json'}, "
        f"{tmp_path / 'gone2' / 'tokenizer.json'}; pass --tokenizer PATH to decode"
    )
    p = inspect_json(moved, "--pack", "0", "--decode", "--tokenizer", DEMO_TOKENIZER)
    assert p["pieces"][1]["text"] == TEXTS[p["pieces"][1]["sample_index"]] + "<|endoftext|>"
    # the message says where the missing path came from
    proc = run_cli("inspect", out, "--pack", "0", "--decode", "--tokenizer", tmp_path / "none", check=False)
    assert proc.returncode == 2 and f"--tokenizer {tmp_path / 'none'}: not found" in proc.stderr
    assert "from the manifest" not in proc.stderr


def _damaged_copies(out: Path, tmp_path: Path) -> dict[str, Path]:
    """Copies of ``out`` whose shard 1 (packs 100..199, row groups of 32) is damaged in one way each."""
    import pyarrow.parquet as pq

    copies = {}
    for how in ("truncated", "footer", "page", "missing"):
        copy = copies[how] = Path(shutil.copytree(out, tmp_path / how))
        shard = copy / "packs-000001.parquet"
        data = bytearray(shard.read_bytes())
        if how == "truncated":
            del data[-3000:]
        elif how == "footer":
            data[-200] ^= 0xFF
        elif how == "page":  # the zstd frame of row group 1's input_ids (packs 132..163)
            chunk = pq.ParquetFile(out / shard.name).metadata.row_group(1).column(0)
            data[data.index(b"\x28\xb5\x2f\xfd", chunk.data_page_offset)] ^= 0xFF
        if how == "missing":
            shard.unlink()
        else:
            shard.write_bytes(data)
    return copies


def test_one_pack_of_a_damaged_parquet_shard_names_the_shard(out: Path, tmp_path: Path):
    """``--pack I`` on a damaged Parquet shard is a one-line error naming the shard and the pack, as for a
    tar shard (not an internal error, not an error with an empty location)."""
    from packtool.errors import PacktoolError
    from packtool.inspect import read_one_pack

    copies = _damaged_copies(out, tmp_path)
    m = Manifest.load(out)
    reasons = {
        "truncated": "does not parse as Parquet: Parquet magic bytes not found in footer",
        "footer": "does not parse as Parquet: ",
        "page": "pack 132: row group 1 does not parse: could not verify page integrity, CRC checksum",
        "missing": "missing",
    }
    for how, reason in reasons.items():
        shard = copies[how] / "packs-000001.parquet"
        with pytest.raises(PacktoolError) as e:
            read_one_pack(copies[how], m, 140)
        msg = str(e.value)
        assert msg.startswith(f"{shard}: pack 140 cannot be read (") and reason in msg, msg
        assert msg.endswith("; run packtool verify"), msg
    # the other row groups of the shard with a damaged page still read
    got, name, row = read_one_pack(copies["page"], m, 170)
    want, _, _ = read_one_pack(out, m, 170)
    assert (name, row) == ("packs-000001.parquet", 70) and got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    proc = run_cli("inspect", copies["page"], "--pack", "140", check=False)
    assert proc.returncode == EXIT_INPUT and "internal error" not in proc.stderr
    assert proc.stderr.startswith(f"packtool: error: {copies['page'] / 'packs-000001.parquet'}: pack 140")


def test_one_pack_of_a_damaged_tar_shard_names_the_shard_the_same_way(tar_out: Path, tmp_path: Path):
    """A damaged member found through the .tar.idx gives the message of the Parquet shards, with the
    reason found reading the shard in order."""
    copy = Path(shutil.copytree(tar_out, tmp_path / "out"))
    shard = copy / "packs-000001.tar"
    start = int(np.fromfile(copy / "packs-000001.tar.idx", dtype="<u8")[49])
    data = bytearray(shard.read_bytes())
    data[data.index(b"fortran_order", start)] ^= 0xFF  # a .npy header of pack 149
    shard.write_bytes(data)
    proc = run_cli("inspect", copy, "--pack", "149", check=False)
    assert proc.returncode == EXIT_INPUT and proc.stderr.startswith(
        f"packtool: error: {shard}: pack 149 cannot be read (field '"
    )
    assert "has a bad .npy header" in proc.stderr and "; run packtool verify" in proc.stderr


def test_not_an_output_directory(tmp_path: Path):
    proc = run_cli("inspect", tmp_path, check=False)
    assert proc.returncode == EXIT_INPUT and "no manifest.json" in proc.stderr


def test_tar_output_fast_full_and_one_pack(tar_out: Path, out: Path):
    r, parquet = inspect_json(tar_out), inspect_json(out)
    assert r["shard_format"] == "webdataset" and r["warnings"] == []
    assert [sh["path"] for sh in r["shards"]] == [f"packs-00000{i}.tar" for i in range(3)]
    for key in ("num_packs", "num_tokens", "fill_rate", "split_samples", "histograms"):
        assert r[key] == parquet[key], key  # the same packs as the Parquet output
    full = inspect_json(tar_out, "--full")
    assert full["warnings"] == []
    for key in (
        "num_packs",
        "num_tokens",
        "packed_samples",
        "fill_rate",
        "samples_per_pack",
        "split_samples",
    ):
        assert full["recomputed"][key] == r[key], key
    text = run_cli("inspect", tar_out, env={"COLUMNS": "120"}).stdout
    assert "packs-000002.tar" in text and "webdataset" in text and "fill rate" in text
    last = r["num_packs"] - 1
    p = inspect_json(tar_out, "--pack", str(last), "--decode")
    assert p["shard"] == "packs-000002.tar" and p["row"] == last - 200
    assert p == inspect_json(out, "--pack", str(last), "--decode") | {"shard": "packs-000002.tar"}


def test_tar_fast_path_notices_a_foreign_manifest_and_a_wrong_count(tar_out: Path, tmp_path: Path):
    bad = Path(shutil.copytree(tar_out, tmp_path / "bad"))
    m = json.loads((bad / "manifest.json").read_text())
    real, m["run_id"] = m["run_id"], "0123456789abcdef"
    m["shards"][1]["num_packs"] += 1
    (bad / "manifest.json").write_text(json.dumps(m))
    warnings = inspect_json(bad)["warnings"]
    assert f"packs-000000.tar: run_id {real} in the file, 0123456789abcdef in the manifest" in warnings
    assert "packs-000001.tar: num_packs 100 in the file, 101 in the manifest" in warnings
    assert len(warnings) == 4  # run_id of each shard, and the count
    # an output written before format_version 2: no run_id or shard in the .json, nothing to compare
    old = Path(shutil.copytree(tar_out, tmp_path / "old"))
    for path in sorted(old.glob("*.tar")):
        rewrite_tar_json(path, lambda meta: {k: meta[k] for k in ("pack_index", "num_tokens", "num_samples")})
    assert inspect_json(old)["warnings"] == []
    # a stale .tar.idx: the fast path cannot read the shard's packs where the index says they are
    shutil.copy(bad / "packs-000002.tar.idx", bad / "packs-000000.tar.idx")
    warnings = inspect_json(bad)["warnings"]
    size = (bad / "packs-000000.tar").stat().st_size
    assert (
        f"packs-000000.tar: metadata unreadable (packs-000000.tar.idx does not end where the tar's {size:,} "
        "bytes do (stale index?))" in warnings
    )


def test_pack_shows_where_each_piece_comes_from_and_what_is_trained(tmp_path: Path):
    """From another directory, with relative paths at pack time: source line, offset in the sample,
    continuation, and the decoded text cut into trained and untrained segments."""
    rows = [{"prompt": f"question {i}?", "completion": f" answer {i} " + "word " * 40} for i in range(6)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(DEMO_TOKENIZER, tmp_path / "data" / "tok.json")
    run_cli("pack", "data/sft.jsonl", "-o", "out", "--tokenizer", "data/tok.json",
            "--packed-sequence-size", 32, "--split-across-pack", "--strategy", "sequential", "-q",
            cwd=tmp_path)  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plain = json.loads(run_cli("inspect", "../out", "--pack", "1", "--json", cwd=elsewhere).stdout)
    assert plain["pieces"][0]["source"] == {  # from the manifest alone: nothing outside the output opened
        "source": "data/sft.jsonl",
        "sample_in_source": 0,
        "row_kind": None,
        "row": None,
    }
    locate = ["--locate", "--decode", "--json"]
    p = json.loads(run_cli("inspect", "../out", "--pack", "1", *locate, cwd=elsewhere).stdout)
    first = p["pieces"][0]
    assert first["continuation"] and first["sample_offset"] == 32 and first["sample_index"] == 0
    assert first["source"] == {
        "source": "data/sft.jsonl",
        "sample_in_source": 0,
        "row_kind": "line",
        "row": 1,
    }
    assert "".join(seg["text"] for seg in first["segments"]).strip() == first["text"].strip()
    # all of it is the completion; its first token's target was taken in the pack before (shifted labels)
    assert [seg["trained"] for seg in first["segments"]] == [False, True]
    assert len(first["segments"][0]["text"].split()) <= 1
    whole = json.loads(run_cli("inspect", "../out", "--pack", "0", *locate, cwd=elsewhere).stdout)
    start = whole["pieces"][0]
    assert not start["continuation"] and start["sample_offset"] == 0
    assert [seg["trained"] for seg in start["segments"]] == [False, True]  # the prompt, then the answer
    assert "question 0?" in start["segments"][0]["text"] and "answer 0" in start["segments"][1]["text"]
    text = run_cli(
        "inspect", "../out", "--pack", "1", "--locate", "--decode", cwd=elsewhere, env={"COLUMNS": "200"}
    ).stdout
    assert "data/sft.jsonl:1" in text and "32 (continued)" in text and "continued from token 32" in text


# --- a mixture -------------------------------------------------------------------------------------------
def test_inspect_of_a_mixture_gives_each_sources_figures_and_share(out: Path, tar_out: Path, tmp_path: Path):
    """A mixture file (repeats) and directories with --weight: each source's packs, tokens and fill from its
    manifest, and what an epoch takes of it: exact for repeats, expected for weights."""
    mixture = tmp_path / "mixture.yaml"
    mixture.write_text(f"sources:\n  - {{path: {out}, repeat: 2}}\n  - {{path: {tar_out}, repeat: 0.5}}\n")
    r = inspect_json(mixture)
    stats = [json.loads((d / "manifest.json").read_text())["stats"] for d in (out, tar_out)]
    assert r["kind"] == "repeat" and r["packed_sequence_size"] == 512 and r["mixture"] == str(mixture)
    a, b = r["sources"]
    assert (a["path"], a["repeat"], b["repeat"]) == (str(out), 2.0, 0.5)
    assert [a["packs"], b["packs"]] == [s["num_packs"] for s in stats]
    assert [a["tokens"], b["tokens"]] == [s["num_tokens"] for s in stats]
    assert a["fill_rate"] == stats[0]["fill_rate"]
    assert [a["epoch_packs"], b["epoch_packs"]] == [2 * a["packs"], b["packs"] // 2]
    assert [a["source_epochs"], b["source_epochs"]] == [2.0, round(b["packs"] // 2 / b["packs"], 4)]
    want = 2 * a["tokens"] / (2 * a["tokens"] + b["packs"] // 2 * b["tokens"] / b["packs"])
    assert abs(a["token_share"] - want) < 1e-6 and abs(a["token_share"] + b["token_share"] - 1) < 1e-5
    text = run_cli("inspect", mixture, env={"COLUMNS": "100"}).stdout
    for needle in (str(out), str(tar_out), "repeat", "tokens/ep", f"{a['token_share']:.2%}", "laps"):
        assert needle in text, needle
    w = inspect_json(out, tar_out, "--weight", "3", "--weight", "1")
    assert w["kind"] == "weight" and [s["pack_share"] for s in w["sources"]] == [0.75, 0.25]
    assert w["epoch_packs"] == a["packs"] + b["packs"]


def test_inspect_refuses_a_mixture_it_cannot_read(out: Path, tar_out: Path, tmp_path: Path):
    """Outputs that do not mix (another packed_sequence_size), a bad share, shares that do not match the
    directories, and the one-output options: exit 2, one line."""
    other = tmp_path / "n256"
    run_cli("pack", TRAIN, "-o", other, "--tokenizer", DEMO_TOKENIZER, "-q", "--packed-sequence-size", "256",
            "--long-samples", "truncate")  # fmt: skip
    cases = [
        ((out, other, "--weight", "1", "--weight", "1"), f"cannot mix {out} and {other}: they differ in "
                                                          "packed_sequence_size (512 and 256)"),
        ((out, tar_out, "--weight", "1", "--weight", "-1"), "sources[1]: weight must be a finite positive"),
        ((out, tar_out), "takes one --weight (or --repeat) each"),
        ((out, tar_out, "--weight", "1", "--repeat", "1"), "--weight and --repeat"),
        ((out, tar_out, "--weight", "1", "--weight", "1", "--pack", "0"), "go with one output directory"),
    ]  # fmt: skip
    for args, message in cases:
        proc = run_cli("inspect", *args, check=False)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1, args
