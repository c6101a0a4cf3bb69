"""``--engine ray`` writes the same bytes as ``--engine local``, through the real CLI on a real local Ray.

One Ray instance is started for the module (``ray.init`` in the test process, 2 CPUs); the CLI runs join
it with ``--ray-address``, as jobs join a cluster. One test lets the CLI start its own local Ray.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray  # noqa: E402  (a dev dependency: the Ray engine is tested in CI, never skipped)

from tests.conftest import DEMO, DEMO_TOKENIZER, ROOT, run_cli, write_jsonl
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures
from tests.fixtures.vision_inputs import llava_rows, write_llava_input
from tests.fixtures.vision_processors import build_qwen2vl

TEXT_ARGS = [
    str(DEMO / "train.jsonl"), "--tokenizer", str(DEMO_TOKENIZER), "--add-eos",
    "--packed-sequence-size", "512", "--long-samples", "truncate",
    "--chunk-size", "150", "--shard-size", "25", "--row-group-size", "10",
]  # fmt: skip


@pytest.fixture(scope="module")
def ray_address():
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    try:
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def local_then_ray(
    out: Path, args: list[str], ray_args: list[str], cwd: Path | None = None, env: dict | None = None
) -> tuple[dict, dict]:
    """Pack with the local engine, then with Ray to the same path (the path is in the manifest)."""
    run_cli("pack", *args, "-o", str(out), "-q", "--num-proc", "2", cwd=cwd, env=env)
    local = files((cwd or Path()) / out)
    shutil.rmtree((cwd or Path()) / out)
    run_cli("pack", *args, "-o", str(out), "-q", "--engine", "ray", *ray_args, cwd=cwd, env=env)
    return local, files((cwd or Path()) / out)


DEMO_TEXTS = [json.loads(line)["text"] for line in (DEMO / "train.jsonl").open()]


def text_inputs(tmp_path: Path) -> tuple[list[str], dict]:
    """The demo texts as each input the workers now read themselves: a ``.txt`` file (a text per line,
    with blank lines), a directory of ``.txt`` files (a text each), a ``save_to_disk`` dataset (3 Arrow
    files) and ``hf:DIR`` (``load_dataset``'s cache, made in ``tmp_path`` by the first run); and the env
    that keeps that cache there."""
    import datasets  # slow to import: only the tests that make datasets pay for it

    lines = tmp_path / "texts.txt"
    lines.write_text("".join(t + "\n" + "\n" * (i % 7 == 0) for i, t in enumerate(DEMO_TEXTS)))
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, t in enumerate(DEMO_TEXTS[:120]):
        (docs / f"{i:04d}.txt").write_text(t)
    rows = [{"text": t, "n": i} for i, t in enumerate(DEMO_TEXTS)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    write_jsonl(tmp_path / "hub" / "data.jsonl", rows[::-1])
    inputs = [str(lines), str(docs), str(tmp_path / "saved"), f"hf:{tmp_path / 'hub'}"]
    return inputs, {"HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}


def test_ray_equals_local_text(tmp_path, ray_address):
    local, on_ray = local_then_ray(tmp_path / "out", TEXT_ARGS, ["--ray-address", ray_address])
    assert len(local) > 10 and local == on_ray  # several shards + manifest


def test_ray_equals_local_pretokenized_split(tmp_path, ray_address):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 700, 600)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(1, 999, offsets[-1])))
    mask = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 2, offsets[-1])))
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"input_ids": ids, "loss_mask": mask}), src, row_group_size=100)
    args = [str(src), "--packed-sequence-size", "256", "--split-across-pack", "--chunk-size", "64",
            "--shard-size", "100"]  # fmt: skip
    local, on_ray = local_then_ray(tmp_path / "out", args, ["--ray-address", ray_address, "--num-proc", "2"])
    assert len(local) > 5 and local == on_ray


def test_ray_equals_local_text_files_directories_and_hf_datasets(tmp_path, ray_address, monkeypatch):
    """.txt lines, a directory of .txt files and Hugging Face datasets (save_to_disk, hf:DIR) in one run:
    the same bytes on Ray as on the local engine (2 processes), and the driver (this process: ``run_pack``
    on the module's Ray) makes no ``SourceBatch``, the records' only form: it hands out line, file and row
    ranges, and the workers read them. (The two-node test below runs the same inputs through the CLI.)"""
    from packtool.options import PackOptions
    from packtool.pipeline.run import run_pack
    from packtool.readers.base import SourceBatch

    inputs, env = text_inputs(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    made = []
    init = SourceBatch.__init__

    def noted(self, *args, **kw):
        made.append(args[0] if args else kw.get("source"))
        init(self, *args, **kw)

    monkeypatch.setattr(SourceBatch, "__init__", noted)
    out = tmp_path / "out"
    config = PackOptions.of(inputs=inputs, output=str(out), tokenizer=str(DEMO_TOKENIZER), add_eos=True,
                        packed_sequence_size=512, long_samples="truncate", chunk_size=150, shard_size=25,
                        row_group_size=10, num_proc=2, quiet=True)  # fmt: skip
    written = {}
    for engine in ("local", "ray"):
        manifest = run_pack(config.replace(engine=engine))
        assert made == [], (engine, made[:3])
        assert [i.num_samples for i in manifest.inputs] == [
            len(DEMO_TEXTS),
            120,
            len(DEMO_TEXTS),
            len(DEMO_TEXTS),
        ]
        written[engine] = files(out)
        shutil.rmtree(out)
    assert len(written["local"]) > 10 and written["local"] == written["ray"]


def test_ray_names_the_exact_line_of_a_bad_text_in_the_middle_of_a_range(tmp_path, ray_address):
    """A line that is not UTF-8, a text too long (``--long-samples error``) and a dataset row without text,
    each in the middle of a worker's range of 150 lines or rows: the one-line error names the file, the
    line or row (and the field) exactly, the same on both engines."""
    import datasets  # slow to import: only the tests that make datasets pay for it

    lines = [t.encode() for t in DEMO_TEXTS[:400]]
    lines[236] = b"caf\xe9 au lait"  # line 237: Latin-1, not UTF-8
    (tmp_path / "bad.txt").write_bytes(b"\n".join(lines) + b"\n")
    lines[236] = b" ".join([b"word"] * 5000)  # line 237: 5,002 tokens, over 4,096 (the demo's: 2,187 at most)
    (tmp_path / "long.txt").write_bytes(b"\n\n".join(lines))  # a blank line after each: line 473
    rows = [{"text": t} for t in DEMO_TEXTS[:400]]
    rows[236] = {"text": None}  # row 236 (0-based)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    flags = ["--tokenizer", str(DEMO_TOKENIZER), "--packed-sequence-size", "4096", "--chunk-size", "150"]
    for name, want in (
        ("bad.txt", "bad.txt, line 237: not valid UTF-8 (byte 3)"),
        ("long.txt", "long.txt, line 473, field 'text': sample has 5002 tokens"),
        ("saved", "saved, row 236, field 'text': missing field or null value"),
    ):
        args = ["pack", str(tmp_path / name), *flags, "-o", str(tmp_path / "o"), "-q"]
        local = run_cli(*args, check=False)
        on_ray = run_cli(*args, "--engine", "ray", "--ray-address", ray_address, check=False)
        assert local.returncode == on_ray.returncode == 3, local.stderr
        assert want in local.stderr and on_ray.stderr == local.stderr, (local.stderr, on_ray.stderr)
        assert local.stderr.count("\n") == 1


def test_ray_equals_local_text_parquet_sequential(tmp_path, ray_address):
    """Ray tasks read their own Parquet row ranges (chunks of 150 rows across row groups of 70). Paths are
    relative to a directory that is not the Ray workers' own: they must mean the same there."""
    texts = [json.loads(line)["text"] for line in (DEMO / "train.jsonl").open()]
    pq.write_table(pa.table({"text": texts}), tmp_path / "texts.parquet", row_group_size=70)
    shutil.copy(DEMO_TOKENIZER, tmp_path / "tok.json")
    args = ["texts.parquet", *TEXT_ARGS[1:], "--tokenizer", "tok.json", "--strategy", "sequential"]
    local, on_ray = local_then_ray(Path("out"), args, ["--ray-address", ray_address], cwd=tmp_path)
    assert len(local) > 10 and local == on_ray


def test_ray_equals_local_sft_config(tmp_path, ray_address):
    """configs/sft_alpaca.yaml (prompt/completion, loss on the output only), as shipped, with 2 workers."""
    out = tmp_path / "sft"
    base = ["pack", "--config", "configs/sft_alpaca.yaml", "-o", str(out), "-q", "--num-proc", "2"]
    run_cli(*base, cwd=ROOT)
    local = files(out)
    shutil.rmtree(out)
    run_cli(*base, "--engine", "ray", "--ray-address", ray_address, cwd=ROOT)
    assert "manifest.json" in local and local == files(out)


def test_ray_reports_bad_input_like_local(tmp_path, ray_address):
    bad = tmp_path / "bad.jsonl"
    rows = [f'{{"input_ids": [1, 2, {i}]}}\n' for i in range(300)] + ['{"input_ids": [1, -5]}\n']
    bad.write_text("".join(rows))
    args = ["pack", str(bad), "--packed-sequence-size", "64", "-o", str(tmp_path / "o"), "-q"]
    local = run_cli(*args, check=False)
    on_ray = run_cli(*args, "--engine", "ray", "--ray-address", ray_address, check=False)
    assert local.returncode == on_ray.returncode == 3
    assert "bad.jsonl, line 301, field 'input_ids': negative token id: -5" in local.stderr
    assert on_ray.stderr == local.stderr and local.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def test_ray_skips_bad_records_like_local(tmp_path, ray_address):
    """--on-error skip: records the reader rejects (malformed line) and the encoder rejects (negative id)
    are left out the same way; chunks (64 records) do not shift between engines."""
    rows = [f'{{"input_ids": [1, 2, {i}]}}\n' for i in range(400)]
    rows[100] = '{"input_ids": [1, 2\n'
    rows[250] = '{"input_ids": [1, -5]}\n'
    (tmp_path / "bad.jsonl").write_text("".join(rows))
    args = [str(tmp_path / "bad.jsonl"), "--packed-sequence-size", "64", "--on-error", "skip",
            "--chunk-size", "64", "--shard-size", "3"]  # fmt: skip
    local, on_ray = local_then_ray(tmp_path / "out", args, ["--ray-address", ray_address])
    assert "errors.jsonl" in local and local == on_ray
    assert json.loads(local["manifest.json"])["stats"]["skipped_samples"] == 2


def test_ray_job_killed_and_resumed(tmp_path, ray_address):
    out = tmp_path / "out"
    run_cli("pack", *TEXT_ARGS, "-o", str(out), "-q")
    local = files(out)
    shutil.rmtree(out)
    ray_args = ["--engine", "ray", "--ray-address", ray_address]
    killed = run_cli("pack", *TEXT_ARGS, "-o", str(out), *ray_args, check=False, kill_at="write:2")
    assert killed.returncode == -9 and not out.exists()
    resumed = run_cli("pack", *TEXT_ARGS, "-o", str(out), *ray_args)
    # Ray tasks already in flight when the driver died may still have finished their shards
    done = re.search(r"resumed: 7 of 7 chunks and (\d+) of (\d+) shards were already done", resumed.stderr)
    assert done and 2 <= int(done.group(1)) < int(done.group(2)), resumed.stderr
    assert files(out) == local


def test_local_job_killed_then_resumed_on_ray(tmp_path, ray_address):
    """Chunk boundaries come from the config alone, so a run resumes on the other engine."""
    out = tmp_path / "out"
    run_cli("pack", *TEXT_ARGS, "-o", str(out), "-q")
    local = files(out)
    shutil.rmtree(out)
    killed = run_cli("pack", *TEXT_ARGS, "-o", str(out), check=False, kill_at="encode:3")
    assert killed.returncode == -9 and not out.exists()
    resumed = run_cli("pack", *TEXT_ARGS, "-o", str(out), "--engine", "ray", "--ray-address", ray_address)
    assert "resumed: 3 of 7 chunks and 0 of" in resumed.stderr, resumed.stderr
    assert files(out) == local


def test_ray_starts_a_local_ray_without_address(tmp_path, ray_address):
    """No --ray-address: the CLI starts (and stops) a Ray of its own, next to the module's one."""
    args = [str(DEMO / "train.jsonl"), "--tokenizer", str(DEMO_TOKENIZER), "--packed-sequence-size", "2048",
            "--split-across-pack", "--chunk-size", "300"]  # fmt: skip
    local, on_ray = local_then_ray(tmp_path / "out", args, [])
    assert local == on_ray


def test_ray_on_a_two_node_cluster_equals_local(tmp_path, s3, s3_server):
    """A multi-node local cluster (``ray.cluster_utils.Cluster``: a head and a worker node, one CPU each,
    so tasks run on both): the same bytes as the local engine, for every kind of input the tasks read
    themselves. The cluster is separate from the module's Ray; the CLI joins it by its address, as a job
    joins a real cluster."""
    from ray.cluster_utils import Cluster  # the test's own cluster, started only here

    cluster = Cluster(
        initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        assert len(cluster.list_all_nodes()) == 2
        # JSON Lines, .txt lines, .txt files and Hugging Face datasets: every range read by the tasks
        inputs, env = text_inputs(tmp_path)
        args = [*TEXT_ARGS, *inputs]
        local, on_ray = local_then_ray(tmp_path / "out", args, ["--ray-address", cluster.address], env=env)
        assert len(local) > 10 and local == on_ray
        # an encoder that notes the node it runs on: the chunks were encoded on both nodes (it takes its
        # time, so that a task waiting for the busy head's one CPU is sent to the other node)
        nodes = tmp_path / "nodes.txt"
        (tmp_path / "where.py").write_text(
            "import time\n"
            "import ray\n"
            "def encode(records):\n"
            "    time.sleep(0.5)\n"
            f"    with open({str(nodes)!r}, 'a') as f:\n"
            "        f.write(ray.get_runtime_context().get_node_id() + '\\n')\n"
            "    return {'input_ids': [[len(w) + 1 for w in t.split()] for t in records['text']]}\n"
        )
        args = [inputs[0], "--tokenizer", f"{tmp_path / 'where.py'}:encode",
                "--packed-sequence-size", "2048", "--chunk-size", "100"]  # fmt: skip
        run_cli(
            "pack", *args, "-o", tmp_path / "where", "-q", "--engine", "ray", "--ray-address", cluster.address
        )
        assert len(set(nodes.read_text().split())) == 2
        # vision-language samples: the same packs and images on the cluster (the processor loaded once per
        # Ray worker, the images read by the tasks)
        data = write_llava_input(tmp_path / "vision")
        write_jsonl(data, llava_rows() * 4)
        processor = build_qwen2vl(tmp_path / "qwen2vl")
        args = [str(data), "--processor", str(processor), "--packed-sequence-size", "256"]
        args += ["--chunk-size", "4"]
        local, on_ray = local_then_ray(tmp_path / "vout", args, ["--ray-address", cluster.address])
        assert local == on_ray and json.loads(local["manifest.json"])["vision"]["packed_images"] == 20
        # inputs, tokenizer and output in a store: the nodes share nothing else (each keeps its scratch in a
        # local folder of its own), and the shards are the local engine's
        args = [s3.put("in/train.jsonl", DEMO / "train.jsonl"), "--tokenizer",
                s3.put("models/tokenizer.json", DEMO_TOKENIZER), *TEXT_ARGS[3:], "-q",
                "--storage-options", _store_options(s3_server)]  # fmt: skip
        run_cli("pack", *args, "-o", f"{s3.url}/out", "--num-proc", "2")
        local = _bucket_files(s3, "out")
        run_cli("pack", *args, "-o", f"{s3.url}/out", "--overwrite", "--engine", "ray",
                "--ray-address", cluster.address)  # fmt: skip
        assert len(local) == 10 and _bucket_files(s3, "out") == local
    finally:
        cluster.shutdown()


def _store_options(s3_server: str) -> str:
    """--storage-options that reach the test's S3 server: they travel with the job to Ray's workers, which
    were started before the test set the AWS variables."""
    return json.dumps({"s3": {"endpoint_url": s3_server, "key": "testing", "secret": "testing"}})


def _bucket_files(s3, prefix: str) -> dict[str, bytes]:
    """The output's objects by name, less the manifest and card (they name the output's URL)."""
    return {
        k[len(prefix) + 1 :]: s3.get(k)
        for k in s3.keys(prefix)
        if not k.endswith(("manifest.json", "README.md"))
    }


def test_ray_packs_bucket_to_bucket_as_the_local_engine(tmp_path, ray_address, s3, s3_server):
    """Inputs, tokenizer and output in a store: Ray's tasks read their ranges from the store and write their
    chunks and shards to it, each node in a local folder of its own (the driver's is another), and the
    shards are the local engine's, byte for byte."""
    url = s3.put("in/train.jsonl", DEMO / "train.jsonl")
    tokenizer = s3.put("models/tokenizer.json", DEMO_TOKENIZER)
    args = [url, "--tokenizer", tokenizer, "--add-eos", "--packed-sequence-size", "512",
            "--long-samples", "truncate", "--chunk-size", "150", "--shard-size", "25", "-q",
            "--storage-options", _store_options(s3_server)]  # fmt: skip
    run_cli("pack", *args, "-o", f"{s3.url}/out", "--num-proc", "2")  # (the output's URL is in the run_id)
    local, run_id = _bucket_files(s3, "out"), json.loads(s3.get("out/manifest.json"))["run_id"]
    run_cli(
        "pack", *args, "-o", f"{s3.url}/out", "--overwrite", "--engine", "ray", "--ray-address", ray_address
    )
    assert len(local) == 10 and _bucket_files(s3, "out") == local
    assert json.loads(s3.get("out/manifest.json"))["run_id"] == run_id
