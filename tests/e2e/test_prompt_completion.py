"""The ``prompt_completion`` encoder: real tokenizer file, real rows, Alpaca data, the real CLI.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json
import random

import pytest

from packtool.encoders.prompt_completion import PromptCompletionEncoder
from packtool.tokenizing.tokenizer import HFTokenizer
from tests.conftest import DEMO, DEMO_TOKENIZER, ROOT, run_cli, write_jsonl
from tests.sft_checks import check_boundary_property, encode_rows, label_runs, packed_samples

BOS, EOS = 2, 1  # <|begin_of_text|>, <|endoftext|>


def encoder(**kw) -> PromptCompletionEncoder:
    return PromptCompletionEncoder(HFTokenizer(str(DEMO_TOKENIZER)), **kw)


# --- through the CLI -------------------------------------------------------------------------------------
def random_rows(rng: random.Random, n: int) -> list[dict]:
    words = "pack the rows into fixed length sequences and train on the answer only".split()

    def say(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, k)))

    return [{"prompt": say(30) + "\n", "completion": say(40) if rng.random() > 0.1 else ""} for _ in range(n)]


@pytest.mark.parametrize("labels,split", [("shifted", False), ("unshifted", True)])
def test_boundary_property_on_random_packs(tmp_path, labels, split):
    rng = random.Random(7 if split else 3)
    rows = random_rows(rng, 120)
    size = rng.choice([96, 128, 200]) if not split else 37
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out"
    run_cli("pack", data, "--sample-format", "prompt_completion", "--tokenizer", DEMO_TOKENIZER,
            "--labels", labels, "--packed-sequence-size", size,
            *(["--split-across-pack"] if split else ["--long-samples", "drop"]), "-o", out, "-q")  # fmt: skip
    expected = encode_rows(encoder(labels=labels), rows)
    if not split:
        expected = [e if len(e["input_ids"]) <= size else {"input_ids": []} for e in expected]
    assert check_boundary_property(out, expected) > 50
    manifest = json.loads((out / "manifest.json").read_text())
    empty_completions = sum(1 for r in rows if not r["completion"])
    assert manifest["stats"]["empty_loss_samples"] == empty_completions > 0
    if split:
        assert manifest["stats"]["split_samples"] > 0


def test_sft_alpaca_config_decoded_labels_are_the_outputs(tmp_path, cli):
    out = tmp_path / "alpaca"
    cli("pack", "--config", ROOT / "configs" / "sft_alpaca.yaml", "-o", out, "-q", cwd=ROOT)
    rows = [json.loads(line) for line in (DEMO / "alpaca.jsonl").read_text().splitlines()]
    tok = HFTokenizer(str(DEMO_TOKENIZER))
    samples = packed_samples(out)
    assert len(samples) == len(rows)
    for i, sample in samples.items():
        assert [tok.decode(r) for r in label_runs(sample["labels"])] == [rows[i]["output"] + "<|endoftext|>"]
        assert tok.decode(sample["input_ids"].tolist()).startswith("Below is an instruction")
    report = json.loads(cli("inspect", "--json", out).stdout)
    assert report["sample_format"] == "prompt_completion" and report["empty_loss_samples"] == 0
