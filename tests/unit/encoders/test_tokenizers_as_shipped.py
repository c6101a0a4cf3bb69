"""Tokenizers as people ship them: their own truncation, padding and length limit never cut a sample.

Three small tokenizers are built here, one per family (WordPiece, byte-level BPE, Metaspace + Unigram),
each saved with ``truncation`` and ``padding`` set (as sentence-transformers exports and many Hub
tokenizers do), both as a ``tokenizer.json`` and as a model directory with a ``model_max_length`` that
``transformers.AutoTokenizer`` loads. Text, prompt/completion and chat records longer than those limits
are packed; every sample's tokens must arrive whole: exactly what the same tokenizer gives with no limit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from packtool import read_packs, run_pack
from packtool.options import PackOptions
from tests.conftest import manifest_json, write_jsonl

LIMIT = 16  # the shipped tokenizers cut and pad to this many tokens
SPECIALS = ["[PAD]", "[UNK]", "<|im_start|>", "<|im_end|>", "</s>"]
WORDS = "the quick brown fox jumps over a lazy dog while packing many long samples into one sequence".split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _text(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, size=words))


def _corpus() -> list[str]:
    rng = np.random.default_rng(0)
    return [_text(rng, 30) for _ in range(200)]


def _build(family: str) -> tokenizers.Tokenizer:
    if family == "wordpiece":
        tokens = SPECIALS + sorted(set(WORDS)) + list("abcdefghijklmnopqrstuvwxyz")
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.decoder = decoders.WordPiece()
    elif family == "bpe":
        tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tok.train_from_iterator(_corpus(), trainer)
    else:  # metaspace + unigram, as SentencePiece-converted tokenizers (T5, Llama 1/2) are
        tok = tokenizers.Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=SPECIALS, unk_token="[UNK]")
        tok.train_from_iterator(_corpus(), trainer)
    tok.add_special_tokens(SPECIALS)
    return tok


def _ship(family: str, where: Path) -> tuple[Path, Path]:
    """Save the tokenizer with truncation and padding on: as a file, and as a model directory."""
    tok = _build(family)
    tok.enable_truncation(max_length=LIMIT)
    tok.enable_padding(length=LIMIT, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    model_dir = where / f"{family}-model"
    model_dir.mkdir(parents=True)
    tok.save(str(where / f"{family}.json"))
    tok.save(str(model_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": LIMIT,
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "eos_token": "</s>",
        "chat_template": CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return where / f"{family}.json", model_dir


def _unlimited(path: Path) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer.from_file(str(path if path.is_file() else path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _pack(tmp_path: Path, records: list[dict], tokenizer: Path, **config) -> tuple[dict, dict[int, list]]:
    src = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    cfg = PackOptions.from_dict(
        {
            "inputs": [str(src)],
            "output": str(out),
            "tokenizer": str(tokenizer),
            "packed_sequence_size": 512,
            "quiet": True,
            **config,
        }
    )
    run_pack(cfg)
    samples: dict[int, list] = {}
    for pack in read_packs(out, with_sample_index=True):
        offsets = np.concatenate([[0], np.cumsum(pack["seq_lens"])])
        for j, s in enumerate(pack["sample_index"].tolist()):
            samples[s] = pack["input_ids"][offsets[j] : offsets[j + 1]].tolist()
    return manifest_json(out), samples


FAMILIES = ["wordpiece", "bpe", "unigram"]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    where = tmp_path_factory.mktemp("tokenizers")
    return {family: _ship(family, where) for family in FAMILIES}


@pytest.mark.parametrize("as_directory", [False, True], ids=["tokenizer.json", "model-dir"])
@pytest.mark.parametrize("family", FAMILIES)
def test_text_samples_arrive_whole(tmp_path, shipped, family, as_directory):
    path = shipped[family][as_directory]
    rng = np.random.default_rng(1)
    texts = [_text(rng, int(rng.integers(20, 60))) for _ in range(12)]
    manifest, samples = _pack(tmp_path, [{"text": t} for t in texts], path)
    full = _unlimited(path)
    expected = [full.encode(t, add_special_tokens=False).ids for t in texts]
    assert max(len(e) for e in expected) > LIMIT  # the shipped tokenizer would have cut these
    assert [samples[i] for i in range(len(texts))] == expected
    off = manifest["tokenizer"]["switched_off"]
    assert off["truncation"]["max_length"] == LIMIT
    assert off["padding"]["length"] == LIMIT
    assert off.get("model_max_length") == (LIMIT if as_directory else None)


@pytest.mark.parametrize("as_directory", [False, True], ids=["tokenizer.json", "model-dir"])
@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_completion_samples_arrive_whole(tmp_path, shipped, family, as_directory):
    path = shipped[family][as_directory]
    rng = np.random.default_rng(2)
    rows = [{"prompt": _text(rng, 25), "completion": _text(rng, 30)} for _ in range(8)]
    _, samples = _pack(tmp_path, rows, path, sample_format="prompt_completion")
    full = _unlimited(path)
    for i, row in enumerate(rows):
        want = full.encode(row["prompt"], add_special_tokens=False).ids
        want += full.encode(row["completion"], add_special_tokens=False).ids
        assert samples[i] == want


@pytest.mark.parametrize("as_directory", [False, True], ids=["tokenizer.json", "model-dir"])
@pytest.mark.parametrize("family", FAMILIES)
def test_chat_samples_arrive_whole(tmp_path, shipped, family, as_directory):
    path = shipped[family][as_directory]
    template = tmp_path / "chatml.jinja"
    template.write_text(CHAT_TEMPLATE)
    rng = np.random.default_rng(3)
    rows = [
        {
            "messages": [
                {"role": "user", "content": _text(rng, 20)},
                {"role": "assistant", "content": _text(rng, 40)},
            ]
        }
        for _ in range(8)
    ]
    extra = {} if as_directory else {"chat_template": str(template)}
    _, samples = _pack(tmp_path, rows, path, sample_format="chat", **extra)
    full = _unlimited(path)
    for i, row in enumerate(rows):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in row["messages"])
        assert samples[i] == full.encode(text, add_special_tokens=False).ids
