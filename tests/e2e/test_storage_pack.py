"""``packtool pack`` from and to an object store: a real S3-protocol server on localhost
(tests/fixtures/s3.py), reached as a user would, through the standard AWS variables and AWS_ENDPOINT_URL."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import socket
import tarfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool import read_packs
from packtool.storage.scratch import staging_base
from tests.conftest import DEMO, DEMO_TOKENIZER, run_cli
from tests.fixtures.s3 import s3, s3_auth, s3_server  # noqa: F401 - fixtures

BASE = [
    "--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", "512", "--long-samples", "truncate", "-q",
    "--add-eos",
]  # fmt: skip


def _records(n: int = 120) -> list[dict]:
    lines = (DEMO / "train.jsonl").read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


def _packs(directory: Path) -> list[tuple]:
    return [
        (p["input_ids"].tobytes(), p["labels"].tobytes(), p["seq_lens"].tobytes())
        for p in read_packs(directory)
    ]


def _download(s3, prefix: str, to: Path) -> Path:
    """The output at ``prefix``, as a local directory (the tests' own download, not packtool's)."""
    for key in s3.keys(prefix):
        path = to / key[len(prefix) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(s3.get(key))
    return to


def _local_inputs(kind: str, tmp: Path) -> tuple[Path, str]:
    """The demo records in the layout ``kind``: a local path to upload, and the input spec relative to
    where it is uploaded (a file, a folder, a pattern)."""
    records = _records()
    root = tmp / "in"
    root.mkdir()
    if kind == "jsonl":
        (root / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return root, "a.jsonl"
    if kind == "jsonl.gz":
        (root / "a.jsonl.gz").write_bytes(
            gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode())
        )
        return root, "a.jsonl.gz"
    if kind == "json-array":
        (root / "a.json").write_text(json.dumps(records))
        return root, "a.json"
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(records), root / "a.parquet", row_group_size=50)
        return root, "a.parquet"
    if kind == "text-folder":  # one sample per file, in tree order, a README left out
        for i, r in enumerate(records[:40]):
            sub = root / "docs" / f"part{i % 3}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"doc{i:03d}.txt").write_text(r["text"])
        (root / "docs" / "README").write_text("not data")
        return root, "docs"
    if kind == "glob":
        for i in range(3):
            sub = root / "shards" / f"s{i}"
            sub.mkdir(parents=True)
            part = records[i * 40 : (i + 1) * 40]
            (sub / f"part{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        return root, "shards/**/*.jsonl"
    if kind == "tar":
        with tarfile.open(root / "a.tar", "w") as tar:
            for i, r in enumerate(records):
                data = r["text"].encode()
                info = tarfile.TarInfo(f"{i:05d}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return root, "a.tar"
    raise AssertionError(kind)


SLOW_KINDS = ("jsonl.gz", "json-array", "tar")  # read by the readers jsonl and text-folder exercise


@pytest.mark.parametrize(
    "kind",
    [pytest.param(k, marks=[pytest.mark.slow] if k in SLOW_KINDS else []) for k in
     ["jsonl", "jsonl.gz", "json-array", "parquet", "text-folder", "glob", "tar"]],
)  # fmt: skip
def test_inputs_in_a_bucket_pack_as_the_same_files_on_local_disk(s3, tmp_path, kind):
    root, spec = _local_inputs(kind, tmp_path)
    url = s3.put_tree("corpus", root)
    args = [*BASE, "--text-field", "txt"] if kind == "tar" else BASE  # a member's extension is its field
    run_cli("pack", root / spec, "-o", tmp_path / "local", *args)
    run_cli("pack", f"{url}/{spec}", "-o", tmp_path / "remote", *args)
    assert _packs(tmp_path / "remote") == _packs(tmp_path / "local")
    sources = [i["source"] for i in json.loads((tmp_path / "remote" / "manifest.json").read_text())["inputs"]]
    assert all(s.startswith(f"{url}/") for s in sources)  # named by their URLs


def test_bucket_to_bucket_writes_the_output_and_nothing_else(s3, tmp_path):
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    proc = run_cli("pack", url, "-o", f"{s3.url}/out", *BASE, "--num-proc", "2", cwd=tmp_path)
    assert f"-> {s3.url}/out" in proc.stderr
    assert not list(tmp_path.iterdir())  # no local directory named after the URL (s3:/...)
    keys = s3.keys("out")
    assert keys == ["out/README.md", "out/manifest.json", "out/packs-000000.parquet"]
    run_cli("pack", DEMO / "train.jsonl", "-o", tmp_path / "local", *BASE)
    assert _packs(_download(s3, "out", tmp_path / "got")) == _packs(tmp_path / "local")
    assert not Path(staging_base(f"{s3.url}/out")).exists()  # the local copies are gone too


def test_webdataset_output_in_a_bucket_has_its_indexes(s3, tmp_path):
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    args = [url, *BASE, "--format", "webdataset", "--shard-size", "40"]
    run_cli("pack", *args, "-o", f"{s3.url}/out")
    run_cli("pack", *args, "-o", tmp_path / "local")
    got = _download(s3, "out", tmp_path / "got")
    local = sorted(p.relative_to(tmp_path / "local").as_posix() for p in (tmp_path / "local").rglob("*"))
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*")) == local
    for name in local:  # the same bytes: the Energon index was built from the uploaded shards
        if (tmp_path / "local" / name).is_file() and name not in ("manifest.json", "README.md"):
            assert (got / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    run_cli("verify", got)


@pytest.mark.parametrize(
    "output, words",
    [
        ("nosuch://bucket/out", "no filesystem serves nosuch://"),
        ("gs://bucket/out", "needs gcsfs (pip install 'packtool[gcs]')"),
    ],
)
def test_an_output_url_no_filesystem_serves_is_a_usage_error(tmp_path, output, words):
    proc = run_cli("pack", DEMO / "train.jsonl", "-o", output, *BASE, check=False, cwd=tmp_path)
    assert proc.returncode == 2 and words in proc.stderr
    assert not list(tmp_path.iterdir())


def test_an_existing_output_is_replaced_only_with_overwrite_and_unknown_objects_stay(s3, tmp_path):
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    out = f"{s3.url}/out"
    run_cli("pack", url, "-o", out, *BASE, "--format", "webdataset", "--shard-size", "20")
    s3.put("out/notes.txt", "mine")  # the user's own object under the prefix
    proc = run_cli("pack", url, "-o", out, *BASE, check=False)
    assert proc.returncode == 2 and "output exists; pass --overwrite" in proc.stderr
    run_cli("pack", url, "-o", out, *BASE, "--overwrite")  # Parquet now: every tar shard goes
    assert s3.keys("out") == [
        "out/README.md",
        "out/manifest.json",
        "out/notes.txt",
        "out/packs-000000.parquet",
    ]


def test_a_prefix_holding_objects_but_no_output_is_refused(s3, tmp_path):
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    s3.put("data/model.bin", b"weights")
    proc = run_cli("pack", url, "-o", f"{s3.url}/data", *BASE, "--overwrite", check=False)
    assert proc.returncode == 2 and "not a packtool output" in proc.stderr
    assert s3.keys("data") == ["data/model.bin"]


def _lock(s3, out: str, **fields) -> None:
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "token": "t", "started": time.time()}
    s3.put(f"{out}/.partial/lock.json", json.dumps({**holder, "expires": time.time() + 600, **fields}))


def test_a_run_holding_the_lock_refuses_another(s3, tmp_path):
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    _lock(s3, "out")  # this test's own process: alive
    proc = run_cli("pack", url, "-o", f"{s3.url}/out", *BASE, check=False)
    assert proc.returncode == 2 and f"another packtool job (pid {os.getpid()} on" in proc.stderr
    assert s3.keys("out") == ["out/.partial/lock.json"]


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"expires": time.time() - 5, "host": "elsewhere"}, "its lease ran out"),
        ({"pid": 2**22 + 7}, "is not running on this host"),
    ],
)
def test_the_lock_of_a_dead_run_is_named_and_taken_over(s3, tmp_path, fields, why):
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    _lock(s3, "out", **fields)
    proc = run_cli("pack", url, "-o", f"{s3.url}/out", *BASE)
    assert "took over the lock of a run that is dead" in proc.stderr and why in proc.stderr
    assert s3.keys("out") == ["out/README.md", "out/manifest.json", "out/packs-000000.parquet"]


def test_a_failed_run_leaves_nothing_under_the_output(s3, tmp_path):
    bad = s3.put("in/bad.jsonl", "".join(json.dumps(r) + "\n" for r in _records(50)) + "{not json\n")
    proc = run_cli("pack", bad, "-o", f"{s3.url}/out", *BASE, check=False)
    assert proc.returncode == 3 and f"{bad}, line 51" in proc.stderr
    assert s3.keys("out") == []


@pytest.mark.parametrize("elsewhere", [pytest.param(False, marks=pytest.mark.slow), True])
def test_a_killed_run_resumes_from_the_bucket_byte_identical(s3, tmp_path, elsewhere):
    """SIGKILL once 2 shards are written; the same command resumes from the store (``elsewhere``: on a
    machine without this one's local copies, the scratch under ``--scratch``) and writes what an
    uninterrupted run writes."""
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    args = [url, *BASE, "--shard-size", "20", "--chunk-size", "100", "--num-proc", "2"]
    out = f"{s3.url}/out"
    scratch = ["--scratch", f"{s3.url}/scratch"] if elsewhere else []
    killed = run_cli("pack", *args, *scratch, "-o", out, check=False, kill_at="write:2")
    assert killed.returncode == -9 and "out/manifest.json" not in s3.keys("out")
    kept = [k for k in s3.keys() if k.endswith("_work/run.json")]
    assert kept == (
        [k for k in kept if k.startswith("scratch/")] if elsewhere else ["out/.partial/_work/run.json"]
    )
    if elsewhere:
        assert len(kept) == 1 and not any(k.startswith("out/.partial") for k in s3.keys())
        shutil.rmtree(staging_base(out))
    args += scratch
    resumed = run_cli("pack", *[a for a in args if a != "-q"], "-o", out)
    assert re.search(
        r"resumed: 10 of 10 chunks and ([2-9]|1[0-2]) of 13 shards were already done", resumed.stderr
    )
    whole = f"{s3.url}/whole"
    run_cli("pack", *args, "-o", whole)
    got, want = s3.keys("out"), s3.keys("whole")
    assert [k[4:] for k in got] == [k[6:] for k in want]
    for a, b in zip(got, want, strict=True):
        if not a.endswith(("manifest.json", "README.md")):
            assert s3.get(a) == s3.get(b), a
    assert (
        json.loads(s3.get("out/manifest.json"))["run_id"]
        == json.loads(s3.get("whole/manifest.json"))["run_id"]
    )
    assert not s3.keys("scratch")  # the scratch is removed once the output is committed


def test_a_missing_object_and_a_missing_bucket(s3, tmp_path):
    proc = run_cli("pack", f"{s3.url}/in/none.jsonl", "-o", tmp_path / "o", *BASE, check=False)
    assert proc.returncode == 3 and f"{s3.url}/in/none.jsonl: no such file or object" in proc.stderr
    proc = run_cli("pack", "s3://no-such-bucket-x/in.jsonl", "-o", tmp_path / "o", *BASE, check=False)
    assert proc.returncode in (2, 3) and "s3://no-such-bucket-x" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_an_unreachable_endpoint_is_named_within_a_minute(tmp_path, monkeypatch):
    with socket.socket() as sock:  # a port on this machine that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
    }
    start = time.monotonic()
    proc = run_cli(
        "pack", "s3://bucket/in.jsonl", "-o", tmp_path / "o", *BASE, check=False, env=env, timeout=90
    )
    assert time.monotonic() - start < 60
    assert proc.returncode == 2 and "cannot reach the object store" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_packs_equal_between_local_disk_and_bucket_for_parquet(s3, tmp_path):
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(1, 200, int(n)).tolist()} for n in rng.integers(5, 300, 300)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tok.parquet", row_group_size=64)
    url = s3.put("in/tok.parquet", tmp_path / "tok.parquet")
    args = ["--packed-sequence-size", "512", "-q", "--num-proc", "2"]
    run_cli("pack", tmp_path / "tok.parquet", "-o", tmp_path / "local", *args)
    run_cli("pack", url, "-o", f"{s3.url}/out", *args)
    assert _packs(_download(s3, "out", tmp_path / "got")) == _packs(tmp_path / "local")


def test_credentials_missing_wrong_or_not_allowed_to_write(s3, s3_auth, tmp_path):
    """Each a one-line error, exit 2, naming the URL; nothing written."""
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    reader = s3_auth.user("reader", ["s3:GetObject", "s3:ListBucket"])
    s3_auth.on()
    out = f"{s3.url}/out"
    # no credentials at all (and no instance metadata service to ask: it is not on this machine)
    bare = {
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
    }
    cases = [
        (bare, "no credentials for the object store"),
        (
            {"AWS_ACCESS_KEY_ID": "AKIAWRONG0000000", "AWS_SECRET_ACCESS_KEY": "x"},
            "credentials are not valid",
        ),
        (reader, "access denied for write"),
    ]
    for env, words in cases:
        proc = run_cli("pack", url, "-o", out, *BASE, check=False, env=env, timeout=90)
        assert proc.returncode == 2, proc.stderr
        assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_an_input_object_replaced_before_the_resume_starts_the_run_afresh(s3, tmp_path):
    """Killed once 3 chunks are encoded; the input object is then rewritten (the same size: only its ETag
    tells): the same command does not mix the old encoding with the new input."""
    records = _records(400)
    text = "".join(json.dumps(r) + "\n" for r in records)
    url = s3.put("in/a.jsonl", text)
    args = [url, *[a for a in BASE if a != "-q"], "--chunk-size", "50", "--num-proc", "2"]
    out = f"{s3.url}/out"
    assert run_cli("pack", *args, "-o", out, check=False, kill_at="encode:3").returncode == -9
    at = text.index('"text": "') + 9
    s3.put("in/a.jsonl", text[:at] + ("Y" if text[at] != "Y" else "Z") + text[at + 1 :])  # the same size
    proc = run_cli("pack", *args, "-o", out)
    assert "holds an interrupted run of another job" in proc.stderr and "resumed:" not in proc.stderr
    local = tmp_path / "a.jsonl"
    local.write_bytes(s3.get("in/a.jsonl"))
    run_cli("pack", local, *args[1:], "-o", tmp_path / "local")
    assert _packs(_download(s3, "out", tmp_path / "got")) == _packs(tmp_path / "local")


def test_inspect_and_verify_read_an_output_in_a_bucket(s3, tmp_path):
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    out = f"{s3.url}/out"
    env = {"PACKTOOL_CACHE": str(tmp_path / "cache")}
    run_cli("pack", url, "-o", out, *BASE, "--shard-size", "40")
    report = json.loads(run_cli("inspect", out, "--json", env=env).stdout)
    assert report["directory"] == out and report["num_packs"] > 40
    proc = run_cli("verify", out, env=env)
    assert proc.stdout.startswith(f"OK: {out} (")
    s3.put("out/packs-000009.parquet", s3.get("out/packs-000000.parquet"))  # a stray shard
    s3.put("out/packs-000001.parquet", s3.get("out/packs-000002.parquet"))  # another shard in its place
    proc = run_cli("verify", out, env=env, check=False)
    assert proc.returncode == 1 and proc.stdout.splitlines()[-1].startswith(f"FAILED: {out}:")
    assert "packs-000009.parquet" in proc.stdout and "packs-000001.parquet" in proc.stdout
    assert str(tmp_path) not in proc.stdout + proc.stderr  # named by the URL, never the cache


@pytest.mark.slow  # (three vision packs, ~20 s) tests/unit/vision/test_files.py reads image objects fast
def test_vision_records_and_their_images_in_a_bucket_pack_as_on_disk(s3, tmp_path):
    """A LLaVA input in a store naming its images relatively (beside it in the store) and by URL: the same
    packs and images as the same files on disk; an image object missing is that record's bad input."""
    from tests.fixtures.vision_inputs import llava_rows, write_llava_input
    from tests.fixtures.vision_processors import build_qwen2vl

    data = write_llava_input(tmp_path / "in")
    processor = build_qwen2vl(tmp_path / "qwen2vl")
    url = s3.put_tree("vision", tmp_path / "in")
    rows = llava_rows()
    rows[1]["image"] = [f"{url}/images/b.jpg", "images/c.webp"]  # an image by its URL, one beside the input
    (tmp_path / "in" / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s3.put("vision/data.jsonl", tmp_path / "in" / "data.jsonl")
    args = ["--processor", processor, "--packed-sequence-size", "256", "-q"]
    run_cli("pack", f"{url}/data.jsonl", "-o", tmp_path / "remote", *args)
    local_rows = llava_rows()  # the same images, all beside the input on disk
    (tmp_path / "in" / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in local_rows))
    run_cli("pack", data, "-o", tmp_path / "local", *args)
    got = list(read_packs(tmp_path / "remote"))
    want = list(read_packs(tmp_path / "local"))
    assert len(got) == len(want) and all(
        np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(got, want, strict=False)
    )
    assert [i["bytes"] for p in got for i in p["images"]] == [i["bytes"] for p in want for i in p["images"]]
    s3.fs.rm(f"{s3.name}/vision/images/c.webp")
    proc = run_cli("pack", f"{url}/data.jsonl", "-o", tmp_path / "gone", *args, check=False)
    assert proc.returncode == 3 and "images/c.webp" in proc.stderr and "no such object" in proc.stderr


@pytest.mark.slow  # (datasets' import and its copy of the dataset: ~5 s) other input kinds run in make test
def test_a_dataset_saved_to_a_bucket_packs_as_on_disk(s3, tmp_path):
    import datasets  # slow to import: only this test pays for it

    datasets.Dataset.from_list(_records(200)).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    url = s3.put_tree("saved", tmp_path / "saved")
    run_cli("pack", tmp_path / "saved", "-o", tmp_path / "local", *BASE)
    run_cli("pack", url, "-o", tmp_path / "remote", *BASE)
    assert _packs(tmp_path / "remote") == _packs(tmp_path / "local")
