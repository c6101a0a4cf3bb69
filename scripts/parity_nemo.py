"""Parity and speed of ``packtool pack --strategy sequential`` against NeMo AutoModel 0.1.2 PackedSequence.

Builds a pretokenized Parquet dataset (lognormal lengths, mean ~300 tokens), then in one run:

1. ``packtool pack`` (a subprocess; wall time and peak RSS of it and its workers), and
2. NeMo AutoModel 0.1.2's ``PackedSequence`` (its module file loaded from the wheel, in a subprocess),

and checks that the packs are equal element for element (``input_ids``, ``labels``, ``position_ids``,
``seq_lens``), by comparing per-field SHA-256 digests over all packs in order.

    python scripts/parity_nemo.py [--samples 100000] [--packed-sequence-size 4096] [--split-across-pack]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from measure import run_measured

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("input_ids", "labels", "position_ids", "seq_lens")

NEMO_CHILD = r"""
import hashlib, json, sys, time
sys.path.insert(0, {tests!r})
from nemo_reference import load_packed_sequence_module
import datasets
m = load_packed_sequence_module()
ds = datasets.Dataset.from_parquet({data!r})
t = time.perf_counter()
ps = m.PackedSequence(ds, "train", {n}, split_across_pack={split}, max_packs=None)
ps.pack()
elapsed = time.perf_counter() - t
h = {{f: hashlib.sha256() for f in {fields!r}}}
for p in ps.packs:
    for f in h:
        h[f].update(p[f].numpy().astype("int64").tobytes())
digests = {{f: v.hexdigest() for f, v in h.items()}}
print(json.dumps({{"seconds": elapsed, "num_packs": len(ps.packs), "digests": digests}}))
"""


def make_dataset(path: Path, samples: int, n: int, split: bool, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(mean=np.log(300) - 0.5, sigma=1.0, size=samples)).astype(np.int64)
    if not split:
        lengths = np.minimum(lengths, n)
    offsets = np.zeros(samples + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(1, 128000, size=offsets[-1], dtype=np.int32)
    labels = np.empty_like(ids)
    labels[:-1] = ids[1:]
    labels[offsets[1:] - 1] = -100
    table = pa.table(
        {
            "input_ids": pa.LargeListArray.from_arrays(offsets, ids),
            "labels": pa.LargeListArray.from_arrays(offsets, labels),
        }
    )
    pq.write_table(table, path, row_group_size=10000)
    return int(offsets[-1])


def run_job(cmd: list[str], env: dict, log: Path) -> tuple[float, float, str]:
    """Run ``cmd``; return wall seconds, peak RSS in MiB (its largest single process), its output."""
    m = run_measured(cmd, env, log)
    if m.rc:
        raise SystemExit(f"{cmd[:3]} failed with {m.rc}: see {log}")
    return m.wall, m.rss / 2**20, log.read_text()


def packtool_digests(out: Path) -> tuple[int, dict]:
    sys.path.insert(0, str(ROOT))
    from packtool import read_packs

    h = {f: hashlib.sha256() for f in FIELDS}
    count = 0
    for pack in read_packs(out):
        count += 1
        for f in FIELDS:
            h[f].update(pack[f].astype(np.int64).tobytes())
    return count, {f: v.hexdigest() for f, v in h.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--packed-sequence-size", type=int, default=4096)
    ap.add_argument("--split-across-pack", action="store_true")
    ap.add_argument("--num-proc", type=int, default=2)
    args = ap.parse_args()
    n, split = args.packed_sequence_size, args.split_across_pack
    with tempfile.TemporaryDirectory(prefix="packtool-parity-") as tmp:
        data = Path(tmp) / "data.parquet"
        tokens = make_dataset(data, args.samples, n, split)
        print(f"dataset: {args.samples:,} samples, {tokens:,} tokens, N={n}, split_across_pack={split}")
        out = Path(tmp) / "out"
        cmd = [
            sys.executable,
            "-m",
            "packtool.cli",
            "pack",
            str(data),
            "-o",
            str(out),
            "--packed-sequence-size",
            str(n),
            "--strategy",
            "sequential",
            "--num-proc",
            str(args.num_proc),
            "-q",
        ]
        if split:
            cmd.append("--split-across-pack")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        pt_wall, pt_rss, _ = run_job(cmd, env, Path(tmp) / "packtool.log")
        child = NEMO_CHILD.format(tests=str(ROOT / "tests"), data=str(data), n=n, split=split, fields=FIELDS)
        nemo_wall, nemo_rss, nemo_out = run_job([sys.executable, "-c", child], env, Path(tmp) / "nemo.log")
        nemo = json.loads([ln for ln in nemo_out.splitlines() if ln.startswith("{")][-1])
        count, digests = packtool_digests(out)
    equal = count == nemo["num_packs"] and digests == nemo["digests"]
    print(f"{'':24s}{'wall s':>10s}{'peak RSS MiB':>14s}{'packs':>10s}")
    print(f"{'packtool pack':24s}{pt_wall:10.2f}{pt_rss:14.0f}{count:10d}")
    print(
        f"{'NeMo PackedSequence':24s}{nemo_wall:10.2f}{nemo_rss:14.0f}{nemo['num_packs']:10d}"
        f"   (pack() alone: {nemo['seconds']:.2f} s)"
    )
    print(f"speed-up (wall): {nemo_wall / pt_wall:.1f}x; packs equal element for element: {equal}")
    if not equal:
        raise SystemExit("MISMATCH: packtool's sequential packs differ from PackedSequence's")


if __name__ == "__main__":
    main()
