"""PackOptions: an option that does not apply, a bad value or a conflict is a usage error naming it; a
config file's errors name the file and line, and its paths are the file's."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.config_file import load_config_file
from packtool.errors import ConfigError
from packtool.options import PackOptions
from packtool.plugins import load_plugin
from tests.conftest import DEMO_TOKENIZER


def _cfg(**kw) -> PackOptions:
    return PackOptions.of(**{"inputs": ["x.jsonl"], "output": "out", "packed_sequence_size": 64, **kw})


# an option whose group does not apply to the choice in effect: a usage error naming it (structure)
@pytest.mark.parametrize(
    ("options", "sample_format", "message"),
    [
        ({"shard_max_bytes": 1000}, None,
         "--shard-max-bytes does not apply to --format parquet: it is for --format webdataset"),
        ({"format": "webdataset",
         "row_group_size": 16}, None, "--row-group-size does not apply to --format webdataset"),
        ({"energon_index": False}, None, "--energon-index does not apply to --format parquet"),
        ({"ray_address": "auto"}, None,
         "--ray-address does not apply to --engine local: it is for --engine ray"),
        ({"strategy": "sequential", "packing_buffer_size": 100}, None,
         "--packing-buffer-size does not apply to --strategy sequential: it is for --strategy bfd or custom"),
        ({"strategy": "sequential",
         "shuffle_packs": False}, None, "--shuffle-packs does not apply to --strategy sequential"),
        ({"chat_template": "t.jinja"},
         "text", "--chat-template does not apply to --sample-format text: it is for --sample-format chat"),
        ({"loss_on": "last"},
         "prompt_completion", "--loss-on does not apply to --sample-format prompt-completion"),
        ({"train_on_prompt": True}, "chat", "--train-on-prompt does not apply to --sample-format chat"),
        ({"prompt_template": "alpaca"},
         "pretokenized", "--prompt-template does not apply to --sample-format pretokenized"),
        ({"empty_loss": "keep"}, "text", "--empty-loss does not apply to --sample-format text"),
        ({"mask_labels": True}, "text", "--mask-labels does not apply to --sample-format text"),
        ({"add_eos": True}, "chat", "--add-eos does not apply to --sample-format chat"),
        ({"add_eos": True,
         "sample_format": "pretokenized"}, None, "--add-eos does not apply to --sample-format pretokenized"),
    ],
)  # fmt: skip
def test_an_option_that_does_not_apply_is_a_usage_error_naming_it(options, sample_format, message):
    with pytest.raises(ConfigError, match="^" + message):
        _cfg(**options).check(sample_format)


# what structure cannot say (two options' values): each remaining conflict names both
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"split_across_pack": True,
         "long_samples": "truncate"}, "--long-samples truncate and --split-across-pack on conflict"),
        ({"strategy": "sequential", "seed": 3}, "--seed 3 and --strategy sequential conflict"),
        ({"shuffle_packs": False, "seed": 3}, "--seed 3 and --shuffle-packs off conflict"),
        ({"strategy": "my_policy:select",
         "split_across_pack": True}, "--split-across-pack on and --strategy my_policy:select conflict"),
        ({"strategy": "my_policy:select",
         "long_samples": "split"}, "--long-samples split and --strategy my_policy:select conflict"),
        ({"eos_token": "</s>"}, "--eos-token </s> and --add-eos off conflict"),
        ({"bos_token": "<s>"}, "--bos-token <s> and --add-bos off conflict"),
        ({"cp_size": 2, "split_across_pack": True}, "--cp-size 2 and --split-across-pack on conflict"),
        ({"cp_size": 2,
         "strategy": "my_policy:select"}, "--cp-size 2 and --strategy my_policy:select conflict"),
    ],
)  # fmt: skip
def test_conflicts_structure_cannot_express_name_both(options, message):
    with pytest.raises(ConfigError, match="^" + message):
        _cfg(**options)


def test_options_that_go_together_pass():
    _cfg(split_across_pack=True)
    _cfg(long_samples="truncate")
    _cfg(format="webdataset", shard_max_bytes=10**6)
    _cfg(add_eos=True, eos_token="</s>")
    _cfg(strategy="bfd", seed=3, packing_buffer_size=100)
    _cfg(strategy="my_policy:select", seed=3, packing_buffer_size=100)  # a policy is handed the seed
    _cfg(empty_loss="keep", loss_on="last").check("chat")
    _cfg(chat_template="t.jinja").check("auto")  # the input decides the format later
    # a default is never a conflict: only what the user set is checked
    PackOptions.from_dict({"format": "webdataset", "row_group_size": 128}, given={"format"})


def test_unknown_keys_and_bad_values_name_the_key():
    with pytest.raises(
        ConfigError, match="unknown key 'packed_sequence_sise'; did you mean 'packed_sequence_size'"
    ):
        _cfg(packed_sequence_sise=4)
    for key, value, message in [
        ("seed", -1, "seed must be at least 0, got -1"),
        ("pad_token_id", 2**31, "pad_token_id must be at least 0 and at most 2147483647, got 2147483648"),
        ("packed_sequence_size", 2**25, "packed_sequence_size must be a positive integer at most 16777216"),
        ("inputs", 5, "inputs must be a list, got 5"),
        ("inputs", [["in.jsonl"]], r"inputs must be a string \(item 0 of the list\)"),
        ("strategy", 3, "strategy must be a string, got 3"),
        ("long_samples", "cut", "long_samples must be one of error, drop, truncate, split, got 'cut'"),
        ("shard_size", True, "shard_size must be a positive integer, got True"),
    ]:
        with pytest.raises(ConfigError, match="^" + message):
            _cfg(**{key: value})


def test_cp_size_needs_packs_a_multiple_of_twice_it():
    _cfg(cp_size=4, long_samples="split")  # 64 = 8 x 8
    with pytest.raises(ConfigError, match="^packed_sequence_size 64 is not a multiple of 2 x cp_size "):
        _cfg(cp_size=3)


def test_val_fraction_takes_a_fraction_and_lets_the_seed_choose():
    _cfg(val_fraction=0)  # a config file's 0
    _cfg(strategy="sequential", seed=3, val_fraction=0.05)  # the seed picks the held-out packs
    for bad in (True, "0.1", 1.0):
        with pytest.raises(ConfigError, match="^val_fraction must be (a number )?at least 0 and below 1"):
            _cfg(val_fraction=bad)


def test_the_provenance_record_rebuilds_the_options_and_ignores_unknown_keys():
    options = _cfg(format="webdataset", strategy="sequential")
    record = {**options.to_dict(include_runtime=False), "future_option": 1}
    again = PackOptions.from_provenance(record)
    assert again.to_dict(include_runtime=False) == options.to_dict(include_runtime=False)


def test_a_config_file_is_checked_against_the_flags_only_once_they_are_in(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text("packed_sequence_size: 64\neos_token: </s>\n")  # --add-eos comes on the command line
    assert load_config_file(path)["eos_token"] == "</s>"


def test_config_file_errors_name_the_file_and_line(tmp_path: Path):
    cases = {
        "aliases": (
            "a: &x [1, 2]\nb: &y [*x, *x]\ninputs: *y\n",
            "aliases.yaml:2: not valid YAML: YAML aliases",
        ),
        "indent": ("packed_sequence_size: 64\n  strategy: bfd\n", "indent.yaml:2: not valid YAML"),
        "bytes": (bytes(range(256)) * 4, "bytes.yaml: not a YAML config file"),
        "typo": ("packed-sequence-sise: 64\n", "typo.yaml: unknown key 'packed_sequence_sise'; did you mean"),
        "inputs": ("inputs: 5\n", "inputs.yaml: inputs must be a list, got 5"),
        "nested": ("inputs: [[in.jsonl]]\n", r"nested.yaml: inputs must be a string \(item 0"),
        "list": ("- 1\n", "list.yaml: a config file must be a mapping"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(ConfigError, match=message):
            load_config_file(path)


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
    assert resolve_num_proc(_cfg(inputs=[str(small)]).to_dict()) == 1
    assert resolve_num_proc(_cfg(inputs=[str(tmp_path / "*.jsonl")]).to_dict()) == cores
    assert resolve_num_proc(_cfg(inputs=[str(tmp_path)]).to_dict()) == cores
    assert resolve_num_proc(_cfg(inputs=["hf:org/set"]).to_dict()) == cores
    assert resolve_num_proc(_cfg(inputs=[str(big)], num_proc=3).to_dict()) == 3
    # pretokenized Parquet is written by the driver's threads: nothing to start, so the cores at any size
    tiny = tmp_path / "tiny.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2]]}), tiny)
    assert resolve_num_proc(_cfg(inputs=[str(tiny)]).to_dict()) == cores
    assert (
        resolve_num_proc(_cfg(inputs=[str(tiny)], tokenizer=str(DEMO_TOKENIZER)).to_dict()) == 1
    )  # text: workers


def test_a_choice_in_the_flags_spelling_is_the_declared_choice():
    """Flags spell values with ``-`` (``--help``: "For --sample-format prompt-completion"); Python callers
    and config files may write either, and the options hold the declared one."""
    opts = PackOptions.of(inputs=["x"], sample_format="prompt-completion", packed_sequence_size=8)
    assert opts.encoding.sample_format == "prompt_completion"
    assert opts.to_dict()["sample_format"] == "prompt_completion"
    with pytest.raises(ConfigError, match="sample_format must be one of .* got 'prompt completion'"):
        PackOptions.of(inputs=["x"], sample_format="prompt completion")
