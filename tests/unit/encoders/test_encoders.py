"""Built-in encoders (tokenizer, pretokenized) and the module:callable plugin path.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import hashlib
import json
import shutil

import pyarrow as pa
import pytest
import tokenizers

from packtool.encoders.base import TOKENS, shifted_labels
from packtool.encoders.registry import build_encoder
from packtool.encoders.text import add_special
from packtool.errors import ConfigError, InputError
from packtool.options import PackOptions
from packtool.pipeline.run import start_run
from packtool.readers.inputs import read_inputs
from tests.conftest import DEMO_TOKENIZER, write_jsonl

TEXTS = ["The quick brown fox.", "Attention is all you need!", "pack padding"]


def _encode(tmp_path, rows, **cfg):
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    config = PackOptions.from_dict({"inputs": [str(src)], "output": "o", "packed_sequence_size": 64, **cfg})
    batch = next(read_inputs([str(src)]))
    fmt = cfg.get("sample_format", "text")
    return build_encoder(config.encoding, fmt, config.packing.packed_sequence_size)(batch)


def test_text_encoder_matches_the_tokenizer(tmp_path):
    tok = tokenizers.Tokenizer.from_file(str(DEMO_TOKENIZER))
    out = _encode(tmp_path, [{"text": t} for t in TEXTS], tokenizer=str(DEMO_TOKENIZER))
    expected = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert out.column("input_ids").to_pylist() == expected
    assert out.column("labels").to_pylist() == [ids[1:] + [-100] for ids in expected]


def test_bos_eos_and_unshifted_labels(tmp_path):
    tok = tokenizers.Tokenizer.from_file(str(DEMO_TOKENIZER))
    out = _encode(
        tmp_path,
        [{"body": t} for t in TEXTS],
        tokenizer=str(DEMO_TOKENIZER),
        text_field="body",
        add_bos=True,
        add_eos=True,
        labels="unshifted",
    )
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|endoftext|>")
    expected = [[bos] + tok.encode(t, add_special_tokens=False).ids + [eos] for t in TEXTS]
    assert out.column("input_ids").to_pylist() == expected
    assert out.column("labels").to_pylist() == expected


def test_named_eos_token_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="not in the vocabulary"):
        _encode(tmp_path, [{"text": "x"}], tokenizer=str(DEMO_TOKENIZER), add_eos=True, eos_token="<nope>")


def test_add_special_and_shifted_labels_are_vectorized_correctly():
    ids = pa.array([[5, 6], [], [7]], type=TOKENS)
    assert add_special(ids, 1, 2).to_pylist() == [[1, 5, 6, 2], [], [1, 7, 2]]
    assert add_special(ids, None, 2).to_pylist() == [[5, 6, 2], [], [7, 2]]
    assert shifted_labels(ids).to_pylist() == [[6, -100], [], [-100]]


def test_model_directory_through_auto_tokenizer(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(DEMO_TOKENIZER, model / "tokenizer.json")
    (model / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None}
        )
    )
    tok = tokenizers.Tokenizer.from_file(str(DEMO_TOKENIZER))
    out = _encode(tmp_path, [{"text": t} for t in TEXTS], tokenizer=str(model), add_eos=True)
    eos = tok.token_to_id("<|endoftext|>")
    assert out.column("input_ids").to_pylist() == [
        tok.encode(t, add_special_tokens=False).ids + [eos] for t in TEXTS
    ]


@pytest.mark.parametrize("where", ["tokenizer_config.json", "config.json"])
def test_a_directory_whose_tokenizer_is_its_own_code_is_refused_before_transformers_asks(
    tmp_path, capfd, where
):
    """``auto_map`` sends AutoTokenizer to code shipped in the directory: transformers would print "Do you
    wish to run the custom code? [y/N]" and wait for the terminal before refusing. packtool refuses first,
    in one line naming the way out, and the code never runs."""
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(DEMO_TOKENIZER, model / "tokenizer.json")
    (model / "tokenization_mine.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    auto_map = {"auto_map": {"AutoTokenizer": ["tokenization_mine.MineTokenizer", None]}}
    (model / where).write_text(json.dumps({"tokenizer_class": "MineTokenizer", **auto_map}))
    with pytest.raises(ConfigError) as e:
        _encode(tmp_path, [{"text": t} for t in TEXTS], tokenizer=str(model))
    assert str(e.value) == (
        f"tokenizer {model}: its {where} maps AutoTokenizer to code in the directory (auto_map: "
        f"tokenization_mine.MineTokenizer), which packtool does not run; pass {model / 'tokenizer.json'} "
        "instead (the fast tokenizer alone: no code), or wrap the tokenizer in a module:callable encoder "
        "you trust"
    )
    assert "custom code" not in "".join(capfd.readouterr()) and not (tmp_path / "ran").exists()


def test_pretokenized_keeps_labels_and_loss_mask(tmp_path):
    rows = [
        {"input_ids": [1, 2, 3], "labels": [2, 3, -100], "loss_mask": [0, 1, 1]},
        {"input_ids": [4], "labels": [-100], "loss_mask": [1]},
    ]
    out = _encode(tmp_path, rows, sample_format="pretokenized")
    assert out.column("labels").to_pylist() == [[2, 3, -100], [-100]]
    assert out.column("loss_mask").to_pylist() == [[0, 1, 1], [1]]
    assert out.column("input_ids").type == TOKENS


def test_pretokenized_errors_name_row_and_field(tmp_path):
    with pytest.raises(InputError, match=r"line 2, field 'labels': has 1 values but input_ids has 2"):
        _encode(
            tmp_path,
            [{"input_ids": [1], "labels": [1]}, {"input_ids": [1, 2], "labels": [1]}],
            sample_format="pretokenized",
        )
    with pytest.raises(InputError, match=r"line 1, field 'input_ids': value 9999999999 does not fit"):
        _encode(tmp_path, [{"input_ids": [9999999999]}], sample_format="pretokenized")
    with pytest.raises(InputError, match=r"line 2, field 'input_ids': token id outside the vocabulary"):
        _encode(
            tmp_path,
            [{"input_ids": [1]}, {"input_ids": [5, 100000]}],
            sample_format="pretokenized",
            tokenizer=str(DEMO_TOKENIZER),
        )


def test_pretokenized_loss_mask_accepts_bools(tmp_path):
    rows = [{"input_ids": [1, 2, 3], "labels": [2, 3, -100], "loss_mask": [True, False, True]}]
    out = _encode(tmp_path, rows, sample_format="pretokenized")
    assert out.column("loss_mask").to_pylist() == [[1, 0, 1]]


def test_pretokenized_labels_keep_ignore_index(tmp_path):
    rows = [{"input_ids": [1, 2, 3], "labels": [-100, 3, -100]}]
    out = _encode(tmp_path, rows, sample_format="pretokenized", tokenizer=str(DEMO_TOKENIZER))
    assert out.column("labels").to_pylist() == [[-100, 3, -100]]


@pytest.mark.parametrize(
    "convention,labels,mask",
    [("shifted", [[-100, 3, -100], [6, -100]], [[0, 1, 0], [1, 0]]),
     ("unshifted", [[1, -100, 3], [5, 6]], [[1, 0, 1], [1, 1]])],
)  # fmt: skip
def test_pretokenized_loss_mask_without_labels_decides_the_labels(tmp_path, convention, labels, mask):
    """A loss_mask over input_ids marks the tokens to learn, as in prompt_completion/chat: labels are -100
    wherever no loss is taken, and the stored loss_mask is exactly labels != -100."""
    rows = [{"input_ids": [1, 2, 3], "loss_mask": [1, 0, 1]}, {"input_ids": [5, 6], "loss_mask": [1, 1]}]
    out = _encode(tmp_path, rows, sample_format="pretokenized", labels=convention)
    assert out.column("labels").to_pylist() == labels
    assert out.column("loss_mask").to_pylist() == mask


VOCAB_ENCODER = """
from pathlib import Path

VOCAB = Path(__file__).with_name("vocab.txt")


def encode(records):
    shift = int(VOCAB.read_text())
    return {"input_ids": [[shift + len(w) for w in t.split()] for t in records["text"]]}
encode.vocab_size = 40
"""


def _identity(tmp_path) -> dict:
    """The identity a run of ``tmp_path/enc.py:encode`` over ``tmp_path/in.jsonl`` records."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS])
    config = PackOptions.from_dict({"inputs": [str(src)], "output": "o", "packed_sequence_size": 64,
                                    "tokenizer": f"{tmp_path / 'enc.py'}:encode"})  # fmt: skip
    return start_run(config, "text", first=next(read_inputs([str(src)], lazy=True)))[1].identity


def test_a_custom_encoders_identity_holds_its_code_and_what_it_makes(tmp_path):
    """The identity a resumed run compares: the module file's sha256 (an edited encoder) and a digest of
    its output on the run's first records (a changed file it reads); before, only the spec's text."""
    plugin = tmp_path / "enc.py"
    plugin.write_text(VOCAB_ENCODER)
    (tmp_path / "vocab.txt").write_text("1")
    first = _identity(tmp_path)
    assert first["sha256"] == hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert first["vocab_size"] == 40 and _identity(tmp_path) == first  # (the same code and data: the same)
    (tmp_path / "vocab.txt").write_text("7")
    data_changed = _identity(tmp_path)
    assert data_changed["probe_sha256"] != first["probe_sha256"] and data_changed["sha256"] == first["sha256"]
    plugin.write_text(VOCAB_ENCODER + "\n# edited\n")
    assert _identity(tmp_path)["sha256"] != first["sha256"]


def test_a_custom_encoders_declared_vocab_size_bounds_its_ids(tmp_path):
    plugin = tmp_path / "enc.py"
    plugin.write_text(VOCAB_ENCODER)
    (tmp_path / "vocab.txt").write_text("39")  # 39 + a word's length: past the 40 it declares
    with pytest.raises(InputError, match=r"token id outside the vocabulary \(size 40\)"):
        _encode(tmp_path, [{"text": t} for t in TEXTS], tokenizer=f"{plugin}:encode")
