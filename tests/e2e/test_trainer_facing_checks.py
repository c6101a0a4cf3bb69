"""What pack and verify say about outputs trainers read: ``verify --source`` on an output whose
``--empty-loss drop`` left samples out, run from another directory; the warning of ``--split-across-pack``
with NeMo positions (which wrap inside a continuation piece)."""

from __future__ import annotations

import numpy as np
import pytest

from packtool import read_packs, run_pack
from packtool.options import PackOptions
from tests.conftest import DEMO, run_cli, write_jsonl

CHAT_TOKENIZER = DEMO / "chat-tokenizer"


def test_verify_source_accounts_for_empty_loss_drops_from_another_directory(tmp_path):
    """A conversation without an assistant turn has nothing to learn: --empty-loss drop (the default)
    leaves it out and counts it as such, not as an empty sample; the relative tokenizer path given to
    pack is found again by the absolute one the manifest recorded."""
    work = tmp_path / "work"
    work.mkdir()
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    rows = [{"messages": turns}, {"messages": turns[:1]}] * 2
    write_jsonl(work / "chats.jsonl", rows)
    (work / "tok").symlink_to(CHAT_TOKENIZER, target_is_directory=True)
    run_cli("pack", "chats.jsonl", "--tokenizer", "tok", "--packed-sequence-size", "64", "-o", "out", "-q",
            cwd=work)  # fmt: skip
    result = run_cli("verify", work / "out", "--source", cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert "OK:" in result.stdout and "source samples: 4" in result.stdout


def test_split_across_pack_with_nemo_positions_warns_and_names_restart(tmp_path, capsys):
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(1, 100, int(n)).tolist()} for n in (30, 90, 40)]
    src = [str(write_jsonl(tmp_path / "in.jsonl", rows))]
    base = {"inputs": src, "packed_sequence_size": 64, "strategy": "sequential", "split_across_pack": True}
    said: list[str] = []
    run_pack(PackOptions.of(output=str(tmp_path / "nemo"), quiet=True, **base), say=said.append)
    (line,) = said  # said even when quiet
    assert line.startswith("warning: --split-across-pack with --position-ids nemo")
    assert "--position-ids restart" in line
    assert not capsys.readouterr().err, "the library prints nothing: the caller says what it is given"
    # without say, the warning reaches a Python caller as a warning
    with pytest.warns(UserWarning, match="--split-across-pack with --position-ids nemo"):
        run_pack(PackOptions.of(output=str(tmp_path / "nemo2"), quiet=True, **base))
    # what it warns of: a piece that continues a sample in the next pack does not continue its positions
    packs = list(read_packs(tmp_path / "nemo", with_sample_index=True))
    continued = [(p, i) for p in packs for i, o in enumerate(p["sample_offset"]) if o > 0]
    wrapped = 0
    for pack, i in continued:
        start, length, offset = (
            int(pack["seq_lens"][:i].sum()),
            int(pack["seq_lens"][i]),
            pack["sample_offset"][i],
        )
        wrapped += not np.array_equal(
            pack["position_ids"][start : start + length], np.arange(offset, offset + length)
        )
    assert wrapped
    said.clear()
    run_pack(
        PackOptions.of(output=str(tmp_path / "restart"), position_ids="restart", quiet=True, **base),
        say=said.append,
    )
    assert not said
