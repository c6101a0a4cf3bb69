"""``inspect``'s details: pieces decoded whole (WordPiece), sample-length quantiles, loss_on for chat, the
figures ``--full`` recomputes from a ``--cp-size`` output."""

from __future__ import annotations

import dataclasses

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from packtool.inspect import decode_segments, recompute_stats, settings
from packtool.manifest import Histogram
from packtool.options import PackOptions
from packtool.pipeline.run import run_pack
from packtool.tokenizing.tokenizer import HFTokenizer

VOCAB = ["[PAD]", "[UNK]", "g", "##cloud", "beta", "_", "run", "##s"]


def test_wordpiece_piece_is_decoded_whole_and_cut_by_offsets(tmp_path):
    """``g ##cloud _ beta`` with a trained span starting at ``##cloud``: each part was decoded alone
    (``g`` + ``##cloud``); now the piece is decoded whole and cut where its prefix's text ends."""
    tok = tokenizers.Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    tok.save(str(tmp_path / "wp.json"))
    wp = HFTokenizer(str(tmp_path / "wp.json"))
    ids = np.array([2, 3, 5, 4, 6, 7])  # g ##cloud _ beta run ##s
    whole, parts = decode_segments(wp, ids, [0, 1, 4, 6])
    assert whole == wp.decode(ids.tolist()) and "##" not in whole
    assert "".join(parts) == whole and parts[0] == "g" and parts[1].startswith("cloud")
    assert parts[2].strip() == "runs"


def test_sample_length_quantiles_and_log_bins():
    lengths = np.concatenate([np.full(990, 100), np.full(10, 170_000)])
    h = Histogram.lengths(lengths, 2048)
    assert h.quantiles == {"p50": 100, "p90": 100, "p99": 100, "max": 170_000}
    # the long tail does not swallow the rest: 100 and 170,000 are in bins far apart, not both in bin 0
    counts = np.array(h.counts)
    assert counts.sum() == 1000 and sorted(counts[counts > 0].tolist()) == [10, 990]
    assert np.flatnonzero(counts)[0] > 1


def test_chat_run_shows_loss_on(tmp_path):
    """``loss_on`` is shown for a chat run, ``train_on_prompt`` for prompt/completion (each only there);
    the manifest of a small pretokenized run stands in for theirs (a chat run imports transformers)."""
    (tmp_path / "in.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    config = {"inputs": [str(tmp_path / "in.jsonl")], "output": str(tmp_path / "out"), "quiet": True,
              "packed_sequence_size": 8}  # fmt: skip
    manifest = run_pack(PackOptions.from_dict(config))
    assert settings(manifest)["loss_on"] is None
    chat = settings(dataclasses.replace(manifest, sample_format="chat"))
    assert chat["loss_on"] == "assistant" and chat["train_on_prompt"] is None
    prompt_completion = settings(dataclasses.replace(manifest, sample_format="prompt_completion"))
    assert prompt_completion["train_on_prompt"] is False and prompt_completion["loss_on"] is None


def test_full_figures_of_a_cp_size_output_leave_the_cp_padding_out(tmp_path):
    """``--full`` counts a piece's tokens without its context-parallel padding, as the run did: no false
    ``differs`` on a ``--cp-size`` output (it counted the cp padding as tokens)."""
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(1, 50, int(n)).tolist()} for n in rng.integers(1, 13, 30)]
    (tmp_path / "in.jsonl").write_text("".join(f'{{"input_ids": {r["input_ids"]}}}\n' for r in rows))
    config = {"inputs": [str(tmp_path / "in.jsonl")], "output": str(tmp_path / "out"), "quiet": True,
              "packed_sequence_size": 16, "cp_size": 2}  # fmt: skip
    manifest = run_pack(PackOptions.from_dict(config))
    assert manifest.stats.cp_padding_tokens > 0
    got = recompute_stats(tmp_path / "out", manifest)
    for key in ("num_tokens", "padding_tokens", "fill_rate", "packed_samples"):
        assert got[key] == getattr(manifest.stats, key), key
