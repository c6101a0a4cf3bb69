"""storage.scratch: a run's scratch on local disk, mirrored to a store; machines meet only in the store."""

from __future__ import annotations

from packtool.storage import scratch as scratch_module
from packtool.storage.scratch import Scratch, as_scratch
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures


def test_a_local_scratch_is_its_folder(tmp_path):
    s = as_scratch(tmp_path)
    (tmp_path / "chunk-000000").mkdir()
    (tmp_path / "chunk-000000" / "meta.json").write_text("{}")
    assert s.local == tmp_path and s.fetch("chunk-000000/meta.json") == tmp_path / "chunk-000000/meta.json"
    assert s.names() == ["chunk-000000/meta.json"]
    s.publish("chunk-000000/meta.json")  # nothing to do
    s.remove("chunk-000000")
    assert not (tmp_path / "chunk-000000").exists()


def test_machines_meet_only_in_the_store(s3, tmp_path, monkeypatch):
    s = Scratch(str(tmp_path), remote=f"{s3.url}/out/.partial/_work")
    monkeypatch.setattr(scratch_module, "_NODE", ["node-a"])
    chunk = s.path("chunk-000003")
    chunk.mkdir(parents=True)
    (chunk / "input_ids.npy").write_bytes(b"ids")
    (chunk / "meta.json").write_text('{"index": 3}')
    s.publish_dir("chunk-000003", last="meta.json")
    assert s.local == tmp_path / "node-a"
    monkeypatch.setattr(scratch_module, "_NODE", ["node-b"])  # another machine: nothing of a's here
    assert not s.path("chunk-000003/meta.json").exists()
    assert s.names() == ["chunk-000003/input_ids.npy", "chunk-000003/meta.json"]
    assert s.fetch("chunk-000003/input_ids.npy").read_bytes() == b"ids"
    assert s.exists("chunk-000003/meta.json")
    s.remove("chunk-000003")
    assert s.names() == [] and not s.path("chunk-000003").exists()
