"""Digest of what ``packtool pack`` writes, to prove a refactoring leaves the output unchanged.

    python scripts/same_bytes.py > before.json      # on the old code
    python scripts/same_bytes.py > after.json       # on the new code
    diff before.json after.json                     # empty: the same bytes

    python scripts/same_bytes.py --code OLD_CHECKOUT --packs   # the old code's packs, by this script

``--code DIR`` runs the packtool of another checkout (``git archive REV | tar -x -C DIR``; its ``src/`` or,
before the src layout, its root) on the same jobs. ``--packs`` adds, per run, a digest of the packs as that
code's ``read_packs`` gives them (every column, ``sample_index`` included): when a change alters the
``run_id`` on purpose (it is written into every shard, and made from the options, so a new option changes
it), the shards' bytes differ while the packs are the same.

Runs a fixed set of jobs (the demo config; 20,000 synthetic texts with ``bfd`` in both shard formats;
pretokenized Parquet with a loss mask, ``sequential`` and ``--split-across-pack``; the two fine-tuning
configs; ``--columns minimal`` on the pretokenized input and on chat in tar shards; the bench's
pretokenized Parquet layout in two files, ``bfd`` with ``--num-proc`` 1 and 2 and into tar shards) in a
scratch directory, each with the same relative paths every time, and prints one JSON object: for every
run, the sha256 of every file it wrote, and of its manifest with the run-specific fields
(``packtool_version``) left out and the scratch directory's path (in the inputs' and the tokenizer's
absolute paths) replaced by ``WORK``.
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
RUN_SPECIFIC = ("packtool_version",)


def make_inputs(work: Path) -> None:
    """20,000 JSON Lines texts and 5,000 pretokenized Parquet samples with a loss mask (fixed seeds)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_demo_data import document

    rng = np.random.default_rng(20_000)
    with open(work / "texts.jsonl", "w") as f:
        for _ in range(20_000):
            words = int(np.clip(rng.lognormal(4.0, 0.9), 3, 1500))
            f.write(json.dumps({"text": document(rng, words)}) + "\n")
    rng = np.random.default_rng(5_000)
    lengths = np.clip(rng.lognormal(5.5, 1.0, 5_000), 1, 6_000).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = rng.integers(0, 1300, int(offsets[-1])).astype(np.int32)
    mask = (rng.random(int(offsets[-1])) < 0.7).astype(np.int8)
    table = pa.table(
        {
            "input_ids": pa.LargeListArray.from_arrays(offsets, ids),
            "loss_mask": pa.LargeListArray.from_arrays(offsets, mask),
        }
    )
    pq.write_table(table, work / "pretokenized.parquet", row_group_size=1_000)
    # the bench's layout (int32 input_ids and shifted labels), in two files: the first with a loss_mask and
    # an attention_mask that pads a few records, the second without either and with bad records (labels of
    # another length, a negative id) that --on-error skip leaves out; chunks of 4096 cut across the files
    rng = np.random.default_rng(6_000)
    for part, count in enumerate((3_000, 4_000)):
        lengths = np.clip(rng.lognormal(5.5, 1.0, count), 1, 6_000).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        ids = rng.integers(0, 32000, int(offsets[-1])).astype(np.int32)
        labels = np.roll(ids, -1)
        labels[offsets[1:] - 1] = -100
        off = pa.array(offsets)
        cols = {
            "input_ids": pa.LargeListArray.from_arrays(off, pa.array(ids)),
            "labels": pa.LargeListArray.from_arrays(off, pa.array(labels)),
        }
        if part == 0:
            cols["loss_mask"] = pa.LargeListArray.from_arrays(
                off, pa.array((rng.random(int(offsets[-1])) < 0.8).astype(np.int8))
            )
            attend = np.ones(int(offsets[-1]), dtype=np.int8)
            attend[offsets[1:][::7] - 1] = 0  # every 7th record ends in a padding token
            cols["attention_mask"] = pa.LargeListArray.from_arrays(off, pa.array(attend))
        table = pa.table(cols)
        if part == 1:
            rows = table.to_pylist()
            rows[10]["labels"] = rows[10]["labels"][:-1]
            rows[2_500]["input_ids"][0] = -5
            table = pa.Table.from_pylist(rows, schema=table.schema)
        pq.write_table(table, work / f"bench-{part}.parquet", row_group_size=1_500)


RUNS: dict[str, list[str]] = {
    "demo": ["--config", "configs/demo.yaml", "-o", "out/demo"],
    "text20k-bfd-parquet": [
        "texts.jsonl", "--tokenizer", "data/demo/tokenizer.json", "--packed-sequence-size", "2048",
        "--add-eos", "--long-samples", "truncate", "--num-proc", "2", "-o", "out/text20k-parquet",
    ],
    "text20k-bfd-webdataset": [
        "texts.jsonl", "--tokenizer", "data/demo/tokenizer.json", "--packed-sequence-size", "2048",
        "--add-eos", "--long-samples", "truncate", "--format", "webdataset", "--shard-size", "500",
        "-o", "out/text20k-tar",
    ],
    "pretokenized-sequential-split": [
        "pretokenized.parquet", "--packed-sequence-size", "4096", "--strategy", "sequential",
        "--split-across-pack", "--row-group-size", "64", "--shard-size", "256", "-o", "out/pretok",
    ],
    "bench-bfd-truncate-np1": [
        "bench-0.parquet", "bench-1.parquet", "--packed-sequence-size", "4096", "--long-samples", "truncate",
        "--on-error", "skip", "--shard-size", "200", "--num-proc", "1", "-o", "out/bench-np1",
    ],
    "bench-bfd-truncate-np2": [
        "bench-0.parquet", "bench-1.parquet", "--packed-sequence-size", "4096", "--long-samples", "truncate",
        "--on-error", "skip", "--shard-size", "200", "--num-proc", "2", "-o", "out/bench-np2",
    ],
    "bench-bfd-split-webdataset-np2": [
        "bench-0.parquet", "bench-1.parquet", "--packed-sequence-size", "2048", "--split-across-pack",
        "--on-error", "skip", "--format", "webdataset", "--shard-size", "300", "--num-proc", "2",
        "-o", "out/bench-tar",
    ],
    "sft-alpaca": ["--config", "configs/sft_alpaca.yaml", "-o", "out/sft_alpaca"],
    "sft-chat": ["--config", "configs/sft_chat.yaml", "-o", "out/sft_chat"],
    "pretokenized-minimal-split": [
        "pretokenized.parquet", "--packed-sequence-size", "4096", "--split-across-pack", "--columns",
        "minimal", "--row-group-size", "64", "--shard-size", "256", "-o", "out/pretok-minimal",
    ],
    "sft-chat-minimal-webdataset": [
        "--config", "configs/sft_chat.yaml", "--columns", "minimal", "--format", "webdataset",
        "-o", "out/sft_chat_minimal",
    ],
}  # fmt: skip


def digest(out: Path, work: Path) -> dict[str, str]:
    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = str(path.relative_to(out))
        if rel == "manifest.json":
            manifest = json.loads(path.read_text())
            for key in RUN_SPECIFIC:
                manifest.pop(key, None)
            # absolute paths (the inputs', the tokenizer's) lie in this run's scratch directory
            data = json.dumps(manifest, sort_keys=True).replace(str(work), "WORK").encode()
        else:
            data = path.read_bytes()
        files[rel] = hashlib.sha256(data).hexdigest()
    return files


# the packs as read_packs gives them, every array in order, digested (run by the code under test)
PACKS_DIGEST = (
    "import hashlib, sys; from packtool import read_packs; h = hashlib.sha256()\n"
    "for pack in read_packs(sys.argv[1], with_sample_index=True):\n"
    "    for name in sorted(pack): h.update(name.encode()); h.update(pack[name].tobytes())\n"
    "print(h.hexdigest())"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="run only these (names above)")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose packtool runs")
    ap.add_argument("--packs", action="store_true", help="add a digest of each run's packs (read_packs)")
    args = ap.parse_args()
    code = args.code / "src" if (args.code / "src" / "packtool").is_dir() else args.code
    work = Path(tempfile.mkdtemp(prefix="packtool-same-bytes-"))
    try:
        shutil.copytree(ROOT / "data", work / "data")
        shutil.copytree(ROOT / "configs", work / "configs")
        make_inputs(work)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(args.code)])}
        result = {}
        for name, args_ in RUNS.items():
            if args.only and name not in args.only:
                continue
            cmd = [sys.executable, "-m", "packtool.cli", "pack", *args_, "-q"]
            subprocess.run(cmd, cwd=work, env=env, check=True)
            out = work / args_[args_.index("-o") + 1]
            result[name] = digest(out, work)
            if args.packs:
                read = subprocess.run([sys.executable, "-c", PACKS_DIGEST, str(out)], env=env, check=True,
                                      capture_output=True, text=True)  # fmt: skip
                result[name]["<packs>"] = read.stdout.strip()
        print(json.dumps(result, indent=1, sort_keys=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
