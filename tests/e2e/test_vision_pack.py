"""``packtool pack --processor DIR`` through the CLI (subprocess): vision-language samples packed with their
images, read back by ``read_packs`` and ``datasets.load_dataset(OUT)``; the bad rows of issue 29 as one-line
errors (exit 3) or counted with ``--on-error skip``.

Each ``pack`` imports transformers (seconds), so the runs are few: one over good and bad rows together
(every bad row counted and logged; Parquet, full), one stopping at a bad row, one of tar (minimal), one of
Janus (an image its processor cannot take).
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from packtool import read_packs
from packtool.inspect import inspect_report, pack_report
from packtool.verify import verify_output
from tests.conftest import run_cli
from tests.fixtures.vision_inputs import image_bytes, llava_rows, write_image, write_jsonl, write_llava_input
from tests.fixtures.vision_processors import build_qwen2vl

N = 60  # the two-image record (80 tokens) is dropped by --long-samples drop, a 400 px image (64) is over N


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width x height`` and that holds no pixel (Pillow reads headers only)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def one(image: str, text: str = "<image>\nWhat?") -> dict:
    return {
        "image": image,
        "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "x"}],
    }


# (what, record, reason counted under --on-error skip, message in errors.jsonl): issue 29's bad rows
BAD_ROWS = [
    ("missing image file", one("images/nope.png"), "missing_image",
     r"image 0 \(images/nope\.png\): cannot read image: No such file"),
    ("not an image", one("images/bad.png"), "bad_image", r"image 0 \(images/bad\.png\): not an image"),
    ("truncated header", one("images/cut.png"), "bad_image", r"image 0 \(images/cut\.png\): (not an|broken)"),
    ("zero-size image", one("images/zero.png"), "bad_image",
     r"image 0 \(images/zero\.png\): (zero-size|not an image)"),
    ("decompression bomb", one("images/bomb.png"), "image_too_large",
     r"image 0 \(images/bomb\.png\): decompression bomb"),
    ("image alone over N", one("images/big.png"), "image_too_large",
     r"image 0 \(images/big\.png\) alone takes 64 tokens, more than packed_sequence_size 60"),
    ("images and placeholders differ", one(["images/a.png", "images/a.png"]), "image_count",
     r"1 <image> placeholder\(s\) for 2 image\(s\)"),
    ("malformed JSON", None, "malformed_json", r"malformed JSON"),
]  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A Qwen2-VL processor directory, the four good LLaVA records (5 images) and every bad row after them."""
    root = tmp_path_factory.mktemp("vision_pack")
    processor = build_qwen2vl(root / "qwen2vl")
    good = write_llava_input(root / "in")
    images = root / "in" / "images"
    (images / "bad.png").write_bytes(b"not a png")
    (images / "cut.png").write_bytes(image_bytes(30, 30)[:20])
    (images / "zero.png").write_bytes(png_header(0, 5))
    (images / "bomb.png").write_bytes(png_header(20000, 20000))
    write_image(images / "big.png", 400, 400)
    lines = [json.dumps(r) for r in llava_rows()] + [
        "{not json" if r is None else json.dumps(r) for _, r, _, _ in BAD_ROWS
    ]
    mixed = root / "in" / "mixed.jsonl"
    mixed.write_text("\n".join(lines) + "\n")
    return {"root": root, "processor": processor, "good": good, "mixed": mixed}


def cli(*args) -> tuple[int, str]:
    proc = run_cli(*args, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def pack(inputs, out: Path, source: Path, *flags: str) -> tuple[int, str]:
    return cli(
        "pack", "--processor", inputs["processor"], source, "-o", out, "--packed-sequence-size", N, *flags
    )  # fmt: skip


def test_bad_rows_are_counted_and_logged_and_the_good_ones_packed_with_their_images(inputs, tmp_path):
    out = tmp_path / "out"
    code, text = pack(inputs, out, inputs["mixed"], "--on-error", "skip", "--long-samples", "drop")
    assert code == 0, text
    m = json.loads((out / "manifest.json").read_text())
    assert (m["format_version"], m["format_minor"]) == (6, 2)  # a 5.x reader would drop the images
    assert m["stats"]["skipped_by_reason"] == {
        "bad_image": 3, "image_count": 1, "image_too_large": 2, "malformed_json": 1, "missing_image": 1,
    }  # fmt: skip
    logged = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    first = len(llava_rows()) + 1
    for (what, _, reason, message), entry in zip(BAD_ROWS, logged, strict=True):
        assert entry["row"] == first + BAD_ROWS.index((what, _, reason, message)), what
        assert entry["reason"] == reason and re.search(message, entry["message"]), (what, entry)
    # the two-image record (80 tokens) is over N: dropped with its images, and said so
    assert m["stats"]["dropped_samples"] == 1 and m["stats"]["whole_samples"] == 3
    vision = m["vision"]
    assert (vision["input_images"], vision["packed_images"], vision["dropped_images"]) == (5, 3, 2)
    assert vision["processor"]["family"] == "qwen2_vl (Qwen2VLProcessor)"
    assert len(vision["processor"]["config_sha256"]) == 64
    assert (
        "packed 3 of 12 samples whole with 3 of 5 images (" in text
        and ", 2 left out with their samples)" in text
    )

    packs = list(read_packs(out, with_sample_index=True))
    stored = [image for p in packs for image in p["images"]]
    assert sorted(i["path"] for i in stored) == ["images/a.png", "images/a.png", "images/c.webp"]
    image_token = None
    for p in packs:
        for k, image in enumerate(p["images"]):
            assert image["bytes"] == (inputs["good"].parent / image["path"]).read_bytes()  # unchanged
            a, n = p["image_offset"][k], p["image_length"][k]
            run = p["input_ids"][a : a + n]
            image_token = run[0] if image_token is None else image_token
            assert (run == image_token).all() and (p["labels"][a : a + n] == -100).all()
            sample = p["image_sample"][k]  # the image lies inside its sample
            starts = np.concatenate([[0], np.cumsum(p["seq_lens"])])
            assert starts[sample] <= a and a + n <= starts[sample + 1]
        assert (p["input_ids"] == image_token).sum() == p["image_length"].sum()
    # the output directory through its dataset card: the images typed as images
    import datasets

    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert isinstance(ds.features["images"].feature, datasets.Image)
    row = next(r for r in ds if r["images"])
    image = row["images"][0]
    assert (image.height, image.width) == (row["image_height"][0], row["image_width"][0])


def test_a_bad_row_stops_the_run_with_one_line_naming_file_line_field_and_image(inputs, tmp_path):
    source = write_jsonl(inputs["root"] / "in" / "bomb.jsonl", [llava_rows()[0], one("images/bomb.png")])
    code, text = pack(inputs, tmp_path / "out", source)
    assert code == 3, text
    line = next(x for x in text.splitlines() if x.startswith("packtool: error:"))
    assert line.startswith(f"packtool: error: {source}, line 2, field 'image': image 0 (images/bomb.png): ")
    assert "decompression bomb" in line and not (tmp_path / "out").exists()


def test_options_that_would_cut_an_image_are_usage_errors(inputs, tmp_path):
    code, text = pack(inputs, tmp_path / "out", inputs["good"], "--long-samples", "truncate")
    assert code == 2 and "--long-samples truncate would cut through images" in text, text
    code, text = cli("pack", inputs["good"], "-o", tmp_path / "o", "--packed-sequence-size", 64,
                     "--sample-format", "vision")  # fmt: skip
    assert code == 2 and "--sample-format vision needs --processor" in text, text


def test_tar_output_holds_each_image_as_a_member_and_balances_image_tokens_per_step(inputs, tmp_path):
    """webdataset, minimal: one ``KEY.img{k}.{ext}`` member per image (original bytes and extension), the
    image columns in the pack's record; ``--balance-visual-tokens 2``: each step of two consecutive packs
    holds two packs adjacent in the order of their image tokens (bfd's shuffled order does not); verify
    passes; inspect shows the image figures and a pack's image spans."""
    import tarfile

    source = write_jsonl(inputs["root"] / "in" / "many.jsonl", llava_rows() * 6)
    out = tmp_path / "out"
    code, text = pack(
        inputs, out, source, "--format", "webdataset", "--columns", "minimal", "--balance-visual-tokens", 2,
        "--long-samples", "drop", "--shard-size", 4,
    )  # fmt: skip
    assert code == 0, text
    m = json.loads((out / "manifest.json").read_text())
    assert m["vision"]["images"]["ranks"] == 2 and m["stats"]["num_packs"] > 6
    with tarfile.open(out / "packs-000000.tar") as tar:
        names = tar.getnames()
        first = next(n for n in names if ".img0." in n)
        original = inputs["good"].parent / "images" / ("c.webp" if first.endswith("webp") else "a.png")
        assert tar.extractfile(first).read() == original.read_bytes()
    assert {n.split(".", 1)[1] for n in names} <= {
        "input_ids.npy", "small_columns.npy", "img0.png", "img1.png", "img0.webp", "img1.webp",
    }  # fmt: skip
    packs = list(read_packs(out))
    tokens = np.array([int(p["image_length"].sum()) for p in packs])
    full = len(tokens) // 2 * 2  # the steps are the image-token order cut in twos, in some order
    steps = sorted(tuple(sorted(step)) for step in tokens[:full].reshape(-1, 2).tolist())
    assert steps == [tuple(step) for step in np.sort(tokens)[:full].reshape(-1, 2).tolist()], tokens
    for p in packs:
        assert [i["path"].split(".", 1)[1] for i in p["images"]] == [
            f"img{k}.{Path(i['path']).suffix[1:]}" for k, i in enumerate(p["images"])
        ]
        for a, n in zip(p["image_offset"], p["image_length"], strict=True):  # minimal: labels rebuilt
            assert (p["labels"][a : a + n] == -100).all()
    verified = verify_output(out, processor=str(inputs["processor"]))  # members, index, spans, counts
    assert verified.ok and verified.checked["images"] == m["vision"]["packed_images"], verified.lines()
    report = inspect_report(out)  # (inspect's CLI prints these: tests/e2e/test_inspect.py)
    assert report["images"]["image_tokens"] == int(tokens.sum()) and report["images"]["ranks"] == 2
    assert sum(report["histograms"]["images_per_pack"]["counts"]) == len(packs)
    shown = pack_report(out, 1)["images"]
    assert [(i["offset"], i["length"]) for i in shown] == list(
        zip(packs[1]["image_offset"].tolist(), packs[1]["image_length"].tolist(), strict=True)
    )


def test_janus_packs_and_an_image_its_processor_cannot_take_is_its_record_s_bad_image(tmp_path):
    """Janus (its processor has no ``image_token_id``) packs with workers; its image processor takes RGB
    images only, so a grayscale image is its record's bad image, counted under ``--on-error skip`` with the
    processor's reason; the output verifies against the processor."""
    from PIL import Image

    from tests.fixtures.vision_families_more import build_janus

    processor = build_janus(tmp_path / "janus")
    write_image(tmp_path / "in" / "images" / "a.png", 60, 40)
    Image.new("L", (50, 30), 90).save(tmp_path / "in" / "images" / "gray.png")
    rows = [one("images/a.png")] * 5 + [one("images/gray.png")] + [one("images/a.png")] * 2
    source = write_jsonl(tmp_path / "in" / "data.jsonl", rows)
    out = tmp_path / "out"
    code, text = cli("pack", "--processor", processor, source, "-o", out, "--packed-sequence-size", 64,
                     "--on-error", "skip", "--num-proc", 2, "--chunk-size", 3)  # fmt: skip
    assert code == 0, text
    m = json.loads((out / "manifest.json").read_text())
    assert m["stats"]["skipped_by_reason"] == {"bad_image": 1} and m["vision"]["packed_images"] == 7
    (entry,) = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert (
        entry["row"] == 6
        and "image 0 (images/gray.png): 30x50 image: the processor fails on it (mode L)" in entry["message"]
    )
    verified = verify_output(out, processor=str(processor))
    assert verified.ok and verified.checked["images"] == 7, verified.lines()
