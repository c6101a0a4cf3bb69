"""Shared test helpers: the shipped demo data, running the real CLI in a subprocess, editing tar shards."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"
DEMO_TOKENIZER = DEMO / "tokenizer.json"


def run_cli(
    *args: str,
    check: bool = True,
    cwd: str | Path | None = None,
    env: dict | None = None,
    kill_at: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``packtool ARGS`` as a user would (``python -m packtool.cli``), capturing output. ``kill_at``
    (``STEP:N``, ``tests/fault_runner.py``) SIGKILLs the job, or one of its workers, at that point."""
    env = dict(env or {})
    extra_path = env.pop("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), extra_path) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", *(("tests.fault_runner", kill_at, "--") if kill_at else ("packtool.cli",))]
        + list(map(str, args)),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"packtool {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def without_conflicts(*args) -> list:
    """``args`` less the shared base flags a test's variant makes meaningless, which packtool refuses
    together: ``--long-samples V`` with ``--split-across-pack`` (a long sample is split, never dropped or
    truncated) and ``--row-group-size V`` with ``--format webdataset`` (tar shards have no row groups)."""
    args = [str(a) for a in args]
    drop = set()
    if "--split-across-pack" in args:
        drop.add("--long-samples")
    if "webdataset" in args:
        drop.add("--row-group-size")
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in drop:
            skip = True
        else:
            out.append(a)
    return out


def masked_rows(count: int, shortest: int, longest: int, vocab: int, seed: int) -> list[dict]:
    """``count`` pretokenized records with a random ``loss_mask``, lengths ``shortest..longest - 1``."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        n = int(rng.integers(shortest, longest))
        rows.append(
            {"input_ids": rng.integers(1, vocab, n).tolist(), "loss_mask": rng.integers(0, 2, n).tolist()}
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def rewrite_tar_json(path: Path, edit: Callable[[dict], dict]) -> None:
    """Rewrite the tar shard ``path`` with each pack's ``.json`` member replaced by ``edit(its object)``
    (its ``.tar.idx`` goes stale when the sizes change)."""
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in members:
            if member.name.endswith(".json"):
                data = json.dumps(edit(json.loads(data))).encode()
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


def rewrite_tar_members(path: Path, change: Callable[[dict[str, dict[str, bytes]]], None]) -> None:
    """Rewrite the tar shard ``path`` after ``change(packs)`` edits its members (``{key: {ext: bytes}}``,
    in order; each pack's members written sorted by extension), and its ``.tar.idx`` with it (the
    manifest's size and checksums do not follow)."""
    packs: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            key, _, ext = member.name.partition(".")
            packs.setdefault(key, {})[ext] = tar.extractfile(member).read()
    change(packs)
    offsets = []
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in packs.items():
            offsets.append(tar.offset)
            for ext in sorted(members):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(members[ext])
                tar.addfile(info, io.BytesIO(members[ext]))
        offsets.append(tar.offset)
    Path(f"{path}.idx").write_bytes(np.asarray(offsets, dtype="<u8").tobytes())


@pytest.fixture
def cli():
    return run_cli


def manifest_json(directory: str | Path) -> dict:
    """An output's ``manifest.json`` as the plain dict a user's script reads."""
    return json.loads((Path(directory) / "manifest.json").read_text())
