"""A hostile or damaged vision-language output (issue 36, item 5): what its ``images`` column may take.

One ``pack --processor`` run (a tiny Qwen2-VL processor) makes the output, each case damages a copy: the
manifest's ``image_bytes`` negative or raised (it is the footer's own figure, so a raised one is refused
before any page is decoded), and an image cell far beyond what any image takes, declared by its footer
with the manifest following it, refused before it is decoded (``MAX_IMAGE_BYTES`` an image, made small here
so that the cell stays small: the check is the same at 256 MiB).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool import read_packs
from packtool.errors import InputError
from packtool.formats import parquet
from packtool.verify import verify_output
from tests.conftest import run_cli
from tests.fixtures.vision_inputs import write_llava_input
from tests.fixtures.vision_processors import build_qwen2vl

N = 120


@pytest.fixture(scope="module")
def vision_out(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision_untrusted")
    processor = build_qwen2vl(root / "qwen2vl")
    source = write_llava_input(root / "in")
    out = root / "out"
    run_cli("pack", "--processor", processor, source, "-o", out, "--packed-sequence-size", N, "-q")
    return out


def edit_shard_entry(out: Path, **fields) -> None:
    m = json.loads((out / "manifest.json").read_text())
    m["shards"][0].update(fields)
    (out / "manifest.json").write_text(json.dumps(m))


def huge_image_cell(out: Path) -> None:
    """The first image's bytes replaced by 8 MiB of zeros (zstd makes them a few KiB), the shard written
    again with its metadata, and the manifest's size and ``image_bytes`` set to the footer's: a manifest
    edited to match the shard, as a crafted output would be."""
    path = out / "packs-000000.parquet"
    table = pq.read_table(path)
    images = table.column("images").combine_chunks()
    values = images.values
    cells = values.field("bytes").to_pylist()
    cells[0] = bytes(8 << 20)
    struct = pa.StructArray.from_arrays(
        [pa.array(cells, pa.binary()), values.field("path")], names=["bytes", "path"]
    )
    column = pa.ListArray.from_arrays(images.offsets, struct)
    table = table.set_column(table.schema.get_field_index("images"), "images", column)
    pq.write_table(table, path, compression="zstd")
    md = pq.ParquetFile(path).metadata
    edit_shard_entry(out, bytes=path.stat().st_size, image_bytes=parquet.image_bytes(md))


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("image_bytes -1", lambda out: edit_shard_entry(out, image_bytes=-1),
     "field 'shards[0].image_bytes': -1 is negative"),
    ("image_bytes raised to 1 GiB", lambda out: edit_shard_entry(out, image_bytes=1 << 30),
     "packs-000000.parquet: its footer's images take "),
    ("an image cell of 8 MiB, the manifest following it", huge_image_cell,
     "packs-000000.parquet: row group 0, column images.list.element.bytes: its footer declares"),
]  # fmt: skip


@pytest.mark.parametrize("what, damage, message", CASES, ids=[c[0] for c in CASES])
def test_images_take_no_more_than_the_run_wrote(tmp_path, vision_out, monkeypatch, what, damage, message):
    monkeypatch.setattr(parquet, "MAX_IMAGE_BYTES", 1 << 20, raising=False)  # (the cell: 8 times it)
    out = Path(shutil.copytree(vision_out, tmp_path / "out"))
    assert len(list(read_packs(out))) > 0
    damage(out)
    with pytest.raises(InputError) as err:
        list(read_packs(out))
    assert message in str(err.value), str(err.value)
    lines = "\n".join(verify_output(out).lines())
    assert message.removeprefix("packs-000000.parquet: ") in lines, lines
