"""A vision-language run's images in its scratch chunks (``pipeline.images``): gathered into packs as the
plan says, read again only as they were encoded, stamped; the run's content key, which holds them and
does not depend on where chunks start (``pipeline.identity.content_key``); and a resumed run's check of
the chunks a killed attempt left (``pipeline.stores.ScratchChunks``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from packtool.errors import InputError
from packtool.options import PackOptions
from packtool.packing.planner import make_plan
from packtool.pipeline.chunks import ChunkStore
from packtool.pipeline.encode import encode_to_chunks
from packtool.pipeline.engines.local import LocalEngine
from packtool.pipeline.identity import content_key
from packtool.pipeline.run import start_run
from packtool.pipeline.stores import ScratchChunks
from packtool.readers.inputs import read_inputs
from packtool.storage.scratch import Scratch
from tests.conftest import DEMO, DEMO_TOKENIZER
from tests.fixtures.vision_inputs import llava_rows, write_jsonl, write_llava_input
from tests.fixtures.vision_processors import build_qwen2vl


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("images")
    data = write_llava_input(root / "in")
    write_jsonl(data, llava_rows() * 3)  # 12 records, 15 images
    return {"data": data, "processor": str(build_qwen2vl(root / "qwen2vl"))}


def encoded(inputs: dict, work: Path, chunk_size: int, **options) -> tuple[ChunkStore, PackOptions]:
    values = {"inputs": [str(inputs["data"])], "output": str(work / "out"), "packed_sequence_size": 256,
              "processor": inputs["processor"], "chunk_size": chunk_size, **options}  # fmt: skip
    opts = PackOptions.from_dict(values)
    spec, _ = start_run(opts, "vision")
    batches = read_inputs(opts.reading.inputs, lazy=True)
    metas = encode_to_chunks(spec, opts, batches, str(work), LocalEngine(1))
    return ChunkStore(work, metas), opts


def test_the_packs_images_are_the_source_bytes_in_pack_order_whatever_the_chunks(inputs, tmp_path):
    images = Path(inputs["data"]).parent / "images"
    by_chunking = []
    for chunk_size in (5, 256):
        store, opts = encoded(inputs, tmp_path / f"work{chunk_size}", chunk_size)
        assert sum(m["num_images"] for m in store.metas) == 15
        plan = make_plan(store.lengths(), opts.packing)
        columns, where = store.images.pack_columns(plan)
        data = store.images.read(where)
        names = data.field("path").to_pylist()
        assert [bytes(b) for b in data.field("bytes").to_pylist()] == [(images.parent / n).read_bytes()
                                                                         for n in names]  # fmt: skip
        # each image's span lies inside its sample's piece, in the pack's coordinates
        offsets = columns["image_sample_offsets"]
        assert offsets[-1] == 15 and np.all(columns["image_length"] > 0)
        by_chunking.append((columns, names, content_key(store)))
    (a, names_a, key_a), (b, names_b, key_b) = by_chunking
    assert names_a == names_b and all(np.array_equal(a[k], b[k]) for k in a) and key_a == key_b


def test_an_image_file_changed_since_it_was_encoded_is_not_written(inputs, tmp_path):
    data = write_llava_input(tmp_path / "in")
    store, opts = encoded({**inputs, "data": data}, tmp_path / "work", 256)
    plan = make_plan(store.lengths(), opts.packing)
    _, where = store.images.pack_columns(plan)
    assert store.images.changed_file() is None
    image = tmp_path / "in" / "images" / "b.jpg"
    image.write_bytes(image.read_bytes()[::-1])  # other bytes, same size
    with pytest.raises(InputError) as e:
        store.images.read(where)
    assert e.value.code == "input_changed" and "line 2, field 'image': image 0 (images/b.jpg)" in str(e.value)
    assert "its bytes are not those it was encoded from" in str(e.value)
    changed = store.images.changed_file()
    assert changed is not None and "image 0 (images/b.jpg): changed while the run read it" in str(changed)


def test_a_touched_image_file_is_a_changed_one(inputs, tmp_path):
    data = write_llava_input(tmp_path / "in")
    store, _ = encoded({**inputs, "data": data}, tmp_path / "work", 256)
    st = os.stat(tmp_path / "in" / "images" / "c.webp")
    os.utime(tmp_path / "in" / "images" / "c.webp", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert "images/c.webp" in str(store.images.changed_file())


def test_the_content_key_of_text_does_not_follow_the_chunk_size(tmp_path):
    keys = set()
    for chunk_size in (37, 4096):
        values = {"inputs": [str(DEMO / "train.jsonl")], "output": str(tmp_path / "o"),
                  "chunk_size": chunk_size, "tokenizer": str(DEMO_TOKENIZER),
                  "packed_sequence_size": 4096}  # fmt: skip
        opts = PackOptions.from_dict(values)
        work = tmp_path / f"w{chunk_size}"
        spec, _ = start_run(opts, "text")
        metas = encode_to_chunks(spec, opts, read_inputs(opts.reading.inputs, lazy=True), str(work),
                                 LocalEngine(1))  # fmt: skip
        assert len(metas) == (28 if chunk_size == 37 else 1)
        keys.add(content_key(ChunkStore(work, metas)))
    assert len(keys) == 1


def _edit_meta(chunk: Path) -> None:
    meta = json.loads((chunk / "meta.json").read_text())
    meta["num_samples"] += 1
    (chunk / "meta.json").write_text(json.dumps(meta))


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:99])


def _out_of_range(path: Path) -> None:
    np.save(path, np.full_like(np.load(path), 99))


DAMAGES = {
    "images.npy emptied": lambda c: (c / "images.npy").write_bytes(b""),
    "image_blob.npy cut": lambda c: _cut(c / "image_blob.npy"),
    "images.npy a FIFO": lambda c: _fifo(c / "images.npy"),
    "a symbolic link for input_ids.npy": lambda c: (
        (c / "input_ids.npy").unlink()
        or (c / "input_ids.npy").symlink_to(c.with_name("chunk-000000") / "input_ids.npy")
    ),
    "meta.json not JSON": lambda c: (c / "meta.json").write_text("{not json"),
    "meta.json a list": lambda c: (c / "meta.json").write_text("[1, 2]"),
    "meta.json's counts edited": _edit_meta,
    "source_ids out of range": lambda c: _out_of_range(c / "source_ids.npy"),
}


@pytest.fixture(scope="module")
def encoded_work(inputs, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("damaged") / "work"
    encoded(inputs, work, 5)
    return work


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_scratch_chunk_is_encoded_again_on_resume(encoded_work, tmp_path, damage):
    """A resumed run keeps the intact chunks and removes the damaged one, whatever the damage: before,
    an emptied array was an EOFError (click's "interrupted", exit 130), a meta that is not one exit 4,
    source_ids out of range an error at write time, a FIFO a hang."""
    work = Path(shutil.copytree(encoded_work, tmp_path / "work", symlinks=True))
    DAMAGES[damage](work / "chunk-000001")
    store = ScratchChunks(None, None, Scratch(str(work)), None, resumed=True)
    assert store.damaged == [1] and sorted(store.done) == [0, 2]
    assert not (work / "chunk-000001").exists()
    assert all("meta_digest" not in m for m in store.done.values())
