"""Packing and training from an object store against local disk, in one run, on the same data and cores.

Run by ``make bench`` (``python scripts/bench_storage.py [--samples 40000] [--loader-packs 0]``). A real
S3-protocol server runs on localhost in this process (moto's ``ThreadedMotoServer``, the dev extra), reached
through the standard AWS variables, as the tests reach it:

* **pack**: ``--samples`` text records (``bench_pack.make_texts``, ~250 tokens each, demo tokenizer,
  N = 4096, 2 processes) packed by the real CLI local -> local, s3 -> local, local -> s3 and s3 -> s3:
  wall and CPU seconds, the peak RSS of the job's process tree, and each row's wall against local ->
  local's. Every output must hold the same packs as local -> local's (checked: the shards differ only by
  the run id, which names the input and the output).
* **loader** (``--loader-packs`` > 0, default 2,000): the N = 4096 output of ``bench_loader.make_data``
  (Parquet, pretokenized) uploaded to the server; ``PackedDataset`` over it with a cold cache (emptied
  first) and a warm one (filled by the cold pass), against the same output on local disk: packs/s of one
  epoch (cold) or of 5 (local, warm) with 2 workers, after the first batch, each in a process of its own,
  with its peak RSS (the loader's process tree) and the cache's bytes at the end; the median of 3 rounds
  taken in turn.

The server is moto's, in Python, in this process: it is far slower than S3 itself (one thread per
request, every object in memory), so the ratios bound what packtool's own handling of a store costs from
above; a real store serves the ranged GETs of several workers in parallel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pack import BENCH, ROOT, make_texts  # noqa: E402
from measure import run_measured  # noqa: E402

N = 4096
TOKENIZER = ROOT / "data/demo/tokenizer.json"


def start_server() -> tuple[object, str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
    )  # fmt: skip
    return server, endpoint


def packs_digest(directory: Path) -> str:
    """sha256 of every pack's tokens, labels and seq_lens, in order."""
    from packtool import read_packs

    h = hashlib.sha256()
    for pack in read_packs(directory):
        for key in ("input_ids", "labels", "seq_lens"):
            h.update(pack[key].tobytes())
    return h.hexdigest()


def downloaded(fs, prefix: str, to: Path) -> Path:
    shutil.rmtree(to, ignore_errors=True)
    fs.get(prefix + "/", str(to) + "/", recursive=True)
    return to


def bench_pack(samples: int, fs) -> list[dict]:
    data = BENCH / f"storage-{samples}.jsonl"
    if not data.exists():
        make_texts(data, samples)
    fs.put_file(str(data), "bench/in/data.jsonl")
    local_out = BENCH / "storage-out"
    rows = []
    for source, target in [("local", "local"), ("s3", "local"), ("local", "s3"), ("s3", "s3")]:
        inp = str(data) if source == "local" else "s3://bench/in/data.jsonl"
        out = str(local_out) if target == "local" else "s3://bench/out"
        if target == "s3" and fs.exists("bench/out"):
            fs.rm("bench/out", recursive=True)
        shutil.rmtree(local_out, ignore_errors=True)
        cmd = [sys.executable, "-m", "packtool.cli", "pack", inp, "-o", out, "-q", "--num-proc", "2",
               "--tokenizer", str(TOKENIZER), "--add-eos", "--packed-sequence-size", str(N),
               "--long-samples", "truncate"]  # fmt: skip
        m = run_measured(cmd, log=BENCH / "storage-last.log", cwd=ROOT)
        if m.rc != 0:
            raise SystemExit(f"{source} -> {target} failed: {m.log.read_text()[-2000:]}")
        got = local_out if target == "local" else downloaded(fs, "bench/out", BENCH / "storage-got")
        rows.append({"row": f"{source} -> {target}", "wall": m.wall, "cpu": m.cpu, "rss": m.tree_rss,
                     "packs": packs_digest(got)})  # fmt: skip
    for r in rows:
        r["ratio"] = r["wall"] / rows[0]["wall"]
    if len({r.pop("packs") for r in rows}) != 1:
        raise SystemExit("the packs differ between local disk and the store")
    return rows


LOADER = """
import json, sys, time
from packtool.loader import PackedDataset, get_loader
ds = PackedDataset(sys.argv[1], batch_size=8, shuffle=True, seed=0, attention="causal", infinite=True)
it = iter(get_loader(ds, num_workers=2))
packs = len(next(it))
t0 = time.perf_counter()
for _ in range(int(sys.argv[2]) * ds.batches_per_epoch - 1):
    packs += len(next(it))
print(json.dumps({"packs": packs, "seconds": time.perf_counter() - t0}))
"""
WARM_EPOCHS = 5  # epochs a local or warm row reads (a cold row: its first epoch alone)


def bench_loader(packs: int, fs, repeats: int = 3) -> list[dict]:
    """The loader rows (module docstring), each the median of ``repeats`` runs taken in turn (local, cold,
    warm; the cache emptied before each cold run), so that other work on the machine weighs on each."""
    from bench_loader import make_data

    local = make_data(BENCH, packs)
    for p in local.iterdir():
        if p.is_file():
            fs.put_file(str(p), f"bench/loaded/{p.name}")
    cache = BENCH / "storage-cache"
    env = {**os.environ, "PACKTOOL_CACHE": str(cache)}
    runs: dict[str, list[dict]] = {}
    plan = [("local disk", str(local), WARM_EPOCHS), ("s3, cold cache", "s3://bench/loaded", 1),
            ("s3, warm cache", "s3://bench/loaded", WARM_EPOCHS)]  # fmt: skip
    for _ in range(repeats):
        shutil.rmtree(cache, ignore_errors=True)
        for row, source, epochs in plan:
            log = BENCH / "storage-loader.log"
            m = run_measured([sys.executable, "-c", LOADER, source, str(epochs)], log=log, cwd=ROOT, env=env)
            if m.rc != 0:
                raise SystemExit(f"{row} failed: {log.read_text()[-2000:]}")
            got = json.loads(log.read_text().strip().splitlines()[-1])
            held = sum(p.stat().st_size for p in cache.rglob("packs-*")) if cache.exists() else 0
            runs.setdefault(row, []).append(
                {"packs_per_s": (got["packs"] - 8) / got["seconds"], "rss": m.tree_rss, "cache_bytes": held}
            )
    rows = []
    for row, _, _ in plan:
        med = sorted(runs[row], key=lambda r: r["packs_per_s"])[len(runs[row]) // 2]
        rows.append({"row": row, **med, "all_packs_per_s": [round(r["packs_per_s"]) for r in runs[row]]})
    for r in rows:
        r["ratio"] = r["packs_per_s"] / rows[0]["packs_per_s"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=40_000)
    ap.add_argument("--loader-packs", type=int, default=3_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    BENCH.mkdir(exist_ok=True)
    server, _ = start_server()
    try:
        import s3fs

        fs = s3fs.S3FileSystem(use_listings_cache=False)
        fs.mkdir("bench")
        rows = bench_pack(args.samples, fs) if args.samples else []
        loader = bench_loader(args.loader_packs, fs) if args.loader_packs else []
    finally:
        server.stop()
    if args.json:
        print(json.dumps({"pack": rows, "loader": loader}, indent=1))
        return
    if rows:
        print(f"pack: {args.samples:,} text records, N = {N}, 2 processes (the same packs in every row)")
        print(f"{'':<16}{'wall s':>8}{'cpu s':>8}{'peak MiB':>10}{'vs local':>10}")
    for r in rows:
        print(f"{r['row']:<16}{r['wall']:>8.2f}{r['cpu']:>8.2f}{r['rss'] / 2**20:>10.0f}{r['ratio']:>9.2f}x")
    if loader:
        print(
            f"loader: {args.loader_packs:,} packs of {N}, 2 workers, medians of 3 (target: warm within 10%)"
        )
        print(f"{'':<16}{'packs/s':>9}{'vs local':>10}{'peak MiB':>10}{'cache MiB':>11}")
        for r in loader:
            print(
                f"{r['row']:<16}{r['packs_per_s']:>9.0f}{r['ratio']:>9.2f}x{r['rss'] / 2**20:>10.0f}"
                f"{r['cache_bytes'] / 2**20:>11.0f}"
            )


if __name__ == "__main__":
    main()
