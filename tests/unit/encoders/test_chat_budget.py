"""The chat template sandbox bounds a render's total work: nested loops over ranges, each under Jinja's
100,000-item cap, stop with one line naming the record (before, ``pack`` ran for hours on one record),
and templates that use ``range`` render as ``apply_chat_template`` renders them."""

from __future__ import annotations

import time

import pytest

from packtool.encoders.chat import RANGE_BUDGET, ChatEncoder, TemplateBudgetError
from packtool.encoders.text import HFTokenizer
from packtool.errors import InputError
from tests.conftest import DEMO
from tests.sft_checks import encode_rows

CHAT_TOKENIZER = DEMO / "chat-tokenizer"
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
NESTED = (
    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
ONE_RANGE_TWICE = (  # a range made once: counting where ranges are made would miss it
    "{% set r = range(2000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}"
)


def _encoder(tmp_path, template: str) -> ChatEncoder:
    path = tmp_path / "t.jinja"
    path.write_text(template)
    return ChatEncoder(HFTokenizer(str(CHAT_TOKENIZER)), str(path))


@pytest.mark.parametrize("template", [NESTED, ONE_RANGE_TWICE], ids=["nested", "one-range-twice"])
def test_nested_loops_stop_on_the_budget_naming_the_record(tmp_path, template):
    encoder = _encoder(tmp_path, template)
    start = time.perf_counter()
    with pytest.raises(TemplateBudgetError, match=f"more than {RANGE_BUDGET:,} range items"):
        encoder.render(MESSAGES)
    assert time.perf_counter() - start < 30  # the budget's items, not 99999 ** 2
    where = r"rows\.jsonl, line 1, field 'messages': the chat template takes more than 1,000,000 range items"
    with pytest.raises(InputError, match=where):
        encode_rows(encoder, [{"messages": MESSAGES}])


def test_templates_using_range_render_as_apply_chat_template_does(tmp_path):
    template = (
        "{% for i in range(messages|length) %}{{ messages[i]['role'] }}:"
        "{{ messages[i]['content'] }};{% endfor %}"
        "{% for i in range(3)|reverse %}{{ i }}{% endfor %}|{{ range(5)|length }}|{{ range(10)[2] }}|"
        "{{ range(10)[2:5]|list }}|{{ 3 in range(4) }}|{{ range(1, 7, 2)|join(',') }}"
        "{% for i in range(4) %}{{ loop.index }}/{{ loop.length }} {% endfor %}"
    )
    encoder = _encoder(tmp_path, template)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(CHAT_TOKENIZER))
    assert encoder.render(MESSAGES)[0] == hf.apply_chat_template(
        MESSAGES, chat_template=template, tokenize=False
    )


def test_the_sandbox_cap_on_one_range_stays(tmp_path):
    with pytest.raises(OverflowError, match="MAX_RANGE"):
        _encoder(tmp_path, "{{ range(100001)|length }}").render(MESSAGES)
