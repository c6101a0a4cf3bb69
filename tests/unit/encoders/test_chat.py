"""The ``chat`` encoder: real tokenizers from local files, real templates, real rows, the real CLI.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import numpy as np
import pytest

from packtool.encoders.chat import ChatEncoder
from packtool.encoders.registry import resolve_sample_format
from packtool.errors import ConfigError, InputError
from packtool.options import PackOptions
from packtool.tokenizing.tokenizer import HFTokenizer
from tests.conftest import DEMO, DEMO_TOKENIZER
from tests.sft_checks import encode_rows, label_runs

CHAT_TOKENIZER = DEMO / "chat-tokenizer"  # demo tokenizer.json + tokenizer_config.json with a ChatML template
X = -100
# Llama-3-like template with the demo tokenizer's special tokens, given as a --chat-template file.
HEADER_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + ':' + '<|im_end|>' + m['content'] + '<|endoftext|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant:<|im_end|>' }}{%- endif %}"
)
# The same as the demo ChatML template, but marking the assistant's text with {% generation %}.
GENERATION_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m['role'] == 'assistant' %}{% generation %}{{- m['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{%- else %}{{- m['content'] + '<|im_end|>' }}{%- endif %}{{- '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Bye now"},
]
# Hand-checked: the ChatML rendering of CONVERSATION through the demo tokenizer, token by token.
IDS = [
    3, 87, 471, 203,  # <|im_start|> s ystem \n
    1065, 268, 296, 73, 74, 18, 4, 203,  # Be Ġb ri e f . <|im_end|> \n
    3, 330, 261, 203, 44, 77, 4, 203,  # <|im_start|> us er \n H i <|im_end|> \n
    3, 319, 87, 77, 281, 286, 88, 203,  # <|im_start|> as s i st an t \n
    1061, 292, 83, 4, 203,  # He ll o <|im_end|> \n
    3, 330, 261, 203, 1172, 73, 4, 203,  # <|im_start|> us er \n By e <|im_end|> \n
    3, 319, 87, 77, 281, 286, 88, 203,  # <|im_start|> as s i st an t \n
    1172, 73, 640, 4, 203,  # By e Ġnow <|im_end|> \n
]  # fmt: skip
HELLO = [1061, 292, 83, 4]  # "Hello<|im_end|>"
BYE_NOW = [1172, 73, 640, 4]  # "Bye now<|im_end|>"


def chat_encoder(**kw) -> ChatEncoder:
    return ChatEncoder(HFTokenizer(str(CHAT_TOKENIZER)), **kw)


def expected_labels(trained: list[tuple[int, int]], convention: str) -> list[int]:
    """Labels for IDS when tokens [a, b) of each span are trained."""
    flags = np.zeros(len(IDS), dtype=bool)
    for a, b in trained:
        flags[a:b] = True
    ids = np.array(IDS)
    if convention == "unshifted":
        return np.where(flags, ids, X).tolist()
    labels = np.full(len(IDS), X)
    labels[:-1] = np.where(flags[1:], ids[1:], X)
    return labels.tolist()


def test_hand_checked_conversation_shifted():
    (out,) = encode_rows(chat_encoder(), [{"messages": CONVERSATION}])
    assert out["input_ids"] == IDS
    # labels[i] is the target of input_ids[i]: the header's "\n" (index 27) predicts "He", ..., "o" predicts
    # <|im_end|>; the <|im_end|> itself predicts the untrained "\n" -> -100
    expected = [X] * 27 + [1061, 292, 83, 4] + [X] * 17 + [1172, 73, 640, 4] + [X, X]
    assert out["labels"] == expected
    assert out["loss_mask"] == [int(x != X) for x in expected]
    assert out["labels"] == expected_labels([(28, 32), (49, 53)], "shifted")


def test_hand_checked_conversation_unshifted():
    (out,) = encode_rows(chat_encoder(labels="unshifted"), [{"messages": CONVERSATION}])
    assert out["input_ids"] == IDS
    expected = [X] * 28 + HELLO + [X] * 17 + BYE_NOW + [X]
    assert out["labels"] == expected
    assert out["loss_mask"] == [int(x != X) for x in expected]


def test_loss_on_last_and_all():
    (last,) = encode_rows(chat_encoder(loss_on="last"), [{"messages": CONVERSATION}])
    assert label_runs(last["labels"]) == [BYE_NOW]
    (every,) = encode_rows(chat_encoder(loss_on="all", labels="unshifted"), [{"messages": CONVERSATION}])
    assert every["labels"] == IDS
    (every,) = encode_rows(chat_encoder(loss_on="all"), [{"messages": CONVERSATION}])
    assert every["labels"] == IDS[1:] + [X]


def test_sharegpt_conversations_match_messages():
    sharegpt = [
        {"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]}
        for m in CONVERSATION
    ]
    (out,) = encode_rows(chat_encoder(), [{"conversations": sharegpt}])
    (ref,) = encode_rows(chat_encoder(), [{"messages": CONVERSATION}])
    assert out == ref


def test_a_file_mixing_messages_and_sharegpt_records_reads_each_as_it_is():
    """A record with ``conversations`` beside records with ``messages`` (one column each, null where the
    record lacks it) is read as ShareGPT; before, it was 'field messages: missing value (null)'."""
    sharegpt = [
        {"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]}
        for m in CONVERSATION
    ]
    mixed = encode_rows(chat_encoder(), [{"messages": CONVERSATION}, {"conversations": sharegpt}])
    (ref,) = encode_rows(chat_encoder(), [{"messages": CONVERSATION}])
    assert mixed == [ref, ref]
    with pytest.raises(InputError, match=r"line 2, field 'messages': missing value"):
        encode_rows(chat_encoder(), [{"messages": CONVERSATION}, {"other": 1}])


def test_sharegpt_unknown_speaker_names_row():
    rows = [{"conversations": [{"from": "human", "value": "a"}, {"from": "robot", "value": "b"}]}]
    match = r"rows.jsonl, line 1, field 'conversations': message 1: unknown speaker"
    with pytest.raises(InputError, match=match):
        encode_rows(chat_encoder(), rows)


def test_tool_and_system_turns_are_kept_and_not_trained():
    tok = HFTokenizer(str(CHAT_TOKENIZER))
    messages = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "2"}}]},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "Four."},
    ]
    # a second row without tool calls: Arrow gives it tool_calls = null, which must not reach the template
    rows = [{"messages": messages}, {"messages": CONVERSATION}]
    out = encode_rows(chat_encoder(), rows)
    text = tok.decode(out[0]["input_ids"])
    assert "<|im_start|>tool\n4<|im_end|>" in text and "<|im_start|>system\nUse tools.<|im_end|>" in text
    runs = [tok.decode(r) for r in label_runs(out[0]["labels"])]
    assert runs == ['<tool_call>{"name": "add", "arguments": "2"}</tool_call><|im_end|>', "Four.<|im_end|>"]
    assert out[1]["input_ids"] == IDS


def test_template_file_with_tokenizer_json(tmp_path):
    template = tmp_path / "header.jinja"
    template.write_text(HEADER_TEMPLATE)
    tok = HFTokenizer(str(DEMO_TOKENIZER))
    enc = ChatEncoder(tok, chat_template=str(template))
    (out,) = encode_rows(enc, [{"messages": CONVERSATION}])
    text = tok.decode(out["input_ids"])
    assert text.startswith("<|begin_of_text|><|im_start|>system:<|im_end|>Be brief.<|endoftext|>")
    # the header ends with <|im_end|>, so the generation prompt covers it: only content and end token trained
    runs = [tok.decode(r) for r in label_runs(out["labels"])]
    assert runs == ["Hello<|endoftext|>", "Bye now<|endoftext|>"]
    assert enc.identity()["chat_template"] == str(template)


def test_generation_markers_give_the_same_spans(tmp_path):
    template = tmp_path / "gen.jinja"
    template.write_text(GENERATION_TEMPLATE)
    enc = ChatEncoder(HFTokenizer(str(CHAT_TOKENIZER)), chat_template=str(template))
    assert enc.span_method == "generation"
    rows = [{"messages": CONVERSATION}]
    assert encode_rows(enc, rows) == encode_rows(chat_encoder(), rows)
    last = ChatEncoder(HFTokenizer(str(CHAT_TOKENIZER)), chat_template=str(template), loss_on="last")
    assert label_runs(encode_rows(last, rows)[0]["labels"]) == [BYE_NOW]


def test_template_that_is_not_prefix_stable_is_an_error_naming_the_row(tmp_path):
    # renders the final assistant turn differently from earlier ones: the prefix method cannot locate turns
    template = tmp_path / "unstable.jinja"
    template.write_text(
        "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] }}"
        "{%- if loop.last %}{{- ' [end]' }}{%- endif %}{{- '\\n' }}{%- endfor %}"
    )
    enc = ChatEncoder(HFTokenizer(str(DEMO_TOKENIZER)), chat_template=str(template))
    match = r"line 1, field 'messages': the chat template does not render message 2"
    with pytest.raises(InputError, match=match):
        encode_rows(enc, [{"messages": CONVERSATION}])
    # loss on all tokens needs no turn boundaries
    ChatEncoder(HFTokenizer(str(DEMO_TOKENIZER)), chat_template=str(template), loss_on="all")


def test_tokenizer_without_template_is_a_config_error():
    with pytest.raises(ConfigError, match="has no chat template: pass --chat-template"):
        ChatEncoder(HFTokenizer(str(DEMO_TOKENIZER)))


def test_auto_picks_chat_for_messages_and_conversations():
    cfg = PackOptions.of()
    assert resolve_sample_format(cfg.encoding, ["messages"]) == "chat"
    assert resolve_sample_format(cfg.encoding, ["id", "conversations"]) == "chat"
    assert resolve_sample_format(cfg.encoding, ["text"]) == "text"


def test_chat_with_add_eos_is_a_config_error():
    """The chat template writes the special tokens: --add-eos does not apply (once auto decided chat)."""
    cfg = PackOptions.of(tokenizer=str(CHAT_TOKENIZER), add_eos=True)
    with pytest.raises(ConfigError, match="^--add-eos does not apply to --sample-format chat"):
        cfg.check("chat")
