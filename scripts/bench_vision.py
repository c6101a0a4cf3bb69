"""Benchmark packtool.vision's pack-side path on a generated image set (issue 29; no download).

    python scripts/bench_vision.py [--samples 20000] [--size 4096] [--data DIR]

Generates ``--samples`` LLaVA samples with ``scripts/make_vision_demo.py`` (kept in ``--data`` and reused
when it is there), builds a Qwen2-VL processor at the released defaults (``min_pixels`` 56 * 56,
``max_pixels`` 28 * 28 * 1280) from the demo chat tokenizer, then times on one core, in this process:

* floor: reading every image's bytes (what any packer must do at least);
* header: ``image_size`` of every image (the size from its header);
* pack: ``read_vision_samples`` -> ``encode_samples`` (sizes, counts, template, tokenizer, expansion) ->
  ``plan_packs`` (best-fit decreasing) -> ``sequence_columns``.

Prints samples/s of each, pack time over the floor, and the fill rate: packed tokens over the tokens of the
packs, and the packs against the lower bound ``ceil(tokens / N)``. Figures belong in docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packtool.vision.images import image_size  # noqa: E402 - after the repository root is on the path
from packtool.vision.inputs import read_vision_samples  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--size", type=int, default=4096, help="packed_sequence_size N")
    parser.add_argument("--data", default=str(ROOT / ".bench" / "vision"))
    args = parser.parse_args()
    data = Path(args.data) / str(args.samples)
    if not (data / "llava.jsonl").is_file():
        _demo_module().make(data, args.samples, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        processor = load_processor(build_qwen2vl(Path(tmp) / "qwen2vl", 56 * 56, 28 * 28 * 1280))
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
