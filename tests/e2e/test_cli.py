"""The Click layer: config files and flags, inspect output, one-line errors with exit codes."""

from __future__ import annotations

import json

import pytest

from packtool.errors import EXIT_INPUT, EXIT_USAGE
from tests.conftest import DEMO, DEMO_TOKENIZER, ROOT, manifest_json, run_cli, write_jsonl


def test_config_file_with_flags_overriding(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"inputs: [{DEMO / 'train.jsonl'}]\noutput: {tmp_path / 'out'}\ntokenizer: {DEMO_TOKENIZER}\n"
        "packed-sequence-size: 2048\nlong_samples: truncate\nstrategy: sequential\n"
    )
    run_cli("pack", "--config", cfg, "--packed-sequence-size", 1024, "--max-packs", 5, "-q")
    m = manifest_json(tmp_path / "out")
    assert m["packed_sequence_size"] == 1024 and m["provenance"]["long_samples"] == "truncate"
    assert m["stats"]["num_packs"] == 5 and m["provenance"]["max_packs"] == 5


def test_inspect_json_has_the_documented_keys(tmp_path):
    out = tmp_path / "out"
    run_cli(
        "pack",
        DEMO / "train.jsonl",
        "-o",
        out,
        "--tokenizer",
        DEMO_TOKENIZER,
        "--packed-sequence-size",
        4096,
        "--strategy",
        "sequential",
        "-q",
    )
    report = json.loads(run_cli("inspect", out, "--json").stdout)
    for key in (
        "num_samples",
        "num_packs",
        "fill_rate",
        "packed_sequence_size",
        "lower_bound_packs",
        "dropped_samples",
    ):
        assert key in report, key
    assert report["num_samples"] == 1000 and report["packed_sequence_size"] == 4096
    table = run_cli("inspect", out).stdout
    assert "fill rate" in table and "packs-000000.parquet" in table


def test_progress_goes_to_stderr_and_quiet_silences_it(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"input_ids": [1, 2, 3]}] * 10)
    loud = run_cli("pack", src, "-o", tmp_path / "a", "--packed-sequence-size", 8)
    assert loud.stdout == "" and "packed 10 of 10 samples whole into 5 packs" in loud.stderr
    quiet = run_cli("pack", src, "-o", tmp_path / "b", "--packed-sequence-size", 8, "-q")
    # --quiet removes the bars, not the result: the one line saying what was written, and where
    assert quiet.stdout == "" and quiet.stderr.splitlines() == [
        f"packed 10 of 10 samples whole into 5 packs of 8 tokens (fill rate 75.00%, lower bound 4 packs) -> "
        f"{tmp_path / 'b'}"
    ]


def test_config_errors_are_one_line_with_exit_code_2(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"input_ids": [1]}])
    cases = [
        (
            ["--packed-sequence-size", "0"],
            "packed_sequence_size must be a positive integer at most 16777216, got 0",
        ),
        (
            ["--packed-sequence-size", "-3"],
            "packed_sequence_size must be a positive integer at most 16777216, got -3",
        ),
        ([], "packed_sequence_size is required"),
        (["--packed-sequence-size", "8", "--strategy", "nope"], "strategy must be one of"),
    ]
    for args, message in cases:
        proc = run_cli("pack", src, "-o", tmp_path / "out", *args, check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("packtool:")]
        assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1]
    (tmp_path / "bad.yaml").write_text("packed_sequence_size: 8\ncolour: blue\n")
    proc = run_cli("pack", src, "-o", tmp_path / "out", "--config", tmp_path / "bad.yaml", check=False)
    assert proc.returncode == 2 and "unknown key 'colour'; did you mean 'columns'?" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_options_and_config_files_are_usage_errors_not_internal_ones(tmp_path):
    """Issue 27 item 8/9, issue 30 item 8: each of these was exit 4 or 3, or said too little."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"input_ids": [1, 2]}])
    files = {
        "random.yaml": bytes(range(256)) * 8,  # a config file of random bytes
        "inputs5.yaml": b"packed_sequence_size: 8\ninputs: 5\n",
        "nested.yaml": b"packed_sequence_size: 8\ninputs: [[in.jsonl]]\n",
        "indent.yaml": b"packed_sequence_size: 8\n  strategy: bfd\n",
        # nested aliases: 1 KB that a YAML loader expands to 9^9 nodes (it ran for minutes)
        "bomb.yaml": b"a: &a [x, x, x, x, x, x, x, x, x]\n"
        + b"".join(
            f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n".encode()
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + b"inputs: *i\n",
        "typo.yaml": b"packed-sequence-sise: 8\n",
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    # fmt: off
    cases = [
        (["--packed-sequence-size", "8", "--seed", "-1"], "seed must be at least 0, got -1"),
        (["--packed-sequence-size", "8", "--pad-token-id", "2147483648"],
         "pad_token_id must be at least 0 and at most 2147483647"),
        (["--config", "random.yaml"], "random.yaml: not a YAML config file (not UTF-8 text at byte 128)"),
        (["--config", "inputs5.yaml"], "inputs5.yaml: inputs must be a list, got 5"),
        (["--config", "nested.yaml"],
         "nested.yaml: inputs must be a string (item 0 of the list), got [['in.jsonl']]"),
        (["--config", "indent.yaml"], "indent.yaml:2: not valid YAML: mapping values are not allowed here"),
        (["--config", "bomb.yaml"], "bomb.yaml:2: not valid YAML: YAML aliases (*name) are not allowed"),
        (["--config", "typo.yaml"],
         "typo.yaml: unknown key 'packed_sequence_sise'; did you mean 'packed_sequence_size'?"),
        (["--packed-sequence-size", "8", "--row-group-size", "64", "--format", "webdataset"],
         "--row-group-size does not apply to --format webdataset: it is for --format parquet; drop it"),
        (["--packed-sequence-size", "8", "--add-eos"],  # the input is pretokenized: nothing adds tokens
         "--add-eos does not apply to --sample-format pretokenized"),
    ]
    # fmt: on
    for args, message in cases:
        proc = run_cli("pack", src, "-o", tmp_path / "out", *args, check=False, cwd=tmp_path)
        assert proc.returncode == EXIT_USAGE and message in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_pack_help_is_grouped_by_stage_marks_the_required_and_ends_with_examples():
    out = run_cli("pack", "--help").stdout
    sections = [line for line in out.splitlines() if line.endswith("options:") or line == "Examples:"]
    assert sections == [
        "Input options:",
        "Encoding options:",
        "Packing options:",
        "Output options:",
        "Running options:",
        "Other options:",
        "Examples:",
    ]
    assert "Tokens per pack (N). [required]" in out and "Output directory (written atomically)." in out
    assert out.rstrip().splitlines()[-1].strip().startswith("packtool pack --config")


def test_demo_config_runs_from_the_repository_root(tmp_path):
    run_cli("pack", "--config", ROOT / "configs" / "demo.yaml", "-o", tmp_path / "demo", "-q", cwd=ROOT)
    assert manifest_json(tmp_path / "demo")["stats"]["num_samples"] == 1000


def test_shipped_config_runs_from_any_directory(tmp_path):
    """Paths in a config file are the file's: the shipped config works from another directory."""
    proc = run_cli(
        "pack", "--config", ROOT / "configs" / "demo.yaml", "-o", tmp_path / "demo", "-q", cwd=tmp_path
    )
    assert proc.returncode == 0
    m = json.loads((tmp_path / "demo" / "manifest.json").read_text())
    assert m["inputs"][0]["path"] == str(ROOT / "data" / "demo" / "train.jsonl")
    assert m["inputs"][0]["num_samples"] == 1000


@pytest.mark.parametrize(
    ("args", "code", "start"),
    [
        (["inspect", "{notmine}"], EXIT_INPUT, "packtool: error: {notmine}: no manifest.json"),
        (["verify", "{notmine}"], EXIT_INPUT, "packtool: error: {notmine}: no manifest.json"),
        (["inspect", "{file}"], EXIT_USAGE, "packtool: error: "),
        (["pack", "--no-such-flag"], EXIT_USAGE, "packtool: error: No such option '--no-such-flag'"),
    ],
)
def test_one_error_style_and_exit_code_convention_across_commands(tmp_path, args, code, start):
    (tmp_path / "notmine").mkdir()
    (tmp_path / "f.jsonl").write_text("{}\n")
    paths = {"notmine": tmp_path / "notmine", "file": tmp_path / "f.jsonl"}
    proc = run_cli(*[a.format(**paths) for a in args], check=False)
    assert proc.returncode == code
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(start.format(**paths))


@pytest.mark.parametrize("spelling", ["prompt-completion", "prompt_completion"])
@pytest.mark.parametrize("where", ["flag", "config"])
def test_a_choice_is_taken_in_either_spelling_and_recorded_in_one(tmp_path, spelling, where):
    """--help shows ``--sample-format prompt-completion`` (flags spell values with -), the declarations
    ``prompt_completion``: both are accepted, by flag and in a config file, and the manifest records one."""
    src = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "a b", "completion": "c d"}])
    args = ["pack", src, "--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", 64, "-o", tmp_path / "o"]
    if where == "flag":
        args += ["--sample-format", spelling]
    else:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"sample_format: {spelling}\nlong-samples: error\n")
        args += ["--config", cfg]
    run_cli(*args)
    m = manifest_json(tmp_path / "o")
    assert m["provenance"]["sample_format"] == m["sample_format"] == "prompt_completion"


def test_a_choice_in_neither_spelling_is_refused(tmp_path):
    proc = run_cli("pack", "x.jsonl", "-o", tmp_path / "o", "--packed-sequence-size", 8, "--sample-format",
                   "prompt completion", check=False)  # fmt: skip
    assert proc.returncode == EXIT_USAGE and "'prompt completion' is not one of" in proc.stderr
