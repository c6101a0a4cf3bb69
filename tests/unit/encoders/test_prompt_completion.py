"""The ``prompt_completion`` encoder: real tokenizer file, real rows, Alpaca data, the real CLI.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import pytest

from packtool.encoders.prompt_completion import ALPACA, ALPACA_NO_INPUT, PromptCompletionEncoder
from packtool.encoders.registry import build_encoder, resolve_sample_format
from packtool.errors import ConfigError, InputError
from packtool.options import PackOptions
from packtool.tokenizing.tokenizer import HFTokenizer
from tests.conftest import DEMO_TOKENIZER
from tests.sft_checks import encode_rows, label_runs

X = -100
ROW = {"prompt": "Q: What is packing?\nA:", "completion": " It fills rows."}
# Hand-checked with the demo tokenizer:
PROMPT = [53, 30, 796, 278, 380, 667, 303, 35, 203, 37, 30]  # Q : ĠWh at Ġis Ġpack ing ? Ċ A :
COMPLETION = [818, 290, 341, 87, 225, 86, 283, 87, 18]  # ĠIt Ġf ill s Ġ r ow s .
BOS, EOS = 2, 1  # <|begin_of_text|>, <|endoftext|>


def encoder(**kw) -> PromptCompletionEncoder:
    return PromptCompletionEncoder(HFTokenizer(str(DEMO_TOKENIZER)), **kw)


def test_hand_checked_shifted_with_bos_and_eos():
    (out,) = encode_rows(encoder(add_bos=True, add_eos=True), [ROW])
    assert out["input_ids"] == [BOS] + PROMPT + COMPLETION + [EOS]
    # labels[i] is the target of input_ids[i]: the prompt's last token ":" predicts "ĠIt"; "." predicts EOS;
    # BOS and the prompt are never targets; the last token has no target
    assert out["labels"] == [X] * 11 + COMPLETION + [EOS, X]
    assert out["loss_mask"] == [0] * 11 + [1] * 10 + [0]


def test_hand_checked_unshifted():
    (out,) = encode_rows(encoder(add_eos=True, labels="unshifted"), [ROW])
    assert out["input_ids"] == PROMPT + COMPLETION + [EOS]
    assert out["labels"] == [X] * 11 + COMPLETION + [EOS]
    assert out["loss_mask"] == [0] * 11 + [1] * 10


def test_train_on_prompt():
    (out,) = encode_rows(encoder(train_on_prompt=True, add_bos=True), [ROW])
    ids = [BOS] + PROMPT + COMPLETION
    assert out["input_ids"] == ids
    assert out["labels"] == ids[1:] + [X]  # every token but BOS is a target
    (out,) = encode_rows(encoder(train_on_prompt=True, labels="unshifted"), [ROW])
    assert out["labels"] == PROMPT + COMPLETION


def test_alpaca_template_with_and_without_input():
    tok = HFTokenizer(str(DEMO_TOKENIZER))
    rows = [
        {"instruction": "Name a colour.", "input": "", "output": "Blue."},
        {"instruction": "Sum these.", "input": "2 and 3", "output": "5."},
        {"instruction": "Say hi.", "output": "Hi."},  # no input field at all in this row
    ]
    out = encode_rows(encoder(prompt_template="alpaca", completion_field="output", add_eos=True), rows)
    prompts = [
        ALPACA_NO_INPUT.format(instruction="Name a colour."),
        ALPACA.format(instruction="Sum these.", input="2 and 3"),
        ALPACA_NO_INPUT.format(instruction="Say hi."),
    ]
    assert prompts[1].endswith("### Instruction:\nSum these.\n\n### Input:\n2 and 3\n\n### Response:\n")
    for o, prompt, row in zip(out, prompts, rows, strict=True):
        assert tok.decode(o["input_ids"]) == prompt + row["output"] + "<|endoftext|>"
        assert [tok.decode(r) for r in label_runs(o["labels"])] == [row["output"] + "<|endoftext|>"]


def test_format_string_template():
    rows = [{"question": "Why?", "answer": "Because."}]
    enc = encoder(prompt_template="Question: {question}\nAnswer: ", completion_field="answer")
    (out,) = encode_rows(enc, rows)
    assert out["input_ids"] == [53, 479, 281, 346, 30, 796, 93, 35, 203, 1067, 87, 91, 261, 30, 225, 1175, 18]
    assert out["labels"] == [X] * 14 + [1175, 18, X]


def test_missing_fields_are_named():
    with pytest.raises(InputError, match=r"line 1, field 'prompt': missing field .*prompt_template: alpaca"):
        encode_rows(encoder(), [{"instruction": "a", "output": "b"}])
    with pytest.raises(InputError, match=r"line 2, field 'question': missing field or null value"):
        rows = [ROW | {"question": "a"}, ROW | {"question": None}]
        encode_rows(encoder(prompt_template="Q: {question}"), rows)
    with pytest.raises(ConfigError, match="not a field name"):
        encoder(prompt_template="Q: {0}")


def test_auto_picks_prompt_completion():
    assert resolve_sample_format(PackOptions.of().encoding, ["prompt", "completion"]) == "prompt_completion"
    assert resolve_sample_format(
        PackOptions.of(prompt_template="alpaca").encoding, ["instruction", "output"]
    ) == ("prompt_completion")
    cfg = PackOptions.of(tokenizer=str(DEMO_TOKENIZER), prompt_field="q", completion_field="a")
    assert resolve_sample_format(cfg.encoding, ["q", "a"]) == "prompt_completion"
    assert isinstance(build_encoder(cfg.encoding, "prompt_completion", 64), PromptCompletionEncoder)


def test_empty_completion_follows_the_policy():
    rows = [ROW, {"prompt": "Q:", "completion": ""}]
    drop = encode_rows(encoder(), rows)
    assert drop[0]["input_ids"] == PROMPT + COMPLETION and drop[1]["input_ids"] == []
    keep = encode_rows(encoder(empty_loss="keep"), rows)
    assert keep[1]["input_ids"] == [53, 30] and keep[1]["labels"] == [X, X]
    with pytest.raises(InputError, match=r"line 2, field 'completion': no token to learn from"):
        encode_rows(encoder(empty_loss="error"), rows)
    # with EOS the model still learns to stop: not empty
    assert encode_rows(encoder(add_eos=True), rows)[1]["labels"] == [X, EOS, X]


def test_backslash_n_typed_in_a_template_is_a_newline():
    """``--prompt-template 'Q: {q}\\nA:'`` from a shell holds a backslash and an n: it is packed as the
    newline a YAML ``"Q: {q}\\nA:"`` gives, the hand-checked prompt above."""
    rows = [{"q": "What is packing?", "completion": " It fills rows."}]
    typed, yaml = (encoder(prompt_template=t) for t in ("Q: {q}\\nA:", "Q: {q}\nA:"))
    (out,) = encode_rows(typed, rows)
    assert out["input_ids"] == PROMPT + COMPLETION
    assert encode_rows(yaml, rows) == [out]
