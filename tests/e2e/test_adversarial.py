"""The adversarial matrix: bad inputs, options, locations and faults, each with the exit code and the
message it must give (issue 19). Add a row to ``CASES`` for a new case: ``setup(tmp)`` makes the files
and returns the ``packtool`` arguments; ``code`` and ``message`` are what the run must end with; nothing
that looks like an output may be left behind by a failure.

Read-time cases (a shard damaged or swapped after the run) are in ``READ_CASES``: ``read_packs`` and the
loader must raise ``InputError`` naming the shard, and say nothing when the checks are switched off only
because the bytes then read as packs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from packtool.errors import EXIT_FAILURE, EXIT_INPUT, EXIT_PROBLEMS, EXIT_USAGE, InputError
from packtool.loader import PackedDataset, get_loader
from packtool.reading import read_packs
from tests.conftest import DEMO, DEMO_TOKENIZER, run_cli, write_jsonl

TOK = ["--tokenizer", str(DEMO_TOKENIZER)]
TEXTS = [{"text": f"sample {i} has a few words in it"} for i in range(40)]


@dataclass
class Case:
    name: str
    setup: Callable[[Path], list]  # makes the files in tmp, returns the pack arguments (no -o)
    code: int
    message: str
    env: dict | None = None
    cwd_is_tmp: bool = False
    console_script: bool = False  # run the installed ``packtool`` (``python -m`` puts the cwd first itself)


def texts(tmp: Path, name: str = "in.jsonl") -> Path:
    return write_jsonl(tmp / name, TEXTS)


def deep(depth: int) -> Callable[[Path], list]:
    def setup(tmp: Path) -> list:
        line = json.dumps({"text": "fine"})[:-1] + ', "meta": ' + "[" * depth + "]" * depth + "}\n"
        (tmp / "in.jsonl").write_text(json.dumps(TEXTS[0]) + "\n" + line)
        return [tmp / "in.jsonl", *TOK, "--packed-sequence-size", 64]

    return setup


def plugin(tmp: Path, name: str, body: str) -> str:
    (tmp / f"{name}.py").write_text(textwrap.dedent(body))
    return f"{tmp / name}.py:encode"


def negative_ids(tmp: Path) -> list:
    spec = plugin(
        tmp, "neg", "def encode(records):\n    return {'input_ids': [[5, -3, 7] for _ in records['text']]}\n"
    )
    return [texts(tmp), "--tokenizer", spec, "--packed-sequence-size", 64]


def changes_its_input(tmp: Path) -> list:
    """An encoder that appends to the input file while the run reads it (as another job might)."""
    src = texts(tmp)
    spec = plugin(tmp, "grow", f"""
        def encode(records):
            with open({str(src)!r}, "a") as f:
                f.write('{{"text": "appended"}}\\n')
            return {{"input_ids": [[1, 2, 3] for _ in records["text"]]}}
        """)  # fmt: skip
    return [src, "--tokenizer", spec, "--packed-sequence-size", 64]


def symlink_loop(tmp: Path) -> list:
    (tmp / "loop.jsonl").symlink_to(tmp / "loop.jsonl")
    return [tmp / "loop.jsonl", *TOK, "--packed-sequence-size", 64]


def glob_name(tmp: Path) -> list:
    return [texts(tmp, "data[1].jsonl"), *TOK, "--packed-sequence-size", 64]


def shadowing_package(tmp: Path) -> list:
    """A packtool/ folder in the working directory: the workers must import the installed packtool."""
    (tmp / "packtool").mkdir()
    (tmp / "packtool" / "__init__.py").write_text("raise ImportError('the wrong packtool')\n")
    return [texts(tmp), *TOK, "--packed-sequence-size", 64, "--num-proc", 2, "--chunk-size", 10]


def bad_record(tmp: Path) -> list:
    (tmp / "in.jsonl").write_text(json.dumps(TEXTS[0]) + "\n{broken\n")
    return [tmp / "in.jsonl", *TOK, "--packed-sequence-size", 64]


def simple(*args) -> Callable[[Path], list]:
    return lambda tmp: [texts(tmp), *TOK, *args]


CASES = [
    Case("json nested 1,000 deep", deep(1000), EXIT_INPUT, "line 2: JSON nested deeper than 128 levels"),
    Case("json nested 20,000 deep", deep(20000), EXIT_INPUT, "line 2: JSON nested deeper than 128 levels"),
    Case("huge packed_sequence_size", simple("--packed-sequence-size", 2**31), EXIT_USAGE,
         "packed_sequence_size must be a positive integer at most 16777216, got 2147483648"),
    Case("pad id negative", simple("--packed-sequence-size", 64, "--pad-token-id", -1), EXIT_USAGE,
         "pad_token_id must be at least 0 and at most 2147483647, got -1"),
    Case("pad id outside the vocabulary", simple("--packed-sequence-size", 64, "--pad-token-id", 99999),
         EXIT_USAGE, "pad_token_id 99999 is not a token id of the tokenizer (vocabulary of 1,300)"),
    Case("custom encoder returns a negative id", negative_ids, EXIT_INPUT,
         "line 1, field 'input_ids': negative token id: -3"),
    Case("input changes while it is read", changes_its_input, EXIT_INPUT,
         "changed while the run read it"),
    Case("output is .", lambda tmp: [*simple("--packed-sequence-size", 64)(tmp), "-o", "."], EXIT_USAGE,
         "output directory exists; pass --overwrite", cwd_is_tmp=True),
    Case("output is /", lambda tmp: [*simple("--packed-sequence-size", 64)(tmp), "-o", "/"], EXIT_USAGE,
         "/: cannot be the output directory"),
    Case("symlink loop", symlink_loop, EXIT_INPUT, "a symbolic link that loops back on itself"),
    Case("glob characters in an existing name", glob_name, 0, ""),
    Case("packtool/ folder in the working directory", shadowing_package, 0, "", cwd_is_tmp=True,
         console_script=True),
    Case("a bad record says how to skip it", bad_record, EXIT_INPUT,
         "malformed JSON: Expecting property name enclosed in double quotes (column 2) (--on-error skip"),
    Case("conflicting options", simple("--packed-sequence-size", 64, "--split-across-pack", "--long-samples",
         "drop"), EXIT_USAGE, "--long-samples drop and --split-across-pack on conflict"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_adversarial_case(tmp_path: Path, case: Case):
    args = [str(a) for a in case.setup(tmp_path)]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "out")]
    cwd = tmp_path if case.cwd_is_tmp else None
    if case.console_script:
        script = Path(sys.executable).with_name("packtool")
        proc = subprocess.run([script, "pack", *args, "-q"], capture_output=True, text=True, cwd=cwd)
    else:
        proc = run_cli("pack", *args, "-q", check=False, cwd=cwd, env=case.env)
    assert proc.returncode == case.code, proc.stderr
    if case.code:
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("packtool: error: ") and case.message in line, line
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*.partial"))
    else:
        assert (tmp_path / "out" / "manifest.json").exists()
    assert not list(tmp_path.glob("*.lock"))


def test_a_dead_worker_is_named_and_the_run_resumes(tmp_path: Path):
    args = ["pack", texts(tmp_path), *TOK, "--packed-sequence-size", 64, "--num-proc", 2, "--chunk-size", 5]
    args += ["-o", tmp_path / "out", "-q"]
    proc = run_cli(*args, check=False, kill_at="worker:3")
    assert proc.returncode == EXIT_FAILURE
    (line,) = proc.stderr.strip().splitlines()
    assert "a worker process died while encoding chunks" in line and "killed by SIGKILL" in line
    assert f"the finished work is kept in {tmp_path / 'out.partial'}" in line
    assert (tmp_path / "out.partial").exists() and not (tmp_path / "out").exists()
    again = run_cli(*args[:-1])
    assert "resuming the interrupted run" in again.stderr
    whole = run_cli(*args[:-3], "-o", tmp_path / "whole", "-q")
    assert whole.returncode == 0
    assert [p["input_ids"].tolist() for p in read_packs(tmp_path / "out")] == [
        p["input_ids"].tolist() for p in read_packs(tmp_path / "whole")
    ]


def test_overwrite_through_a_symlink_and_stale_old_copies(tmp_path: Path):
    src = texts(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    base = ["pack", src, *TOK, "--packed-sequence-size", 64, "-q", "--overwrite"]
    run_cli(*base, "-o", tmp_path / "link")
    (tmp_path / "real.old-999999").mkdir()  # a job killed between commit's two renames left it
    run_cli(*base, "-o", tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "manifest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "link", "real"]


# --- read time -----------------------------------------------------------------------------------------
def _flip(path: Path) -> None:
    """One bit flipped in the middle of the shard's token data (for a tar, inside a token member, so that
    every header still parses: only a checksum can tell)."""
    data = bytearray(path.read_bytes())
    at = len(data) // 2
    if path.suffix == ".tar":
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.name.endswith(".input_ids.npy")]
        member = members[len(members) // 2]
        at = member.offset_data + member.size - 64  # a token id, past the .npy header
    data[at] ^= 0x04
    path.write_bytes(bytes(data))


def _remove_a_shard_entry(out: Path) -> None:
    m = json.loads((out / "manifest.json").read_text())
    m["shards"].pop()
    (out / "manifest.json").write_text(json.dumps(m))


def _swap_in_another_runs_shard(out: Path, other: Path, shard: str) -> None:
    shutil.copy(other / shard, out / shard)


READ_CASES = [
    ("parquet", "a flipped bit mid-shard", lambda out, other: _flip(out / "packs-000001.parquet"),
     "packs-000001.parquet"),
    ("webdataset", "a flipped bit mid-shard", lambda out, other: _flip(out / "packs-000001.tar"),
     "packs-000001.tar"),
    ("parquet", "a shard entry removed from the manifest", lambda out, other: _remove_a_shard_entry(out),
     "manifest.json"),
    ("webdataset", "a shard of another run with as many packs",
     lambda out, other: _swap_in_another_runs_shard(out, other, "packs-000001.tar"), "packs-000001.tar"),
]  # fmt: skip


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict:
    """For each format, an output and another run's output with the same pack layout (another seed)."""
    base = tmp_path_factory.mktemp("read")
    made = {}
    for fmt in ("parquet", "webdataset"):
        for name, seed in (("out", 0), ("other", 1)):
            out = base / f"{fmt}-{name}"
            args = ["--packed-sequence-size", 1024, "--long-samples", "truncate", "--shard-size", 40]
            run_cli(
                "pack", DEMO / "train.jsonl", *TOK, *args, "--seed", seed, "--format", fmt, "-o", out, "-q"
            )
            made[fmt, name] = out
    return made


@pytest.mark.parametrize(
    ("fmt", "what", "damage", "named"), READ_CASES, ids=[c[1] + f" ({c[0]})" for c in READ_CASES]
)
def test_damage_after_the_run_is_caught_where_training_reads(tmp_path, outputs, fmt, what, damage, named):
    out = Path(shutil.copytree(outputs[fmt, "out"], tmp_path / "out"))
    damage(out, outputs[fmt, "other"])
    with pytest.raises(InputError, match=named.replace(".", r"\.")):
        for _ in read_packs(out):
            pass
    with pytest.raises(InputError, match=named.replace(".", r"\.")):
        for _ in get_loader(PackedDataset(out, batch_size=4, shuffle=False), num_workers=0):
            pass
    assert run_cli("verify", out, check=False).returncode == EXIT_PROBLEMS


def test_verify_checks_that_the_manifest_adds_up(tmp_path, outputs):
    out = Path(shutil.copytree(outputs["parquet", "out"], tmp_path / "out"))
    m = json.loads((out / "manifest.json").read_text())
    m["stats"]["num_samples"] -= 10  # fewer samples than it packed
    m["pad_token_id"] = 99999
    (out / "manifest.json").write_text(json.dumps(m))
    proc = run_cli("verify", out, check=False)
    assert proc.returncode == EXIT_PROBLEMS
    assert "sample fates add up to 1,000, not the 990 input samples" in proc.stdout
    assert "pad_token_id 99999 is outside the vocabulary (size 1300)" in proc.stdout


def test_checks_can_be_switched_off(tmp_path, outputs):
    out = Path(shutil.copytree(outputs["parquet", "out"], tmp_path / "out"))
    _flip(out / "packs-000001.parquet")
    packs = list(read_packs(out, verify_checksums=False))  # the damaged bytes decode: no error, as asked
    assert len(packs) == json.loads((out / "manifest.json").read_text())["stats"]["num_packs"]


def test_verify_source_follows_the_runs_on_error(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps(t) + "\n" for t in TEXTS[:10]) + "{broken\n" + json.dumps(TEXTS[10]) + "\n"
    )
    run_cli(
        "pack", src, *TOK, "--packed-sequence-size", 64, "--on-error", "skip", "-o", tmp_path / "out", "-q"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_cli("verify", tmp_path / "out", "--source", "-q", cwd=elsewhere)
    assert proc.returncode == 0 and proc.stdout.startswith("OK:"), proc.stdout + proc.stderr
