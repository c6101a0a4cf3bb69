"""Benchmark ``--tar-compression none`` against ``gzip`` on the same packs (issue 30, item 10).

    python scripts/bench_tar_compression.py [--texts 40000] [--samples 30000] [--pairs 3]

Three inputs, each packed by ``packtool pack --format webdataset`` once per compression (``--num-proc 1``)
and once as Parquet (the reference the issue compared with):

* ``demo``: ``configs/demo.yaml`` (1,000 documents, N = 1024);
* ``texts``: ``bench_pack.py``'s texts of the demo corpus's words (``--texts`` of them), demo tokenizer,
  N = 2048 (docs/performance.md's storage-layout table: the issue's 446 MB against 53 MB);
* ``tokens``: ``bench_pack.py``'s pretokenized samples (``--samples``; ids uniform over 32,000: the worst
  case for compression), N = 4096.

For each it prints the shards' bytes; the write step alone (every shard of the ``none`` output's packs
written again by ``write_tar_shard`` with each compression, in this process); and reading: ``read_packs``,
the loader (``PackedDataset``, 0 workers, batch 8) and ``webdataset.WebDataset(...).decode()`` over every
pack, in ``--pairs`` pairs alternating which compression goes first, as packs/s and the median of the
pairs' ratios gzip / none (this shared machine's speed drifts more than some of the gaps). Then zlib's
levels 1, 6 and 9 on the first shard's ``.npy`` members: bytes (as tar members) and seconds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "scripts")]

from bench_pack import make_texts, make_tokens  # noqa: E402

from packtool.formats.tar import member_size  # noqa: E402
from packtool.formats.webdataset import write_tar_shard  # noqa: E402
from packtool.loader import PackedDataset, get_loader  # noqa: E402
from packtool.reading import load_manifest, read_packs  # noqa: E402

BENCH = ROOT / ".bench"
COMPRESSIONS = ("none", "gzip")


def pack(out: Path, args: list[str]) -> float:
    """``packtool pack ARGS -o out``; its wall seconds."""
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "packtool.cli", "pack", *args, "-o", str(out), "-q", "--overwrite"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed: {proc.stderr}")
    return time.perf_counter() - t


def shard_bytes(out: Path) -> int:
    return sum((out / s.path).stat().st_size for s in load_manifest(out).shards)


def write_step(src: Path, compression: str, scratch: Path) -> float:
    """Seconds to write every shard of ``src``'s packs again with ``compression`` (the packs read first)."""
    from packtool.formats.registry import get_format

    m = load_manifest(src)
    reader = get_format("webdataset").reader.open_reader(src, m)
    shards = [reader.read_stored(i, 0, list(m.columns)) for i in range(len(m.shards))]
    t = time.perf_counter()
    for i, (entry, packs) in enumerate(zip(m.shards, shards, strict=True)):
        write_tar_shard(scratch / f"{i}.tar", packs, first_pack=entry.first_pack, run_id=m.run_id, shard=i,
                        layout=m.layout, compression=compression)  # fmt: skip
    return time.perf_counter() - t


def read_all(out: Path, how: str) -> float:
    """Seconds to read every pack of ``out`` with ``how`` (read_packs, loader, webdataset)."""
    t = time.perf_counter()
    if how == "read_packs":
        for _ in read_packs(out):
            pass
    elif how == "loader":
        for _ in get_loader(PackedDataset(out, batch_size=8, shuffle=False, drop_last=False), num_workers=0):
            pass
    else:
        import webdataset as wds

        urls = [str(out / s.path) for s in load_manifest(out).shards]
        for _ in wds.WebDataset(urls, shardshuffle=False).decode():
            pass
    return time.perf_counter() - t


def levels(out: Path) -> list[tuple[int, int, float]]:
    """``(level, tar bytes of the first shard's .npy members, seconds)`` for zlib levels 1, 6, 9."""
    with tarfile.open(out / load_manifest(out).shards[0].path) as tar:
        data = [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".npy")]
    rows = [(0, sum(member_size(len(d)) for d in data), 0.0)]
    for level in (1, 6, 9):
        t = time.perf_counter()
        sizes = [member_size(len(zlib.compress(d, level, wbits=31))) for d in data]
        rows.append((level, sum(sizes), time.perf_counter() - t))
    return rows


def bench(name: str, args: list[str], pairs: int) -> None:
    work = BENCH / f"tarz-{name}"
    work.mkdir(parents=True, exist_ok=True)
    outs = {c: work / c for c in COMPRESSIONS}
    wall = {c: pack(outs[c], [*args, "--format", "webdataset", "--tar-compression", c]) for c in COMPRESSIONS}
    wall["parquet"] = pack(work / "parquet", args)
    m = load_manifest(outs["none"])
    k = m.num_packs
    size = {c: shard_bytes(o) for c, o in outs.items()} | {"parquet": shard_bytes(work / "parquet")}
    print(f"\n## {name}: {k:,} packs of N = {m.packed_sequence_size}, {m.stats.num_tokens:,} tokens")
    print("| | none | gzip | parquet |\n|---|---|---|---|")
    print(f"| shard bytes | {size['none']:,} | {size['gzip']:,} | {size['parquet']:,} |")
    print(f"| of none | 1.0 | {size['gzip'] / size['none']:.3f} | {size['parquet'] / size['none']:.3f} |")
    walls = " | ".join(f"{wall[c]:.2f}" for c in (*COMPRESSIONS, "parquet"))
    print(f"| `packtool pack` wall s (one run) | {walls} |")
    scratch = work / "rewrite"
    scratch.mkdir(exist_ok=True)
    rows: dict[str, dict[str, list[float]]] = {}
    for i in range(pairs):
        order = COMPRESSIONS if i % 2 == 0 else COMPRESSIONS[::-1]
        for c in order:
            rows.setdefault("write step", {}).setdefault(c, []).append(write_step(outs["none"], c, scratch))
        for how in ("read_packs", "loader", "webdataset"):
            for c in order:
                rows.setdefault(how, {}).setdefault(c, []).append(read_all(outs[c], how))
    for how, times in rows.items():
        none, gz = statistics.median(times["none"]), statistics.median(times["gzip"])
        ratio = statistics.median(a / b for a, b in zip(times["none"], times["gzip"], strict=True))
        print(f"| {how}, packs/s (median of {pairs}) | {k / none:,.0f} | {k / gz:,.0f} (x{ratio:.2f}) | |")
    print("\n| zlib level | bytes of shard 0's .npy members | of uncompressed | s |\n|---|---|---|---|")
    rows_levels = levels(outs["none"])
    for level, nbytes, seconds in rows_levels:
        print(f"| {level or 'none'} | {nbytes:,} | {nbytes / rows_levels[0][1]:.3f} | {seconds:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=40_000)
    ap.add_argument("--samples", type=int, default=30_000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=["demo", "texts", "tokens"])
    args = ap.parse_args()
    BENCH.mkdir(exist_ok=True)
    runs = {"demo": ["--config", "configs/demo.yaml", "--num-proc", "1"]}
    texts = BENCH / f"texts-{args.texts}.jsonl"
    if not args.only or "texts" in args.only:
        if not texts.exists():
            make_texts(texts, args.texts)
    runs["texts"] = [str(texts), "--tokenizer", "data/demo/tokenizer.json", "--packed-sequence-size", "2048",
                     "--long-samples", "truncate", "--num-proc", "1"]  # fmt: skip
    tokens = BENCH / f"tokens-{args.samples}.parquet"
    if (not args.only or "tokens" in args.only) and not tokens.exists():
        make_tokens(tokens, args.samples)
    runs["tokens"] = [str(tokens), "--packed-sequence-size", "4096", "--long-samples", "truncate",
                      "--num-proc", "1"]  # fmt: skip
    for name, run in runs.items():
        if not args.only or name in args.only:
            bench(name, run, args.pairs)


if __name__ == "__main__":
    main()
