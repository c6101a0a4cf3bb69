"""Benchmark packtool.vision's pack-side path on a generated image set (issue 29; no download).

    python scripts/bench_vision.py [--samples 20000] [--size 4096] [--data DIR]

Generates ``--samples`` LLaVA samples with ``scripts/make_vision_demo.py`` (kept in ``--data`` and reused
when it is there), builds a Qwen2-VL processor at the released defaults (``min_pixels`` 56 * 56,
``max_pixels`` 28 * 28 * 1280) from the demo chat tokenizer, then times on one core, in this process:

* floor: reading every image's bytes (what any packer must do at least);
* header: ``image_size`` of every image (the size from its header);
* pack: ``read_vision_samples`` -> ``encode_samples`` (sizes, counts, template, tokenizer, expansion) ->
  ``plan_packs`` (best-fit decreasing) -> ``sequence_columns``;
* ``packtool pack --processor`` on the same samples, the whole command (its imports, and the images'
  bytes written into Parquet shards), in a process of its own.

Prints samples/s of each, pack time over the floor, and the fill rate: packed tokens over the tokens of the
packs, and the packs against the lower bound ``ceil(tokens / N)``.

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

Prints images/s of each and their ratio. Figures belong in docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packtool.loader import get_loader  # noqa: E402 - after the repository root is on the path
from packtool.vision.images import image_size  # noqa: E402
from packtool.vision.inputs import read_vision_samples  # noqa: E402
from packtool.vision.loader import vision_dataset  # noqa: E402
from packtool.vision.model_inputs import decode_images, image_inputs  # noqa: E402
from packtool.vision.packs import plan_packs  # noqa: E402
from packtool.vision.processor import load_processor  # noqa: E402
from packtool.vision.sequences import encode_samples, sequence_columns  # noqa: E402
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
    args = parser.parse_args()
    wanted = max(args.samples, args.loader_samples)
    data = Path(args.data) / str(wanted)
    if not (data / "llava.jsonl").is_file():
        _demo_module().make(data, wanted, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        processor_dir = build_qwen2vl(Path(tmp) / "qwen2vl", 56 * 56, 28 * 28 * 1280)
        processor = load_processor(processor_dir)
        if args.samples:
            bench_pack(data, processor, args)
            start = time.perf_counter()  # the whole command: imports, encode, plan, images into shards
            pack_with_cli(data, processor_dir, Path(tmp) / "pack", args.samples, args.size)
            cli = time.perf_counter() - start
            print(f"packtool pack --processor: {args.samples / cli:10.0f} samples/s {cli:7.2f} s (Parquet)")
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


def bench_pack(data: Path, processor, args) -> None:
    images = sorted((data / "images").iterdir())

    _, floor = timed(lambda: [p.read_bytes() for p in images])
    _, header = timed(lambda: [image_size(p) for p in images])

    def pack():
        samples, sequences = encode_samples(processor, read_vision_samples([data / "llava.jsonl"]))
        plan = plan_packs(sequences, args.size, samples=samples)
        sequence_columns(sequences)
        return samples, sequences, plan

    (samples, sequences, plan), packing = timed(pack)
    tokens = sum(len(s) for s in sequences)
    image_tokens = sum(int(s.image_lengths.sum()) for s in sequences)
    bound = math.ceil(tokens / args.size)
    print(
        f"{len(samples)} samples, {len(images)} images, {tokens} tokens ({image_tokens / tokens:.1%} image)"
    )
    print(f"floor (read bytes):   {len(images) / floor:10.0f} images/s  {floor:7.2f} s")
    print(f"header (image_size):  {len(images) / header:10.0f} images/s  {header:7.2f} s")
    rate = len(samples) / packing
    print(f"pack (encode + plan): {rate:10.0f} samples/s {packing:7.2f} s  = {packing / floor:.1f}x floor")
    print(f"fill: {tokens / (plan.num_packs * args.size):.4f}; packs {plan.num_packs} vs lower bound {bound}")


if __name__ == "__main__":
    main()
