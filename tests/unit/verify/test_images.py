"""``verify`` of vision-language outputs (``packtool.verify.images``): a sound output passes with every image
counted; an image whose stored size, token count or span is wrong, or whose bytes differ from the
source's, is a problem naming its shard, pack and field; without the processor a note says the counts were
not checked."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.options import PackOptions
from packtool.pipeline.run import run_pack
from packtool.verify import verify_output
from tests.fixtures.vision_inputs import image_bytes, write_llava_input
from tests.fixtures.vision_processors import build_qwen2vl


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A Qwen2-VL output of the four LLaVA records (5 images, 2 packs), and the processor's directory."""
    root = tmp_path_factory.mktemp("checks")
    source = write_llava_input(root / "in")
    processor = str(build_qwen2vl(root / "qwen2vl"))
    options = PackOptions.of(
        inputs=[str(source)],
        output=str(root / "out"),
        packed_sequence_size=128,
        processor=processor,
        quiet=True,
    )
    run_pack(options)
    return root / "out", processor, source


def rewrite(out, change) -> None:
    """Rewrite the output's Parquet shard with ``change(table) -> table`` (its metadata kept)."""
    path = out / "packs-000000.parquet"
    table = pq.read_table(path)
    pq.write_table(change(table).replace_schema_metadata(table.schema.metadata), path)


def column(table: pa.Table, name: str, rows: list) -> pa.Table:
    return table.set_column(
        table.schema.get_field_index(name), name, pa.array(rows, table.schema.field(name).type)
    )


def test_a_sound_output_passes_with_every_image_counted(packed):
    out, processor, source = packed
    report = verify_output(out, processor=processor)
    assert report.ok and report.checked["images"] == 5, report.lines()
    without = verify_output(out)
    assert without.ok and any("image spans not checked" in n for n in without.notes)
    with_source = verify_output(out, source=[str(source)])  # the run's recorded processor
    assert with_source.ok and with_source.checked["source images"] == 5, with_source.lines()


def test_wrong_size_count_span_and_bytes_are_problems(packed, tmp_path):
    import shutil

    out, processor, source = packed
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    table = pq.read_table(copy / "packs-000000.parquet")
    lengths = table.column("image_length").to_pylist()
    heights = table.column("image_height").to_pylist()
    offsets = table.column("image_offset").to_pylist()
    lengths[0][0] += 1  # a count the processor does not give, and a span running past the image tokens
    heights[1][0] += 1  # a size the header does not give
    offsets[1][-1] = 127  # a span past its sample
    rewrite(copy, lambda t: column(column(column(t, "image_length", lengths), "image_height", heights),
                                   "image_offset", offsets))  # fmt: skip
    report = verify_output(copy, processor=processor)
    kinds = {p.kind for p in report.problems}
    assert {"image length", "image size", "image span", "image tokens"} <= kinds, report.lines()
    line = next(str(p) for p in report.problems if p.kind == "image size")
    assert line.startswith("packs-000000.parquet, pack 1, field 'image_height': image 0 is ")


def test_source_finds_an_image_changed_since_the_run(packed, tmp_path):
    import shutil

    out, processor, source = packed
    inputs = tmp_path / "in"
    shutil.copytree(source.parent, inputs)
    (inputs / "images" / "a.png").write_bytes(image_bytes(60, 40, seed=9))  # same size, other pixels
    report = verify_output(out, source=[str(inputs / "data.jsonl")], processor=processor)
    bad = [str(p) for p in report.problems if p.field == "images"]
    assert bad and all("bytes differ from images/a.png's" in line for line in bad), report.lines()


def test_the_image_bytes_a_footer_may_declare_are_bounded_by_the_shard_entry(packed, tmp_path):
    """An output is untrusted: a Parquet footer declaring more image bytes than its entry's image_bytes
    is refused before a page is read (an entry edited to 0 stands for a footer inflated past it)."""
    import json

    import numpy as np
    from PIL import Image

    from packtool import read_packs
    from packtool.errors import InputError

    _, processor, _ = packed
    noise = np.random.default_rng(0).integers(0, 256, (300, 300, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "noise.png")  # ~270 KB: beyond the footer check's slack
    record = {"image": "noise.png", "conversations": [{"from": "human", "value": "<image>"},
                                                      {"from": "gpt", "value": "noise"}]}  # fmt: skip
    (tmp_path / "in.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "out"
    run_pack(PackOptions.of(inputs=[str(tmp_path / "in.jsonl")], output=str(out), packed_sequence_size=128,
                            processor=processor, quiet=True))  # fmt: skip
    assert len(list(read_packs(out))) == 1
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["image_bytes"] = 0
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"column images\.list\.element\.bytes: its footer declares"):
        list(read_packs(out))


def test_a_span_of_the_right_length_with_a_wrong_token_is_a_problem(packed, tmp_path):
    """With the processor, each span is compared token by token with the processor's for its size."""
    import shutil

    out, processor, _ = packed
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    table = pq.read_table(copy / "packs-000000.parquet")
    ids = table.column("input_ids").to_pylist()
    offset = table.column("image_offset").to_pylist()[0][0]
    ids[0][offset + 1] = ids[0][offset - 1]  # <|vision_start|> inside the run of <|image_pad|>
    rewrite(copy, lambda t: column(t, "input_ids", ids))
    report = verify_output(copy, processor=processor)
    line = next(str(p) for p in report.problems if p.kind == "image tokens")
    assert "image 0 (" in line and "its tokens are not the processor's for its size" in line
    plain = verify_output(copy)  # without the processor only the spans' first tokens are compared
    # (the rewrite's footer declares other image bytes than the manifest: reported apart, as image_bytes)
    assert not [p for p in plain.problems if p.kind.startswith("image") and p.kind != "image_bytes"]
