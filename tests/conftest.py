"""Shared test helpers: the shipped demo data, and running the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
DEMO_TOKENIZER = DEMO / "tokenizer.json"


def run_cli(
    *args: str, check: bool = True, cwd: str | Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run ``packtool ARGS`` as a user would (``python -m packtool.cli``), capturing output."""
    env = dict(env or {})
    extra_path = env.pop("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), extra_path) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "packtool.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"packtool {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture
def cli():
    return run_cli
