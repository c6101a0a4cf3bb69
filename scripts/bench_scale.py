"""How ``packtool pack`` scales: a pretokenized run at 100M, 300M and 1B tokens on this machine.

    python scripts/bench_scale.py [--tokens 100M,300M,1B] [--num-proc 2] [--work .bench/scale]

For each size it writes (once, then reuses) a pretokenized Parquet input of samples with lognormal lengths
(median 245 tokens, 8..32,768) and random token ids below 32,000, packs it with N = 4,096 and
``--split-across-pack`` through the real CLI, and prints one markdown table row: samples, tokens, wall
time, tokens/s, the peak resident memory of the whole process tree (the driver, the forkserver and its
workers, summed; sampled every 50 ms from /proc), the input and output sizes and the peak scratch space.

A second table times the driver-side plan alone (``packtool.packing.planner.make_plan`` on the same
lengths, in this process) and its peak memory from ``tracemalloc``: what the driver holds per sample,
which is what stops a single machine first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from measure import tree_rss  # noqa: E402  (scripts/measure.py: the process tree's RSS)

from packtool.options import PackOptions  # noqa: E402
from packtool.packing.planner import make_plan  # noqa: E402

N = 4096
BATCH_TOKENS = 20_000_000  # tokens generated and written per Parquet row group of the input


def parse_tokens(text: str) -> int:
    units = {"K": 10**3, "M": 10**6, "B": 10**9}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def lengths_for(tokens: int, seed: int = 0) -> np.ndarray:
    """Lognormal sample lengths (median 245, clipped to 8..32,768) adding up to about ``tokens``."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.5, 1.0, size=int(tokens / 380 * 1.1) + 16), 8, 32_768).astype(np.int64)
    cut = int(np.searchsorted(np.cumsum(lengths), tokens)) + 1
    return lengths[:cut]


def make_input(work: Path, tokens: int) -> tuple[Path, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = lengths_for(tokens)
    path = work / f"input-{tokens}.parquet"
    if path.exists() and pq.ParquetFile(path).metadata.num_rows == len(lengths):
        return path, lengths
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    tmp = path.with_suffix(".tmp")
    writer = None
    first = 0
    while first < len(lengths):
        cs = np.cumsum(lengths[first:])
        last = first + max(1, int(np.searchsorted(cs, BATCH_TOKENS)))
        part = lengths[first:last]
        offsets = np.concatenate([[0], np.cumsum(part)]).astype(np.int64)
        values = rng.integers(1, 32_000, int(offsets[-1]), dtype=np.int32)
        table = pa.table({"input_ids": pa.LargeListArray.from_arrays(offsets, values)})
        if writer is None:
            writer = pq.ParquetWriter(tmp, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=len(part))
        first = last
    writer.close()
    os.replace(tmp, path)
    return path, lengths


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (a run renames and removes them as it goes: those are skipped)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def pack(src: Path, out: Path, num_proc: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(src), "-o", str(out), "-q"]
    cmd += ["--packed-sequence-size", str(N), "--split-across-pack", "--num-proc", str(num_proc)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    peak = {"rss": 0, "scratch": 0}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    partial = out.with_name(out.name + ".partial")

    def watch() -> None:
        ticks = 0
        while proc.poll() is None:
            peak["rss"] = max(peak["rss"], tree_rss(proc.pid))
            if ticks % 10 == 0:  # the scratch space, twice a second
                peak["scratch"] = max(peak["scratch"], du(partial))
            ticks += 1
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    watcher.join()
    if proc.returncode:
        raise SystemExit(f"pack failed ({proc.returncode}): {err}")
    return {"wall_s": wall, "peak_rss": peak["rss"], "scratch": peak["scratch"], "output": du(out)}


def plan_cost(lengths: np.ndarray) -> dict:
    cfg = PackOptions.of(inputs=["x"], output="o", packed_sequence_size=N, split_across_pack=True)
    tracemalloc.start()
    t0 = time.perf_counter()
    plan = make_plan(lengths, cfg.packing)
    wall = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    held = sum(a.nbytes for a in (plan.pack_offsets, plan.sample, plan.start, plan.length))
    return {"wall_s": wall, "peak": peak, "held": held, "packs": plan.num_packs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="100M,300M,1B", help="comma-separated sizes (K, M, B suffixes)")
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--work", default=str(ROOT / ".bench" / "scale"), help="inputs (kept) and outputs")
    args = ap.parse_args()
    work = Path(args.work)
    sizes = [parse_tokens(t) for t in args.tokens.split(",")]
    gib = 2**30
    print(f"pretokenized Parquet in, N={N}, --split-across-pack, --num-proc {args.num_proc}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| tokens | samples | wall s | tokens/s | peak RSS (tree) | input | output | peak scratch |")
    print("|---|---|---|---|---|---|---|---|")
    plans = []
    for tokens in sizes:
        src, lengths = make_input(work, tokens)
        r = pack(src, work / f"out-{tokens}", args.num_proc)
        total = int(lengths.sum())
        print(
            f"| {total:,} | {len(lengths):,} | {r['wall_s']:.1f} | {total / r['wall_s'] / 1e6:.1f}M | "
            f"{r['peak_rss'] / gib:.2f} GiB | {src.stat().st_size / gib:.2f} GiB | "
            f"{r['output'] / gib:.2f} GiB | {r['scratch'] / gib:.2f} GiB |",
            flush=True,
        )
        shutil.rmtree(work / f"out-{tokens}", ignore_errors=True)
        plans.append((len(lengths), plan_cost(lengths)))
    print()
    print("| samples | plan s | plan peak memory | plan held | bytes per sample (peak) |")
    print("|---|---|---|---|---|")
    for samples, p in plans:
        print(
            f"| {samples:,} | {p['wall_s']:.2f} | {p['peak'] / 2**20:.0f} MiB | "
            f"{p['held'] / 2**20:.0f} MiB | {p['peak'] / samples:.0f} |"
        )


if __name__ == "__main__":
    main()
