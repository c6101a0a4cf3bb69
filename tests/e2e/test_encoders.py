"""Built-in encoders (tokenizer, pretokenized) and the module:callable plugin path.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tokenizers

from packtool import read_packs
from packtool.encoders.registry import build_encoder
from packtool.errors import InputError
from packtool.options import PackOptions
from packtool.readers.inputs import read_inputs
from tests.conftest import DEMO_TOKENIZER, manifest_json, run_cli, write_jsonl

TEXTS = ["The quick brown fox.", "Attention is all you need!", "pack padding"]


def _encode(tmp_path, rows, **cfg):
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    config = PackOptions.from_dict({"inputs": [str(src)], "output": "o", "packed_sequence_size": 64, **cfg})
    batch = next(read_inputs([str(src)]))
    fmt = cfg.get("sample_format", "text")
    return build_encoder(config.encoding, fmt, config.packing.packed_sequence_size)(batch)


PLUGIN = '''
import numpy as np

def encode(records):
    """Byte-level encoder: one token per UTF-8 byte, +1 so that 0 stays the pad id."""
    ids = [list(np.frombuffer(t.encode(), dtype=np.uint8).astype(int) + 1) for t in records["text"]]
    return {"input_ids": ids}

class Shouter:
    def __init__(self, offset=1000):
        self.offset = offset

    def __call__(self, records):
        return {"input_ids": [[self.offset + len(t)] for t in records["text"]],
                "labels": [[7] for _ in records["text"]]}
'''


def test_plugin_encoder_from_a_file_via_the_cli(tmp_path):
    (tmp_path / "my_encoder.py").write_text(PLUGIN)
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS])
    out = tmp_path / "out"
    run_cli(
        "pack",
        src,
        "-o",
        out,
        "--tokenizer",
        f"{tmp_path / 'my_encoder.py'}:encode",
        "--packed-sequence-size",
        128,
        "--strategy",
        "sequential",
        "-q",
    )
    pack = next(read_packs(out))
    expected = [b + 1 for t in TEXTS for b in t.encode()]
    assert pack["input_ids"][: len(expected)].tolist() == expected
    assert manifest_json(out)["tokenizer"]["kind"] == "custom"


def test_plugin_class_by_module_name_with_kwargs(tmp_path):
    (tmp_path / "shout_enc.py").write_text(PLUGIN)
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS])
    (tmp_path / "cfg.yaml").write_text(
        f"inputs: [{src}]\noutput: {tmp_path / 'out'}\n"
        "tokenizer: shout_enc:Shouter\nencoder_kwargs: {offset: 50}\n"
        "packed_sequence_size: 8\nstrategy: sequential\n"
    )
    run_cli("pack", "--config", tmp_path / "cfg.yaml", "-q", env={"PYTHONPATH": f"{tmp_path}"}, cwd=tmp_path)
    pack = next(read_packs(tmp_path / "out"))
    assert pack["input_ids"][:3].tolist() == [50 + len(t) for t in TEXTS]
    assert pack["labels"][:3].tolist() == [7, 7, 7]


def test_bad_tokenizer_specs_fail_with_one_line(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    (tmp_path / "broken.json").write_text("{not json")
    for spec, message in [
        (tmp_path / "broken.json", "not a loadable tokenizer.json"),
        (tmp_path / "missing.json", "no such file or directory"),
        ("no_such_module_xyz:encode", "cannot import no_such_module_xyz"),
    ]:
        proc = run_cli(
            "pack", src, "-o", tmp_path / "out", "--tokenizer", spec, "--packed-sequence-size", 8, check=False
        )
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_lengths_are_what_the_packs_hold(tmp_path):
    rows = [{"text": t} for t in TEXTS * 5]
    out = tmp_path / "out"
    run_cli(
        "pack",
        write_jsonl(tmp_path / "in.jsonl", rows),
        "-o",
        out,
        "--tokenizer",
        DEMO_TOKENIZER,
        "--packed-sequence-size",
        16,
        "--split-across-pack",
        "--strategy",
        "sequential",
        "-q",
    )
    tok = tokenizers.Tokenizer.from_file(str(DEMO_TOKENIZER))
    stream = np.concatenate([tok.encode(r["text"], add_special_tokens=False).ids for r in rows])
    packed = np.concatenate([p["input_ids"] for p in read_packs(out)])[: len(stream)]
    np.testing.assert_array_equal(packed, stream)


@pytest.mark.parametrize("bad", [300, 7, -1])
def test_pretokenized_loss_mask_must_be_0_or_1(tmp_path, bad):
    rows = [
        {"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1]},
        {"input_ids": [1, 2, 3], "loss_mask": [1, 0, bad]},
    ]
    with pytest.raises(InputError, match=rf"line 2, field 'loss_mask': expected 0 or 1, got {bad}"):
        _encode(tmp_path, rows, sample_format="pretokenized")
    out = tmp_path / "o"
    proc = run_cli("pack", tmp_path / "in.jsonl", "-o", out, "--packed-sequence-size", 8, "-q", check=False)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "line 2, field 'loss_mask'" in proc.stderr
    run_cli("pack", tmp_path / "in.jsonl", "-o", out, "--packed-sequence-size", 8, "--on-error", "skip", "-q")
    stats = manifest_json(out)["stats"]
    assert stats["skipped_by_reason"] == {"bad_loss_mask": 1} and stats["num_samples"] == 1


@pytest.mark.parametrize("bad", [-5, 99999, -101])
def test_pretokenized_labels_must_be_ignore_index_or_a_token_id(tmp_path, bad):
    rows = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [1, 2], "labels": [1, bad]}]
    with pytest.raises(InputError, match=rf"line 2, field 'labels': .*{bad}"):
        _encode(tmp_path, rows, sample_format="pretokenized", tokenizer=str(DEMO_TOKENIZER))
    if bad < 0:  # without a tokenizer only the sign can be checked
        with pytest.raises(InputError, match=rf"line 2, field 'labels': .*{bad}"):
            _encode(tmp_path, rows, sample_format="pretokenized")
    out = tmp_path / "o"
    args = (
        "pack",
        tmp_path / "in.jsonl",
        "-o",
        out,
        "--packed-sequence-size",
        64,
        "--tokenizer",
        DEMO_TOKENIZER,
    )
    proc = run_cli(*args, check=False)
    assert proc.returncode == 3 and "line 2, field 'labels'" in proc.stderr, proc.stderr
    run_cli(*args, "--on-error", "skip", "-q")
    stats = manifest_json(out)["stats"]
    assert sum(stats["skipped_by_reason"].values()) == 1 and stats["num_samples"] == 1


def test_pretokenized_attention_mask_strips_padding_and_other_token_fields_are_named(tmp_path):
    """A tokenizer's padded output (attention_mask 0 on padding) packs only the real tokens; a record with
    no attention_mask keeps all of its tokens; list fields the packs do not hold are named in a warning."""
    rows = [
        {"input_ids": [1, 2, 3, 0, 0], "attention_mask": [1, 1, 1, 0, 0], "token_type_ids": [0] * 5},
        {"input_ids": [4, 5], "token_type_ids": [0, 0]},
        {"input_ids": [6, 7, 0], "attention_mask": [1, 1, 0], "token_type_ids": [0, 0, 0]},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    args = ["--packed-sequence-size", 16, "--strategy", "sequential", "-q"]
    proc = run_cli("pack", src, "-o", tmp_path / "out", *args)
    assert (
        "packtool: warning: field(s) token_type_ids hold a list per record and are not packed" in proc.stderr
    )
    inspected = json.loads(run_cli("inspect", tmp_path / "out", "--json").stdout)
    assert any(w.startswith("lost: field(s) token_type_ids hold a list") for w in inspected["warnings"])
    (pack,) = read_packs(tmp_path / "out")
    assert pack["input_ids"][:7].tolist() == [1, 2, 3, 4, 5, 6, 7] and pack["seq_lens"].tolist() == [
        3,
        2,
        2,
        9,
    ]
    assert pack["labels"][:7].tolist() == [2, 3, -100, 5, -100, 7, -100]  # shifted within the real tokens
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"input_ids": [1, 2], "attention_mask": [1]}])
    proc = run_cli("pack", bad, "-o", tmp_path / "o2", "--packed-sequence-size", 16, check=False)
    assert (
        proc.returncode == 3
        and "line 1, field 'attention_mask': has 1 values but input_ids has 2" in proc.stderr
    )


def test_mask_labels_writes_ignore_index_where_loss_mask_is_0(tmp_path):
    """NeMo AutoModel's convention, on request: given labels and loss_mask, -100 where the mask is 0."""
    rows = [{"input_ids": [5, 6, 7, 8], "labels": [6, 7, 8, 9], "loss_mask": [0, 1, 1, 0]}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    for flag, want in (("--no-mask-labels", [6, 7, 8, 9]), ("--mask-labels", [-100, 7, 8, -100])):
        out = tmp_path / flag.strip("-")
        run_cli("pack", src, "-o", out, "--packed-sequence-size", 8, flag, "-q")
        (pack,) = read_packs(out)
        assert pack["labels"][:4].tolist() == want and pack["loss_mask"][:4].tolist() == [0, 1, 1, 0]
    text = write_jsonl(tmp_path / "t.jsonl", [{"text": "a b"}])
    args = ["--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", 8, "--mask-labels"]
    proc = run_cli("pack", text, "-o", tmp_path / "t", *args, check=False)
    assert proc.returncode == 2 and "--mask-labels does not apply to --sample-format text" in proc.stderr
