"""Peak memory of ``packtool pack``: that it follows the workers, not the input.

**Long documents** (``--sections documents``): 300 documents of 300,000 characters in one JSON Lines file,
and the demo (``configs/demo.yaml``), packed at default options (the demo tokenizer; for the documents N =
4096 with ``--split-across-pack``, the number of processes the default), in a child process each:
the peak RSS of the largest process (target: under 1.5 GiB for the documents) and of the process tree,
and the wall time. ``--reference REV`` packs the same inputs in the same run with the packtool of git
revision REV too (``git archive``), rounds alternating, and prints the ratios new / reference.

**Token count** (``--sections scale``, described below): at 1x and 4x input size through the scratch chunks
it must not grow with the token count; held in memory it grows by the encoded tokens.

Builds pretokenized Parquet inputs of ``--samples`` and ``4 * --samples`` samples (lengths lognormal, mean
about 300 tokens, ids uniform in a 32k vocabulary; default row groups, i.e. one row group per 1Mi rows, as
a user's file would have), packs each with the real CLI in a child process, and reports:

* ``peak_rss``: the largest resident set of the packtool process or any of its workers
  (``ru_maxrss`` through ``measure.py``'s wrapper, which runs only that job);
* ``peak_tree_rss``: the largest sum of resident sets over the packtool process and its workers, polled
  from ``/proc`` every 20 ms;
* the ratio 4x / 1x of each, and the size of the lengths array (``num_samples * 8`` bytes), which is the
  part of the driver's memory that is allowed to grow.

Pretokenized Parquet this size is held in memory by default (``packtool/pipeline/memory.py``): each scale
is packed both ways, through the scratch chunks (``PACKTOOL_MEMORY_STORE_BYTES=0``, as an input larger
than a quarter of the memory would go), where memory must stay flat, and held in memory, where it grows by
about 8 bytes a token (``--paths`` picks one).

Run ``python scripts/bench_memory.py [--sections documents,scale] [--samples 100000] [--num-proc 1]
[--reference REV --rounds 3]`` (``make bench`` runs both sections).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from measure import run_measured

ROOT = Path(__file__).resolve().parents[1]


def make_input(path: Path, num_samples: int, seed: int = 0) -> int:
    """Pretokenized Parquet of ``num_samples`` rows; returns the number of tokens."""
    rng = np.random.default_rng(seed)
    # lognormal(mu, sigma) has mean exp(mu + sigma^2 / 2): 5.5 and 0.6 give about 293 tokens
    lengths = np.clip(rng.lognormal(5.5, 0.6, num_samples).astype(np.int64), 1, 2048)
    offsets = np.zeros(num_samples + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, 32000, int(offsets[-1]), dtype=np.int32)
    col = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(ids))
    pq.write_table(pa.table({"input_ids": col}), path, compression="zstd")
    return int(offsets[-1])


PATHS = {"chunks": {"PACKTOOL_MEMORY_STORE_BYTES": "0"}, "memory": {}}


def measure(input_path: Path, out: Path, num_proc: int, n: int, engine: str, env_extra: dict) -> dict:
    cmd = [
        sys.executable, "-m", "packtool.cli", "pack", str(input_path), "--output", str(out),
        "--packed-sequence-size", str(n), "--num-proc", str(num_proc), "--engine", engine,
        "--quiet", "--overwrite",
    ]  # fmt: skip
    path = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(path), **env_extra}
    m = run_measured(cmd, env, out.parent / f"{out.name}.log", poll=0.02)
    if m.rc != 0:
        raise SystemExit(f"packtool failed ({m.rc}):\n{m.log.read_text()}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {
        "peak_rss_mib": m.rss / 2**20,
        "peak_tree_rss_mib": m.tree_rss / 2**20,
        "seconds": m.wall,
        "num_samples": manifest["stats"]["num_samples"],
        "num_tokens": manifest["stats"]["input_tokens"],
        "num_packs": manifest["stats"]["num_packs"],
    }


def report(args: argparse.Namespace, path: str, rows: list[dict]) -> None:
    print(f"bench_memory: engine={args.engine} num_proc={args.num_proc} N={args.packed_sequence_size} {path}")
    print(
        f"{'scale':>5} {'samples':>9} {'tokens':>12} {'input MiB':>9} {'lengths MiB':>11} "
        f"{'peak RSS MiB':>12} {'tree RSS MiB':>12} {'seconds':>8}"
    )
    for r in rows:
        print(
            f"{r['scale']:>4}x {r['num_samples']:>9,} {r['num_tokens']:>12,} {r['input_mib']:>9.1f} "
            f"{r['lengths_mib']:>11.2f} {r['peak_rss_mib']:>12.1f} {r['peak_tree_rss_mib']:>12.1f} "
            f"{r['seconds']:>8.1f}"
        )
    a, b = rows
    print(
        f"ratio 4x/1x: tokens {b['num_tokens'] / a['num_tokens']:.2f}, "
        f"peak RSS {b['peak_rss_mib'] / a['peak_rss_mib']:.2f}, "
        f"tree RSS {b['peak_tree_rss_mib'] / a['peak_tree_rss_mib']:.2f}, "
        f"growth {b['peak_rss_mib'] - a['peak_rss_mib']:.1f} MiB for "
        f"{b['lengths_mib'] - a['lengths_mib']:.1f} MiB more lengths and "
        f"{(b['num_tokens'] - a['num_tokens']) * 8 / 2**20:.1f} MiB more tokens (8 bytes each)\n"
    )


# --- long documents: memory follows the workers, not the documents' length ----------------------------
DOCUMENTS, DOCUMENT_CHARS = 300, 300_000
LONG_TARGET_MIB = 1536  # the largest process's peak RSS, at default options


def make_documents(path: Path, count: int = DOCUMENTS, chars: int = DOCUMENT_CHARS) -> None:
    """``count`` JSON Lines records of ``chars`` characters of synthetic English (the demo's generator)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_demo_data import document  # the demo's text generator: its vocabulary suits the tokenizer

    rng = np.random.default_rng(300)
    with open(path, "w") as f:
        for _ in range(count):
            text = document(rng, chars // 5)
            while len(text) < chars:
                text += " " + document(rng, (chars - len(text)) // 5 + 1)
            f.write(json.dumps({"text": text[:chars]}) + "\n")


def reference_code(rev: str, where: Path) -> Path:
    """The ``src`` of git revision ``rev`` of this repository, unpacked under ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where / "src"


def pack_measured(code: Path, args: list[str], out: Path, log: Path) -> dict:
    """``packtool pack ARGS -o OUT`` with the packtool under ``code``: peak RSS (largest process and
    tree, MiB) and wall seconds."""
    cmd = [sys.executable, "-m", "packtool.cli", "pack", *args, "--output", str(out), "--overwrite", "-q"]
    m = run_measured(cmd, {"PYTHONPATH": str(code)}, log, cwd=ROOT, poll=0.02)
    if m.rc != 0:
        raise SystemExit(f"packtool failed ({m.rc}):\n{m.log.read_text()}")
    return {"rss": m.rss / 2**20, "tree": m.tree_rss / 2**20, "seconds": m.wall}


def documents_section(args: argparse.Namespace, work: Path) -> None:
    docs = work / "documents.jsonl"
    make_documents(docs)
    tokenizer = str(ROOT / "data" / "demo" / "tokenizer.json")
    jobs = {
        f"{DOCUMENTS} x {DOCUMENT_CHARS:,} chars": [
            str(docs), "--tokenizer", tokenizer, "--packed-sequence-size", "4096", "--split-across-pack"
        ],
        "demo": ["--config", str(ROOT / "configs" / "demo.yaml")],
    }  # fmt: skip
    codes = {"new": ROOT / "src"}
    if args.reference:
        codes["reference"] = reference_code(args.reference, work / "reference")
    rows: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):  # rounds alternate the codes, so a busy machine weighs on both alike
        for name, job in jobs.items():
            for code_name, code in codes.items():
                out = work / f"out-{code_name}"
                r = pack_measured(code, job, out, work / f"{code_name}.log")
                rows.setdefault((name, code_name), []).append(r)
                shutil.rmtree(out, ignore_errors=True)
    cores = len(os.sched_getaffinity(0))
    print(f"bench_memory documents: default options, {cores} cores, best of {args.rounds} round(s)")
    print(f"{'job':>28} {'code':>9} {'peak RSS MiB':>12} {'tree RSS MiB':>12} {'seconds':>8} {'median s':>8}")
    best = {k: {m: min(r[m] for r in v) for m in ("rss", "tree", "seconds")} for k, v in rows.items()}
    for (name, code_name), b in best.items():
        median = float(np.median([r["seconds"] for r in rows[(name, code_name)]]))
        print(
            f"{name:>28} {code_name:>9} {b['rss']:>12.0f} {b['tree']:>12.0f} {b['seconds']:>8.2f} "
            f"{median:>8.2f}"
        )
    for name in jobs:
        if "reference" in codes:
            new, ref = best[(name, "new")], best[(name, "reference")]
            print(
                f"{name}: new / {args.reference}: peak RSS {new['rss'] / ref['rss']:.2f}, tree RSS "
                f"{new['tree'] / ref['tree']:.2f}, time {new['seconds'] / ref['seconds']:.2f}"
            )
    long_rss = best[(next(iter(jobs)), "new")]["rss"]
    verdict = "under" if long_rss < LONG_TARGET_MIB else "OVER"
    print(f"long documents: peak RSS {long_rss:.0f} MiB, {verdict} the {LONG_TARGET_MIB} MiB target\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="documents,scale", help="documents, scale, or both (default)")
    ap.add_argument("--reference", default=None, help="documents: also pack with git revision REV's packtool")
    ap.add_argument("--rounds", type=int, default=1, help="documents: rounds (best of each is shown)")
    ap.add_argument("--samples", type=int, default=100_000, help="samples at 1x (4x is also run)")
    ap.add_argument("--num-proc", type=int, default=1)
    ap.add_argument("--packed-sequence-size", type=int, default=4096)
    ap.add_argument("--engine", default="local")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--paths", default="chunks,memory", help="chunks, memory, or chunks,memory (default)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="packtool-bench-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if "documents" in args.sections.split(","):
            documents_section(args, work)
        if "scale" in args.sections.split(","):
            scale_section(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def scale_section(args: argparse.Namespace, work: Path) -> None:
    inputs = {}
    for scale in (1, 4):
        src = work / f"input-{scale}x.parquet"
        inputs[scale] = (src, make_input(src, args.samples * scale, seed=scale))
    for path in args.paths.split(","):
        rows = []
        for scale, (src, tokens) in inputs.items():
            out = work / f"out-{scale}x"
            r = measure(src, out, args.num_proc, args.packed_sequence_size, args.engine, PATHS[path])
            r.update(scale=scale, input_mib=src.stat().st_size / 2**20)
            r["lengths_mib"] = r["num_samples"] * 8 / 2**20
            assert r["num_tokens"] == tokens
            rows.append(r)
            shutil.rmtree(out, ignore_errors=True)
        report(args, path, rows)


if __name__ == "__main__":
    main()
