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

from tests.conftest import DEMO, DEMO_TOKENIZER, ROOT, run_cli

# one local Ray for the module: its tests run on one xdist worker
pytestmark = pytest.mark.xdist_group("ray")

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
    out: Path, args: list[str], ray_args: list[str], cwd: Path | None = None
) -> tuple[dict, dict]:
    """Pack with the local engine, then with Ray to the same path (the path is in the manifest)."""
    run_cli("pack", *args, "-o", str(out), "-q", "--num-proc", "2", cwd=cwd)
    local = files((cwd or Path()) / out)
    shutil.rmtree((cwd or Path()) / out)
    run_cli("pack", *args, "-o", str(out), "-q", "--engine", "ray", *ray_args, cwd=cwd)
    return local, files((cwd or Path()) / out)


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
    kill = {"PACKTOOL_TEST_KILL": "write:2"}
    killed = run_cli("pack", *TEXT_ARGS, "-o", str(out), *ray_args, check=False, env=kill)
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
    killed = run_cli("pack", *TEXT_ARGS, "-o", str(out), check=False, env={"PACKTOOL_TEST_KILL": "encode:3"})
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


def test_ray_on_a_two_node_cluster_equals_local(tmp_path):
    """A multi-node local cluster (``ray.cluster_utils.Cluster``: a head and a worker node, one CPU each,
    so tasks run on both): the same bytes as the local engine. The cluster is separate from the module's
    Ray; the CLI joins it by its address, as a job joins a real cluster."""
    from ray.cluster_utils import Cluster  # the test's own cluster, started only here

    cluster = Cluster(
        initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        assert len(cluster.list_all_nodes()) == 2
        local, on_ray = local_then_ray(tmp_path / "out", TEXT_ARGS, ["--ray-address", cluster.address])
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
        args = [str(DEMO / "train.jsonl"), "--tokenizer", f"{tmp_path / 'where.py'}:encode",
                "--packed-sequence-size", "2048", "--chunk-size", "100"]  # fmt: skip
        run_cli(
            "pack", *args, "-o", tmp_path / "where", "-q", "--engine", "ray", "--ray-address", cluster.address
        )
        assert len(set(nodes.read_text().split())) == 2
    finally:
        cluster.shutdown()
