"""``--engine local`` against ``--engine ray``, and how far the driver-side plan scales.

Run by ``make bench`` (``python scripts/bench_engines.py [--samples 50000] [--plan-samples 2000000]``).
In one run, on the same data and cores:

* **engines**, on ``--samples`` records of two inputs: text JSON Lines of the demo corpus's words (~40
  words a record, tokenized with the demo tokenizer) and pretokenized Parquet (``bench_pack.py``'s
  builder, ~300 tokens a record), each packed by the real CLI (bfd, N = 4096) in its own process:
  ``local`` with 1 and 2 processes, ``ray`` that starts its own local Ray (2 CPUs), and ``ray`` joining a
  Ray already running (``--ray-address``, started by this script with 2 CPUs, as a cluster would be).
  Wall seconds and the ratio to ``local 1`` of the same run; every row's shards must have the same sha256
  as ``local 1``'s (checked, not assumed).
* **Ray Data for comparison** (same running Ray, in this process): ``ray.data.read_parquet`` /
  ``ray.data.read_json`` + ``map_batches`` with packtool's own encoder, materialized. This is only the
  read+encode step (no chunk files, no plan, no output), and it carries no row numbers, which packtool's
  error messages need (see the README's Ray section for why the engine has its tasks read row ranges).
* **driver-side plan**: lengths of ``--plan-samples`` samples (lognormal, mean 300 tokens) planned by
  ``sequential`` and ``bfd`` in a child process each (N = 4096, long samples truncated): plan seconds,
  the lengths array's bytes, the plan's bytes and the child's peak RSS, with a linear extrapolation to
  1B samples (the plan is one process on one machine, whatever the engine): seconds, the bytes kept to
  the end (lengths + plan) and the peak (lengths + the plan's growth of the peak RSS, temporaries in).

Peak RSS is the summed RSS of the CLI run's process tree, polled every 50 ms (for ``ray joined`` the Ray
workers belong to the running Ray, not to the CLI, so they are not in it).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pack import BENCH, ROOT, lognormal_lengths, make_texts, make_tokens  # noqa: E402
from measure import run_measured  # noqa: E402

N = 4096
TOKENIZER = ROOT / "data/demo/tokenizer.json"


def pack_cmd(data: Path, out: Path, *flags: str) -> list[str]:
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(data), "-o", str(out), "--overwrite", "-q"]
    cmd += ["--packed-sequence-size", str(N), "--long-samples", "truncate", *flags]
    if data.suffix == ".jsonl":
        cmd += ["--tokenizer", str(TOKENIZER), "--add-eos"]
    return cmd


def measure(cmd: list[str]) -> dict:
    """Run ``cmd``: wall seconds and the peak summed RSS of its process tree (see ``measure.py``: a child
    started straight from this script, which holds a Ray driver, would inherit its ``ru_maxrss``)."""
    m = run_measured(cmd, log=BENCH / "engines-last.log", cwd=ROOT)
    return {"rc": m.rc, "wall": m.wall, "rss": m.tree_rss, "log": str(m.log)}


def _hwm() -> int:
    """This process's peak resident set (VmHWM, bytes): its own since exec, unlike ``ru_maxrss``."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def shard_hashes(out: Path) -> list[str]:
    return [s["sha256"] for s in json.loads((out / "manifest.json").read_text())["shards"]]


def engine_rows(data: Path, address: str) -> list[dict]:
    out = BENCH / "engines-out"
    runs = [
        ("local 1 proc", ["--num-proc", "1"]),
        ("local 2 procs", ["--num-proc", "2"]),
        ("ray, own local Ray (2 CPUs)", ["--engine", "ray", "--num-proc", "2"]),
        ("ray, joins a running Ray", ["--engine", "ray", "--ray-address", address]),
    ]
    rows, reference = [], None
    for name, flags in runs:
        m = measure(pack_cmd(data, out, *flags))
        if m["rc"] != 0:
            raise SystemExit(f"{name} failed (rc {m['rc']}); see {m['log']}")
        hashes = shard_hashes(out)
        reference = reference or hashes
        rows.append({"name": name, "wall": m["wall"], "rss": m["rss"], "same": hashes == reference})
    shutil.rmtree(out)
    return rows


def ray_data_row(data: Path) -> dict:
    """Read + encode only, with Ray Data on the running Ray: what ``read_*`` + ``map_batches`` costs."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    from packtool.encoders.registry import resolve_sample_format
    from packtool.options import PackOptions
    from packtool.readers.base import SourceBatch

    text = data.suffix == ".jsonl"
    cfg = PackOptions.from_dict(
        {"packed_sequence_size": N, "tokenizer": str(TOKENIZER) if text else None, "add_eos": text}
    )
    fmt = resolve_sample_format(cfg.encoding, ["text"] if text else ["input_ids", "labels"])

    config = cfg.to_dict()

    def encode(table):
        """Encode one block with packtool's encoder (built once per Ray worker process)."""
        import numpy as np
        import pyarrow as pa

        from packtool.pipeline.encode import RunSpec, worker

        encoder = worker(RunSpec(json.dumps(config), fmt, "ray-data")).encoder
        out = []
        for b in table.to_batches():  # row numbers are not known here: -1 stands for them
            enc = encoder(SourceBatch(str(data), b, np.full(b.num_rows, -1), "row"))
            out.append(enc.select(["input_ids"]))
        if not out:  # an empty block
            return pa.table({"input_ids": pa.array([], pa.list_(pa.int32()))})
        return pa.Table.from_batches(out)

    t0 = time.perf_counter()
    ds = ray.data.read_json(str(data)) if text else ray.data.read_parquet(str(data))
    ds = ds.map_batches(encode, batch_format="pyarrow", batch_size=2048)
    rows = ds.materialize().count()
    return {"name": f"ray.data.{'read_json' if text else 'read_parquet'} + map_batches (encode only, "
            f"{rows} rows)", "wall": time.perf_counter() - t0, "rss": None, "same": None}  # fmt: skip


def print_engine_table(title: str, rows: list[dict]) -> None:
    base = rows[0]["wall"]
    print(f"\n{title}")
    print(f"  {'run':<66} {'wall s':>7} {'x local 1':>9} {'peak RSS MiB':>12} {'same bytes':>10}")
    for r in rows:
        rss = f"{r['rss'] / 2**20:12.0f}" if r["rss"] else f"{'-':>12}"
        same = {True: "yes", False: "NO", None: "-"}[r["same"]]
        print(f"  {r['name']:<66} {r['wall']:7.2f} {r['wall'] / base:9.2f} {rss} {same:>10}")


# --- the driver-side plan --------------------------------------------------------------------------------
def plan_child(strategy: str, samples: int) -> None:
    """Child: plan ``samples`` lognormal lengths with ``strategy``; print one JSON line."""
    from packtool.options import PackOptions
    from packtool.packing.planner import make_plan

    lengths = lognormal_lengths(samples, 300, seed=0)
    cfg = PackOptions.from_dict(
        {"packed_sequence_size": N, "strategy": strategy, "long_samples": "truncate"}, origin="bench"
    )
    base = _hwm()
    t0 = time.perf_counter()
    plan = make_plan(lengths, cfg.packing)
    seconds = time.perf_counter() - t0
    peak = _hwm()
    plan_bytes = sum(a.nbytes for a in (plan.pack_offsets, plan.sample, plan.start, plan.length))
    result = {"seconds": seconds, "lengths_bytes": lengths.nbytes, "plan_bytes": plan_bytes,
              "peak_before": base, "peak": peak, "packs": plan.num_packs}  # fmt: skip
    print(json.dumps(result))


def plan_rows(samples: int) -> None:
    import subprocess

    print(f"\ndriver-side plan of {samples:,} sample lengths (N = {N}; one process, whatever the engine)")
    print(f"  {'strategy':<11} {'plan s':>7} {'lengths MiB':>11} {'plan MiB':>9} {'peak RSS MiB':>12} "
          f"{'(before plan)':>13} {'1B samples: s':>13} {'1B: GB kept':>11} {'1B: GB peak':>11}")  # fmt: skip
    scale = 1e9 / samples
    for strategy in ("sequential", "bfd"):
        cmd = [sys.executable, __file__, "--plan-child", strategy, str(samples)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        kept = (r["lengths_bytes"] + r["plan_bytes"]) * scale / 1e9  # lengths + plan, held to the end
        peak = (r["peak"] - r["peak_before"] + r["lengths_bytes"]) * scale / 1e9  # with the temporaries
        print(f"  {strategy:<11} {r['seconds']:7.2f} {r['lengths_bytes'] / 2**20:11.0f} "
              f"{r['plan_bytes'] / 2**20:9.0f} {r['peak'] / 2**20:12.0f} {r['peak_before'] / 2**20:13.0f} "
              f"{r['seconds'] * scale:13.0f} {kept:11.1f} {peak:11.1f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--plan-samples", type=int, default=2_000_000)
    ap.add_argument("--plan-child", nargs=2, metavar=("STRATEGY", "SAMPLES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plan_child:
        plan_child(args.plan_child[0], int(args.plan_child[1]))
        return
    import ray

    BENCH.mkdir(exist_ok=True)
    texts = BENCH / f"short-texts-{args.samples}.jsonl"
    tokens = BENCH / f"tokens-{args.samples}.parquet"
    if not texts.exists():
        make_texts(texts, args.samples, mean_words=40)
    if not tokens.exists():
        make_tokens(tokens, args.samples)
    t0 = time.perf_counter()
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR,
                   log_to_driver=False)  # fmt: skip
    print(f"a running Ray for the 'joins' rows: started in {time.perf_counter() - t0:.1f} s (not counted)")
    try:
        address = ctx.address_info["gcs_address"]
        for title, data in ((f"text JSON Lines, {args.samples:,} records", texts),
                            (f"pretokenized Parquet, {args.samples:,} records", tokens)):  # fmt: skip
            rows = engine_rows(data, address)
            rows.append(ray_data_row(data))
            print_engine_table(title, rows)
    finally:
        ray.shutdown()
    plan_rows(args.plan_samples)


if __name__ == "__main__":
    main()
