"""Regenerate tests/golden/: small outputs written by the packtool commits of every earlier format version.

    python scripts/make_golden.py            # every folder below (about a minute on 2 cores)
    python scripts/make_golden.py --only v2  # one folder

For each folder of ``SETS`` (a format version and a commit that wrote it) this checks out the commit (a
temporary ``git worktree``), runs that checkout's own ``packtool pack`` (``PYTHONPATH`` on the checkout,
the current virtual environment) on small inputs made here from data/demo/, into
``tests/golden/<folder>/<run>/``, then reads every output with that checkout's own ``read_packs`` and
records what it gave in ``tests/golden/<folder>/<run>.expected.json``: the commit, the command, the
number of packs and one sha256 per pack (``pack_digest``: every array's name, dtype, shape and bytes). The
tests
(tests/unit/test_golden_outputs.py) read every golden output with the current code and compare.

The inputs are written to a fixed scratch directory (``SCRATCH``), so the absolute paths the manifests
record are the same every time; the directory is removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
SCRATCH = Path(tempfile.gettempdir()) / "packtool-golden-inputs"

# folder -> (format_version, a commit that wrote it, the runs made: None for every run that version has).
# git log -G"FORMAT_VERSION = [0-9]" -- packtool/: 2 from 681af19 on, 3 from 1e69f18, 4 from d85fa4c, 5 until
# the commit that made tar members compressible (6; v5 holds three runs, to stay under the size cap); format
# 2 had two accountings of the stats (packtool.stats): 8080027 before the sample fates, f5c97c8 with them
SETS: dict[str, tuple[int, str, tuple[str, ...] | None]] = {
    "v2": (2, "8080027", None),
    "v2-fates": (2, "f5c97c8", ("pretok-split-parquet", "text-tar")),
    "v3": (3, "fe08b65", None),
    "v4": (4, "51bca6e", None),
    "v5": (5, "246f1ae", ("text-tar", "chat-minimal-tar", "alpaca-parquet")),  # 6.0: compressed tar members
}

# packed_sequence_size is small (64, 128) so that a few dozen packs hold the inputs and tar outputs stay small
_TEXT = ["text.jsonl", "--tokenizer", "data/demo/tokenizer.json", "--add-eos", "--long-samples", "truncate"]
_ALPACA = [
    "alpaca.jsonl",
    "--sample-format",
    "prompt_completion",
    "--prompt-template",
    "alpaca",
    "--completion-field",
    "output",
    "--tokenizer",
    "data/demo/tokenizer.json",
    "--add-eos",
    "--empty-loss",
    "drop",
    "--long-samples",
    "drop",
]
_CHAT = [
    "chat.jsonl",
    "--sample-format",
    "chat",
    "--tokenizer",
    "data/demo/chat-tokenizer",
    "--empty-loss",
    "drop",
    "--long-samples",
    "drop",
]
_PRETOK = ["pretokenized.parquet", "--strategy", "sequential", "--split-across-pack"]
_N, _RG = "--packed-sequence-size", "--row-group-size"
_TAR, _MIN = ["--format", "webdataset"], ["--columns", "minimal"]
# run name -> (first format version it can be made with, pack arguments)
RUNS: dict[str, tuple[int, list[str]]] = {
    "text-parquet": (2, [*_TEXT, _N, "128", _RG, "8", "--shard-size", "24"]),
    "text-tar": (2, [*_TEXT, _N, "64", *_TAR, "--shard-size", "4", "--max-packs", "8"]),
    "pretok-split-parquet": (2, [*_PRETOK, _N, "128", _RG, "8", "--shard-size", "20"]),
    "alpaca-parquet": (2, [*_ALPACA, _N, "256", _RG, "8"]),
    "chat-tar": (2, [*_CHAT, _N, "128", *_TAR, "--max-packs", "6"]),
    "pretok-split-minimal-parquet": (3, [*_PRETOK, _N, "128", *_MIN, _RG, "8", "--shard-size", "20"]),
    "chat-minimal-tar": (3, [*_CHAT, _N, "128", *_MIN, *_TAR, "--max-packs", "6"]),
}  # fmt: skip
# tar runs leave out Energon's .nv-meta (28 KiB of sqlite a run) from format 3 on, where it is an option
NO_ENERGON_INDEX_SINCE = 3


def pack_digest(pack: dict[str, np.ndarray]) -> str:
    """sha256 of one pack as read: every array's name, dtype, shape and bytes, by name.

    >>> pack_digest({"input_ids": np.arange(3, dtype=np.int32)})[:12]
    '95525db29283'
    """
    h = hashlib.sha256()
    for name in sorted(pack):
        a = np.ascontiguousarray(pack[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def make_inputs(work: Path) -> None:
    """Small inputs from data/demo/ (their first records) and a pretokenized Parquet file (fixed seed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    demo = ROOT / "data" / "demo"
    (work / "data" / "demo").mkdir(parents=True)
    shutil.copy(demo / "tokenizer.json", work / "data" / "demo" / "tokenizer.json")
    shutil.copytree(demo / "chat-tokenizer", work / "data" / "demo" / "chat-tokenizer")
    for name, source, count in (("text.jsonl", "train.jsonl", 30), ("alpaca.jsonl", "alpaca.jsonl", 30),
                                ("chat.jsonl", "chat.jsonl", 40)):  # fmt: skip
        lines = (demo / source).read_text().splitlines(keepends=True)[:count]
        (work / name).write_text("".join(lines))
    rng = np.random.default_rng(2026)
    lengths = np.clip(rng.lognormal(4.0, 0.9, 40), 2, 400).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = rng.integers(0, 1000, int(offsets[-1])).astype(np.int32)
    mask = (rng.random(int(offsets[-1])) < 0.7).astype(np.int8)
    table = pa.table(
        {
            "input_ids": pa.LargeListArray.from_arrays(offsets, ids),
            "loss_mask": pa.LargeListArray.from_arrays(offsets, mask),
        }
    )
    pq.write_table(table, work / "pretokenized.parquet")


READ_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from make_golden import pack_digest
from packtool.reading import read_packs
print(json.dumps([pack_digest(p) for p in read_packs(sys.argv[2], with_sample_index=True)]))
"""


def generate(folder: str, version: int, commit: str, runs: tuple[str, ...] | None) -> None:
    """Write tests/golden/<folder>/ with the commit's own packtool."""
    checkout = Path(tempfile.mkdtemp(prefix=f"packtool-gold-{folder}-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(checkout), commit], check=True)
    try:
        full = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
        out = GOLDEN / folder
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        src = checkout / "src"  # the package moved under src/ (issue 30): PYTHONPATH on the commit's own
        env = {**os.environ, "PYTHONPATH": str(src if (src / "packtool").is_dir() else checkout)}
        for name, (since, args) in RUNS.items():
            if version < since or (runs is not None and name not in runs):
                continue
            target = out / name
            if "webdataset" in args and version >= NO_ENERGON_INDEX_SINCE:
                args = [*args, "--no-energon-index"]
            cmd = [sys.executable, "-m", "packtool.cli", "pack", *args, "-o", str(target), "-q"]
            subprocess.run(cmd, cwd=SCRATCH, env=env, check=True)
            read = [sys.executable, "-c", READ_SCRIPT, str(ROOT / "scripts"), str(target)]
            digests = json.loads(subprocess.run(read, env=env, check=True, capture_output=True).stdout)
            manifest = json.loads((target / "manifest.json").read_text())
            record = {
                "format_version": manifest["format_version"],
                "commit": full,
                "command": ["packtool", "pack", *args],
                "read_with": "that commit's packtool.reading.read_packs(DIR, with_sample_index=True)",
                "num_packs": len(digests),
                "pack_digests": digests,
            }
            (out / f"{name}.expected.json").write_text(json.dumps(record, indent=1) + "\n")
            print(f"{folder} {name}: {len(digests)} packs", file=sys.stderr)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=list(SETS), help="folders to regenerate (default: all)")
    args = ap.parse_args()
    shutil.rmtree(SCRATCH, ignore_errors=True)
    SCRATCH.mkdir(parents=True)
    try:
        make_inputs(SCRATCH)
        for folder, (version, commit, runs) in SETS.items():
            if not args.only or folder in args.only:
                generate(folder, version, commit, runs)
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    main()
