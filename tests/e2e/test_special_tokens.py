"""The BOS/EOS/pad tokens a run puts in the packs are named in its summary and manifest, and a guessed one
is said aloud (``[SEP]`` as EOS for a BERT-style WordPiece tokenizer, which declares no EOS)."""

from __future__ import annotations

from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from tests.conftest import manifest_json, run_cli, write_jsonl

BERT_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "quick", "brown", "fox", "##es"]


def bert_style(tmp_path: Path) -> Path:
    tok = tokenizers.Tokenizer(models.WordPiece({t: i for i, t in enumerate(BERT_TOKENS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    path = tmp_path / "bert.json"
    tok.save(str(path))
    return path


def test_guessed_eos_is_named_and_warned(tmp_path):
    tokenizer = bert_style(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "the quick brown foxes"}] * 6)
    args = ["pack", src, "--tokenizer", tokenizer, "--packed-sequence-size", 32, "--add-eos"]
    proc = run_cli(*args, "-o", tmp_path / "guess")
    assert "packtool: warning: --add-eos: the tokenizer declares no EOS token; '[SEP]' (id 3)" in proc.stderr
    assert "--eos-token" in proc.stderr
    assert "tokens: eos '[SEP]' (id 3) ends every sample; pad '[PAD]' (id 0) fills the packs" in proc.stderr
    m = manifest_json(tmp_path / "guess")
    assert (m["tokenizer"]["eos_token"], m["tokenizer"]["eos_token_id"], m["tokenizer"]["pad_token"]) == (
        "[SEP]",
        3,
        "[PAD]",
    )
    assert m["tokenizer"]["guessed_tokens"] == ["eos"] and not m.get("warnings")  # a guess, not a loss
    quiet = run_cli(*args, "-q", "-o", tmp_path / "quiet")
    assert "'[SEP]' (id 3) was chosen by its name" in quiet.stderr  # said even with --quiet
    named = run_cli(*args, "--eos-token", "[SEP]", "-o", tmp_path / "named")
    assert "warning" not in named.stderr  # chosen by the user: not a guess
