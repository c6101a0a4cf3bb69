"""Benchmark vision-language packing and loading on a generated image set (no download).

    python scripts/bench_vision.py [--samples 20000] [--size 4096] [--data DIR]

Generates ``--samples`` LLaVA samples with ``scripts/make_vision_demo.py`` (kept in ``--data`` and reused
when it is there), builds a Qwen2-VL processor at the released defaults (``min_pixels`` 56 * 56,
``max_pixels`` 28 * 28 * 1280) from the demo chat tokenizer, then runs ``packtool pack --processor`` on
them, each run a whole command in a process of its own (``measure.run_measured``: wall and CPU seconds of
every process, peak RSS), with the run's steps timed from inside (``measure.STEPS_RUNNER``):

* floor: reading every image's bytes, in this process (what any packer must do at least);
* ``--num-proc 1`` and ``--num-proc 2``: encode + plan (from the first record read to the plan made)
  in each, and their ratio (the workers: the target is 1.7x on 2 cores);
* the same samples with their images removed (``image`` dropped, ``<image>`` placeholders gone), the
  same processor's tokenizer and template: CPU seconds per sample of the whole command with images over
  without (the images' own cost: read, header, digest, their bytes written; target at most 1.5x);
* a ``--num-proc 2`` run interrupted with SIGINT (to its process group, as Ctrl-C is) once half its
  chunks are encoded, then run again: the rerun's CPU over a whole run's (target at most 0.6), and the
  same for the work after start-up (from the first record read, once a worker has loaded the processor:
  the start-up, transformers and torch imported by the workers' server, is the same for every run,
  however large).

Each pack command runs ``--repeats`` times, alternating, and the best of each counts.

Interleaved documents (``--documents``, 0 to skip): the first ``--documents`` samples as image-text
documents (``documents_input``: each turn's text a text, each ``<image>`` an image at its place, in
OBELICS's ``texts`` / ``images`` layout), packed by ``packtool pack --processor`` (``--num-proc 1``), against
the same documents as text only (their texts joined, the images left out: ``{"text": ...}`` packed by
``--tokenizer`` over the processor's own tokenizer, the text path), and between them the same documents
without their images through ``--processor`` (what the interleaved path costs on text): the CPU a
document of each, of the whole command and of the encoding and planning alone (from the first record read
to the plan made, in one process: the start-up, transformers imported, paid once by any run, left out),
and their ratios.

The loader (``--loader-samples``, 0 to skip; ``make bench`` runs it alone with ``--samples 0``): the first
``--loader-samples`` samples packed by ``packtool pack --processor`` (Parquet), then, alternating
``--loader-repeats`` times:

* alone: every pack's stored images decoded (``decode_images``) and run through the processor
  (``image_inputs``, a pack's images as one group), one pack after the other in this process: the work
  the loader's workers do, alone;
* loader: one epoch of ``get_loader(vision_dataset(OUT, processor, rule), num_workers=2)`` (batch 4): the
  same images, decoded and processed in 2 DataLoader workers, the runs checked, the M-RoPE ids computed by
  Qwen2-VL's own rule (a model on the ``meta`` device), batched with the packs' tokens and moved to the
  main process; once with ``pixel_values`` in float32 (as the processor gives them), once cast to
  bfloat16 in the workers (``dtype=``, the training dtype: half the bytes to move).

Prints images/s of each and their ratio.

``--scale 100000,1000000`` (not in ``make bench``: minutes and gigabytes) packs that many synthetic LLaVA
samples (``scale_input``: short turns, 0 to 2 images each drawn from 64 small gradient images, reused) with
``--num-proc 2`` and prints a markdown row per size: wall time, samples/s, the peak RSS of the whole process
tree and of its largest process, the fill rate and the packs against the lower bound, the output's size.
Figures belong in docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "scripts"), str(ROOT)])}
CHUNK = 256  # records per chunk of a vision run (pipeline.encode.VISION_CHUNK_RECORDS)

from measure import STEPS_RUNNER, run_measured, step_times  # noqa: E402 - scripts/ is on the path

from packtool.loader import get_loader  # noqa: E402 - after the repository root is on the path
from packtool.vision.loader import vision_dataset  # noqa: E402
from packtool.vision.model_inputs import decode_images, image_inputs  # noqa: E402
from packtool.vision.processor import load_processor  # noqa: E402
from tests.fixtures.vision_processors import build_qwen2vl  # noqa: E402


def _demo_module():
    spec = importlib.util.spec_from_file_location(
        "make_vision_demo", ROOT / "scripts" / "make_vision_demo.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def pack_with_cli(data: Path, processor_dir: Path, out: Path, samples: int, size: int) -> Path:
    """The first ``samples`` samples of ``data/llava.jsonl`` packed by ``packtool pack --processor`` into
    ``out`` (Parquet)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = (data / "llava.jsonl").read_text().splitlines()[:samples]
    records = [json.loads(line) for line in lines]
    for r in records:  # paths against the copy's directory: the demo's images stay where they are
        if "image" in r:
            images = r["image"] if isinstance(r["image"], list) else [r["image"]]
            r["image"] = [str((data / i).resolve()) for i in images]
    src = out.parent / "loader-input.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(src), "-o", str(out), "--processor",
           str(processor_dir), "--packed-sequence-size", str(size), "--overwrite"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def qwen2vl_rule(processor):
    """The M-RoPE rule (``get_rope_index``) of a Qwen2-VL built on the ``meta`` device for the processor's
    tokens: the model's own code, no weights (what the loader's workers run per sample)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tok = processor.tokenizer
    config = Qwen2VLConfig(
        text_config={"vocab_size": tok.vocab_size, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1]}},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 4},
        image_token_id=processor.image_token_id, video_token_id=tok.token_to_id("<|video_pad|>"),
        vision_start_token_id=tok.token_to_id("<|vision_start|>"),
        vision_end_token_id=tok.token_to_id("<|vision_end|>"),
    )  # fmt: skip
    with torch.device("meta"):
        return Qwen2VLForConditionalGeneration(config).model.get_rope_index


def bench_loader(out: Path, processor, workers: int, repeats: int) -> dict:
    """Seconds (the best of ``repeats``, alternating) to process every pack's images alone (this process),
    and through the loader (``workers`` DataLoader workers) with ``pixel_values`` as the processor gives
    them (float32) and cast to bfloat16 in the workers (``dtype=``: half the bytes to move)."""
    encoded = []
    for path in sorted(out.glob("*.parquet")):
        for row in pq.read_table(path, columns=["images"]).column("images").to_pylist():
            encoded.append([image["bytes"] for image in row])
    images = sum(len(e) for e in encoded)
    rule = qwen2vl_rule(processor)
    times = {"alone": [], "float32": [], "bfloat16": []}
    moved = {}
    for _ in range(repeats):
        start = time.perf_counter()
        for pack in encoded:
            image_inputs(processor, [decode_images(pack)])
        times["alone"].append(time.perf_counter() - start)
        for name, dtype in (("float32", None), ("bfloat16", torch.bfloat16)):
            ds = vision_dataset(
                out, processor, rule, dtype=dtype, batch_size=4, shuffle=True, drop_last=False
            )
            start, seen, moved[name] = time.perf_counter(), 0, 0
            for batch in get_loader(ds, num_workers=workers):
                seen += int(batch.images_per_pack.sum())
                moved[name] += batch.pixel_values.numel() * batch.pixel_values.element_size()
            times[name].append(time.perf_counter() - start)
            assert seen == images, (seen, images)
    return {"packs": len(encoded), "images": images, "moved": moved, **{k: min(v) for k, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000, help="pack side; 0 skips it")
    parser.add_argument("--size", type=int, default=4096, help="packed_sequence_size N")
    parser.add_argument("--data", default=str(ROOT / ".bench" / "vision"))
    parser.add_argument("--loader-samples", type=int, default=2000, help="loader side; 0 skips it")
    parser.add_argument("--loader-repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each pack command (the best)")
    parser.add_argument("--documents", type=int, default=5000, help="interleaved documents; 0 skips them")
    parser.add_argument("--scale", default="", help="sample counts of synthetic runs, e.g. 100000,1000000")
    parser.add_argument(
        "--scale-rerun", action="store_true", help="--scale: also a SIGINT at half way, rerun"
    )
    args = parser.parse_args()
    if args.scale:
        counts = [int(n) for n in args.scale.split(",")]
        scale(counts, Path(args.data) / "scale", args.size, args.scale_rerun)
        return
    wanted = max(args.samples, args.loader_samples, args.documents)
    data = Path(args.data) / str(wanted)
    if not (data / "llava.jsonl").is_file():
        _demo_module().make(data, wanted, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        processor_dir = build_qwen2vl(Path(tmp) / "qwen2vl", 56 * 56, 28 * 28 * 1280)
        processor = load_processor(processor_dir)
        if args.samples:
            bench_pack(data, processor_dir, Path(tmp), args)
        if args.documents:
            bench_documents(data, processor_dir, Path(tmp), args)
        if args.loader_samples:
            out = pack_with_cli(data, processor_dir, Path(tmp) / "out", args.loader_samples, args.size)
            res = bench_loader(out, processor, args.workers, args.loader_repeats)
            print(f"loader: {res['packs']} packs, {res['images']} images (Qwen2-VL processor, N={args.size})")
            alone = res["images"] / res["alone"]
            print(f"alone (decode + processor, 1 process): {alone:6.0f} images/s {res['alone']:7.2f} s")
            for name in ("float32", "bfloat16"):
                rate = res["images"] / res[name]
                print(
                    f"loader ({args.workers} workers, batch 4, {name} pixel_values, "
                    f"{res['moved'][name] / 1e9:.2f} GB): {rate:6.0f} images/s {res[name]:7.2f} s"
                    f" = {rate / alone:.2f}x alone"
                )


def without_images(data: Path, out: Path) -> Path:
    """``data/llava.jsonl``'s samples with their images removed: no ``image``, no ``<image>``."""
    rows = []
    for line in (data / "llava.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("image", None)
        for turn in r["conversations"]:
            turn["value"] = re.sub(r"<image>\n?", "", turn["value"])
        rows.append(r)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def pack_timed(source: Path, processor_dir: Path | None, tmp: Path, name: str, *flags: str):
    """``packtool pack --processor`` (without ``processor_dir``: as the flags say) as a whole command
    (``measure``): the measure, and when each of its steps last came (``read``: the first record read,
    ``plan``: the plan made, ``write``: the last shard written)."""
    out, steps = tmp / name, tmp / f"{name}.steps"
    steps.unlink(missing_ok=True)
    processor = ["--processor", str(processor_dir)] if processor_dir is not None else []
    cmd = [sys.executable, "-c", STEPS_RUNNER, str(steps), "pack", str(source), "-o", str(out), "-q",
           *processor, "--overwrite", *flags]  # fmt: skip
    m = run_measured(cmd, env=ENV, log=tmp / f"{name}.log")
    assert m.rc == 0, m.log.read_text()
    return m, step_times(steps)


def interrupted_then_rerun(source: Path, processor_dir: Path, tmp: Path, samples: int, *flags: str):
    """A run interrupted with SIGINT once half its chunks are encoded, then the same command again:
    the rerun's measure, its steps' times and ``(chunks kept, chunks)``."""
    out = tmp / "sigint"
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(source), "-o", str(out),
           "--processor", str(processor_dir), *flags]  # fmt: skip
    env = {**os.environ, **ENV}
    proc = subprocess.Popen([*cmd, "-q"], env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    work, half = out.with_name("sigint.partial") / "_work", math.ceil(samples / CHUNK) // 2
    while len(list(work.glob("chunk-*/meta.json"))) < half:
        assert proc.poll() is None, "the run ended before half its chunks"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    steps = tmp / "sigint.steps"
    rerun = [sys.executable, "-c", STEPS_RUNNER, str(steps), *cmd[3:]]
    m = run_measured(rerun, env=ENV, log=tmp / "sigint.log")
    assert m.rc == 0, m.log.read_text()
    kept = re.search(r"resumed: (\d+) of (\d+) chunks", m.log.read_text())
    assert kept, "the rerun did not resume:\n" + m.log.read_text()[-2000:]
    return m, step_times(steps), (int(kept[1]), int(kept[2]))


def bench_pack(data: Path, processor_dir: Path, tmp: Path, args) -> None:
    source = data / "llava.jsonl"
    images = sorted((data / "images").iterdir())
    start = time.perf_counter()
    total = sum(len(p.read_bytes()) for p in images)
    floor = time.perf_counter() - start
    size = ["--packed-sequence-size", str(args.size)]
    text = without_images(data, tmp / "text.jsonl")
    runs: dict[str, list] = {"one": [], "two": [], "text": []}
    for _ in range(args.repeats):  # alternating, the best of each: the machine's load varies
        runs["one"].append(pack_timed(source, processor_dir, tmp, "one", *size, "--num-proc", "1"))
        runs["two"].append(pack_timed(source, processor_dir, tmp, "two", *size, "--num-proc", "2"))
        runs["text"].append(pack_timed(text, processor_dir, tmp, "text", *size, "--num-proc", "1"))
    (one, _), (two, two_steps), (bare, _) = (
        min(runs[k], key=lambda r: r[0].cpu) for k in ("one", "two", "text")
    )
    one_plan, two_plan = (min(t["plan"] - t["read"] for _, t in runs[k]) for k in ("one", "two"))
    rerun, rerun_steps, (done, total) = interrupted_then_rerun(
        source, processor_dir, tmp, args.samples, *size, "--num-proc", "2"
    )
    work, rework = (t["write"] - t["read"] for t in (two_steps, rerun_steps))
    stats = json.loads((tmp / "one" / "manifest.json").read_text())["stats"]
    tokens, packs = stats["num_tokens"], stats["num_packs"]
    n = args.samples
    print(f"{n} samples, {len(images)} images ({total / 1e6:.0f} MB), {tokens} tokens, N={args.size}")
    print(f"floor (read the images' bytes):     {len(images) / floor:10.0f} images/s {floor:7.2f} s")
    print(f"encode + plan, 1 process:           {n / one_plan:10.0f} samples/s {one_plan:7.2f} s")
    print(f"encode + plan, 2 processes:         {n / two_plan:10.0f} samples/s {two_plan:7.2f} s"
          f" = {one_plan / two_plan:.2f}x 1 process (target >= 1.7x)")  # fmt: skip
    for label, m in (("whole command, 1 process", one), ("whole command, 2 processes", two),
                     ("whole command, images removed", bare)):  # fmt: skip
        print(f"{label + ':':36s}{n / m.wall:10.0f} samples/s {m.wall:7.2f} s wall, "
              f"{m.cpu / n * 1e6:6.0f} us CPU a sample, peak RSS {m.tree_rss / 2**20:,.0f} MiB")  # fmt: skip
    print(
        f"the images' own cost: {one.cpu / bare.cpu:.2f}x the CPU of the samples without them "
        "(target <= 1.5x)"
    )
    print(
        f"rerun after SIGINT at half way ({done} of {total} chunks kept): {rerun.cpu / two.cpu:.2f}x a whole "
        f"run's CPU "
        f"({rerun.cpu:.1f} s against {two.cpu:.1f} s; target <= 0.6); after start-up: {rework / work:.2f}x "
        f"({rework:.1f} s against {work:.1f} s from the first record read to the last shard written)"
    )
    # what every run pays (start-up, plan, the shards' write) and the encoding, from the two measures: the
    # whole run is fixed + encode, the rerun fixed + the share of the chunks it encoded again
    share = (total - done) / total
    fixed = (rerun.cpu - share * two.cpu) / (1 - share)
    print(
        f"  of a whole run's CPU, {fixed:.1f} s is paid by every run however much was done before (start-up, "
        f"plan, the shards' write) and {two.cpu - fixed:.1f} s is encoding: a rerun of half the chunks at "
        "0.6x needs the first at most a quarter of the second"
    )
    print(f"fill: {stats['fill_rate']:.4f}; packs {packs} vs lower bound {stats['lower_bound_packs']}")


def documents_input(data: Path, out: Path, count: int) -> tuple[Path, Path, Path]:
    """The first ``count`` samples of ``data/llava.jsonl`` as interleaved documents (``texts`` and
    ``images``: each turn's text, split at its ``<image>`` placeholders, with the images at their places;
    paths absolute) in ``out/documents.jsonl``, the same documents without their images in
    ``out/documents-no-images.jsonl``, and as text only (``{"text": ...}``, their texts joined) in
    ``out/documents-text.jsonl``."""
    documents, bare, texts = [], [], []
    for line in (data / "llava.jsonl").read_text().splitlines()[:count]:
        record = json.loads(line)
        images = record.get("image") or []
        images = iter(images if isinstance(images, list) else [images])
        items: list[tuple[str | None, str | None]] = []
        for turn in record["conversations"]:
            for k, text in enumerate(turn["value"].split("<image>")):
                if k:
                    items.append((None, str((data / next(images)).resolve())))
                if text.strip():
                    items.append((text.strip() + "\n", None))
        documents.append({"texts": [t for t, _ in items], "images": [i for _, i in items]})
        kept = [t for t, _ in items if t is not None]
        bare.append({"texts": kept, "images": [None] * len(kept)})
        texts.append({"text": "".join(kept)})
    paths = (out / "documents.jsonl", out / "documents-no-images.jsonl", out / "documents-text.jsonl")
    for path, rows in zip(paths, (documents, bare, texts), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def bench_documents(data: Path, processor_dir: Path, tmp: Path, args) -> None:
    """Interleaved documents against the same documents as text only (module docstring)."""
    documents, bare, texts = documents_input(data, tmp, args.documents)
    n = len(documents.read_text().splitlines())
    images = sum(1 for line in documents.read_text().splitlines() for i in json.loads(line)["images"] if i)
    size = ["--packed-sequence-size", str(args.size), "--num-proc", "1", "--long-samples", "split"]
    kinds = {  # name: (input, processor, flags)
        "documents": (documents, processor_dir, size),
        "no images": (bare, processor_dir, ["--sample-format", "interleaved", *size]),
        "text": (texts, None, ["--tokenizer", str(processor_dir), *size]),
    }
    runs: dict[str, list] = {k: [] for k in kinds}
    for _ in range(args.repeats):  # alternating, the best of each
        for k, (source, processor, flags) in kinds.items():
            runs[k].append(pack_timed(source, processor, tmp, f"documents-{k.replace(' ', '-')}", *flags))
    best = {k: min(runs[k], key=lambda r: r[0].cpu)[0] for k in kinds}
    work = {k: min(t["plan"] - t["read"] for _, t in runs[k]) for k in kinds}
    tokens = json.loads((tmp / "documents-documents" / "manifest.json").read_text())["stats"]["num_tokens"]
    print(f"{n} interleaved documents, {images} images, {tokens} tokens (Qwen2-VL processor, N={args.size}, "
          "1 process)")  # fmt: skip
    labels = {"documents": "documents (--processor)", "no images": "without their images",
              "text": "text only (--tokenizer)"}  # fmt: skip
    for k, label in labels.items():
        m = best[k]
        print(f"{label + ':':28s}{m.cpu / n * 1e6:7.0f} us CPU a document (whole command, {m.cpu:6.1f} s), "
              f"{work[k] / n * 1e6:6.0f} us a document encoding and planning ({work[k]:5.1f} s)")  # fmt: skip
    for a, b in (("documents", "text"), ("documents", "no images"), ("no images", "text")):
        print(f"{labels[a]} against {labels[b]}: {best[a].cpu / best[b].cpu:.2f}x the whole command's CPU, "
              f"{work[a] / work[b]:.2f}x the encoding and planning")  # fmt: skip


def scale_input(work: Path, samples: int) -> Path:
    """``samples`` LLaVA records over 64 small images (32 to 256 px, reused): one in eight text-only, one in
    five with two images; written once and reused."""
    from PIL import Image

    path = work / f"llava-{samples}.jsonl"
    if path.is_file():
        return path
    rng = np.random.default_rng(0)
    (work / "images").mkdir(parents=True, exist_ok=True)
    for k in range(64):  # smooth gradients: a few kB each, so that a million packed images stay small
        w, h = (int(x) for x in rng.integers(32, 257, 2))
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([x * 255 // w, y * 255 // h, np.full((h, w), 16 * (k % 16))], axis=-1)
        Image.fromarray(pixels.astype(np.uint8)).save(work / "images" / f"{k}.png")
    kinds = rng.random(samples)
    picks = rng.integers(0, 64, (samples, 2))
    words = rng.integers(3, 40, samples)
    with open(path, "w") as f:
        for i in range(samples):
            n = 0 if kinds[i] < 0.125 else 2 if kinds[i] > 0.8 else 1
            record = {"conversations": [
                {"from": "human", "value": "<image>\n" * n + "Describe it. " * int(words[i] // 3)},
                {"from": "gpt", "value": "A picture of noise. " * int(words[i])},
            ]}  # fmt: skip
            if n:
                record["image"] = [f"images/{k}.png" for k in picks[i, :n]]
            f.write(json.dumps(record) + "\n")
    return path


def scale(counts: list[int], work: Path, size: int, rerun: bool = False) -> None:
    """A markdown row per sample count (``--scale``); with ``rerun`` (``--scale-rerun``), the same command
    interrupted with SIGINT once half its chunks are encoded and run again: the rerun's CPU over the whole
    run's, where the start-up that every run pays (about 10 s of CPU) weighs less than at 20,000 samples."""
    with tempfile.TemporaryDirectory() as tmp:
        processor_dir = build_qwen2vl(Path(tmp) / "qwen2vl", 56 * 56, 28 * 28 * 1280)
        print(
            "| samples | wall | samples/s | peak RSS (tree) | peak RSS (largest process) | fill | packs "
            "(lower bound) | output |" + (" rerun after SIGINT at half way (CPU) |" if rerun else "")
        )
        print("|---|---|---|---|---|---|---|---|" + ("---|" if rerun else ""))
        for samples in counts:
            source = scale_input(work, samples)
            out = work / f"out-{samples}"
            cmd = [sys.executable, "-m", "packtool.cli", "pack", str(source), "-o", str(out), "-q",
                   "--processor", str(processor_dir), "--packed-sequence-size", str(size), "--overwrite",
                   "--num-proc", "2"]  # fmt: skip
            m = run_measured(cmd, env=ENV, log=work / f"out-{samples}.log")
            assert m.rc == 0, m.log.read_text()
            stats = json.loads((out / "manifest.json").read_text())["stats"]
            output = sum(p.stat().st_size for p in out.iterdir())
            packs = f"{stats['num_packs']:,} ({stats['lower_bound_packs']:,})"
            again = ""
            if rerun:
                flags = ("--packed-sequence-size", str(size), "--num-proc", "2")
                r, _, (done, total) = interrupted_then_rerun(source, processor_dir, work, samples, *flags)
                again = (f" {r.cpu / m.cpu:.2f}x ({r.cpu:,.0f} s against {m.cpu:,.0f} s; "
                         f"{done} of {total} chunks kept) |")  # fmt: skip
                shutil.rmtree(work / "sigint")
            print(f"| {samples:,} | {m.wall:,.0f} s | {samples / m.wall:,.0f} | "
                  f"{m.tree_rss / 2**20:,.0f} MiB | {m.rss / 2**20:,.0f} MiB | {stats['fill_rate']:.4f} | "
                  f"{packs} | {output / 1e9:.2f} GB |{again}")  # fmt: skip
            shutil.rmtree(out)


if __name__ == "__main__":
    main()
