"""Bad input and faults, each on a real file through the real CLI (``packtool.errors``, ``--on-error``).

Every failure must be: one line on stderr naming the file, the row and the field where there is one; exit
code 3 for bad input, 2 for bad options (4 for a failure to write); and no output directory, ``.partial``
or lock left behind. Under ``--on-error skip`` the bad records are left out, counted by reason in the
manifest and in ``inspect --json``, and logged to ``errors.jsonl``.


(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool import run_pack
from packtool.errors import EXIT_INPUT, EXIT_USAGE
from packtool.options import PackOptions
from packtool.reading import read_packs
from tests.conftest import DEMO, DEMO_TOKENIZER, run_cli, write_jsonl

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
GOOD = [{"text": f"sample number {i} has a few words"} for i in range(6)]


def pack(tmp_path: Path, inputs, *extra: str, out: str = "out", check: bool = False, **kw):
    inputs = inputs if isinstance(inputs, list | tuple) else [inputs]
    args = [*map(str, inputs), "-o", str(tmp_path / out), "-q", *extra]
    if "--packed-sequence-size" not in extra:
        args += ["--packed-sequence-size", "64"]
    return run_cli("pack", *args, check=check, **kw)


def assert_clean_failure(
    proc: subprocess.CompletedProcess, tmp_path: Path, code: int = EXIT_INPUT, out: str = "out"
):
    """Exit code ``code``, exactly one line on stderr, and nothing left that looks like output."""
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("packtool: error: "), proc.stderr
    assert not (tmp_path / out).exists()
    assert not (tmp_path / f"{out}.partial").exists()
    assert not (tmp_path / f"{out}.lock").exists()
    return lines[0]


def manifest(tmp_path: Path, out: str = "out") -> dict:
    return json.loads((tmp_path / out / "manifest.json").read_text())


def errors_log(tmp_path: Path, out: str = "out") -> list[dict]:
    return [json.loads(line) for line in (tmp_path / out / "errors.jsonl").read_text().splitlines()]


def packed_tokens(directory: Path) -> list[list[int]]:
    """Every pack's real tokens (padding left out), in order."""
    out = []
    for p in read_packs(directory):
        used = int(p["seq_lens"].sum()) - (int(p["seq_lens"][-1]) if p["labels"][-1] == -100 else 0)
        out.append(p["input_ids"][:used].tolist())
    return out


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def jl(rec: dict) -> bytes:
    return json.dumps(rec).encode()


# --- bad records: fail names them, skip counts them -------------------------------------------------------
BAD_RECORD_CASES = {
    # name: (lines of the file (line 3 is the bad one), extra flags, expected field, reason, words in message)
    "malformed_json": ([b'{"text": "sample three", '], [], None, "malformed_json", "malformed JSON"),
    "not_an_object": ([b'["a", "list"]'], [], None, "not_object", "expected a JSON object"),
    "non_utf8_bytes": ([b'{"text": "caf\xe9 \xff"}'], [], None, "not_utf8", "UTF-8"),
    "lone_surrogate": ([b'{"text": "bad \\ud800 escape"}'], [], "text", "not_utf8", "Unicode"),
    "text_wrong_type": ([b'{"text": 12345}'], [], "text", "wrong_type", "expected str"),
    "text_is_a_list": ([b'{"text": ["a", "b"]}'], [], "text", "wrong_type", "got list"),
    "text_missing": ([b'{"body": "no text here"}'], [], "text", "missing_field", "missing"),
    "text_null": ([b'{"text": null}'], [], "text", "missing_field", "null"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORD_CASES))
def test_bad_text_record_fails_with_its_line_and_field(tmp_path, case):
    bad, extra, field, _, words = BAD_RECORD_CASES[case]
    src = write_lines(tmp_path / "in.jsonl", [jl(GOOD[0]), jl(GOOD[1]), *bad, jl(GOOD[2])])
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, *extra), tmp_path)
    assert f"{src}, line 3" in line
    assert words in line
    if field:
        assert f"field '{field}'" in line


@pytest.mark.parametrize("chunk_size", [4096, 20])
def test_fail_names_the_first_bad_record(tmp_path, chunk_size):
    """A text that is not a string at line 51 comes before malformed JSON at line 52: --on-error fail
    names line 51, the first line errors.jsonl lists under --on-error skip, wherever the chunks begin."""
    lines = [jl({"text": f"record {i}"}) for i in range(100)]
    lines[50], lines[51] = jl({"text": 5}), b"{not json"
    src = write_lines(tmp_path / "in.jsonl", lines)
    extra = ("--tokenizer", DEMO_TOKENIZER, "--chunk-size", str(chunk_size))
    line = assert_clean_failure(pack(tmp_path, src, *extra), tmp_path)
    assert f"{src}, line 51, field 'text'" in line
    pack(tmp_path, src, *extra, "--on-error", "skip", check=True)
    first = json.loads((tmp_path / "out" / "errors.jsonl").read_text().splitlines()[0])
    assert first["row"] == 51


def test_wrong_text_field_names_the_fields_and_the_option(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "body": f"record {i}"} for i in range(5)])
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)
    assert "record has: id, body" in line and "--text-field body" in line
    assert "--on-error skip" not in line  # skipping would leave every record out


@pytest.mark.parametrize("case", sorted(BAD_RECORD_CASES))
def test_bad_text_record_is_skipped_counted_and_logged(tmp_path, case):
    bad, extra, field, reason, _ = BAD_RECORD_CASES[case]
    src = write_lines(tmp_path / "in.jsonl", [jl(GOOD[0]), jl(GOOD[1]), *bad, jl(GOOD[2])])
    clean = write_jsonl(tmp_path / "clean.jsonl", GOOD[:3])
    tok = ["--tokenizer", DEMO_TOKENIZER, *extra]
    proc = pack(tmp_path, src, *tok, "--on-error", "skip", check=True)
    pack(tmp_path, clean, *tok, out="clean", check=True)
    stats = manifest(tmp_path)["stats"]
    assert stats["skipped_samples"] == 1 and stats["skipped_by_reason"] == {reason: 1}
    assert stats["num_samples"] == 3 and stats["packed_samples"] == 3
    (entry,) = errors_log(tmp_path)
    assert entry["source"] == str(src) and entry["row"] == 3 and entry["row_kind"] == "line"
    assert entry["reason"] == reason and entry["field"] == field
    assert packed_tokens(tmp_path / "out") == packed_tokens(tmp_path / "clean")  # the rest, in order
    assert proc.returncode == 0


PRETOKENIZED_CASES = {
    # name: (bad record, with tokenizer?, field, reason, words)
    "input_ids_missing": ({"ids": [1, 2]}, False, "input_ids", "missing_field", "missing field"),
    "input_ids_null": ({"input_ids": None}, False, "input_ids", "missing_field", "null"),
    "null_in_input_ids": ({"input_ids": [5, None]}, False, "input_ids", "null_value", "null inside"),
    "input_ids_a_string": (
        {"input_ids": "1 2 3"},
        False,
        "input_ids",
        "wrong_type",
        "expected list of number",
    ),
    "input_ids_float": ({"input_ids": [5, 2.5, 7]}, False, "input_ids", "wrong_type", "integers"),
    "input_ids_bool": ({"input_ids": [5, True]}, False, "input_ids", "wrong_type", "bool"),
    "negative_id": (
        {"input_ids": [5, -3, 7]},
        False,
        "input_ids",
        "negative_token_id",
        "negative token id: -3",
    ),
    "id_outside_vocab": ({"input_ids": [5, 99999]}, True, "input_ids", "token_out_of_vocab", "vocabulary"),
    "id_beyond_int32": ({"input_ids": [5, 2**40]}, False, "input_ids", "token_out_of_range", "int32"),
    "labels_length": (
        {"input_ids": [5, 6], "labels": [6, 7, 8]},
        False,
        "labels",
        "length_mismatch",
        "values",
    ),
}


def _pretokenized_file(tmp_path: Path, bad: dict) -> Path:
    good = [{"input_ids": list(range(10 + i, 20 + i))} for i in range(4)]
    if "labels" in bad:  # labels on every record or on none
        good = [{**g, "labels": g["input_ids"]} for g in good]
    return write_jsonl(tmp_path / "ids.jsonl", [good[0], good[1], bad, good[2], good[3]])


@pytest.mark.parametrize("case", sorted(PRETOKENIZED_CASES))
def test_bad_pretokenized_record(tmp_path, case):
    bad, with_tok, field, reason, words = PRETOKENIZED_CASES[case]
    src = _pretokenized_file(tmp_path, bad)
    extra = ["--sample-format", "pretokenized"] + (["--tokenizer", str(DEMO_TOKENIZER)] if with_tok else [])
    line = assert_clean_failure(pack(tmp_path, src, *extra), tmp_path)
    assert f"{src}, line 3, field '{field}'" in line and words in line

    pack(tmp_path, src, *extra, "--on-error", "skip", "--chunk-size", "2", check=True)
    stats = manifest(tmp_path)["stats"]
    assert stats["skipped_by_reason"] == {reason: 1} and stats["packed_samples"] == 4
    assert errors_log(tmp_path)[0]["row"] == 3
    ids = np.concatenate(packed_tokens(tmp_path / "out")).tolist()
    assert ids == [t for i in range(4) for t in range(10 + i, 20 + i)]


def test_out_of_vocab_needs_the_tokenizer_to_be_known(tmp_path):
    # without --tokenizer there is no vocabulary to check against: the id is packed as is
    src = _pretokenized_file(tmp_path, {"input_ids": [5, 99999]})
    pack(tmp_path, src, check=True)
    assert manifest(tmp_path)["stats"]["packed_samples"] == 5


def test_skip_many_bad_records_keeps_order_and_is_the_same_for_any_num_proc(tmp_path):
    lines, good = [], []
    for i in range(60):
        if i % 7 == 3:
            lines.append(b"{broken")
        elif i % 11 == 5:
            lines.append(jl({"text": i}))
        elif i % 13 == 8:
            lines.append(jl({"text": None}))
        else:
            lines.append(jl({"text": f"record {i} " + "word " * (i % 5)}))
            good.append(json.loads(lines[-1]))
    src = write_lines(tmp_path / "in.jsonl", lines)
    clean = write_jsonl(tmp_path / "clean.jsonl", good)
    common = ["--tokenizer", DEMO_TOKENIZER, "--chunk-size", "4", "--shard-size", "3"]
    p1, p2 = tmp_path / "p1", tmp_path / "p2"
    for num_proc, cwd in ((1, p1), (2, p2)):  # the same relative --output, so the same run_id
        cwd.mkdir()
        args = ["pack", src, "-o", "out", "-q", "--packed-sequence-size", "64", "--on-error", "skip"]
        run_cli(*args, *common, "--num-proc", num_proc, cwd=cwd)
    pack(tmp_path, clean, *common, out="clean", check=True)
    m1, m2 = manifest(p1), manifest(p2)
    assert m1 == m2
    for name in [sh["path"] for sh in m1["shards"]] + ["errors.jsonl"]:
        assert (p1 / "out" / name).read_bytes() == (p2 / "out" / name).read_bytes()
    assert m1["stats"]["skipped_samples"] == 60 - len(good)
    assert sum(m1["stats"]["skipped_by_reason"].values()) == 60 - len(good)
    rows = [e["row"] for e in errors_log(p1)]
    assert rows == sorted(rows) and len(rows) == 60 - len(good)
    assert packed_tokens(p1 / "out") == packed_tokens(tmp_path / "clean")
    report = json.loads(run_cli("inspect", "--json", p1 / "out").stdout)
    assert report["skipped_samples"] == m1["stats"]["skipped_samples"]
    assert report["skipped_by_reason"] == m1["stats"]["skipped_by_reason"]


def test_errors_log_keeps_only_the_first_locations(tmp_path):
    lines = [b"{broken"] * 150 + [jl(GOOD[0])]
    src = write_lines(tmp_path / "in.jsonl", lines)
    pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--on-error", "skip", check=True)
    assert manifest(tmp_path)["stats"]["skipped_samples"] == 150
    assert [e["row"] for e in errors_log(tmp_path)] == list(range(1, 101))


def test_skip_with_nothing_left_is_an_error(tmp_path):
    src = write_lines(tmp_path / "in.jsonl", [b"{broken", jl({"text": 5}), jl({"text": 6})])
    line = assert_clean_failure(
        pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--on-error", "skip"), tmp_path
    )
    assert "all 3 were skipped" in line and "malformed_json: 1" in line


def test_bad_line_in_a_text_file(tmp_path):
    src = write_lines(tmp_path / "in.txt", [b"first line", b"second \xff line", b"third line"])
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)
    assert f"{src}, line 2" in line and "UTF-8" in line
    pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--on-error", "skip", check=True)
    assert manifest(tmp_path)["stats"]["skipped_by_reason"] == {"not_utf8": 1}


def test_bad_element_of_a_json_array(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps([GOOD[0], "not an object", GOOD[1]]))
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)
    assert f"{src}, row 1" in line
    pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--on-error", "skip", check=True)
    assert manifest(tmp_path)["stats"]["packed_samples"] == 2


def test_malformed_json_array_stops_even_under_skip(tmp_path):
    src = tmp_path / "in.json"
    src.write_text('[{"text": "a"}, {"text": ')
    line = assert_clean_failure(
        pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--on-error", "skip"), tmp_path
    )
    assert str(src) in line and "malformed JSON" in line


def test_empty_text_is_counted_as_empty_and_left_out(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD[0], {"text": ""}, GOOD[1]])
    proc = run_cli(
        "pack", src, "-o", tmp_path / "out", "--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", "64"
    )
    stats = manifest(tmp_path)["stats"]
    assert stats["num_samples"] == 3 and stats["empty_samples"] == 1 and stats["packed_samples"] == 2
    assert stats["skipped_samples"] == 0
    assert "packtool: warning: 1 of 3 samples were empty (no tokens) and left out" in proc.stderr


def test_empty_input_ids_are_empty_samples(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"input_ids": []}, {"input_ids": [5, 6]}, {"input_ids": []}])
    pack(tmp_path, src, check=True)
    stats = manifest(tmp_path)["stats"]
    assert stats["empty_samples"] == 2 and stats["packed_samples"] == 1


@pytest.mark.parametrize(
    ("records", "extra"),
    [([{"input_ids": []}, {"input_ids": []}], []), ([{"input_ids": [1] * 100}], ["--long-samples", "drop"])],
)
def test_nothing_left_to_pack_is_an_error(tmp_path, records, extra):
    src = write_jsonl(tmp_path / "in.jsonl", records)
    line = assert_clean_failure(pack(tmp_path, src, *extra), tmp_path)
    assert "nothing to pack" in line and str(src) in line


# --- options ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["0", "-5"])
def test_packed_sequence_size_must_be_positive(tmp_path, size):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    line = assert_clean_failure(
        pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", size),
        tmp_path,
        code=EXIT_USAGE,
    )
    assert "packed_sequence_size must be a positive integer" in line


def test_packed_sequence_size_from_config_file_must_be_positive(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"inputs: [{DEMO / 'train.jsonl'}]\ntokenizer: {DEMO_TOKENIZER}\npacked_sequence_size: 0\n"
    )
    line = assert_clean_failure(
        run_cli("pack", "--config", cfg, "-o", tmp_path / "out", check=False), tmp_path, code=EXIT_USAGE
    )
    assert "packed_sequence_size" in line


def test_unknown_on_error_value_is_refused(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"inputs: [{DEMO / 'train.jsonl'}]\npacked_sequence_size: 64\non_error: ignore\n")
    line = assert_clean_failure(
        run_cli("pack", "--config", cfg, "-o", tmp_path / "out", check=False), tmp_path, code=EXIT_USAGE
    )
    assert "on_error must be one of fail, skip" in line


# --- samples longer than N --------------------------------------------------------------------------------
def _long_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "in.jsonl", [GOOD[0], {"text": "long " * 200}, GOOD[1]])


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_long_sample_under_error_policy_names_line_and_field(tmp_path, on_error):
    # --on-error skip does not override an explicit --long-samples error
    src = _long_file(tmp_path)
    line = assert_clean_failure(
        pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--long-samples", "error", "--on-error", on_error),
        tmp_path,
    )
    assert f"{src}, line 2, field 'text'" in line and "more than packed_sequence_size 64" in line
    # how common such samples are, so that --long-samples is chosen knowingly
    assert "(1 of this chunk's 3 samples are longer: 33.3%;" in line and "tokens lie beyond N)" in line


def test_long_sample_dropped_is_counted(tmp_path):
    pack(tmp_path, _long_file(tmp_path), "--tokenizer", DEMO_TOKENIZER, "--long-samples", "drop", check=True)
    stats = manifest(tmp_path)["stats"]
    assert stats["dropped_samples"] == 1 and stats["dropped_tokens"] >= 200 and stats["packed_samples"] == 2
    assert stats["num_tokens"] + stats["dropped_tokens"] == stats["input_tokens"]


def test_long_sample_truncated_is_counted(tmp_path):
    pack(
        tmp_path,
        _long_file(tmp_path),
        "--tokenizer",
        DEMO_TOKENIZER,
        "--long-samples",
        "truncate",
        check=True,
    )
    stats = manifest(tmp_path)["stats"]
    assert stats["truncated_samples"] == 1 and stats["packed_samples"] == 3
    assert stats["num_tokens"] + stats["truncated_tokens"] == stats["input_tokens"]
    assert all(len(p["input_ids"]) == 64 for p in read_packs(tmp_path / "out"))


# --- files that cannot be read ----------------------------------------------------------------------------
def test_empty_input_file(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"")
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)
    assert str(src) in line and "no records" in line


def test_blank_lines_only(tmp_path):
    src = write_lines(tmp_path / "in.jsonl", [b"", b"   ", b""])
    assert "no records" in assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)


def _parquet(tmp_path: Path) -> Path:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " * 20 for i in range(2000)]}), path, row_group_size=500)
    return path


def test_parquet_that_is_not_parquet(tmp_path):
    src = tmp_path / "in.parquet"
    src.write_bytes(b"this is not a parquet file at all" * 10)
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)
    assert f"{src}: not a readable Parquet file" in line


def test_truncated_parquet(tmp_path):
    src = _parquet(tmp_path)
    src.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)
    assert f"{src}: not a readable Parquet file" in line


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_parquet_with_corrupt_data_pages(tmp_path, on_error):
    src = _parquet(tmp_path)
    data = bytearray(src.read_bytes())
    md = pq.ParquetFile(src).metadata
    col = md.row_group(2).column(0)  # the third row group's data: the file's footer stays whole
    start = col.data_page_offset + 40
    data[start : start + 200] = bytes(200)
    src.write_bytes(bytes(data))
    line = assert_clean_failure(
        pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--on-error", on_error), tmp_path
    )
    assert str(src) in line and "Parquet" in line


def test_missing_path(tmp_path):
    line = assert_clean_failure(
        pack(tmp_path, tmp_path / "nope.jsonl", "--tokenizer", DEMO_TOKENIZER), tmp_path
    )
    assert f"{tmp_path / 'nope.jsonl'}: no such file or directory" in line


def test_glob_matching_nothing(tmp_path):
    line = assert_clean_failure(pack(tmp_path, tmp_path / "*.jsonl", "--tokenizer", DEMO_TOKENIZER), tmp_path)
    assert "no file matches" in line


def test_directory_named_like_a_file(tmp_path):
    # a path that exists but cannot be read as a file, whoever runs the test (chmod does not stop root)
    (tmp_path / "in.jsonl").mkdir()
    line = assert_clean_failure(
        pack(tmp_path, tmp_path / "in.jsonl", "--tokenizer", DEMO_TOKENIZER), tmp_path
    )
    assert str(tmp_path / "in.jsonl") in line


@pytest.mark.skipif(
    AS_ROOT, reason="root reads a chmod 000 file anyway; test_directory_named_like_a_file covers it"
)
def test_unreadable_file(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    src.chmod(0)
    try:
        line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)
    finally:
        src.chmod(0o644)
    assert str(src) in line and "not readable" in line


# --- tokenizer --------------------------------------------------------------------------------------------
def test_tokenizer_path_missing(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    line = assert_clean_failure(
        pack(tmp_path, src, "--tokenizer", tmp_path / "tok.json"), tmp_path, code=EXIT_USAGE
    )
    assert "tok.json" in line and "no such file" in line


def test_tokenizer_file_that_does_not_load(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    tok = tmp_path / "tokenizer.json"
    tok.write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", tok), tmp_path, code=EXIT_USAGE)
    assert f"tokenizer {tok}: not a loadable tokenizer.json" in line


def test_tokenizer_directory_that_does_not_load(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    line = assert_clean_failure(
        pack(tmp_path, src, "--tokenizer", tmp_path / "model"), tmp_path, code=EXIT_USAGE
    )
    assert "tokenizer" in line and "model" in line


def test_tokenizer_plugin_that_does_not_import(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    line = assert_clean_failure(
        pack(tmp_path, src, "--tokenizer", "no_such_module_xyz:encode"), tmp_path, code=EXIT_USAGE
    )
    assert "no_such_module_xyz" in line


def test_encoder_plugin_failing_on_one_record_is_named(tmp_path):
    plugin = tmp_path / "enc.py"
    plugin.write_text(
        "def encode(records):\n"
        "    out = []\n"
        "    for t in records['text']:\n"
        "        if 'poison' in t:\n"
        "            raise ValueError('cannot encode this one')\n"
        "        out.append([len(w) for w in t.split()])\n"
        "    return {'input_ids': out}\n"
    )
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD[0], GOOD[1], {"text": "a poison pill"}, GOOD[2]])
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", f"{plugin}:encode"), tmp_path)
    assert f"{src}, line 3" in line and "cannot encode this one" in line
    pack(tmp_path, src, "--tokenizer", f"{plugin}:encode", "--on-error", "skip", check=True)
    assert manifest(tmp_path)["stats"]["skipped_by_reason"] == {"encoder_failed": 1}


@pytest.mark.parametrize(
    ("ids", "said"),
    [("[1, 2.5]", "got 2.5"), ("[True, False]", "got bool"), ("['7']", "expected")],
)
def test_encoder_plugin_returning_what_is_not_integers_is_named(tmp_path, ids, said):
    """A plugin's floats were truncated to integers without a word (1.7 packed as 1): now the record is
    named, as pretokenized input's floats are; integral floats (2.0) are token ids as JSON's are."""
    plugin = tmp_path / "enc.py"
    plugin.write_text(
        "def encode(records):\n"
        f"    return {{'input_ids': [[3, 4] if 'bad' not in t else {ids} for t in records['text']]}}\n"
    )
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD[0], {"text": "a bad one"}, GOOD[1]])
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", f"{plugin}:encode"), tmp_path)
    assert f"{src}, line 2, field 'input_ids'" in line and said in line
    plugin.write_text(
        "def encode(records):\n    return {'input_ids': [[3.0, 4.0] for t in records['text']]}\n"
    )
    pack(tmp_path, src, "--tokenizer", f"{plugin}:encode", "--overwrite", check=True)


# --- the output directory ---------------------------------------------------------------------------------
def test_existing_output_is_refused_without_overwrite(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    proc = pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER)
    assert proc.returncode == EXIT_USAGE and "output directory exists; pass --overwrite" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "out.partial").exists()
    # --overwrite replaces packtool outputs and empty directories only: this one is neither
    proc = pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--overwrite")
    assert proc.returncode == EXIT_USAGE and "not a packtool output (no manifest.json)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    (tmp_path / "out" / "keep.txt").unlink()
    pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--overwrite", check=True)  # empty: replaced
    pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--overwrite", check=True)  # an output: replaced
    assert (tmp_path / "out" / "manifest.json").exists()


def test_output_that_is_a_file_is_named_as_one(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    (tmp_path / "out").write_text("x")
    for flags in ((), ("--overwrite",)):
        proc = pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, *flags)
        assert proc.returncode == EXIT_USAGE and "exists and is not a directory" in proc.stderr
        assert (tmp_path / "out").read_text() == "x"


def test_failed_overwrite_keeps_the_old_output(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, check=True)
    before = manifest(tmp_path)
    bad = write_lines(tmp_path / "bad.jsonl", [b"{broken"])
    proc = pack(tmp_path, bad, "--tokenizer", DEMO_TOKENIZER, "--overwrite")
    assert proc.returncode == EXIT_INPUT and manifest(tmp_path) == before
    assert not (tmp_path / "out.partial").exists()


def test_output_under_a_file_is_not_writable(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    (tmp_path / "afile").write_text("x")
    proc = pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, out="afile/out")
    assert proc.returncode == EXIT_USAGE and len(proc.stderr.strip().splitlines()) == 1
    assert "afile" in proc.stderr and (tmp_path / "afile").read_text() == "x"


@pytest.mark.skipif(AS_ROOT, reason="root writes into a read-only directory anyway")
def test_output_in_a_read_only_directory(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", GOOD)
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        proc = pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, out="ro/out")
    finally:
        (tmp_path / "ro").chmod(0o700)
    assert proc.returncode == EXIT_USAGE and "not writable" in proc.stderr
    assert list((tmp_path / "ro").iterdir()) == []


# --- fields the encoder does not read, and type conflicts in those it does --------------------------------
UNUSED_FIELD_CASES = {
    "id_number_then_str": ({"id": 1}, {"id": "b"}),
    "meta_dict_then_list": ({"meta": {"a": 1}}, {"meta": [1, 2]}),
    "score_beyond_int64": ({"score": 1}, {"score": 2**80}),
    "lone_surrogate": ({"note": "ok"}, {"note": "bad \ud800"}),
}


@pytest.mark.parametrize("case", sorted(UNUSED_FIELD_CASES))
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_mixed_types_in_a_field_not_read_are_harmless(tmp_path, case, on_error):
    first, second = UNUSED_FIELD_CASES[case]
    rows = [{**first, "text": "first good"}, {**second, "text": "second good"}, {**first, "text": "third"}]
    src = write_lines(tmp_path / "in.jsonl", [json.dumps(r).encode() for r in rows])
    pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER, "--on-error", on_error, check=True)
    stats = manifest(tmp_path)["stats"]
    assert stats["skipped_samples"] == 0 and stats["packed_samples"] == 3


def test_mixed_types_in_a_field_read_still_fail_with_line_and_field(tmp_path):
    rows = [{"id": 1, "text": "first good"}, {"id": "b", "text": 5}, {"id": 2, "text": "third"}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", DEMO_TOKENIZER), tmp_path)
    assert line.endswith(
        f"{src}, line 2, field 'text': expected str, got number: '5' "
        "(--on-error skip leaves bad records out and counts them)"
    )


CHAT_TOKENIZER = DEMO / "chat-tokenizer"
PARTS = [
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "assistant", "content": "yo"},
]


def test_a_content_list_the_template_drops_names_its_line_and_skips(tmp_path):
    """Contents given as a string in some records and as a list of parts in others are read (the messages
    are any JSON); a template that renders string contents only would drop the parts' text without a
    word, as apply_chat_template does: that record is a bad one, named."""
    plain = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    src = write_jsonl(tmp_path / "parts.jsonl", [plain, {"messages": PARTS}, plain])
    line = assert_clean_failure(pack(tmp_path, src, "--tokenizer", CHAT_TOKENIZER), tmp_path)
    assert f"{src}, line 2, field 'messages': the chat template does not render message 0's text" in line
    values = {"inputs": [str(src)], "output": str(tmp_path / "out"), "tokenizer": str(CHAT_TOKENIZER),
              "packed_sequence_size": 64, "on_error": "skip", "quiet": True}  # fmt: skip
    stats = run_pack(PackOptions.from_dict(values), progress=False).stats  # (in this process: quicker)
    assert stats.skipped_by_reason == {"invalid": 1} and stats.packed_samples == 2
    (entry,) = errors_log(tmp_path)
    assert entry["row"] == 2 and entry["field"] == "messages"


def test_long_sample_error_stops_at_its_chunk_not_after_the_input(tmp_path):
    """--long-samples error stops in the chunk that holds the first over-long sample: later chunks are
    never encoded (an encoder that counts its calls says so)."""
    counter = tmp_path / "calls"
    (tmp_path / "enc.py").write_text(
        "def encode(records):\n"
        f"    with open({str(counter)!r}, 'a') as f:\n"
        "        f.write('x')\n"
        "    return {'input_ids': [[1] * len(t.split()) for t in records['text']]}\n"
    )
    rows = [{"text": "word " * 10} for _ in range(5000)]
    rows[150] = {"text": "word " * 500}
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    proc = run_cli("pack", src, "-o", tmp_path / "out", "--tokenizer", f"{tmp_path / 'enc.py'}:encode",
                   "--packed-sequence-size", 64, "--chunk-size", 100, check=False)  # fmt: skip
    assert proc.returncode == EXIT_INPUT
    assert (
        f"{src}, line 151, field 'text': sample has 500 tokens, more than packed_sequence_size 64"
        in proc.stderr
    )
    assert len(counter.read_text()) <= 4  # the chunks up to line 200, not the 50 chunks of the input
