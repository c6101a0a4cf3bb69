"""Vision-language samples through the one pack pipeline: the text path's readers, workers, scratch store,
planner, writers, resume and engines, with every image bound to the run.

The case table: each numbered gap of a vision run beside the text one, as a test that fails on the
two-pipeline code and passes on the one pipeline:

1. workers: ``--num-proc 2`` encodes in worker processes, the same bytes as one process;
2. resume: a job killed while encoding resumes from its finished chunks, the same bytes;
3. (memory: ``make bench``, scripts/bench_vision.py, and docs/performance.md);
4. inputs: every input kind the text path reads (compressed JSON Lines, directories, Parquet with image
   bytes, ``save_to_disk`` datasets, WebDataset shards); a FIFO or a device as an image is refused at once;
5. an image replaced while the run reads the images fails the run (exit 3) naming it;
6. the run id is bound to the images' bytes;
7. options are resolved and checked once: one that does not apply to vision samples is exit 2 whatever
   the format's spelling, ``--loss-on`` / ``--empty-loss`` / ``--chat-template`` are honoured, and
   ``--chunk-size`` changes no byte;
8. (the prototype's unused code: tests/unit/test_architecture.py).

Ray on a two-node cluster: tests/e2e/test_ray_engine.py. Most runs call ``run_pack`` in this process
(transformers is imported once); the exit codes and kills go through the CLI.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from packtool import read_packs, run_pack
from packtool.errors import ConfigError, InputError
from packtool.options import PackOptions
from packtool.pipeline import progress
from tests.conftest import run_cli
from tests.fixtures.vision_inputs import image_bytes, llava_rows, write_jsonl, write_llava_input
from tests.fixtures.vision_processors import build_qwen2vl

N = 256


@pytest.fixture(scope="module")
def vision(tmp_path_factory) -> dict:
    """A Qwen2-VL processor, and 24 LLaVA records over 3 images (``llava_rows`` six times)."""
    root = tmp_path_factory.mktemp("vision_pipeline")
    data = write_llava_input(root / "in")
    write_jsonl(data, llava_rows() * 6)
    return {"root": root, "processor": str(build_qwen2vl(root / "qwen2vl")), "data": data}


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def pack(vision: dict, out: Path, inputs: list | None = None, **options) -> dict[str, bytes]:
    """``run_pack`` in this process; the output's files (``out`` is moved away, so that the next run
    writes to the same path: the path is in the manifest)."""
    values = {"inputs": [str(i) for i in inputs or [vision["data"]]], "output": str(out), "quiet": True,
              "processor": vision["processor"], "packed_sequence_size": N, **options}  # fmt: skip
    run_pack(PackOptions.from_dict(values), progress=False)
    out_files = files(out)
    if (out / "errors.jsonl").exists():  # kept beside, for the test to read
        shutil.copyfile(out / "errors.jsonl", out.parent / "errors.jsonl")
    shutil.rmtree(out)
    return out_files


def cli(vision: dict, out: Path, *flags, inputs: list | None = None, **kw):
    args = [*(inputs or [vision["data"]]), "-o", out, "--processor", vision["processor"],
            "--packed-sequence-size", N, *flags]  # fmt: skip
    return run_cli("pack", *map(str, args), check=False, **kw)


def record_step(path: str, step: str, n: int) -> None:
    """``progress.on_step`` (picklable: the local engine hands it to its workers): each step and the
    process it ran in."""
    with open(path, "a") as f:
        f.write(f"{step} {n} {os.getpid()}\n")


# 1. workers ---------------------------------------------------------------------------------------------


def test_workers_encode_vision_samples_and_write_the_bytes_of_one_process(vision, tmp_path, monkeypatch):
    one = pack(vision, tmp_path / "out", num_proc=1)
    steps = tmp_path / "steps.txt"
    monkeypatch.setattr(progress, "on_step", functools.partial(record_step, str(steps)))
    two = pack(vision, tmp_path / "out", num_proc=2, chunk_size=5)
    assert two == one  # the chunk size cuts the work only: same packs, same run id
    encoded_in = {int(line.split()[2]) for line in steps.read_text().splitlines() if "encode_chunk" in line}
    assert len(encoded_in) >= 1 and os.getpid() not in encoded_in  # the workers encoded the chunks
    assert sum("encode_chunk" in line for line in steps.read_text().splitlines()) == 5  # 24 records / 5


DRIVER_MODULES = (  # runs packtool's CLI, then says which heavy modules the driver process imported
    "import atexit, sys; from packtool.cli import main; "
    "atexit.register(lambda: print('imported:', *sorted({'transformers', 'torch'} & set(sys.modules)), "
    "file=sys.stderr)); main(sys.argv[1:])"
)


def test_the_driver_of_a_run_whose_workers_encode_never_loads_the_processor(vision, tmp_path):
    """transformers and torch (4 s of CPU, ~450 MB) are imported by the workers' forkserver only: the
    driver learns the run's identity from the worker that built the encoder first (the packs are those of
    one process: the test above)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    args = [vision["data"], "-o", tmp_path / "out", "--processor", vision["processor"],
            "--packed-sequence-size", N, "--num-proc", 2, "-q"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", DRIVER_MODULES, "pack", *map(str, args)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "imported:"
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["stats"]["num_samples"] == 24


def test_a_bad_processor_loaded_first_by_a_worker_is_the_same_one_line_usage_error(vision, tmp_path):
    """With workers, the processor is first loaded by one of them (the test above): its error is the one a
    process alone gives (tests/unit/vision/test_processor.py), exit 2, no output."""
    bad = tmp_path / "bad_processor"
    shutil.copytree(vision["processor"], bad)
    config = json.loads((bad / "preprocessor_config.json").read_text())
    (bad / "preprocessor_config.json").write_text(json.dumps({**config, "patch_size": 0}))
    out = tmp_path / "out"
    args = [vision["data"], "-o", out, "--processor", bad, "--packed-sequence-size", N, "--num-proc", 2]
    proc = run_cli("pack", *map(str, args), check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"packtool: error: processor {bad}: preprocessor_config.json field 'patch_size' is 0: "
        "must be positive"
    ]
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


# 2. resume ----------------------------------------------------------------------------------------------


def test_a_killed_vision_job_resumes_from_its_chunks_and_encodes_again_those_whose_images_changed(
    vision, tmp_path
):
    data = write_llava_input(tmp_path / "in")
    write_jsonl(data, llava_rows() * 6)  # one record a chunk: b.jpg is in records 1, 5, 9, ...
    out, flags = tmp_path / "out", ["--chunk-size", "1", "--num-proc", "1"]
    killed = cli(vision, out, *flags, "-q", inputs=[data], kill_at="encode:4")
    assert killed.returncode == -9 and not out.exists()
    replace_image(tmp_path / "in" / "images" / "b.jpg", seed=300)
    resumed = cli(vision, out, *flags, inputs=[data])
    assert resumed.returncode == 0, resumed.stderr
    assert "1 scratch chunk(s) of the interrupted run are not what was encoded (chunk 1" in resumed.stderr
    assert "resumed: 3 of 24 chunks" in resumed.stderr
    got = files(out)
    shutil.rmtree(out)
    assert pack(vision, out, inputs=[data]) == got  # as a run that never stopped, over the new image


# 4. inputs ----------------------------------------------------------------------------------------------


def test_every_input_kind_of_the_text_path_packs_vision_samples(vision, tmp_path):
    """The same records as compressed JSON Lines, a directory, Parquet holding the image bytes, a
    ``save_to_disk`` dataset with an ``Image`` column, and WebDataset captioning shards: each packs every
    image, the packs' images are the source's bytes."""
    import datasets  # slow to import: only this test makes datasets

    base = Path(vision["data"]).parent
    rows = llava_rows()
    gz = tmp_path / "data.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    (tmp_path / "images").symlink_to(base / "images")  # the paths resolve against the input's folder
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", rows[:2])
    write_jsonl(folder / "b.jsonl", rows[2:])
    (folder / "images").symlink_to(base / "images")

    def embedded(row: dict) -> dict:  # the image bytes in the record, as Parquet and datasets hold them
        names = row.get("image") or []
        names = names if isinstance(names, list) else [names]
        parts = [{"bytes": (base / n).read_bytes(), "path": n} for n in names]
        return {"conversations": row["conversations"], "images": parts}

    table = pa.Table.from_pylist([embedded(r) for r in rows])
    pq.write_table(table, tmp_path / "data.parquet")
    features = datasets.Features({
        "conversations": [{"from": datasets.Value("string"), "value": datasets.Value("string")}],
        "images": datasets.Sequence(datasets.Image()),
    })  # fmt: skip
    datasets.Dataset.from_list([embedded(r) for r in rows], features=features).save_to_disk(
        tmp_path / "saved"
    )
    tar = tmp_path / "captions.tar"
    with tarfile.open(tar, "w") as t:
        for i, name in enumerate(["a.png", "b.jpg", "c.webp"]):
            for ext, data in (
                (name.split(".")[1], (base / "images" / name).read_bytes()),
                ("txt", b"A cap."),
            ):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    wanted = sorted(part["bytes"] for r in rows for part in embedded(r)["images"])
    for source in (gz, folder, tmp_path / "data.parquet", tmp_path / "saved", tar):
        out = tmp_path / "out"
        values = {"inputs": [str(source)], "output": str(out), "packed_sequence_size": N,
                  "processor": vision["processor"], "quiet": True}  # fmt: skip
        run_pack(PackOptions.from_dict(values), progress=False)
        images = sorted(image["bytes"] for p in read_packs(out) for image in p["images"])
        shutil.rmtree(out)
        names = ("a.png", "b.jpg", "c.webp")
        expected = sorted((base / "images" / n).read_bytes() for n in names) if source == tar else wanted
        assert images == expected, source


def test_the_first_bad_record_is_named_when_a_later_line_is_not_json(vision, tmp_path):
    """The reader meets the malformed line 3 first; the error is still the first bad record's (line 2)."""
    data = write_llava_input(tmp_path / "in")
    rows = [json.dumps(r) for r in llava_rows()[:1]]
    rows += [
        json.dumps({"image": "images/nope.png", "conversations": [{"from": "human", "value": "<image>"}]})
    ]
    data.write_text("\n".join([*rows, "{not json", *rows[:1]]) + "\n")
    values = {"inputs": [str(data)], "output": str(tmp_path / "out"), "quiet": True,
              "processor": vision["processor"], "packed_sequence_size": N}  # fmt: skip
    with pytest.raises(InputError, match=r"line 2, field 'image': image 0 \(images/nope.png\)"):
        run_pack(PackOptions.from_dict(values), progress=False)


def test_an_image_that_is_no_regular_file_is_refused_at_once(vision, tmp_path):
    """A FIFO (reading it would wait for a writer for ever) and a link to a device (reading it would never
    end): each a bad record, named, and the run ends (the CLI, with a time limit, first)."""
    images = tmp_path / "images"
    images.mkdir()
    os.mkfifo(images / "fifo.png")
    (images / "zero.png").symlink_to("/dev/zero")
    one = llava_rows()[0]
    rows = [{**one, "image": "images/fifo.png"}, {**one, "image": "images/zero.png"}, llava_rows()[2]]
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    failed = cli(vision, tmp_path / "out", inputs=[data], timeout=120)
    assert failed.returncode == 3 and "line 1, field 'image': image 0 (images/fifo.png)" in failed.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.lock").exists()
    manifest = pack(vision, tmp_path / "out", inputs=[data], on_error="skip")["manifest.json"]
    assert json.loads(manifest)["stats"]["skipped_by_reason"] == {"bad_image": 2}
    (fifo, zero) = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert "image 0 (images/fifo.png): is a FIFO, not a regular file" in fifo["message"]
    assert "image 0 (images/zero.png): is a character device, not a regular file" in zero["message"]


# 5. and 6. images bound to the run ----------------------------------------------------------------------


def replace_image(path: Path, seed: int) -> None:
    """Another image of the same size in pixels and in bytes, moved over ``path`` (atomically)."""
    old = path.read_bytes()
    fmt = {".png": "PNG", ".jpg": "JPEG", ".webp": "WEBP"}[path.suffix]
    with Image.open(path) as image:
        size = image.size
    for s in range(seed, seed + 1000):
        new = image_bytes(*size, fmt, seed=s)
        if len(new) == len(old) and new != old:
            tmp = path.with_name("tmp" + path.suffix)
            tmp.write_bytes(new)
            os.replace(tmp, path)
            return
    raise AssertionError("no image of the same size found")


def replace_at(path: str, step: str, n: int) -> None:
    if (step, n) == ("write", 1):
        replace_image(Path(path), seed=100)


def test_an_image_replaced_while_the_run_reads_them_fails_the_run(vision, tmp_path, monkeypatch):
    data = write_llava_input(tmp_path / "in")
    monkeypatch.setattr(progress, "on_step", functools.partial(replace_at, str(tmp_path / "in/images/a.png")))
    options = {"inputs": [str(data)], "output": str(tmp_path / "out"), "processor": vision["processor"],
               "packed_sequence_size": N, "shard_size": 1, "num_proc": 1, "quiet": True}  # fmt: skip
    with pytest.raises(InputError) as e:
        run_pack(PackOptions.from_dict(options), progress=False)
    assert e.value.code == "input_changed" and "images/a.png" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_the_run_id_is_bound_to_the_image_bytes(vision, tmp_path):
    a, b = write_llava_input(tmp_path / "a"), write_llava_input(tmp_path / "b")
    replace_image(tmp_path / "b" / "images" / "a.png", seed=200)  # same name, size in pixels and bytes
    options = {"processor": vision["processor"], "packed_sequence_size": N, "quiet": True}
    for data, out in ((a, tmp_path / "out-a"), (b, tmp_path / "out-b")):
        run_pack(
            PackOptions.from_dict({**options, "inputs": [str(data)], "output": str(out)}), progress=False
        )
    run_a = json.loads((tmp_path / "out-a" / "manifest.json").read_text())["run_id"]
    run_b = json.loads((tmp_path / "out-b" / "manifest.json").read_text())["run_id"]
    assert run_a != run_b
    shard = "packs-000000.parquet"
    shutil.copyfile(tmp_path / "out-b" / shard, tmp_path / "out-a" / shard)  # b's images under a's manifest
    with pytest.raises(InputError):
        list(read_packs(tmp_path / "out-a"))


# 7. options resolved and checked once -------------------------------------------------------------------

NOT_FOR_VISION = [
    ({"add_eos": True}, "--add-eos does not apply to --sample-format vision"),
    ({"prompt_field": "q"}, "--prompt-field does not apply to --sample-format vision"),
    ({"mask_labels": True}, "--mask-labels does not apply to --sample-format vision"),
    ({"chat_template": "/nonexistent.jinja"}, "/nonexistent.jinja: no such file"),
]


@pytest.mark.parametrize("spelling", [{}, {"sample_format": "vision"}], ids=["auto", "vision"])
@pytest.mark.parametrize("options, message", NOT_FOR_VISION, ids=[next(iter(o)) for o, _ in NOT_FOR_VISION])
def test_an_option_vision_samples_do_not_take_is_a_usage_error(vision, tmp_path, spelling, options, message):
    values = {"inputs": [str(vision["data"])], "output": str(tmp_path / "out"), "quiet": True,
              "processor": vision["processor"], "packed_sequence_size": N, **spelling, **options}  # fmt: skip
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_pack(PackOptions.from_dict(values), progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_the_cli_says_a_usage_error_in_one_line_with_exit_2(vision, tmp_path):
    proc = cli(vision, tmp_path / "out", "--add-eos")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--add-eos does not apply to --sample-format vision" in proc.stderr


def test_loss_on_and_empty_loss_and_chat_template_are_honoured(vision, tmp_path):
    def labels(**options) -> list[list[int]]:
        out = tmp_path / "out"
        values = {"inputs": [str(vision["data"])], "output": str(out), "processor": vision["processor"],
                  "packed_sequence_size": N, "quiet": True, "strategy": "sequential", **options}  # fmt: skip
        run_pack(PackOptions.from_dict(values), progress=False)
        got = [np.asarray(p["labels"]).tolist() for p in read_packs(out)]
        shutil.rmtree(out)
        return got

    every_turn, last_turn, all_tokens = labels(), labels(loss_on="last"), labels(loss_on="all")
    trained = [sum(x != -100 for p in packs for x in p) for packs in (last_turn, every_turn, all_tokens)]
    assert trained[0] < trained[1] < trained[2]  # the two-turn samples train one turn less with "last"
    template = tmp_path / "plain.jinja"
    template.write_text(
        "{%- for m in messages -%}{{ m['role'] }}: {%- for p in m['content'] -%}"
        "{%- if p['type'] == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>"
        "{%- else -%}{{ p['text'] }}{%- endif -%}{%- endfor -%}\n{%- endfor -%}"
    )
    assert labels(chat_template=str(template), loss_on="all") != all_tokens  # another rendering


@pytest.mark.parametrize("policy", ["drop", "keep", "error"])
def test_a_sample_with_nothing_to_learn_follows_empty_loss(vision, tmp_path, policy):
    question = {"image": "images/a.png", "conversations": [{"from": "human", "value": "<image> Hm?"}]}
    data = write_jsonl(Path(vision["data"]).with_name("empty.jsonl"), [question, llava_rows()[0]])
    values = {"inputs": [str(data)], "output": str(tmp_path / "out"), "processor": vision["processor"],
              "packed_sequence_size": N, "quiet": True, "empty_loss": policy}  # fmt: skip
    if policy == "error":
        with pytest.raises(InputError, match="line 1.*no token to learn from"):
            run_pack(PackOptions.from_dict(values), progress=False)
        return
    manifest = run_pack(PackOptions.from_dict(values), progress=False)
    assert manifest.stats.empty_loss_samples == 1
    packed = [image for p in read_packs(tmp_path / "out") for image in p["images"]]
    assert len(packed) == (1 if policy == "drop" else 2)  # a dropped sample leaves with its image
    assert manifest.vision["packed_images"] == len(packed)
