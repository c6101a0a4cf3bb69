"""Benchmark the storage layouts ``--columns full`` and ``--columns minimal`` against each other (issue 18).

    python scripts/bench_columns.py [--samples 100000] [--sft-samples 30000] [--pairs 3] [--write-pairs 9]

Two pretokenized inputs in ``.bench/`` (N = 4096): ``pretrain``, ``bench_pack.py``'s 100k samples
(lognormal lengths, mean ~300 tokens, with shifted ``labels`` of their own, which follow the rule the
minimal layout rebuilds them by), and ``sft``, samples with a ``loss_mask`` (a prompt of 0s, then a
response of 1s: labels and loss_mask as the fine-tuning encoders make them). For each, in one run:

* **bytes**: the Parquet shards of each layout, and the same packs' ``input_ids`` alone written by
  packtool's Parquet writer with the same settings (zstd, row groups, page checksums): the reference.
  Target: minimal / input_ids alone <= 1.15. The tar shards (``--format webdataset``, uncompressed) are
  shown beside, against the ``input_ids.npy`` members alone (``tar_input_ids_bytes``), with the same
  target (a minimal tar pack: ``input_ids.npy`` and one ``small_columns.npy`` record, no ``.json``);
* **write**: the write step alone (plan + encoded chunks -> shards, ``pipeline.write.write_shard`` for
  every shard, in this process), on the same encoded chunks and plan, full and minimal one after the
  other in ``--write-pairs`` pairs (alternating which goes first): the figure is the median of the
  pairs' ratios, since this shared machine's speed drifts more than the gap (single pairs of this
  second-long step ranged 0.34-0.66 in one run). Target: minimal / full <= 0.6.
  ``packtool pack`` end to end (a subprocess each, same pairing) is shown beside;
* **loader**: ``PackedDataset`` packs/s (batch 8, shuffled, one epoch) on each layout's output, with 0
  and 2 workers, paired the same way. Target: minimal / full >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from bench_pack import lognormal_lengths, make_tokens, write_lists  # noqa: E402

from packtool.formats.parquet import write_parquet_shard  # noqa: E402
from packtool.formats.registry import ShardMeta, get_format  # noqa: E402
from packtool.formats.tar import BLOCK, RECORD, member_size, npy_size  # noqa: E402
from packtool.loader import PackedDataset, get_loader  # noqa: E402
from packtool.options import PackOptions  # noqa: E402
from packtool.packing.planner import make_plan  # noqa: E402
from packtool.packs import PackArrays  # noqa: E402
from packtool.pipeline.chunks import ChunkStore  # noqa: E402
from packtool.pipeline.encode import encode_to_chunks  # noqa: E402
from packtool.pipeline.engines import make_engine  # noqa: E402
from packtool.pipeline.run import start_run  # noqa: E402
from packtool.pipeline.write import output_columns, write_shard  # noqa: E402
from packtool.readers.inputs import read_inputs  # noqa: E402
from packtool.reading import load_manifest  # noqa: E402

BENCH = ROOT / ".bench"
N = 4096
LAYOUTS = ("full", "minimal")


def make_sft(path: Path, samples: int, seed: int = 0) -> None:
    """``samples`` pretokenized records with a ``loss_mask``: 20-60% prompt (0), the rest response (1)."""

    lengths = lognormal_lengths(samples, 300, seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rng = np.random.default_rng(seed + 1)
    ids = rng.integers(0, 32000, offsets[-1], dtype=np.int32)
    prompt = (lengths * rng.uniform(0.2, 0.6, samples)).astype(np.int64)
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    mask = (position >= np.repeat(prompt, lengths)).astype(np.int8)
    write_lists(path, offsets, {"input_ids": ids, "loss_mask": mask})


def pair_order(i: int) -> tuple[str, str]:
    return LAYOUTS if i % 2 == 0 else LAYOUTS[::-1]


def pack_cli(data: Path, out: Path, layout: str, fmt: str = "parquet") -> float:
    """``packtool pack`` end to end in a subprocess; wall seconds."""
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(data), "-o", str(out), "--overwrite", "-q"]
    cmd += ["--packed-sequence-size", str(N), "--long-samples", "truncate"]
    cmd += ["--columns", layout, "--format", fmt]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return time.perf_counter() - t


def config_for(data: Path, out: Path, layout: str) -> PackOptions:
    return PackOptions.of(
        inputs=[str(data)],
        output=str(out),
        packed_sequence_size=N,
        long_samples="truncate",
        columns=layout,
        num_proc=1,
        quiet=True,
    )


def write_step(data: Path, work: Path, pairs: int) -> tuple[list[float], dict]:
    """Encode ``data`` once, plan it, then time the write step of each layout on the same chunks and plan."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "chunks" / "shards").mkdir(parents=True)
    config = config_for(data, work / "out", "minimal")  # minimal: the chunks record whether labels follow
    spec = start_run(config, "pretokenized")
    batches = read_inputs(
        config.reading.inputs, split=config.reading.split, text_field=config.encoding.text_field
    )
    with make_engine(config.running, 1) as engine:
        metas = encode_to_chunks(spec, config, batches, str(work / "chunks"), engine)
    store = ChunkStore(work / "chunks", metas)
    plan = make_plan(store.lengths(), config.packing)
    times: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for i in range(pairs):
        for layout in pair_order(i):
            cfg = config_for(data, work / layout, layout)
            spec = start_run(cfg, "pretokenized")
            columns = output_columns(cfg, ChunkStore(work / "chunks", metas))
            fmt = get_format(cfg.output.format)
            out = work / layout
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            t = time.perf_counter()
            for s, (a, b) in enumerate(fmt.writer.shard_ranges(plan, cfg.output, columns)):
                meta = ShardMeta("bench", s, a, N)
                write_shard(spec, meta, plan.slice(a, b), str(work / "chunks"), str(out))
            times[layout].append(time.perf_counter() - t)
    ratios = [m / f for m, f in zip(times["minimal"], times["full"], strict=True)]
    return ratios, times


def input_ids_alone_bytes(out: Path, scratch: Path) -> int:
    """Bytes of the output's ``input_ids`` alone, written by packtool's Parquet writer as the output was
    (same row groups, zstd, page checksums)."""
    import pyarrow.parquet as pq

    m = load_manifest(out)
    scratch.mkdir(parents=True, exist_ok=True)
    total = 0
    for entry in m.shards:
        pf = pq.ParquetFile(out / entry.path)
        blocks = []
        for rg in range(pf.metadata.num_row_groups):
            col = pf.read_row_group(rg, columns=["input_ids"]).column("input_ids").combine_chunks()
            blocks.append(PackArrays(input_ids=col.values.to_numpy().reshape(-1, N)))
        path = scratch / entry.path
        write_parquet_shard(path, blocks, row_group_size=m.option("row_group_size"), metadata={"run_id": "x"})
        total += path.stat().st_size
        path.unlink()
    return total


def shard_bytes(out: Path) -> int:
    return sum(s.bytes for s in load_manifest(out).shards)


def tar_input_ids_bytes(out: Path) -> int:
    """Bytes of a tar holding each pack's ``input_ids.npy`` member alone (the tar's own layout)."""
    m = load_manifest(out)
    per_pack = member_size(npy_size((N,), np.dtype(np.int32)))
    return sum(-(-(e.num_packs * per_pack + 2 * BLOCK) // RECORD) * RECORD for e in m.shards)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its reaped children (the DataLoader workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def loader_pps(out: Path, workers: int) -> tuple[float, float]:
    """Packs/s after the first batch, and CPU seconds per 1,000 packs over the whole epoch (workers and
    their start-up included: what other jobs on the machine change least)."""
    ds = PackedDataset(out, batch_size=8, shuffle=True, seed=0)
    loader = get_loader(ds, num_workers=workers)
    c0 = cpu_seconds()
    it = iter(loader)
    packs = len(next(it))
    t = time.perf_counter()
    for batch in it:
        packs += len(batch)
    wall = time.perf_counter() - t
    del it  # the workers are joined: their CPU time counts from here
    return (packs - 8) / wall, (cpu_seconds() - c0) / packs * 1000


def bench(name: str, data: Path, pairs: int, write_pairs: int) -> dict:
    work = BENCH / f"columns-{name}"
    outs = {layout: work / f"out-{layout}" for layout in LAYOUTS}
    pack_s: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for i in range(pairs):
        for layout in pair_order(i):
            pack_s[layout].append(pack_cli(data, outs[layout], layout))
    tars = {layout: work / f"tar-{layout}" for layout in LAYOUTS}
    for layout in LAYOUTS:
        pack_cli(data, tars[layout], layout, "webdataset")
    res: dict = {"name": name, "columns": load_manifest(outs["minimal"]).columns}
    ids_alone = input_ids_alone_bytes(outs["minimal"], work / "ids-alone")
    res["bytes"] = {layout: shard_bytes(outs[layout]) for layout in LAYOUTS} | {"input_ids alone": ids_alone}
    res["tar_bytes"] = {layout: shard_bytes(tars[layout]) for layout in LAYOUTS}
    res["tar_bytes"]["input_ids alone"] = tar_input_ids_bytes(tars["minimal"])
    ratios, times = write_step(data, work / "write", write_pairs)
    res["write_s"], res["write_ratio"] = times, statistics.median(ratios)
    res["pack_s"] = pack_s
    res["pack_ratio"] = statistics.median(
        m / f for m, f in zip(pack_s["minimal"], pack_s["full"], strict=True)
    )
    res["loader"] = {}
    for workers in (0, 2):
        pps: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        cpu: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        for i in range(pairs):
            for layout in pair_order(i):
                speed, per_1k = loader_pps(outs[layout], workers)
                pps[layout].append(speed)
                cpu[layout].append(per_1k)
        ratio = statistics.median(m / f for m, f in zip(pps["minimal"], pps["full"], strict=True))
        res["loader"][workers] = {"packs_per_s": pps, "cpu_s_per_1k": cpu, "ratio": ratio}
    return res


def report(res: dict) -> None:
    b, t = res["bytes"], res["tar_bytes"]
    print(f"\n== {res['name']}: minimal stores {', '.join(res['columns'])}")
    print(
        f"(a) bytes, Parquet: full {b['full'] / 2**20:,.1f} MiB, minimal {b['minimal'] / 2**20:,.1f} MiB, "
        f"input_ids alone {b['input_ids alone'] / 2**20:,.1f} MiB: minimal / input_ids alone = "
        f"{b['minimal'] / b['input_ids alone']:.3f} (target <= 1.15; "
        f"full: {b['full'] / b['input_ids alone']:.3f})"
    )
    print(
        f"    bytes, tar: full {t['full'] / 2**20:,.1f} MiB, minimal {t['minimal'] / 2**20:,.1f} MiB, "
        f"input_ids members alone {t['input_ids alone'] / 2**20:,.1f} MiB: minimal / input_ids alone = "
        f"{t['minimal'] / t['input_ids alone']:.3f} (target <= 1.15; "
        f"full: {t['full'] / t['input_ids alone']:.3f})"
    )
    w = res["write_s"]
    print(
        f"(b) write step (one process): full {statistics.median(w['full']):.2f} s, minimal "
        f"{statistics.median(w['minimal']):.2f} s (medians): minimal / full = {res['write_ratio']:.3f} "
        f"(median of {len(w['full'])} pairs; target <= 0.6)"
    )
    p = res["pack_s"]
    print(
        f"    packtool pack end to end: full {statistics.median(p['full']):.2f} s, minimal "
        f"{statistics.median(p['minimal']):.2f} s: minimal / full = {res['pack_ratio']:.3f}"
    )
    for workers, row in res["loader"].items():
        pps, cpu = row["packs_per_s"], row["cpu_s_per_1k"]
        print(
            f"(c) loader, {workers} workers: full {statistics.median(pps['full']):,.0f} packs/s, minimal "
            f"{statistics.median(pps['minimal']):,.0f} packs/s: minimal / full = {row['ratio']:.3f} "
            f"(target >= 0.9); CPU s / 1k packs: full {statistics.median(cpu['full']):.3f}, minimal "
            f"{statistics.median(cpu['minimal']):.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000, help="pretrain samples (default 100,000)")
    ap.add_argument("--sft-samples", type=int, default=30_000, help="fine-tuning samples (default 30,000)")
    ap.add_argument("--pairs", type=int, default=3, help="paired runs per figure (median of the ratios)")
    ap.add_argument("--write-pairs", type=int, default=9, help="paired runs of the write step (median)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()
    BENCH.mkdir(exist_ok=True)
    pretrain = BENCH / f"tokens-{args.samples}.parquet"
    if not pretrain.exists():
        make_tokens(pretrain, args.samples)
    sft = BENCH / f"sft-{args.sft_samples}.parquet"
    if not sft.exists():
        make_sft(sft, args.sft_samples)
    print(
        f"packtool --columns full vs minimal, N = {N}, {args.pairs} pairs per figure "
        f"({args.write_pairs} for the write step)"
    )
    results = [
        bench(name, data, args.pairs, args.write_pairs)
        for name, data in (("pretrain", pretrain), ("sft", sft))
    ]
    for res in results:
        report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
