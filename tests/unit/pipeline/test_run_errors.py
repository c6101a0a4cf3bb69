"""Bad input and faults, each on a real file through the real CLI (``packtool.errors``, ``--on-error``).

Every failure must be: one line on stderr naming the file, the row and the field where there is one; exit
code 3 for bad input, 2 for bad options (4 for a failure to write); and no output directory, ``.partial``
or lock left behind. Under ``--on-error skip`` the bad records are left out, counted by reason in the
manifest and in ``inspect --json``, and logged to ``errors.jsonl``.


(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from packtool.errors import EXIT_FAILURE, EXIT_INPUT
from tests.conftest import DEMO, DEMO_TOKENIZER, ROOT


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


LIMIT_FSIZE = (
    "import resource, runpy, sys\n"
    "limit = int(sys.argv.pop(1))\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "sys.argv[0] = 'packtool'\n"
    "runpy.run_module('packtool.cli', run_name='__main__')\n"
)


@pytest.mark.parametrize(("limit", "num_proc"), [(20_000, 1), (300_000, 1), (300_000, 2)])
def test_disk_full_while_writing(tmp_path, limit, num_proc):
    """A file size limit (what a full disk looks like to a writer): one line, exit 1, nothing left."""
    args = [
        "pack", DEMO / "train.jsonl", "-o", tmp_path / "out", "-q", "--tokenizer", DEMO_TOKENIZER,
        "--packed-sequence-size", "512", "--long-samples", "truncate", "--num-proc", num_proc,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", LIMIT_FSIZE, str(limit), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
    )
    line = assert_clean_failure(proc, tmp_path, code=EXIT_FAILURE)
    assert f"{tmp_path / 'out'}: cannot write the output" in line and "nothing was left behind" in line
    assert os.listdir(tmp_path) == []
