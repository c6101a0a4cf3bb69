"""The ``chat`` encoder: real tokenizers from local files, real templates, real rows, the real CLI.

(The CLI in a subprocess; in-process tests are in tests/unit.)"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from packtool import run_pack
from packtool.encoders.chat import ChatEncoder
from packtool.options import PackOptions
from packtool.tokenizing.tokenizer import HFTokenizer
from tests.conftest import DEMO, run_cli, write_jsonl
from tests.sft_checks import check_boundary_property, encode_rows, label_runs, packed_samples

CHAT_TOKENIZER = DEMO / "chat-tokenizer"  # demo tokenizer.json + tokenizer_config.json with a ChatML template
X = -100
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Bye now"},
]


def chat_encoder(**kw) -> ChatEncoder:
    return ChatEncoder(HFTokenizer(str(CHAT_TOKENIZER)), **kw)


# --- through the CLI -------------------------------------------------------------------------------------
WORDS = "the model reads a long text and then writes short answers about packing tokens into rows".split()


def random_conversations(rng: random.Random, n: int) -> list[dict]:
    def say(k: int = 12) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, k))).capitalize() + "."

    convs = []
    for _ in range(n):
        messages = [{"role": "system", "content": say()}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": say()})
            if rng.random() < 0.2:
                messages.append({"role": "tool", "content": say(4)})
            messages.append({"role": "assistant", "content": say(20)})
        convs.append({"messages": messages})
    return convs


def test_cli_pack_chat_decoded_labels_are_exactly_the_assistant_turns(tmp_path):
    rows = [json.loads(line) for line in (DEMO / "chat.jsonl").read_text().splitlines()[:40]]
    rows += random_conversations(random.Random(1), 20)
    data = write_jsonl(tmp_path / "chats.jsonl", rows)
    out = tmp_path / "out"
    run_cli("pack", data, "--sample-format", "chat", "--tokenizer", CHAT_TOKENIZER, "--packed-sequence-size",
            "1024", "--long-samples", "drop", "-o", out, "-q")  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sample_format"] == "chat" and manifest["labels"] == "shifted"
    assert "loss_mask" in manifest["columns"]
    tok = HFTokenizer(str(CHAT_TOKENIZER))
    samples = packed_samples(out)
    assert len(samples) == len(rows) - manifest["stats"]["dropped_samples"] and len(samples) > 50
    for i, sample in samples.items():
        turns = [m["content"] + "<|im_end|>" for m in rows[i]["messages"] if m["role"] == "assistant"]
        assert [tok.decode(r) for r in label_runs(sample["labels"])] == turns


@pytest.mark.parametrize("labels,size", [("shifted", 96), ("unshifted", 257)])
def test_boundary_property_on_random_packs(tmp_path, labels, size):
    rng = random.Random(size)
    rows = random_conversations(rng, 60)
    data = write_jsonl(tmp_path / "chats.jsonl", rows)
    out = tmp_path / "out"
    run_cli("pack", data, "--sample-format", "chat", "--tokenizer", CHAT_TOKENIZER, "--labels", labels,
            "--packed-sequence-size", size, "--long-samples", "drop", "-o", out, "-q")  # fmt: skip
    expected = encode_rows(chat_encoder(labels=labels), rows)
    too_long = [i for i, e in enumerate(expected) if len(e["input_ids"]) > size]
    for i in too_long:
        expected[i] = {"input_ids": []}
    assert check_boundary_property(out, expected) == len(rows) - len(too_long) > 10


def test_empty_loss_policies(tmp_path, cli):
    rows = [{"messages": CONVERSATION}, {"messages": [{"role": "user", "content": "Anyone?"}]}] * 3
    data = write_jsonl(tmp_path / "chats.jsonl", rows)
    base = ["pack", data, "--tokenizer", CHAT_TOKENIZER, "--packed-sequence-size", "128", "-q"]

    def inspect(out):
        return json.loads(cli("inspect", "--json", out).stdout)

    cli(*base, "-o", tmp_path / "drop")  # auto: records with messages are chat
    report = inspect(tmp_path / "drop")
    assert report["sample_format"] == "chat"
    assert (report["empty_loss_samples"], report["empty_samples"], report["packed_samples"]) == (3, 0, 3)
    assert "nothing to learn, left out" in cli("inspect", tmp_path / "drop").stdout

    # keep: in process (the same pipeline as the CLI, without paying for another interpreter start)
    config = PackOptions.of(inputs=[str(data)], output=str(tmp_path / "keep"), tokenizer=str(CHAT_TOKENIZER),
                        packed_sequence_size=128, empty_loss="keep", quiet=True)  # fmt: skip
    run_pack(config)
    report = inspect(tmp_path / "keep")
    assert (report["empty_loss_samples"], report["empty_samples"], report["packed_samples"]) == (3, 0, 6)
    samples = packed_samples(tmp_path / "keep")
    assert all(np.all(samples[i]["labels"] == X) for i in (1, 3, 5))

    proc = cli(*base, "--empty-loss", "error", "-o", tmp_path / "error", check=False)
    assert proc.returncode == 3
    assert f"{data}, line 2, field 'messages': no token to learn from" in proc.stderr
    assert not (tmp_path / "error").exists()


def test_cli_missing_messages_names_file_line_and_field(tmp_path, cli):
    data = write_jsonl(tmp_path / "bad.jsonl", [{"text": "not a chat"}])
    proc = cli("pack", data, "--sample-format", "chat", "--tokenizer", CHAT_TOKENIZER,
               "--packed-sequence-size", "64", "-o", tmp_path / "out", "-q", check=False)  # fmt: skip
    assert proc.returncode == 3
    assert f"{data}, line 1, field 'messages': missing field" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_sft_chat_config_runs_offline(tmp_path, cli):
    out = tmp_path / "sft_chat"
    cli("pack", "--config", DEMO.parent.parent / "configs" / "sft_chat.yaml", "-o", out, "-q",
        cwd=DEMO.parent.parent)  # fmt: skip
    report = json.loads(cli("inspect", "--json", out).stdout)
    assert report["sample_format"] == "chat" and report["packed_samples"] == 200
