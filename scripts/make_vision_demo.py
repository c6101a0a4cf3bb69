"""Generate a small vision-language demo set (no download): images drawn with Pillow and the records that
name them, in every input layout ``packtool.vision`` reads.

    python scripts/make_vision_demo.py [--out data/vision-demo] [--samples 200] [--seed 0]

Writes into ``--out``:

* ``images/NNNNN.{png,jpg,webp}``: shapes on a background, 32 to 1024 px a side, aspect ratios 1:4 to 4:1
  (log-uniform), so dynamic-resolution models (Qwen2-VL) give their images varied token counts;
* ``llava.jsonl``: LLaVA records (``image`` a path or a list, ``conversations`` with ``<image>``), one in
  eight text-only, one in five with two images;
* ``chat.jsonl``: the same samples as chat ``messages`` with ``{"type": "image", "path": ...}`` parts;
* ``captions-000000.tar``: a WebDataset captioning shard (``KEY.jpg`` or ``.png`` + ``KEY.txt``), Energon's
  ``CaptioningSample`` layout, of the samples with one image.

The set is deterministic for a seed. Nothing here is committed: run the script to build it.
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

COLORS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]
SHAPES = ["circle", "square", "triangle"]
FORMATS = [("png", "PNG"), ("jpg", "JPEG"), ("webp", "WEBP")]


def draw(rng: np.random.Generator) -> tuple[Image.Image, str]:
    """An image of one shape and its caption."""
    side = float(np.exp(rng.uniform(np.log(32), np.log(1024))))
    ratio = float(np.exp(rng.uniform(-np.log(4), np.log(4))))
    width, height = max(8, int(side * ratio**0.5)), max(8, int(side / ratio**0.5))
    background, color = rng.choice(len(COLORS), 2, replace=False)
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    image = Image.new("RGB", (width, height), COLORS[background])
    pen = ImageDraw.Draw(image)
    box = [width * 0.2, height * 0.2, width * 0.8, height * 0.8]
    if shape == "circle":
        pen.ellipse(box, fill=COLORS[color])
    elif shape == "square":
        pen.rectangle(box, fill=COLORS[color])
    else:
        pen.polygon([(width / 2, box[1]), (box[0], box[3]), (box[2], box[3])], fill=COLORS[color])
    return image, f"A {COLORS[color]} {shape} on a {COLORS[background]} background."


def make(out: Path, samples: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    llava, chat, shard = [], [], []
    counter = 0

    def new_image() -> tuple[str, str, bytes]:
        nonlocal counter
        image, caption = draw(rng)
        ext, fmt = FORMATS[counter % len(FORMATS)]
        buffer = io.BytesIO()
        image.save(buffer, format=fmt)
        name = f"images/{counter:05d}.{ext}"
        (out / name).write_bytes(buffer.getvalue())
        counter += 1
        return name, caption, buffer.getvalue()

    for i in range(samples):
        kind = rng.random()
        if kind < 0.125:
            question, answer = "Name a color.", COLORS[int(rng.integers(len(COLORS)))].capitalize() + "."
            llava.append(
                {
                    "id": i,
                    "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}],
                }
            )
            chat.append(
                {
                    "messages": [
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
        elif kind < 0.325:
            (a, cap_a, _), (b, cap_b, _) = new_image(), new_image()
            llava.append({"id": i, "image": [a, b], "conversations": [
                {"from": "human", "value": "<image>\n<image>\nDescribe both pictures."},
                {"from": "gpt", "value": f"First: {cap_a} Second: {cap_b}"},
            ]})  # fmt: skip
            chat.append({"messages": [
                {"role": "user", "content": [{"type": "image", "path": a}, {"type": "image", "path": b},
                                             {"type": "text", "text": "Describe both pictures."}]},
                {"role": "assistant", "content": f"First: {cap_a} Second: {cap_b}"},
            ]})  # fmt: skip
        else:
            name, caption, data = new_image()
            llava.append({"id": i, "image": name, "conversations": [
                {"from": "human", "value": "<image>\nWhat is in the picture?"},
                {"from": "gpt", "value": caption},
            ]})  # fmt: skip
            chat.append({"messages": [
                {"role": "user", "content": [{"type": "image", "path": name},
                                             {"type": "text", "text": "What is in the picture?"}]},
                {"role": "assistant", "content": caption},
            ]})  # fmt: skip
            shard.append((f"{i:06d}", name.rsplit(".", 1)[1], data, caption))
    (out / "llava.jsonl").write_text("".join(json.dumps(r) + "\n" for r in llava))
    (out / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    with tarfile.open(out / "captions-000000.tar", "w") as tar:
        for key, ext, data, caption in shard:
            for member, payload in ((f"{key}.{ext}", data), (f"{key}.txt", caption.encode())):
                info = tarfile.TarInfo(member)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    print(f"{out}: {samples} samples, {counter} images, {len(shard)} in the WebDataset shard")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/vision-demo")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make(Path(args.out), args.samples, args.seed)


if __name__ == "__main__":
    main()
