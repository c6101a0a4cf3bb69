"""Benchmark ``packtool pack`` against NeMo AutoModel 0.1.2 ``PackedSequence`` and TRL ``pack_dataset``.

Run by ``make bench`` (``python scripts/bench_pack.py [--samples K]``). In one run, on the same data:

* builds ``.bench/tokens-<K>.parquet``: ``K`` (default 100,000) pretokenized samples with ``input_ids`` and
  shifted ``labels``, lengths lognormal (mean ~300 tokens, sigma 1), a tail past N = 4096;
* times, each in its own subprocess under ``measure.py``'s wrapper (wall and CPU seconds; peak RSS as the
  largest of the biggest single process's ``ru_maxrss`` and the summed RSS of the process tree sampled every
  0.2 s):

  - NeMo ``PackedSequence`` (its ``packed_sequence.py`` loaded from the 0.1.2 wheel in ``.cache/wheels``,
    as ``tests/nemo_reference.py`` does): ``Dataset.from_parquet`` -> ``pack()`` -> ``to_parquet``, with
    ``split_across_pack=True`` (without it, NeMo stops at the first sample longer than N);
  - TRL ``pack_dataset`` ``bfd`` and ``bfd_split`` (``from_parquet`` -> pack -> ``to_parquet``), from a venv
    made by this script in ``.bench/trl-venv``: ``trl`` installed with ``--no-deps``, everything else
    (torch, datasets, transformers) seen from the running environment through a ``.pth`` file, so that no
    second torch is ever installed;
  - ``packtool pack`` through its CLI, ``sequential`` and ``bfd``, ``--num-proc 1`` and ``2``;

  and prints wall s, CPU s, samples/s, peak RSS, packs, packs over the lower bound ``ceil(tokens / N)`` of
  the tokens each row packed, fill rate, tokens dropped (truncated), and the speed and RSS ratios against
  NeMo. The references' wall time stops when their output is written (they report the moment); the few
  statistics they compute afterwards count in their CPU and RSS only.
* floors, measured in the same run, so the table shows how far packtool is from them: Python start-up with
  packtool's imports (a process), reading the input Parquet alone and writing packtool's output arrays
  alone (zstd Parquet, packtool's writer settings, page CRC-32s included, from memory), both in-process;
  their sum is the time one core needs for I/O and start-up only, and ``startup + (read + write) / 2`` the
  same on 2 cores with a perfect split. A ratio against NeMo above what the floor row shows cannot be
  reached by any packer that reads this input and writes this output. The floor's parts and ``packtool
  pack`` (bfd, truncate) at ``--num-proc`` 1 and 2 are measured ``--floor-pairs`` times (default 5), one
  right after the other, and printed as medians with floor / packtool, the median of the rounds' ratios
  (``--only-floor`` runs this alone; ``--floor-baseline DIR`` adds another checkout's packtool, e.g. an
  older commit's, to the same rounds).
* end to end from raw text: ``.bench/texts-<K>.jsonl`` (``--text-samples``, default 20,000 and 100,000
  lognormal texts of the demo corpus's words; the small set shows what start-up and the last shards weigh
  in a ~3 s job, the large one the throughput a real dataset sees) tokenized and packed by ``packtool
  pack`` (``--num-proc 2``, and 1) beside
  the tokenizer alone on the same texts and cores, load time excluded, ids fetched (``Encoding.ids``, as
  any user of them must), in its two layouts: ``encode_batch_fast`` with 2 Rayon threads, and 2 processes
  with 1 thread each (half the texts each, timed from a barrier), each with all texts in one call and in
  calls of 2,048 and 512 texts (``TOKENIZER_BATCHES``: one huge call is the slowest at 40k texts or more).
  The ceiling is the fastest of these, per size. Then ``--pairs`` (default 3) times the ceiling's layout
  and ``packtool pack --num-proc 2`` right after one another: the figure is the median of the pairs'
  ratios, since this machine's speed drifts by tens of percent over minutes (the same tokenizer call on
  the same texts took 12.4 s and 17.2 s an hour apart), more than the gap being measured. On a shared
  machine each pair also says how many CPU seconds other processes took during it (``/proc/stat``'s busy
  time less the pair's own CPU), and the median is given again over the quiet pairs alone, those where
  that was under ``QUIET_SHARE`` (5%) of packtool's wall time.
* the same end to end on ``--long-texts`` (default 20,000) long documents (``LONG_WORDS`` words on
  average), with the tokenizer.json encoder; every raw-text table ends with packtool's own cost, its
  wall time less the encoder alone's, in seconds per million tokens (median of the pairs);
* the same end to end with a ``module:callable`` encoder that calls the tokenizer once per text
  (``.bench/enc_one_text.py:encode``, written by this script; ``--text-encoders plugin``): its ceiling is
  the same function alone on the same texts, in 2 processes taking batches of 512 texts in turn from a
  shared counter (timed from a barrier, texts loaded before), and the pairs and the median as above.
  ``--text-only`` skips everything before the raw-text rows; ``--text-input txt`` has packtool read the
  same texts from a ``.txt`` file (a text per line) instead of JSON Lines; ``--baseline DIR`` times
  another checkout of packtool in every pair too (before or after this one in turn), for a before/after
  comparison against the same ceilings.

The figures are for the machine it runs on; other work on the same cores shows up in them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from measure import run_measured

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / ".bench"
N = 4096
TRL_SPEC = "trl==1.16.0"
# words per long document on average (--long-texts): about 1,150 tokens with the demo tokenizer, as the
# man pages and Perl PODs of issue 30 (26.4M cl100k tokens in 23,129 documents)
LONG_WORDS = 1_050
# texts per encode_batch_fast call for the tokenizer-alone ceiling (0: all in one call); the best one counts
TOKENIZER_BATCHES = (0, 2048, 512)
# a pair is quiet when other work took less CPU during it than this share of packtool's wall time
QUIET_SHARE = 0.05


# --- data ------------------------------------------------------------------------------------------------
def lognormal_lengths(count: int, mean: float, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    sigma = 1.0
    return np.maximum(1, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, count)).astype(np.int64)


def make_tokens(path: Path, samples: int, seed: int = 0) -> None:
    import numpy as np

    lengths = lognormal_lengths(samples, 300, seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.random.default_rng(seed + 1).integers(0, 32000, offsets[-1], dtype=np.int32)
    labels = np.empty_like(ids)
    labels[:-1] = ids[1:]
    labels[offsets[1:] - 1] = -100
    write_lists(path, offsets, {"input_ids": ids, "labels": labels})


def write_lists(path: Path, offsets, columns: dict) -> None:
    """A Parquet file of list columns (the flat ``columns`` split by ``offsets``), written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    off = pa.array(offsets)
    table = pa.table({k: pa.LargeListArray.from_arrays(off, pa.array(v)) for k, v in columns.items()})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=10_000)
    tmp.rename(path)


def make_texts(path: Path, samples: int, mean_words: int = 230, seed: int = 0) -> None:
    """``samples`` JSON lines ``{"text": ...}`` of the demo corpus's words, lognormal word counts (230 words
    is ~250 tokens with the demo tokenizer)."""
    import numpy as np

    words = sorted(
        {w for line in (ROOT / "data/demo/train.jsonl").open() for w in json.loads(line)["text"].split()}
    )
    rng = np.random.default_rng(seed)
    counts = lognormal_lengths(samples, mean_words, seed + 2)
    ranks = rng.zipf(1.3, int(counts.sum())) % len(words)
    vocab = np.array(words, dtype=object)[ranks]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        at = 0
        for c in counts.tolist():
            f.write(json.dumps({"text": " ".join(vocab[at : at + c])}) + "\n")
            at += c
    tmp.rename(path)


# --- measuring a child process -------------------------------------------------------------------------
def measure(cmd: list[str], env: dict | None = None, log: Path | None = None, cwd: Path = ROOT) -> dict:
    """Run ``cmd``; wall s, CPU s (user + system, children included) and peak RSS bytes (``measure.py``)."""
    m = run_measured(cmd, env, log or BENCH / "last.log", cwd=cwd, poll=0.2)
    return {"rc": m.rc, "wall": m.wall, "t0": m.t0, "cpu": m.cpu, "rss": m.tree_rss, "log": str(m.log)}


# --- children: the references, run as `bench_pack.py --child KIND ...` ----------------------------------
def _encode_in_batches(tok, texts: list[str], batch: int) -> int:
    """Encode ``texts`` in calls of ``batch`` texts (0: all in one call); the number of tokens."""
    step = batch or len(texts)
    tokens = 0
    for i in range(0, len(texts), step):
        encodings = tok.encode_batch_fast(texts[i : i + step], add_special_tokens=False)
        tokens += sum(len(e.ids) for e in encodings)
    return tokens


def _tokenize_half(args: tuple) -> tuple[int, float]:
    data, half, batch, barrier = args
    import tokenizers

    texts = [json.loads(line)["text"] for line in open(data)]
    texts = texts[: len(texts) // 2] if half == 0 else texts[len(texts) // 2 :]
    tok = tokenizers.Tokenizer.from_file(str(ROOT / "data/demo/tokenizer.json"))
    barrier.wait()
    t0 = time.perf_counter()
    tokens = _encode_in_batches(tok, texts, batch)
    return tokens, time.perf_counter() - t0


# the module:callable encoder of the plugin rows: one tokenizer call per text, as a user's own code may be
PLUGIN_SOURCE = """\
\"\"\"packtool's bench: a module:callable encoder that tokenizes one text at a time.\"\"\"

import tokenizers

TOKENIZER = tokenizers.Tokenizer.from_file({tokenizer!r})


def encode(records):
    return {{"input_ids": [TOKENIZER.encode(t, add_special_tokens=False).ids for t in records["text"]]}}
"""


def write_plugin() -> Path:
    """``.bench/enc_one_text.py``, the plugin rows' encoder (``--tokenizer PATH:encode``)."""
    path = BENCH / "enc_one_text.py"
    path.write_text(PLUGIN_SOURCE.format(tokenizer=str(ROOT / "data/demo/tokenizer.json")))
    return path


def _plugin_worker(texts: list[str], batch: int, counter, barrier, results) -> None:
    """One of 2 processes running the plugin alone: batches of ``batch`` texts, each claimed from a shared
    counter (as a process pool hands out tasks: neither process idles while the other has a backlog)."""
    sys.path.insert(0, str(BENCH))
    from enc_one_text import encode

    barrier.wait()
    tokens = 0
    while True:
        with counter.get_lock():
            i = counter.value
            counter.value += batch
        if i >= len(texts):
            break
        tokens += sum(map(len, encode({"text": texts[i : i + batch]})["input_ids"]))
    results.put(tokens)


def child(kind: str, data: str, out: str, result: str) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    if kind.startswith("plugin-procs:"):  # the plugin alone: 2 processes x 1 thread, batches of B texts
        import multiprocessing as mp

        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # as in packtool's workers (one text per call anyway)
        texts = [json.loads(line)["text"] for line in open(data)]
        ctx = mp.get_context("fork")  # the texts are loaded once, before the clock starts
        barrier, results = ctx.Barrier(3), ctx.Queue()
        args = (texts, int(kind.partition(":")[2]), ctx.Value("q", 0), barrier, results)
        procs = [ctx.Process(target=_plugin_worker, args=args) for _ in range(2)]
        for p in procs:
            p.start()
        barrier.wait()  # both processes are ready: the clock starts
        t0 = time.perf_counter()
        tokens = results.get() + results.get()
        seconds = time.perf_counter() - t0
        for p in procs:
            p.join()
        Path(result).write_text(json.dumps({"tokens": tokens, "seconds": seconds}))
        return
    if kind.startswith("tokenizer"):  # tokenizer[-procs]:B encodes in calls of B texts (0: one call)
        kind, _, batch = kind.partition(":")
    if kind == "tokenizer-procs":  # 2 processes x 1 thread, each half of the texts, from a barrier
        import multiprocessing as mp

        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        ctx = mp.get_context("fork")  # nothing imported or threaded yet
        barrier = ctx.Manager().Barrier(2)
        with ctx.Pool(2) as pool:
            parts = pool.map(_tokenize_half, [(data, 0, int(batch), barrier), (data, 1, int(batch), barrier)])
        Path(result).write_text(
            json.dumps({"tokens": sum(p[0] for p in parts), "seconds": max(p[1] for p in parts)})
        )
        return
    if kind == "read-floor":  # the input Parquet read as packtool reads it, nothing else
        import pyarrow.parquet as pq

        t0 = time.perf_counter()
        pf = pq.ParquetFile(data, pre_buffer=False, buffer_size=1 << 20)
        rows = sum(b.num_rows for b in pf.iter_batches(batch_size=8192))
        Path(result).write_text(json.dumps({"seconds": time.perf_counter() - t0, "rows": rows}))
        return
    if kind == "write-floor":  # packtool's output arrays (from memory) written with its writer settings
        import pyarrow.parquet as pq

        tables = [(p.name, pq.read_table(p)) for p in sorted(Path(data).glob("packs-*.parquet"))]
        t0 = time.perf_counter()
        for name, table in tables:
            writer = pq.ParquetWriter(
                Path(out) / name, table.schema, compression="zstd", use_dictionary=False,
                write_statistics=False, store_schema=True, write_page_checksum=True,
            )  # fmt: skip
            writer.write_table(table, row_group_size=128)
            writer.close()
        Path(result).write_text(json.dumps({"seconds": time.perf_counter() - t0}))
        return
    if kind == "tokenizer":
        import tokenizers

        texts = [json.loads(line)["text"] for line in open(data)]
        tok = tokenizers.Tokenizer.from_file(str(ROOT / "data/demo/tokenizer.json"))
        t0 = time.perf_counter()
        tokens = _encode_in_batches(tok, texts, int(batch))
        Path(result).write_text(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - t0}))
        return
    import pyarrow.compute as pc
    from datasets import Dataset

    ds = Dataset.from_parquet(data)
    if kind == "nemo":
        sys.path.insert(0, str(ROOT / "tests"))
        from nemo_reference import load_packed_sequence_module

        mod = load_packed_sequence_module()
        packed = mod.PackedSequence(ds, "train", N, split_across_pack=True).pack()
    else:
        from trl.data_utils import pack_dataset

        packed = pack_dataset(ds, N, strategy=kind.split(":", 1)[1])
    packed.to_parquet(str(Path(out) / "packs.parquet"))
    t_done = time.time()
    lengths = pc.list_value_length(ds.data.column("input_ids"))
    input_tokens = pc.sum(lengths).as_py()
    if kind == "nemo":
        tokens = input_tokens  # split_across_pack: every token is packed (the pad entry is in seq_lens)
    else:  # TRL does not pad: the packed tokens are the lists' lengths
        tokens = pc.sum(pc.list_value_length(packed.data.column("input_ids"))).as_py()
    stats = {"t_done": t_done, "packs": len(packed), "tokens": tokens, "input_tokens": input_tokens}
    Path(result).write_text(json.dumps(stats))


def trl_python() -> tuple[str | None, str]:
    """A venv in .bench/trl-venv with trl (--no-deps) that sees this environment's packages."""
    venv = BENCH / "trl-venv"
    py = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        Path(site, "_packtool_bench_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        proc = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "--no-deps", TRL_SPEC], capture_output=True, text=True
        )
        if proc.returncode:
            return None, f"pip install {TRL_SPEC} failed: {proc.stderr.strip().splitlines()[-1:]}"
        (venv / ".ready").touch()
    check = subprocess.run([str(py), "-c", "from trl.data_utils import pack_dataset"], capture_output=True)
    if check.returncode:
        return None, "trl.data_utils does not import: " + check.stderr.decode().strip().splitlines()[-1]
    return str(py), ""


def import_path(root: Path) -> str:
    """``PYTHONPATH`` that imports the packtool of checkout ``root`` (``src/`` layout, or an older checkout's
    top-level ``packtool/``)."""
    return str(root / "src") if (root / "src" / "packtool").is_dir() else str(root)


# --- rows ----------------------------------------------------------------------------------------------
def reference_row(name: str, python: str, kind: str, data: Path, samples: int) -> dict:
    out, result = BENCH / "out" / name, BENCH / "out" / f"{name}.json"
    result.unlink(missing_ok=True)
    env = {"HF_DATASETS_CACHE": str(BENCH / "hf-cache" / name), "PYTHONPATH": import_path(ROOT)}
    subprocess.run(["rm", "-rf", str(BENCH / "hf-cache" / name), str(out)], check=True)
    m = measure(
        [python, str(Path(__file__).resolve()), "--child", kind, "--data", str(data), "--out", str(out),
         "--result", str(result)],
        env, BENCH / f"{name}.log",
    )  # fmt: skip
    if m["rc"] != 0 or not result.exists():
        return {"name": name, "error": f"exit {m['rc']}, see {m['log']}"}
    s = json.loads(result.read_text())
    m["wall"] = s["t_done"] - m["t0"]
    return row(name, m, samples, s["packs"], s["tokens"], s["input_tokens"] - s["tokens"])


def packtool_row(name: str, data: Path, samples: int, *flags: str, root: Path = ROOT) -> dict:
    """``packtool pack`` of the checkout ``root`` (this one by default) on ``data``, measured."""
    out = BENCH / "out" / name
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(data), "-o", str(out), "-q", "--overwrite"]
    # run from root: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH
    m = measure(
        cmd + ["--packed-sequence-size", str(N), *flags],
        {"PYTHONPATH": import_path(root)},
        BENCH / f"{name}.log",
        root,
    )
    if m["rc"] != 0:
        return {"name": name, "error": f"exit {m['rc']}, see {m['log']}"}
    s = json.loads((out / "manifest.json").read_text())["stats"]
    dropped = s["truncated_tokens"] + s["dropped_tokens"] + s["tokens_over_max_packs"]
    return row(name, m, samples, s["num_packs"], s["num_tokens"], dropped, input_tokens=s["input_tokens"])


def floor_parts(data: Path, packed: Path) -> dict[str, float] | str:
    """One measurement of the floor's parts (see the module docstring): ``{"start", "read", "write"}``
    seconds, or why it failed."""
    m = measure(
        [sys.executable, "-c", "import packtool.cli, packtool.pipeline.run"],
        {"PYTHONPATH": import_path(ROOT)},
    )
    parts = {"start": m["wall"]}
    for kind, src in (("read-floor", data), ("write-floor", packed)):
        result = BENCH / "out" / f"{kind}.json"
        result.unlink(missing_ok=True)
        r = measure(
            [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--data", str(src),
             "--out", str(BENCH / "out" / kind), "--result", str(result)],
            {"PYTHONPATH": import_path(ROOT)}, BENCH / f"{kind}.log",
        )  # fmt: skip
        if r["rc"] != 0 or not result.exists():
            return f"{kind}: exit {r['rc']}, see {r['log']}"
        parts[kind.split("-")[0]] = json.loads(result.read_text())["seconds"]
    return parts


FLOOR_FLAGS = ("--strategy", "bfd", "--long-samples", "truncate")  # the job the floor is measured against


def floor_rows(data: Path, samples: int, pairs: int, baseline: Path | None = None) -> list[dict]:
    """The floor's parts and ``packtool pack`` (bfd, truncate) at ``--num-proc`` 1 and 2, measured in
    ``pairs`` rounds one right after the other (the order rotating from round to round), since this
    machine's speed drifts by tens of percent over minutes: each figure is the median over the rounds, and
    floor / packtool the median of the rounds' ratios. The write floor writes the shards of that job's
    first ``--num-proc 1`` run. With ``baseline`` (another checkout of packtool, e.g. an older commit)
    its packtool runs the same jobs in the same rounds: before and after, measured side by side."""
    packed = BENCH / "out" / "floor packtool np1"
    jobs = {"floor": None, "np1": "1", "np2": "2"}
    if baseline is not None:
        jobs.update({"baseline np1": "1", "baseline np2": "2"})
    times: dict[str, list[float]] = {
        "start": [],
        "read": [],
        "write": [],
        **{j: [] for j in jobs if j != "floor"},
    }
    rounds: list[dict[str, float]] = []
    for i in range(pairs):
        order = list(jobs)[i % len(jobs) :] + list(jobs)[: i % len(jobs)]
        if i == 0:  # the write floor needs the shards first
            order = ["np1", *(j for j in order if j != "np1")]
        got: dict[str, float] = {}
        for job in order:
            if job == "floor":
                parts = floor_parts(data, packed)
                if isinstance(parts, str):
                    return [{"name": "floor", "error": parts}]
                for k, v in parts.items():
                    times[k].append(v)
                got["floor"] = sum(parts.values())
                continue
            root = baseline if job.startswith("baseline") and baseline is not None else ROOT
            r = packtool_row(
                f"floor packtool {job}", data, samples, *FLOOR_FLAGS, "--num-proc", jobs[job], root=root
            )
            if "error" in r:
                return [r]
            times[job].append(r["wall"])
            got[job] = r["wall"]
        rounds.append(got)
        print(
            f"  floor pair {i + 1}/{pairs}: " + ", ".join(f"{k} {v:.2f} s" for k, v in got.items()),
            file=sys.stderr,
        )
    med = {k: statistics.median(v) for k, v in times.items()}
    out = [
        {"name": "floor: python + packtool imports", "wall": med["start"]},
        {"name": "floor: read input Parquet (in-process)", "wall": med["read"]},
        {"name": "floor: write output, zstd (in-process)", "wall": med["write"]},
        {"name": "floor total, 1 core", "wall": med["start"] + med["read"] + med["write"]},
        {
            "name": "floor total, 2 cores (perfect split)",
            "wall": med["start"] + (med["read"] + med["write"]) / 2,
        },
    ]
    for job in jobs:
        if job == "floor":
            continue
        ratios = [r["floor"] / r[job] for r in rounds]
        who = f"baseline {baseline.name}" if job.startswith("baseline") else "packtool"
        out.append(
            {"name": f"{who} bfd truncate {job.split()[-1]} (paired)", "wall": med[job],
             "floor_ratio": statistics.median(ratios), "ratios": ratios}
        )  # fmt: skip
    for r in out:
        r["samples_s"] = samples / r["wall"]
        r["floor"] = True
    return out


def print_floor(rows: list[dict], pairs: int, nemo: dict | None = None) -> None:
    """The floor's parts and packtool beside them: wall s (medians of ``pairs`` rounds), floor / packtool,
    and the speed against NeMo's row of this run, if there is one."""
    print(f"\nthe one-core floor against packtool, {pairs} paired rounds (medians; bfd, truncate)\n")
    print(f"{'run':48} {'wall s':>8} {'x NeMo':>7} {'floor/packtool':>15}  per round")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:48} {r['error']}")
            continue
        speed = f"{nemo['wall'] / r['wall']:6.1f}x" if nemo else f"{'-':>7}"
        ratio = f"{r['floor_ratio']:15.3f}" if "floor_ratio" in r else f"{'':15}"
        each = " ".join(f"{x:.2f}" for x in r.get("ratios", []))
        print(f"{r['name']:48} {r['wall']:8.2f} {speed} {ratio}  {each}")


def row(name: str, m: dict, samples: int, packs: int, tokens: int, dropped: int, **extra) -> dict:
    lower = -(-tokens // N)
    return {
        "name": name,
        "wall": m["wall"],
        "cpu": m["cpu"],
        "samples_s": samples / m["wall"],
        "rss": m["rss"],
        "packs": packs,
        "over_lb": packs - lower,
        "fill": tokens / (packs * N) if packs else 0.0,
        "dropped": dropped,
        **extra,
    }


def print_table(rows: list[dict]) -> None:
    ref = next((r for r in rows if r["name"].startswith("nemo") and "error" not in r), None)
    head = (
        f"{'run':34} {'wall s':>8} {'CPU s':>8} {'samples/s':>10} {'peak RSS':>9} {'packs':>7} "
        f"{'>LB':>5} {'fill':>8} {'dropped':>9} {'x NeMo':>8} {'RSS/NeMo':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['name']:34} {r['error']}")
            continue
        speed = f"{r['samples_s'] / ref['samples_s']:.1f}x" if ref else "-"
        rss = f"{r['rss'] / ref['rss']:.3f}" if ref and r.get("rss") else "-"
        if r.get("floor"):
            cpu = f"{r['cpu']:8.2f}" if r.get("cpu") is not None else f"{'-':>8}"
            mem = f"{r['rss'] / 2**20:8.0f}M" if r.get("rss") else f"{'-':>9}"
            print(
                f"{r['name']:34} {r['wall']:8.2f} {cpu} {r['samples_s']:10,.0f} {mem} {'':7} {'':5} {'':8} "
                f"{'':9} {speed:>8} {rss:>9}"
            )
            continue
        print(
            f"{r['name']:34} {r['wall']:8.2f} {r['cpu']:8.2f} {r['samples_s']:10,.0f} "
            f"{r['rss'] / 2**20:8.0f}M {r['packs']:7,} {r['over_lb']:5} {r['fill']:8.4%} "
            f"{r['dropped']:9,} {speed:>8} {rss:>9}"
        )


def machine_cpu() -> float | None:
    """CPU seconds this machine has been busy since it booted, all processes (``/proc/stat``), or None
    where that is not known. Its growth over a pair less the pair's own CPU is the other work that ran
    on the same cores meanwhile."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def tokenizer_alone(kind: str, env: dict, texts: Path) -> dict | None:
    """One encoder-alone child (``tokenizer[-procs]:B``, ``plugin-procs:B``) on ``texts``: ``{"tokens",
    "seconds"}`` (its own timing, load excluded) and ``cpu``, the child's CPU seconds in all."""
    result = BENCH / "out" / f"{kind.replace(':', '-')}.json"
    result.unlink(missing_ok=True)
    tm = measure(
        [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--data", str(texts),
         "--out", str(BENCH / "out" / "tok"), "--result", str(result)],
        env, result.with_suffix(".log"),
    )  # fmt: skip
    if tm["rc"] == 0 and result.exists():
        return {**json.loads(result.read_text()), "cpu": tm["cpu"]}
    print(f"failed: {kind} exit {tm['rc']} ({tm['log']})")
    return None


def text_rows(
    count: int,
    pairs: int = 3,
    encoder: str = "tokenizer",
    fmt: str = "jsonl",
    baseline: Path | None = None,
    mean_words: int = 230,
) -> list[dict]:
    """End to end from raw text on ``count`` texts of ``mean_words`` words on average; prints their table.

    Each pair also gives packtool's own cost: its wall time less the encoder alone's, in seconds per
    million tokens (the same tokens, cores and layout), and the median of the pairs.

    ``encoder``: ``tokenizer`` (``--tokenizer tokenizer.json``, batch calls) or ``plugin`` (``--tokenizer
    .bench/enc_one_text.py:encode``, a module:callable calling the tokenizer once per text). First the
    encoder alone in each layout and call size (the fastest is the ceiling), then ``pairs`` times the
    ceiling's layout and ``packtool pack --num-proc 2`` one right after the other: this machine's speed
    drifts by tens of percent over minutes, so each pair's ratio compares two runs a few seconds apart, and
    the median of the pairs is the figure. Last, ``--num-proc 1`` once. ``fmt``: the input packtool reads,
    ``jsonl`` (``{"text": ...}`` lines) or ``txt`` (the same texts, one per line); the encoder alone is
    given the same texts either way, loaded before its clock starts. ``baseline``: another checkout of
    packtool (e.g. ``git worktree add /tmp/base COMMIT``), timed in every pair too, right before or after
    this one in turn, for a before/after comparison against the same ceilings.
    """
    rows: list[dict] = []
    long = mean_words != 230
    texts = BENCH / (f"texts-{count}.jsonl" if not long else f"texts-{count}-words{mean_words}.jsonl")
    if not texts.exists():
        print(f"building {texts.name} ...", file=sys.stderr)
        make_texts(texts, count, mean_words)
    source = texts
    if fmt == "txt":  # the same texts as plain text, a sample per line (none holds a newline)
        source = texts.with_suffix(".txt")
        if not source.exists():
            with open(texts) as f, open(source, "w") as out:
                out.writelines(json.loads(line)["text"] + "\n" for line in f)
    if encoder == "plugin":
        # the plugin alone: 2 processes taking batches in turn (one text per call: no thread of its own)
        candidates = [("plugin-procs:512", "plugin alone, 2 procs x 1 thread, batches of 512", {})]
        flags = ["--tokenizer", f"{write_plugin()}:encode"]
        title = "module:callable encoder, one tokenizer call per text"
    else:
        rayon = {"RAYON_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true"}
        layouts = (
            ("tokenizer", "tokenizer alone, 2 threads", rayon),
            ("tokenizer-procs", "tokenizer alone, 2 procs x 1 thread", {}),
        )
        candidates = [
            (f"{kind}:{batch}", f"{layout}, {f'calls of {batch}' if batch else 'one call'}", env)
            for (kind, layout, env), batch in itertools.product(layouts, TOKENIZER_BATCHES)
        ]
        flags = ["--tokenizer", str(ROOT / "data/demo/tokenizer.json")]
        title = "demo tokenizer.json, batch calls"
    ceilings = {}  # label -> (kind, env, result)
    for kind, label, env in candidates:
        if (tok := tokenizer_alone(kind, env, texts)) is not None:
            ceilings[label] = (kind, env, tok)

    def pack(procs: int, root: Path = ROOT) -> dict:
        tag = "" if root == ROOT else " baseline"
        return packtool_row(
            f"packtool{tag} {encoder} {fmt} {count // 1000}k np{procs}", source, count,
            *flags, "--num-proc", str(procs), "--split-across-pack", root=root,
        )  # fmt: skip

    size = f"{count:,} texts" + (f" of {mean_words:,} words on average" if long else "")
    print(f"\nend to end from raw text, {size} read from {fmt}, {title}, 2 cores\n")
    if not ceilings:
        return rows

    def line(name: str, tokens: int | str, seconds: float | str, share: float) -> None:
        tokens_s = f"{tokens / seconds:,.0f}" if isinstance(seconds, float) else ""
        tokens = f"{tokens:,}" if isinstance(tokens, int) else tokens
        seconds = f"{seconds:.2f}" if isinstance(seconds, float) else seconds
        print(f"{name:50} {tokens:>12} {seconds:>13} {tokens_s:>12} {share:10.1%}")

    speed = lambda t: t["tokens"] / t["seconds"]  # noqa: E731
    best_label = max(ceilings, key=lambda k: speed(ceilings[k][2]))
    best = speed(ceilings[best_label][2])
    print(f"{'run':50} {'tokens':>12} {'seconds':>13} {'tokens/s':>12} {'of ceiling':>10}")
    for label, (_, _, tok) in ceilings.items():
        line(label, tok["tokens"], tok["seconds"], speed(tok) / best)
        rows.append(
            {
                "name": label,
                "encoder": encoder,
                "texts": count,
                "tokens": tok["tokens"],
                "seconds": tok["seconds"],
            }
        )
    kind, env, _ = ceilings[best_label]
    ratios, quiet, ceiling_speeds, base_ratios, base_quiet = [], [], [], [], []
    own_cost, base_cost = [], []  # packtool's wall less the encoder's, s per million tokens
    for i in range(1, pairs + 1):
        busy, own = machine_cpu(), time.process_time()
        tok = tokenizer_alone(kind, env, texts)
        base = None
        if baseline is not None and i % 2 == 0:  # the baseline first in every other pair
            base = pack(2, baseline)
        ours = pack(2)
        if baseline is not None and base is None:
            base = pack(2, baseline)
        if tok is None or "error" in ours or (base is not None and "error" in base):
            print(f"pair {i}: {ours.get('error', (base or {}).get('error', 'the encoder alone failed'))}")
            continue
        # CPU seconds of other work on the machine during the pair (not known off Linux)
        others = None
        if busy is not None:
            ran = tok["cpu"] + ours["cpu"] + (base["cpu"] if base else 0.0)
            others = machine_cpu() - busy - ran - (time.process_time() - own)
        is_quiet = others is not None and others < QUIET_SHARE * ours["wall"] * (2 if base else 1)
        if base is not None:
            base_ratios.append(base["input_tokens"] / base["wall"] / speed(tok))
            base_quiet += [base_ratios[-1]] if is_quiet else []
            line(
                f"pair {i}: baseline (whole job)",
                base["input_tokens"],
                f"{base['wall']:.2f}",
                base_ratios[-1],
            )
            rows.append(
                {**base, "encoder": encoder, "texts": count, "pair": i, "of_ceiling": base_ratios[-1]}
            )
        ratios.append(ours["input_tokens"] / ours["wall"] / speed(tok))
        ceiling_speeds.append(speed(tok))
        own_cost.append((ours["wall"] - tok["seconds"]) / ours["input_tokens"] * 1e6)
        if base is not None:
            base_cost.append((base["wall"] - tok["seconds"]) / base["input_tokens"] * 1e6)
        seconds = f"{tok['seconds']:.2f} / {ours['wall']:.2f}"
        label = f"pair {i}: ceiling / packtool np2" + (f", others {max(others, 0):.1f} s" if busy else "")
        line(label, ours["input_tokens"], seconds, ratios[-1])
        if is_quiet:
            quiet.append(ratios[-1])
        rows.append(
            {**ours, "encoder": encoder, "texts": count, "pair": i, "ceiling_s": tok["seconds"],
             "ceiling_cpu": tok["cpu"], "others_cpu": others, "of_ceiling": ratios[-1]}
        )  # fmt: skip
    if ratios:
        line("packtool np2 / ceiling: median of the pairs", "", "", statistics.median(ratios))
    if quiet:
        line(f"  median of the {len(quiet)} quiet pairs", "", "", statistics.median(quiet))
    if base_ratios:
        line("baseline np2 / ceiling: median of the pairs", "", "", statistics.median(base_ratios))
    if base_quiet:
        line(f"  median of the {len(base_quiet)} quiet pairs", "", "", statistics.median(base_quiet))
    for name, values in (("packtool", own_cost), ("baseline", base_cost)):
        if values:  # what the job adds to the encoder: reading, plugin boundary, chunks, planning, writing
            each = ", ".join(f"{v:.3f}" for v in values)
            median = statistics.median(values)
            print(f"{name} np2's own cost: {median:.3f} s per million tokens (pairs: {each})")
    ours = pack(1)
    if "error" in ours:
        print(f"{ours['name']:50} {ours['error']}")
    else:  # against the pairs' ceilings, run nearer in time than the first measurement of the layouts
        share = ours["input_tokens"] / ours["wall"] / statistics.median(ceiling_speeds or [best])
        line(f"{ours['name']} (whole job)", ours["input_tokens"], ours["wall"], share)
        rows.append({**ours, "encoder": encoder, "texts": count})
    return rows


def packer_rows(data: Path, k: int, args: argparse.Namespace, step) -> None:
    """NeMo, TRL and packtool on the pretokenized input, each row handed to ``step``."""
    if not args.no_nemo:
        step(reference_row("nemo PackedSequence split", sys.executable, "nemo", data, k))
    if not args.no_trl:
        py, why = trl_python()
        for strategy in ("bfd", "bfd_split"):
            if py is None:
                step({"name": f"trl pack_dataset {strategy}", "error": why})
            else:
                step(reference_row(f"trl pack_dataset {strategy}", py, f"trl:{strategy}", data, k))
    for strategy, extra in (
        ("sequential", ["--split-across-pack"]),
        ("bfd", ["--long-samples", "truncate"]),
        ("bfd", ["--split-across-pack"]),
    ):
        tag = "split" if "--split-across-pack" in extra else "truncate"
        for procs in (1, 2):
            step(
                packtool_row(
                    f"packtool {strategy} {tag} np{procs}", data, k,
                    "--strategy", strategy, "--num-proc", str(procs), *extra,
                )
            )  # fmt: skip
    step(
        packtool_row(
            "packtool bfd truncate buf10k np2", data, k,
            "--long-samples", "truncate", "--packing-buffer-size", "10000", "--num-proc", "2",
        )
    )  # fmt: skip


def pretokenized_rows(args: argparse.Namespace) -> list[dict]:
    """NeMo, TRL and packtool on pretokenized Parquet, then the floor against packtool in paired rounds;
    prints their tables."""
    data = BENCH / f"tokens-{args.samples}.parquet"
    if not data.exists():
        print(f"building {data.name} ...", file=sys.stderr)
        make_tokens(data, args.samples)
    k = args.samples
    rows: list[dict] = []
    step = lambda r: (rows.append(r), print(f"  {r['name']}: done", file=sys.stderr))  # noqa: E731
    if not args.only_floor:
        packer_rows(data, k, args, step)
        print(f"\npretokenized Parquet -> packed Parquet, {k:,} samples (lognormal, mean ~300), N={N}\n")
        print_table(rows)
    if args.floor_pairs:
        floor = floor_rows(data, k, args.floor_pairs, args.floor_baseline)
        nemo = next((r for r in rows if r["name"].startswith("nemo") and "error" not in r), None)
        print_floor(floor, args.floor_pairs, nemo)
        rows += floor
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=100_000, help="pretokenized samples (default 100,000)")
    ap.add_argument(
        "--text-samples",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=[20_000, 100_000],
        help="texts for the end-to-end rows, comma-separated sizes (default 20000,100000; '' for none)",
    )
    ap.add_argument(
        "--long-texts",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=[20_000],
        help=f"long documents ({LONG_WORDS:,} words on average) for end-to-end rows with the tokenizer.json "
        "encoder, comma-separated sizes (default 20000; '' for none)",
    )
    ap.add_argument(
        "--pairs", type=int, default=3, help="ceiling / packtool np2 pairs per text size (default 3)"
    )
    ap.add_argument(
        "--text-encoders",
        type=lambda v: v.split(","),
        default=["tokenizer", "plugin"],
        help="encoders of the end-to-end rows: tokenizer (tokenizer.json, batch calls), plugin (a "
        "module:callable calling the tokenizer once per text); default tokenizer,plugin",
    )
    ap.add_argument(
        "--text-input",
        choices=["jsonl", "txt"],
        default="jsonl",
        help="what packtool reads in the raw-text rows: JSON Lines (default) or the same texts as .txt",
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        help="another packtool checkout (git worktree add DIR COMMIT) timed in every raw-text pair too",
    )
    ap.add_argument(
        "--text-only",
        action="store_true",
        help="only the end-to-end rows from raw text (no pretokenized rows)",
    )
    ap.add_argument(
        "--floor-pairs", type=int, default=5, help="rounds of floor / packtool np1 / np2 (default 5; 0 skips)"
    )
    ap.add_argument(
        "--only-floor", action="store_true", help="only the floor rounds (no references, packers or texts)"
    )
    ap.add_argument(
        "--floor-baseline",
        type=Path,
        help="another packtool checkout (e.g. `git worktree add DIR COMMIT`) run in the same floor rounds",
    )
    ap.add_argument("--no-nemo", action="store_true", help="skip NeMo PackedSequence (slowest row)")
    ap.add_argument("--no-trl", action="store_true", help="skip TRL pack_dataset")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.data, args.out, args.result)
        return

    BENCH.mkdir(exist_ok=True)
    (BENCH / "out").mkdir(exist_ok=True)
    rows: list[dict] = []
    if not args.text_only:
        rows += pretokenized_rows(args)
    for encoder, count in itertools.product(args.text_encoders, args.text_samples):
        if not args.only_floor:
            rows += text_rows(count, args.pairs, encoder, args.text_input, args.baseline)
    for count in args.long_texts:  # long documents (man pages, papers) through the fast encoder
        if not args.only_floor:
            rows += text_rows(count, args.pairs, "tokenizer", args.text_input, args.baseline, LONG_WORDS)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
