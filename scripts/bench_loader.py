"""Benchmark packtool.loader and packtool.masks against references measured in the same run.

    python scripts/bench_loader.py [--packs 3000] [--threads 1] [--repeats 5] [--loader-repeats 3]

Prints, for packs of N=4096 tokens written by ``packtool pack`` (Parquet, zstd, row groups of 128):
* loader packs/s and tokens/s with 0, 1 and 2 workers (batch 8) and the time to the first batch, beside
  the raw single-process decode speed of ``packtool.reading.read_packs`` (the reference), and the CPU
  seconds per 1,000 packs of each (workers included), which other jobs on the machine do not change much;
  a floor row reads the same row groups in one process without batching, with Arrow's
  ``read_row_group(use_threads=False)`` (what the loader's workers use);
* mask build time per batch for each kind at N=4096 and N=32768, beside NeMo AutoModel's
  ``create_block_causal_mask`` (identical output checked) and flex attention's ``create_block_mask`` with a
  document mask function. The dense masks and ``create_block_mask`` (which evaluates the mask function
  at all N^2 positions) take B * N^2 bytes: at N=32768 they are timed with B=1 (1 GiB), not B=8 (8 GiB).
  Three floor rows time what a dense builder must at least do: ``torch.ones`` of the output (one write
  pass through torch's allocator); fresh zeroed memory with only the diagonal set (the one True of every
  row; the kernel zeroes each page it touches), the least a builder that takes fresh memory for each
  mask can do; and a memset of an existing buffer of the output's size (one write pass, no page faults),
  the least a builder that reuses memory (``block_causal_mask`` does, see ``masks.MASK_CACHE_SIZE``) can
  do. As timed here each mask is dropped before the next is built, as in a training loop. Rows with a
  sliding window of N / 8, alone and beside the full mask (a model with sliding and full layers).

A mixture row (``--mixture-only`` runs just that): the same samples packed as one output and as three
(50%, 30%, 20% of them), read with 2 workers as the one output and as a mixture of the three (``repeat: 1``
each: every pack once an epoch, as the one output), runs interleaved; and the three at weights.

A last row reads with the integrity checks on (Parquet page CRCs and content digests, the default) and off
(``verify_checksums=False``), runs interleaved; and the content digests alone (``--content-only`` runs
just that): ``read_packs`` and the loader with 0 and 2 workers reading the same output with the row groups'
digests checked, and as an output written before content digests is read (their check left out, the page
CRCs still checked), runs interleaved.

Targets: >= 3,000 packs/s with 2 workers (issue 16); first batch < 1 s; integrity checks on cost at most
10% of the CPU per pack against off (issue 19); a mixture of 3 sources within 5% of the packs/s of one
output of the same samples (issue 43); the content digests at most 5% of the loader's CPU per pack
with 2 workers (issue 36; CPU rather than wall-clock time, which moves by more on a shared machine);
flex_block_mask >= 100x faster
than create_block_mask at N=4096; block_causal_mask >= 10x faster than NeMo's, identical output.
Mask timings are the median of ``--repeats`` interleaved runs after one warm-up run of each; loader
figures the median of ``--loader-repeats`` runs per worker count (NeMo's time alone varies 150-230 ms at
B=8, N=4096 on a shared machine, so single runs mislead). Mask builds use ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from packtool.formats import parquet  # noqa: E402
from packtool.loader import PackedDataset, get_loader  # noqa: E402
from packtool.manifest import BASE_FORMAT_VERSION, NEWEST_MINOR  # noqa: E402
from packtool.masks import block_causal_mask, flex_block_mask, padded_seq_lens, sequence_starts, varlen_args  # noqa: E402
from packtool.reading import load_manifest, read_packs  # noqa: E402

N = 4096


def make_data(work: Path, packs: int) -> Path:
    """Pretokenized samples (64..2048 tokens) packed by the real CLI into N=4096 packs; reused if present."""
    out = work / f"loader-{packs}"
    newest = f"{BASE_FORMAT_VERSION}.{NEWEST_MINOR[BASE_FORMAT_VERSION]}"  # what a text output says
    if (out / "manifest.json").exists() and load_manifest(out).version == newest:
        return out  # (an output of an older format is written again: it may lack the checksums)
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    lengths = rng.integers(64, 2049, int(packs * N / 1056 * 1.02))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(1, 32000, int(offsets[-1])).astype(np.int32)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"loader-{packs}-input.parquet"
    pq.write_table(pa.table({"input_ids": pa.LargeListArray.from_arrays(offsets, tokens)}), src)
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(src), "-o", str(out)]
    cmd += [
        "--packed-sequence-size",
        str(N),
        "--max-packs",
        str(packs),
        "-q",
        "--num-proc",
        "2",
        "--overwrite",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return out


def make_mixture_data(work: Path, packs: int) -> tuple[Path, list[Path]]:
    """``make_data``'s samples in three parts (50%, 30%, 20%), each packed by the CLI into its own output, and
    the three packed together into one: the same samples, in packs of the same N. Reused if present."""
    import pyarrow.parquet as pq

    make_data(work, packs)
    whole, parts = work / f"mixture-{packs}-whole", [work / f"mixture-{packs}-{i}" for i in range(3)]
    if all((p / "manifest.json").exists() for p in (whole, *parts)):
        return whole, parts
    table = pq.read_table(work / f"loader-{packs}-input.parquet")
    cuts = [0, len(table) // 2, len(table) * 8 // 10, len(table)]
    inputs = [work / f"mixture-{packs}-{i}-input.parquet" for i in range(3)]
    for i, src in enumerate(inputs):
        pq.write_table(table.slice(cuts[i], cuts[i + 1] - cuts[i]), src)
    base = [sys.executable, "-m", "packtool.cli", "pack", "--packed-sequence-size", str(N), "-q"]
    base.append("--overwrite")
    for src, out in zip(inputs, parts, strict=True):
        subprocess.run([*base, str(src), "-o", str(out)], check=True, cwd=ROOT)
    subprocess.run([*base, *map(str, inputs), "-o", str(whole)], check=True, cwd=ROOT)
    return whole, parts


def bench_mixture(work: Path, packs: int, repeats: int, epochs: int) -> dict:
    """The loader (2 workers) over one output and over a mixture of three of the same samples, every pack
    once an epoch (``repeat: 1``), runs interleaved; and the three at weights (their sizes'): medians."""
    whole, parts = make_mixture_data(work, packs)
    sources = {
        "one output": whole,
        "mixture of 3 (repeat 1)": [{"path": str(p), "repeat": 1} for p in parts],
        "mixture of 3 (weights)": {str(p): load_manifest(p).num_packs for p in parts},
    }
    runs: dict = {name: [] for name in sources}
    for i in range(repeats):
        for name in list(sources)[:: 1 if i % 2 == 0 else -1]:  # neither always first
            runs[name].append(bench_loader(sources[name], 2, epochs))
    return {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for name, rs in runs.items()}


def report_mixture(mixture: dict) -> list[tuple[str, bool]]:
    """Print the mixture's packs/s beside one output's; return the target check."""
    one = mixture["one output"]
    print("a mixture of 3 outputs against one output of the same samples, 2 workers, interleaved (medians):")
    for name, r in mixture.items():
        print(
            f"  {name:<24} {r['packs_per_s']:>8,.0f} packs/s ({r['packs_per_s'] / one['packs_per_s']:.3f}x), "
            f"{r['cpu_s_per_1k_packs']:.3f} CPU s / 1k packs "
            f"({r['cpu_s_per_1k_packs'] / one['cpu_s_per_1k_packs']:.3f}x)"
        )
    ratio = mixture["mixture of 3 (repeat 1)"]["packs_per_s"] / one["packs_per_s"]
    return [("a mixture of 3 sources within 5% of one output's packs/s (2 workers)", ratio >= 0.95)]


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its reaped children (the DataLoader workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def bench_loader(data: Path | list, workers: int, epochs: int, verify_checksums: bool = True) -> dict:
    """Wall-clock packs/s after the first batch, and CPU seconds per 1,000 packs over the whole run
    (workers included, start-up too): the second does not depend on what else runs on the machine.
    ``data``: an output directory, or a mixture (``packtool.loader.sources``)."""
    ds = PackedDataset(
        data, batch_size=8, shuffle=True, seed=0, infinite=True, verify_checksums=verify_checksums
    )
    loader = get_loader(ds, num_workers=workers)
    target = epochs * ds.batches_per_epoch
    c0, t0 = cpu_seconds(), time.perf_counter()
    it = iter(loader)
    packs = len(next(it))
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(target - 1):
        packs += len(next(it))
    steady = time.perf_counter() - t1
    del it  # joins the workers: their CPU time is counted from here
    return {
        "first_batch_s": first,
        "packs_per_s": (packs - 8) / steady,
        "total_s": time.perf_counter() - t0,
        "cpu_s_per_1k_packs": (cpu_seconds() - c0) / packs * 1000,
    }


@contextlib.contextmanager
def content_check_off():
    """Readers as they read an output written before content digests: no shard's content record taken, so
    no row group's digests checked (the page CRCs still are). Workers started inside inherit it (fork)."""
    saved = parquet.content_record
    parquet.content_record = lambda *args: None
    try:
        yield
    finally:
        parquet.content_record = saved


def read_packs_speed(data: Path) -> dict:
    c, t = cpu_seconds(), time.perf_counter()
    count = sum(1 for _ in read_packs(data))
    wall = time.perf_counter() - t
    return {"packs_per_s": count / wall, "cpu_s_per_1k_packs": (cpu_seconds() - c) / count * 1000}


CONTENT_RUNS = {
    "read_packs": lambda data, epochs: read_packs_speed(data),
    "loader 0 workers": lambda data, epochs: bench_loader(data, 0, epochs),
    "loader 2 workers": lambda data, epochs: bench_loader(data, 2, epochs),
}


def content_run(data: Path, name: str, check: str, epochs: int) -> dict:
    """One run of ``CONTENT_RUNS[name]`` with the content digests checked (``check`` ``on``) or not, in a
    fresh process (this script, ``--content-run``): each run starts alike, whatever ran before it."""
    cmd = [sys.executable, __file__, "--work", str(data.parent), "--packs", data.name.split("-")[-1]]
    cmd += ["--epochs", str(epochs), "--content-run", name, check]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.splitlines()[-1])


def bench_content(data: Path, repeats: int, epochs: int) -> dict:
    """``read_packs`` and the loader (0 and 2 workers) with the content digests checked and not, on the
    same output, each run in a fresh process, on and off interleaved (neither always first): medians of
    ``repeats``."""
    runs: dict = {}
    for i in range(repeats):
        for check in ("on", "off") if i % 2 == 0 else ("off", "on"):
            for name in CONTENT_RUNS:
                runs.setdefault(name, {}).setdefault(check, []).append(content_run(data, name, check, epochs))
    return {
        "digest share": digest_share(data, max(3, repeats)),
        **{
            name: {
                check: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for check, rs in by.items()
            }
            for name, by in runs.items()
        },
    }


def digest_share(data: Path, repeats: int) -> dict:
    """CPU seconds per 1,000 packs of Arrow's decode of the training columns of every row group, and of the
    check of their digests after it (``ContentRecord.problem``), in this process: medians of ``repeats``
    (CPU time, which the machine's load moves less than the loader's wall-clock time)."""
    manifest = load_manifest(data)
    cols = ["input_ids", "labels", "position_ids", "seq_lens"]
    decode, digest, packs = [], [], manifest.num_packs
    for _ in range(repeats):
        d = g = 0.0
        for s in range(len(manifest.shards)):
            shard = parquet.open_shard(data, manifest, s)
            for rg in range(shard.parquet.num_row_groups):
                t = time.process_time()
                table = shard.parquet.read_row_group(rg, columns=cols, use_threads=False)
                d += time.process_time() - t
                t = time.process_time()
                assert shard.content.problem(table, rg) is None
                g += time.process_time() - t
            shard.close()
        decode.append(d / packs * 1000)
        digest.append(g / packs * 1000)
    return {
        "decode_cpu_s_per_1k_packs": float(np.median(decode)),
        "digest_cpu_s_per_1k_packs": float(np.median(digest)),
    }


def report_content(content: dict) -> list[tuple[str, bool]]:
    """Print the content digests' cost; return the target check."""
    share = content.pop("digest share")
    print(
        f"content digests alone: {share['digest_cpu_s_per_1k_packs'] * 1000:.1f} CPU ms / 1k packs against "
        f"{share['decode_cpu_s_per_1k_packs'] * 1000:.1f} for Arrow's decode of the same row groups "
        f"({share['digest_cpu_s_per_1k_packs'] / share['decode_cpu_s_per_1k_packs']:.1%})"
    )
    print("content digests checked (on) and not (off), the same output, interleaved runs (medians):")
    for name, r in content.items():
        on, off = r["on"], r["off"]
        print(
            f"  {name:<17} on {on['packs_per_s']:>8,.0f} packs/s ({on['cpu_s_per_1k_packs']:.3f} CPU s / 1k"
            f" packs), off {off['packs_per_s']:>8,.0f} packs/s ({off['cpu_s_per_1k_packs']:.3f}): on / off ="
            f" {on['packs_per_s'] / off['packs_per_s']:.3f} packs/s, "
            f"{on['cpu_s_per_1k_packs'] / off['cpu_s_per_1k_packs']:.3f}x CPU"
        )
    two = content["loader 2 workers"]
    cost = two["on"]["cpu_s_per_1k_packs"] / two["off"]["cpu_s_per_1k_packs"]
    return [("content digests cost <= 5% of the loader's CPU per pack (2 workers)", cost <= 1.05)]


def timeit(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def read_floor(data: Path) -> dict:
    """Packs/s of reading every row group's pack columns in this process, nothing else: Arrow's
    ``read_row_group(use_threads=False)`` (a floor for the loader)."""
    import pyarrow.parquet as pq

    manifest = json.loads((data / "manifest.json").read_text())
    cols = ["input_ids", "labels", "position_ids", "seq_lens"]
    c, t, count = cpu_seconds(), time.perf_counter(), 0
    for shard in manifest["shards"]:
        pf = pq.ParquetFile(data / shard["path"])
        for rg in range(pf.num_row_groups):
            count += pf.read_row_group(rg, columns=cols, use_threads=False).num_rows
    wall = time.perf_counter() - t
    return {"packs_per_s": count / wall, "cpu_s_per_1k_packs": (cpu_seconds() - c) / count * 1000}


def random_seq_lens(batch: int, n: int, seed: int) -> list[torch.Tensor]:
    """Sequence lengths like packtool output: samples of 64..2048 tokens, then the padding."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        lens = rng.integers(64, 2049, n // 64 + 1)
        ends = np.cumsum(lens)
        k = int(np.searchsorted(ends, n, side="right"))
        row = lens[:k].tolist()
        rows.append(torch.tensor(row + ([n - sum(row)] if sum(row) < n else [])))
    return rows


def touched_zeros(b: int, n: int) -> torch.Tensor:
    """Floor for a dense block-causal ``[B, 1, N, N]`` bool mask in fresh memory: zeroed pages with the
    diagonal set, the one True every row has (the kernel zeroes each page, or huge page, on first touch)."""
    out = torch.from_numpy(np.zeros(b * n * n, dtype=np.bool_)).view(b, n, n)
    out.diagonal(dim1=1, dim2=2).fill_(True)
    return out.unsqueeze(1)


def bench_masks(n: int, batch: int, dense_batch: int, repeats: int, nemo) -> dict:
    from torch.nn.attention.flex_attention import create_block_mask

    rows = random_seq_lens(batch, n, seed=n)
    seq_lens = padded_seq_lens(rows)
    drows, dseq = rows[:dense_batch], seq_lens[:dense_batch]
    doc, _ = sequence_starts(dseq, n)

    def document_causal(b, h, q, k):
        return (doc[b, q] == doc[b, k]) & (q >= k)

    out = {"B": batch, "dense_B": dense_batch}
    nemo_rows = [r.to(torch.int64) for r in drows]  # NeMo's form: a list of int64 (S_i,) tensors
    mine = block_causal_mask(dseq, n)
    if nemo is not None:
        out["identical_to_nemo"] = bool(torch.equal(mine, nemo(nemo_rows)))
    del mine
    buffer = np.ones(dense_batch * n * n, dtype=np.bool_)  # for the memset floor: pages touched once here
    fns = {
        "varlen_args": (lambda: varlen_args(seq_lens, n), batch),
        "flex_block_mask": (lambda: flex_block_mask(seq_lens, n), batch),
        "flex_block_mask@dense_B": (lambda: flex_block_mask(dseq, n), dense_batch),
        "block_causal_mask": (lambda: block_causal_mask(dseq, n), dense_batch),
        # a sliding window of N / 8 (Mistral's 4096 in packs of 32768); both masks of a model with sliding
        # and full layers (Gemma 2 and 3), built per batch as PackedBatch does
        "block_causal_mask window=N/8": (lambda: block_causal_mask(dseq, n, window=n // 8), dense_batch),
        "block_causal_mask sliding + full": (
            lambda: (block_causal_mask(dseq, n, window=n // 8), block_causal_mask(dseq, n)),
            dense_batch,
        ),
        "flex_block_mask window=N/8": (lambda: flex_block_mask(seq_lens, n, window=n // 8), batch),
        "create_block_mask": (
            lambda: create_block_mask(document_causal, dense_batch, 1, n, n, device="cpu"),
            dense_batch,
        ),
    }
    if nemo is not None:
        fns["nemo_create_block_causal_mask"] = (lambda: nemo(nemo_rows), dense_batch)
    # floors: the least a builder of the dense output can do (write or zero B * N^2 bytes once)
    fns["floor: torch.ones"] = (lambda: torch.ones(dense_batch, 1, n, n, dtype=torch.bool), dense_batch)
    # NumPy's fill is a plain memset; torch's fill_ on bool was 3-4x slower here
    fns["floor: memset of the output"] = (lambda: buffer.fill(False), dense_batch)
    fns["floor: zeros + diagonal"] = (lambda: touched_zeros(dense_batch, n), dense_batch)
    for fn, _b in fns.values():  # warm-up: first calls pay for lazy imports and allocator growth
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):  # interleaved, so that load on the machine hits every kind alike
        for k, (fn, _b) in fns.items():
            times[k].append(timeit(fn))
    for k, (_fn, b) in fns.items():
        out[k] = {"s_per_batch": float(np.median(times[k])), "B": b}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packs", type=int, default=3000, help="packs of 4096 tokens to write and read")
    ap.add_argument("--epochs", type=int, default=2, help="epochs read per worker count")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the mask builds")
    ap.add_argument("--repeats", type=int, default=5, help="mask timings: median of this many")
    ap.add_argument("--loader-repeats", type=int, default=3, help="loader runs per worker count (median)")
    ap.add_argument("--work", default=str(ROOT / ".bench"), help="where the data is written (reused)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--content-only", action="store_true", help="only the content digests' cost")
    ap.add_argument("--mixture-only", action="store_true", help="only a mixture against one output")
    ap.add_argument("--content-run", nargs=2, metavar=("RUN", "CHECK"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.content_run:  # one run of bench_content, in this fresh process: its figures as one JSON line
        name, check = args.content_run
        data = Path(args.work) / f"loader-{args.packs}"
        with contextlib.nullcontext() if check == "on" else content_check_off():
            print(json.dumps(CONTENT_RUNS[name](data, args.epochs)))
        return
    data = make_data(Path(args.work), args.packs)
    manifest = json.loads((data / "manifest.json").read_text())
    res: dict = {"packs": manifest["stats"]["num_packs"], "N": N, "fill_rate": manifest["stats"]["fill_rate"]}
    if args.mixture_only:
        res["mixture"] = bench_mixture(Path(args.work), args.packs, args.loader_repeats, args.epochs)
        if args.json:
            print(json.dumps(res, indent=1, default=str))
            return
        for name, ok in report_mixture(res["mixture"]):
            print(f"target {'MET ' if ok else 'MISS'}  {name}")
        return
    if args.content_only:
        res["load_average"] = os.getloadavg()
        res["content"] = bench_content(data, args.loader_repeats, args.epochs)
        if args.json:
            print(json.dumps(res, indent=1, default=str))
            return
        print(f"data: {res['packs']} packs of N={N}; load average {res['load_average'][0]:.2f}")
        for name, ok in report_content(res["content"]):
            print(f"target {'MET ' if ok else 'MISS'}  {name}")
        return

    c, t = cpu_seconds(), time.perf_counter()
    count = sum(1 for _ in read_packs(data))
    res["read_packs_per_s"] = count / (time.perf_counter() - t)
    res["read_packs_cpu_s_per_1k_packs"] = (cpu_seconds() - c) / count * 1000
    res["read_floor_arrow"] = read_floor(data)
    res["load_average"] = os.getloadavg()
    res["loader"] = {}
    for w in (0, 1, 2):
        runs = [bench_loader(data, w, args.epochs) for _ in range(args.loader_repeats)]
        res["loader"][w] = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    # integrity checks (Parquet page CRCs) on against off, 2 workers, runs interleaved so that the load of
    # the machine weighs on both alike
    on, off = [], []
    for _ in range(args.loader_repeats):
        on.append(bench_loader(data, 2, args.epochs, verify_checksums=True))
        off.append(bench_loader(data, 2, args.epochs, verify_checksums=False))
    res["integrity"] = {
        name: {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
        for name, runs in (("on", on), ("off", off))
    }
    res["content"] = bench_content(data, args.loader_repeats, args.epochs)
    res["mixture"] = bench_mixture(Path(args.work), args.packs, args.loader_repeats, args.epochs)

    torch.set_num_threads(args.threads)
    try:
        from nemo_reference import load_packed_sequence_module

        nemo = load_packed_sequence_module().create_block_causal_mask
    except FileNotFoundError:
        nemo = None
    res["masks"] = {
        4096: bench_masks(4096, 8, 8, args.repeats, nemo),
        32768: bench_masks(32768, 8, 1, max(1, args.repeats - 2), nemo),
    }
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return
    report(res, args)


def report(res: dict, args) -> None:
    print(
        f"data: {res['packs']} packs of N={res['N']} (fill {res['fill_rate']:.3f}), torch {torch.__version__}"
    )
    print(
        f"load average before the loader runs: {', '.join(f'{x:.2f}' for x in res['load_average'])}"
        f" on {os.cpu_count()} cores"
    )
    ref = res["read_packs_per_s"]
    print(
        f"reference read_packs (1 process, no batching): {ref:,.0f} packs/s, "
        f"{res['read_packs_cpu_s_per_1k_packs']:.3f} CPU s / 1k packs"
    )
    r = res["read_floor_arrow"]
    print(
        f"floor: Arrow read_row_group of the same row groups (1 process, no batching): "
        f"{r['packs_per_s']:,.0f} packs/s, {r['cpu_s_per_1k_packs']:.3f} CPU s / 1k packs"
    )
    print(f"loader: median of {args.loader_repeats} runs per worker count")
    print(
        f"{'workers':>8} {'first batch':>12} {'packs/s':>10} {'tokens/s':>14} {'x read_packs':>13}"
        f" {'CPU s/1k packs':>15}"
    )
    for w, r in res["loader"].items():
        pps = r["packs_per_s"]
        print(
            f"{w:>8} {r['first_batch_s']:>11.3f}s {pps:>10,.0f} {pps * N:>14,.0f} {pps / ref:>12.2f}x"
            f" {r['cpu_s_per_1k_packs']:>15.3f}"
        )
    on, off = res["integrity"]["on"], res["integrity"]["off"]
    cpu_ratio = on["cpu_s_per_1k_packs"] / off["cpu_s_per_1k_packs"]
    print(
        f"integrity checks, 2 workers, interleaved runs: on {on['packs_per_s']:,.0f} packs/s "
        f"({on['cpu_s_per_1k_packs']:.3f} CPU s / 1k packs), off {off['packs_per_s']:,.0f} packs/s "
        f"({off['cpu_s_per_1k_packs']:.3f} CPU s / 1k packs): on / off = "
        f"{on['packs_per_s'] / off['packs_per_s']:.3f} (CPU {cpu_ratio:.3f}x)"
    )
    print(f"mask build per batch (torch threads: {args.threads}; median of {args.repeats} after a warm-up)")
    for n, m in res["masks"].items():
        print(f"  N={n}")
        for k, v in m.items():
            if isinstance(v, dict):
                print(f"    {k:<32} B={v['B']:<2} {v['s_per_batch'] * 1e3:>10.2f} ms")
        if "identical_to_nemo" in m:
            print(f"    block_causal_mask identical to NeMo's: {m['identical_to_nemo']}")
        cbm, flex = m["create_block_mask"]["s_per_batch"], m["flex_block_mask@dense_B"]["s_per_batch"]
        print(f"    flex_block_mask vs create_block_mask (B={m['dense_B']}): {cbm / flex:,.0f}x faster")
        if "nemo_create_block_causal_mask" in m:
            nemo = m["nemo_create_block_causal_mask"]["s_per_batch"]
            floor = m["floor: zeros + diagonal"]["s_per_batch"]
            memset = m["floor: memset of the output"]["s_per_batch"]
            print(
                f"    block_causal_mask vs NeMo: {nemo / m['block_causal_mask']['s_per_batch']:.1f}x faster"
                f" (ceilings: NeMo / zeros + diagonal floor {nemo / floor:.1f}x in fresh memory,"
                f" NeMo / memset floor {nemo / memset:.1f}x in reused memory)"
            )
    two = res["loader"][2]
    m4 = res["masks"][4096]
    checks = [
        ("loader >= 3,000 packs/s with 2 workers", two["packs_per_s"] >= 3_000),
        ("first batch < 1 s (2 workers)", two["first_batch_s"] < 1.0),
        (
            "integrity checks cost <= 10% of the CPU per pack (2 workers)",
            on["cpu_s_per_1k_packs"] <= 1.10 * off["cpu_s_per_1k_packs"],
        ),
        (
            "flex_block_mask >= 100x create_block_mask at N=4096",
            m4["create_block_mask"]["s_per_batch"] / m4["flex_block_mask@dense_B"]["s_per_batch"] >= 100,
        ),
    ]
    if "nemo_create_block_causal_mask" in m4:
        ratio = m4["nemo_create_block_causal_mask"]["s_per_batch"] / m4["block_causal_mask"]["s_per_batch"]
        checks.append(("block_causal_mask >= 10x NeMo, identical", ratio >= 10 and m4["identical_to_nemo"]))
    checks += report_content(res["content"])
    checks += report_mixture(res["mixture"])
    for name, ok in checks:
        print(f"target {'MET ' if ok else 'MISS'}  {name}")


if __name__ == "__main__":
    main()
