"""``--add-bos`` / ``--add-eos`` with a ``module:callable`` encoder (issue 36, item 3): the id comes from
``--bos-token-id`` / ``--eos-token-id``, from ``--bos-token`` / ``--eos-token`` through the encoder's
``token_to_id``, or from what the encoder declares (``eos_token_id``); with none of them, or one that
cannot be honoured, the run stops in one line (exit 2): an option is never recorded as applied when it
was not. Each case is a ``pack`` run through the CLI, its packs read back.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from packtool import read_packs
from packtool.errors import EXIT_USAGE
from tests.conftest import DEMO_TOKENIZER, run_cli, write_jsonl

N = 64
RECORDS = [{"text": " ".join(f"w{j}" for j in range(2 + i % 9))} for i in range(40)]
# a tiktoken-like encoder: ids of its own, the end-of-text token's id declared as tiktoken's eot_token is
ENCODERS = textwrap.dedent("""
    def plain(records):
        return {"input_ids": [[10 + len(w) for w in t.split()] for t in records["text"]]}

    def declares(records):
        return plain(records)
    declares.bos_token_id, declares.eos_token_id = 1, 2

    class Wrapped:
        vocab_size = 100
        def __call__(self, records):
            return plain(records)
        def token_to_id(self, text):
            return {"<|endoftext|>": 99}.get(text)

    def with_labels(records):
        ids = plain(records)["input_ids"]
        return {"input_ids": ids, "labels": ids}
""")


@dataclass
class Case:
    name: str
    args: list
    code: int
    message: str = ""  # in the one line on stderr (an error)
    bos: int | None = None  # the id every sample must start with
    eos: int | None = None  # the id every sample must end with


CASES = [
    Case("--add-eos, no id declared or given", ["plain", "--add-eos"], EXIT_USAGE,
         "--add-eos: encoder ENC:plain declares no EOS id (an attribute eos_token_id on it); give"),
    Case("--add-bos, no id declared or given", ["plain", "--add-bos"], EXIT_USAGE,
         "--add-bos: encoder ENC:plain declares no BOS id"),
    Case("--eos-token-id", ["plain", "--add-eos", "--eos-token-id", 7], 0, eos=7),
    Case("the ids the encoder declares", ["declares", "--add-eos", "--add-bos"], 0, bos=1, eos=2),
    Case("--eos-token-id over the declared one", ["declares", "--add-eos", "--eos-token-id", 5], 0, eos=5),
    Case("--eos-token through the encoder's token_to_id",
         ["Wrapped", "--add-eos", "--eos-token", "<|endoftext|>"], 0, eos=99),
    Case("--eos-token its token_to_id does not know", ["Wrapped", "--add-eos", "--eos-token", "<eos>"],
         EXIT_USAGE, "--eos-token <eos>: encoder ENC:Wrapped's token_to_id knows no such token"),
    Case("--eos-token without token_to_id", ["plain", "--add-eos", "--eos-token", "</s>"], EXIT_USAGE,
         "--eos-token </s>: encoder ENC:plain has no token_to_id(text) to find its id; give --eos-token-id"),
    Case("an id past the encoder's vocab_size", ["Wrapped", "--add-eos", "--eos-token-id", 100], EXIT_USAGE,
         "--add-eos: 100 is not a token id of encoder ENC:Wrapped (its vocab_size is 100)"),
    Case("an encoder that returns its own labels", ["with_labels", "--add-eos", "--eos-token-id", 5],
         EXIT_USAGE, "--add-eos: encoder ENC:with_labels returns its own labels, which cannot say whether"),
    Case("--eos-token-id without --add-eos", ["plain", "--eos-token-id", 5], EXIT_USAGE,
         "--eos-token-id 5 and --add-eos off conflict"),
    Case("--eos-token and --eos-token-id", ["Wrapped", "--add-eos", "--eos-token", "x", "--eos-token-id", 5],
         EXIT_USAGE, "--eos-token x and --eos-token-id 5 conflict"),
]  # fmt: skip


def sample_ends(out: Path) -> tuple[set[int], set[int]]:
    """The first and the last token of every sample in the packs (none is split across packs here)."""
    firsts, lasts = set(), set()
    for pack in read_packs(out, with_sample_index=True):
        ends = np.cumsum(pack["seq_lens"][: len(pack["sample_index"])])
        starts = ends - pack["seq_lens"][: len(ends)]
        firsts |= set(pack["input_ids"][starts].tolist())
        lasts |= set(pack["input_ids"][ends - 1].tolist())
    return firsts, lasts


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_special_ids_with_a_custom_encoder(tmp_path: Path, case: Case):
    (tmp_path / "enc.py").write_text(ENCODERS)
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    spec = f"{tmp_path / 'enc.py'}:{case.args[0]}"
    out = tmp_path / "out"
    proc = run_cli("pack", src, "--tokenizer", spec, *case.args[1:], "--packed-sequence-size", N, "-o", out,
                   "-q", check=False)  # fmt: skip
    assert proc.returncode == case.code, proc.stderr
    if case.code:
        (line,) = proc.stderr.strip().splitlines()
        assert case.message.replace("ENC", str(tmp_path / "enc.py")) in line, line
        assert not (out / "manifest.json").exists()
        return
    firsts, lasts = sample_ends(out)
    assert firsts == ({case.bos} if case.bos is not None else firsts - {1, 2, 5, 7, 99})
    assert lasts == {case.eos}
    tokenizer = json.loads((out / "manifest.json").read_text())["tokenizer"]
    assert tokenizer.get("eos_token_id") == case.eos and tokenizer.get("bos_token_id") == case.bos
    # the token before the EOS is trained to predict it; the EOS predicts nothing (shifted labels)
    pack = next(read_packs(out))
    end = int(pack["seq_lens"][0])
    assert pack["labels"][end - 2] == case.eos and pack["labels"][end - 1] == -100


def test_eos_token_id_with_a_tokenizer_json(tmp_path: Path):
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    args = ["pack", src, "--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", N, "--add-eos", "-q"]
    wrong = run_cli(*args, "--eos-token-id", 99_999, "-o", tmp_path / "x", check=False)
    assert wrong.returncode == EXIT_USAGE
    assert "--eos-token-id 99999: not a token of " in wrong.stderr and "(vocabulary of 1,300)" in wrong.stderr
    by_text = run_cli(*args, "-o", tmp_path / "text")  # the tokenizer's own EOS, by its text
    eos = json.loads((tmp_path / "text" / "manifest.json").read_text())["tokenizer"]["eos_token_id"]
    run_cli(*args, "--eos-token-id", eos, "-o", tmp_path / "id")
    assert by_text.returncode == 0 and sample_ends(tmp_path / "id")[1] == {eos}
    assert [p["input_ids"].tolist() for p in read_packs(tmp_path / "id")] == [
        p["input_ids"].tolist() for p in read_packs(tmp_path / "text")
    ]
