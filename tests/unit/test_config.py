"""PackConfig: conflicting options are a usage error naming both; config file paths are the file's."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.config import PackConfig, load_config_file
from packtool.errors import ConfigError
from packtool.plugins import load_plugin
from tests.conftest import DEMO_TOKENIZER


def _cfg(**kw) -> PackConfig:
    return PackConfig(**{"inputs": ["x.jsonl"], "output": "out", "packed_sequence_size": 64, **kw})


@pytest.mark.parametrize(
    ("options", "sample_format", "message"),
    [
        ({"split_across_pack": True, "long_samples": "truncate"}, "auto",
         "--long-samples truncate and --split-across-pack on conflict"),
        ({"split_across_pack": True, "long_samples": "drop"}, "auto",
         "--long-samples drop and --split-across-pack on conflict"),
        ({"shard_max_bytes": 1000}, "auto", "--shard-max-bytes 1000 and --format parquet conflict"),
        ({"format": "webdataset", "row_group_size": 16}, "auto",
         "--row-group-size 16 and --format webdataset conflict"),
        ({"energon_index": False}, "auto", "--energon-index off and --format parquet conflict"),
        ({"ray_address": "auto"}, "auto", "--ray-address auto and --engine local conflict"),
        ({"strategy": "sequential", "packing_buffer_size": 100}, "auto",
         "--packing-buffer-size 100 and --strategy sequential conflict"),
        ({"strategy": "sequential", "seed": 3}, "auto", "--seed 3 and --strategy sequential conflict"),
        ({"strategy": "my_policy:select", "split_across_pack": True}, "auto",
         "--split-across-pack on and --strategy my_policy:select conflict"),
        ({"eos_token": "</s>"}, "auto", "--eos-token </s> and --add-eos off conflict"),
        ({"bos_token": "<s>"}, "auto", "--bos-token <s> and --add-bos off conflict"),
        ({"chat_template": "t.jinja"}, "text", "--chat-template t.jinja and --sample-format text conflict"),
        ({"loss_on": "last"}, "prompt_completion", "--loss-on last and --sample-format prompt-completion"),
        ({"train_on_prompt": True}, "chat", "--train-on-prompt on and --sample-format chat conflict"),
        ({"prompt_template": "alpaca"}, "pretokenized", "--prompt-template alpaca and --sample-format"),
        ({"empty_loss": "keep"}, "text", "--empty-loss keep and --sample-format text conflict"),
        ({"cp_size": 2, "split_across_pack": True}, "auto",
         "--cp-size 2 and --split-across-pack on conflict"),
        ({"cp_size": 2, "strategy": "my_policy:select"}, "auto",
         "--cp-size 2 and --strategy my_policy:select conflict"),
    ],
)  # fmt: skip
def test_conflicting_options_name_both(options, sample_format, message):
    with pytest.raises(ConfigError, match="^" + message.replace("$", r"\$")):
        _cfg(**options).check_conflicts(sample_format)


def test_options_that_go_together_pass():
    _cfg(split_across_pack=True).validate()
    _cfg(long_samples="truncate").validate()
    _cfg(format="webdataset", shard_max_bytes=10**6).validate()
    _cfg(add_eos=True, eos_token="</s>").validate()
    _cfg(strategy="bfd", seed=3, packing_buffer_size=100).validate()
    _cfg(empty_loss="keep", loss_on="last").check_conflicts("chat")
    _cfg(chat_template="t.jinja").check_conflicts("auto")  # the input decides the format later


def test_cp_size_needs_packs_a_multiple_of_twice_it():
    _cfg(cp_size=4, long_samples="split").validate()  # 64 = 8 x 8
    with pytest.raises(ConfigError, match="^packed_sequence_size 64 is not a multiple of 2 x cp_size "):
        _cfg(cp_size=3).validate()


def test_val_fraction_takes_a_fraction_and_lets_the_seed_choose():
    _cfg(val_fraction=0).validate()  # a config file's 0
    _cfg(strategy="sequential", seed=3, val_fraction=0.05).validate()  # the seed picks the held-out packs
    for bad in (True, "0.1"):
        with pytest.raises(ConfigError, match="^val_fraction must be float"):
            _cfg(val_fraction=bad).validate()
    with pytest.raises(ConfigError, match="^--seed 3 and --strategy sequential conflict"):
        _cfg(strategy="sequential", seed=3).validate()


def test_validate_checks_conflicts():
    with pytest.raises(ConfigError, match="--long-samples drop and --split-across-pack on conflict"):
        _cfg(split_across_pack=True, long_samples="drop").validate()


def test_config_file_paths_are_relative_to_the_file(tmp_path: Path):
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "run.yaml"
    path.write_text(
        "inputs: [../data/a.jsonl, 'hf:org/set', /abs/b.jsonl]\noutput: ../out/run\n"
        "tokenizer: ../tok/tokenizer.json\nchat_template: t.jinja\nstrategy: policy.py:select\n"
    )
    values = load_config_file(path)
    base = tmp_path / "configs"
    assert values["inputs"] == [str(tmp_path / "data/a.jsonl"), "hf:org/set", "/abs/b.jsonl"]
    assert values["output"] == str(tmp_path / "out/run")
    assert values["tokenizer"] == str(tmp_path / "tok/tokenizer.json")
    assert values["chat_template"] == str(base / "t.jinja")
    assert values["strategy"] == f"{base / 'policy.py'}:select"


def test_config_file_keeps_names_that_are_not_paths(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text("strategy: sequential\ntokenizer: my_encoders:encode\n")
    assert load_config_file(path) == {"strategy": "sequential", "tokenizer": "my_encoders:encode"}


def test_a_module_in_the_working_directory_is_named_with_its_path(tmp_path: Path, monkeypatch):
    (tmp_path / "cl100k_enc.py").write_text("def encode(texts):\n    return {'input_ids': []}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"\./cl100k_enc\.py is in the working directory: name it "
                       r"\./cl100k_enc\.py:encode"):  # fmt: skip
        load_plugin("cl100k_enc:encode", "tokenizer")
    assert callable(load_plugin("./cl100k_enc.py:encode", "tokenizer"))


def test_num_proc_defaults_to_the_cores_for_inputs_worth_it(tmp_path: Path):
    from packtool.pipeline.engines import SMALL_INPUT_BYTES, resolve_num_proc

    cores = len(os.sched_getaffinity(0))
    small = tmp_path / "small.jsonl"
    small.write_text('{"text": "a"}\n')
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:  # sparse: the size is what counts
        f.truncate(SMALL_INPUT_BYTES)
    assert resolve_num_proc(_cfg(inputs=[str(small)])) == 1
    assert resolve_num_proc(_cfg(inputs=[str(tmp_path / "*.jsonl")])) == cores
    assert resolve_num_proc(_cfg(inputs=[str(tmp_path)])) == cores
    assert resolve_num_proc(_cfg(inputs=["hf:org/set"])) == cores
    assert resolve_num_proc(_cfg(inputs=[str(big)], num_proc=3)) == 3
    # pretokenized Parquet is written by the driver's threads: nothing to start, so the cores at any size
    tiny = tmp_path / "tiny.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2]]}), tiny)
    assert resolve_num_proc(_cfg(inputs=[str(tiny)])) == cores
    assert resolve_num_proc(_cfg(inputs=[str(tiny)], tokenizer=DEMO_TOKENIZER)) == 1  # text: workers
