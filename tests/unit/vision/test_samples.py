"""Records -> ``VisionSample``, read by the pipeline's readers: LLaVA JSON / JSON Lines, chat messages with
image parts, Hugging Face datasets with ``Image`` features, WebDataset captioning shards; and the bad
rows, as a table."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest

from packtool.errors import InputError
from packtool.vision.samples import sample_from_record
from tests.fixtures.vision_inputs import (
    image_bytes,
    llava_rows,
    read_samples,
    write_image,
    write_jsonl,
    write_llava_input,
)


def test_llava_json_lines(tmp_path):
    samples = read_samples([write_llava_input(tmp_path)])
    assert [len(s.images) for s in samples] == [1, 2, 0, 2]
    assert [s.row for s in samples] == [1, 2, 3, 4] and samples[0].row_kind == "line"
    assert samples[1].images[1].path == str(tmp_path / "images" / "c.webp")
    assert samples[1].messages[2] == {
        "role": "user",
        "content": [{"type": "text", "text": "Compare with "}, {"type": "image"}],
    }
    assert samples[3].messages[1]["content"][:2] == [{"type": "image"}, {"type": "image"}]
    assert [(s.height, s.width) for s in samples[1].image_sizes()] == [(120, 90), (50, 200)]


def test_llava_json_array_resolves_against_its_own_directory(tmp_path):
    write_llava_input(tmp_path / "d")
    array = tmp_path / "d" / "data.json"
    array.write_text(json.dumps(llava_rows()))
    samples = read_samples([array])
    assert samples[0].row == 0 and samples[0].row_kind == "row"
    assert samples[0].image_sizes()[0].width == 60


def test_chat_messages_with_paths_bytes_and_listed_images(tmp_path):
    write_image(tmp_path / "x.png", 30, 20)
    record = {
        "messages": [
            {"role": "user", "content": [{"type": "image", "path": "x.png"}, {"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": [{"type": "image", "image": image_bytes(10, 50)}, {"type": "image"}]},
        ],
        "images": [{"bytes": image_bytes(7, 8), "path": "y.png"}],
    }
    sample = sample_from_record(record, str(tmp_path / "in.jsonl"), 3, "line")
    assert [(s.height, s.width) for s in sample.image_sizes()] == [(20, 30), (50, 10), (8, 7)]
    assert sample.images[2].name == "y.png"
    assert sample.messages[1]["content"] == [{"type": "text", "text": "hello"}]


def test_hugging_face_dataset_with_image_features(tmp_path):
    """An ``images`` column of ``datasets.Image`` (TRL's layout): read undecoded, bytes as stored."""
    import datasets

    write_image(tmp_path / "p.png", 33, 44)
    user = [{"type": "image", "text": None}, {"type": "text", "text": "see"}]
    rows = {
        "messages": [
            [
                {"role": "user", "content": user},
                {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            ],
            [{"role": "user", "content": [{"type": "text", "text": "text only"}]}],
        ],
        "images": [[str(tmp_path / "p.png")], []],
    }
    dataset = datasets.Dataset.from_dict(rows).cast_column("images", datasets.List(datasets.Image()))
    dataset.save_to_disk(str(tmp_path / "ds"))
    first, second = read_samples([tmp_path / "ds"])
    assert first.images[0].data == (tmp_path / "p.png").read_bytes()
    assert (first.image_sizes()[0].height, first.image_sizes()[0].width) == (44, 33)
    assert second.images == [] and first.source == str(tmp_path / "ds") and second.row == 1


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_webdataset_captioning_shard(tmp_path):
    shard = _tar(
        tmp_path / "shard-000.tar",
        {
            "s/000.jpg": image_bytes(64, 48, "JPEG"),
            "s/000.txt": b"a red square",
            "s/001.png": image_bytes(20, 30, "PNG"),
            "s/001.json": json.dumps({"caption": "blocks", "id": 1}).encode(),
        },
    )
    samples = read_samples([shard])
    assert [s.messages[1]["content"][0]["text"] for s in samples] == ["a red square", "blocks"]
    assert [s.images[0].name for s in samples] == ["s/000.jpg", "s/001.png"]
    assert [(s.row, s.row_kind) for s in samples] == [(0, "sample"), (1, "sample")]
    assert [s.image_sizes()[0].width for s in samples] == [64, 20]


# what is wrong, the record (or None: the file itself), where the error must point, what it must say
BAD_ROWS = [
    ("missing image file", {"image": "nope.png", "conversations": [{"from": "human", "value": "<image>"}]},
     "line 1, field 'image'", r"image 0 \(nope\.png\): cannot read image: No such file"),
    ("more images than placeholders",
     {"image": ["a.png", "a.png"], "conversations": [{"from": "human", "value": "<image> x"}]},
     "line 1, field 'conversations'", r"1 <image> placeholder\(s\) for 2 image\(s\)"),
    ("a placeholder without an image", {"conversations": [{"from": "human", "value": "<image> x"}]},
     "line 1, field 'conversations'", r"1 <image> placeholder\(s\) for 0 image\(s\)"),
    ("an image without a placeholder", {"image": "a.png", "conversations": [{"from": "human", "value": "x"}]},
     "line 1, field 'conversations'", r"0 <image> placeholder\(s\) for 1 image\(s\)"),
    ("not an image", {"image": "bad.png", "conversations": [{"from": "human", "value": "<image>"}]},
     "line 1, field 'image'", r"image 0 \(bad\.png\): not an image Pillow can read"),
    ("truncated header", {"image": "cut.png", "conversations": [{"from": "human", "value": "<image>"}]},
     "line 1, field 'image'", r"image 0 \(cut\.png\): (not an image|broken image)"),
    ("truncated body", {"image": "body.png", "conversations": [{"from": "human", "value": "<image>"}]},
     "line 1, field 'image'", r"image 0 \(body\.png\): broken image: image file is truncated"),
    ("unknown role", {"conversations": [{"from": "robot", "value": "x"}]},
     "line 1, field 'conversations'", r"turn 0 needs 'from'"),
    ("neither kind", {"text": "x"}, "line 1", r"needs 'conversations' \(LLaVA\), 'messages' \(chat\)"),
    ("image part naming nothing", {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "line 1, field 'messages'", r"image 0 names no image"),
    ("unknown part type", {"messages": [{"role": "user", "content": [{"type": "video", "path": "v"}]}]},
     "line 1, field 'messages'", r"content part of type 'video'"),
    ("images listed but unused", {"messages": [{"role": "user", "content": "x"}], "images": ["a.png"]},
     "line 1, field 'images'", r"1 image\(s\) listed for 0 image part"),
    ("an image value that is no path", {"image": 5, "conversations": [{"from": "human", "value": "<image>"}]},
     "line 1, field 'image'", r"image 0 is not a path or image bytes"),
    ("a web URL", {"messages": [{"role": "user", "content": [{"type": "image", "url": "https://x/a.png"}]}]},
     "line 1, field 'image'", r"image 0 \(https://x/a\.png\): a web URL: .* downloaded from the web"),
    ("malformed JSON", None, "line 1", r"malformed JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "record", "where", "message"), BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_bad_rows_are_one_line_errors_naming_file_line_and_field(tmp_path, what, record, message, where):
    write_image(tmp_path / "a.png", 10, 10)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    (tmp_path / "cut.png").write_bytes(image_bytes(30, 30)[:20])
    whole = image_bytes(300, 200)
    (tmp_path / "body.png").write_bytes(whole[: len(whole) - 30])  # the header whole, IEND cut off
    path = tmp_path / "in.jsonl"
    if record is None:
        path.write_text("{not json\n")
    else:
        write_jsonl(path, [record])
    with pytest.raises(InputError) as caught:
        for sample in read_samples([path]):
            sample.image_sizes()
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{path}, {where}"), text
    assert re.search(message, text), text


def test_every_kind_of_input_through_one_entry(tmp_path):
    import datasets

    jsonl = write_llava_input(tmp_path / "llava")
    shard = _tar(tmp_path / "s.tar", {"k.png": image_bytes(9, 9), "k.txt": b"caption"})
    parts = [{"type": "image"}, {"type": "text", "text": "x"}]
    datasets.Dataset.from_dict(
        {
            "messages": [[{"role": "user", "content": parts}]],
            "images": [[str(tmp_path / "llava/images/a.png")]],
        }
    ).cast_column("images", datasets.List(datasets.Image())).save_to_disk(str(tmp_path / "ds"))
    samples = read_samples([jsonl, shard, tmp_path / "ds"])
    assert [s.source for s in samples] == [str(jsonl)] * 4 + [str(shard), str(tmp_path / "ds")]
    (tmp_path / "nope.csv").write_text("a,b\n")
    with pytest.raises(InputError, match="nope.csv: unknown input format '.csv'"):
        read_samples([tmp_path / "nope.csv"])


def test_the_demo_script_writes_inputs_every_reader_takes(tmp_path, processors):
    """scripts/make_vision_demo.py: the same samples as LLaVA and chat records, and a captioning shard."""
    import subprocess
    import sys

    from packtool.vision.sequences import encode_sample

    root = Path(__file__).resolve().parents[3]
    script = root / "scripts" / "make_vision_demo.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--samples", "24"], check=True)
    llava = read_samples([tmp_path / "llava.jsonl"])
    chat = read_samples([tmp_path / "chat.jsonl"])
    shard = read_samples([tmp_path / "captions-000000.tar"])
    assert len(llava) == len(chat) == 24 and 0 < len(shard) < 24
    assert {len(s.images) for s in llava} == {0, 1, 2}
    vp = processors["qwen2vl"]
    for a, b in zip(llava, chat, strict=True):
        assert [r.path for r in a.images] == [r.path for r in b.images]
        assert encode_sample(vp, a).image_lengths.tolist() == encode_sample(vp, b).image_lengths.tolist()
    assert len({int(n) for s in llava for n in encode_sample(vp, s).image_lengths}) > 3


def test_on_error_skip_counts_every_bad_row_and_keeps_the_good_ones(tmp_path, processors):
    """The BAD_ROWS table in one file between good rows: ``skip`` keeps the good rows and counts each bad
    one by reason; ``fail`` raises at the first, with the hint."""
    from packtool.errors import ErrorSink
    from packtool.vision.sequences import encode_samples

    write_llava_input(tmp_path)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    (tmp_path / "cut.png").write_bytes(image_bytes(30, 30)[:20])
    whole = image_bytes(300, 200)
    (tmp_path / "body.png").write_bytes(whole[: len(whole) - 30])
    write_image(tmp_path / "a.png", 10, 10)
    lines = [json.dumps(r) for r in llava_rows()]
    for _, record, _, _ in BAD_ROWS:
        lines.append("{not json" if record is None else json.dumps(record))
    lines += [json.dumps(r) for r in llava_rows()]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    sink = ErrorSink("skip")
    kept, sequences = encode_samples(processors["llava"], read_samples([path], sink), sink)
    assert len(kept) == len(sequences) == 2 * len(llava_rows())
    assert sink.total == len(BAD_ROWS)
    assert sink.counts["missing_image"] == 2 and sink.counts["bad_image"] == 3
    assert sink.counts["image_count"] == 4 and sink.counts["malformed_json"] == 1
    assert sorted(e["row"] for e in sink.entries) == list(range(5, 5 + len(BAD_ROWS)))
    first_bad = tmp_path / "first_bad.jsonl"  # (the pipeline finds the first of several: first_bad_record)
    first_bad.write_text("\n".join(lines[:5]) + "\n")
    with pytest.raises(InputError, match=r"line 5, field 'image': .*--on-error skip leaves bad records"):
        encode_samples(processors["llava"], read_samples([first_bad], ErrorSink("fail")), ErrorSink("fail"))
