"""The chat template sandbox bounds a render's total work and size: nested loops (over ranges, strings or
lists), huge integers, format widths, indents, JSON indents, doubled strings and repeated messages stop
with one line naming the record, in well under a second each (before, ``pack`` ran for minutes or hours,
or took gigabytes, on one record), and templates render as ``apply_chat_template`` renders them."""

from __future__ import annotations

import time

import pytest

from packtool.encoders.chat import ChatEncoder
from packtool.errors import InputError
from packtool.tokenizing.template_sandbox import STEP_BUDGET, TemplateBudgetError
from packtool.tokenizing.tokenizer import HFTokenizer
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
    with pytest.raises(TemplateBudgetError, match=f"more than {STEP_BUDGET:,} steps"):
        encoder.render(MESSAGES)
    assert time.perf_counter() - start < 30  # the budget's items, not 99999 ** 2
    where = r"rows\.jsonl, line 1, field 'messages': the chat template takes more than 250,000 steps"
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


LONG = [{"role": "user", "content": "hi there\nsecond line"}, {"role": "assistant", "content": "hello"}]
# (what, template, the error's words): each ran for minutes or took gigabytes on one record before
OVER_BUDGET = [
    ("loops over strings", "{% for i in 'x' * 100000 %}{% for j in 'x' * 100000 %}{% endfor %}{% endfor %}",
     "more than 250,000 steps"),
    ("loops over lists", "{% for i in [0] * 100000 %}{% for j in [0] * 100000 %}{% endfor %}{% endfor %}",
     "more than 250,000 steps"),
    ("a huge power", "{{ 2 ** 1000000000 }}", "an integer of 1,000,000,001 bits or more"),
    ("a product squared in a loop",
     "{% set ns = namespace(n=3) %}{% for i in range(100) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
     "an integer of"),
    ("a % width", "{{ '%999999999d' % 1 }}", "a value of 1,000,000,012 characters or items with %"),
    ("a % width from the arguments", "{{ '%*d' % (999999999, 1) }}", "characters or items with %"),
    ("a format width", "{{ '{:>999999999}'.format(1) }}", "with format()"),
    ("the format filter", "{{ '%999999999s'|format(1) }}", "with |format"),
    ("indent over many lines", "{{ ('x\n' * 100000)|indent(1000000) }}", "with |indent"),
    ("indent in a loop", "{% for i in range(1000) %}{{ messages[0].content|indent(1000000) }}{% endfor %}",
     "more than 250,000 steps"),  # (64 characters a step: 64 MiB written, at most)
    ("tojson's indent", "{{ messages|tojson(indent=1000000000) }}", "with |tojson"),
    ("a string doubled with ~",
     "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "more than 250,000 steps"),
    ("a string doubled with +",
     "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "more than 250,000 steps"),
    ("a message repeated 1e8 times", "{{ messages[0]['content'] * 100000000 }}", "with *"),
    ("ljust", "{{ 'x'.ljust(1000000000) }}", "with ljust()"),
    ("center", "{{ 'x'|center(1000000000) }}", "with |center"),
    ("join with a long separator", "{{ ('y' * 1000000).join(['a'] * 1000) }}", "with join()"),
    ("lipsum", "{{ lipsum(100000000) }}", "with generate_lorem_ipsum()"),
    ("to_bytes", "{{ (1).to_bytes(1000000000, 'big') }}", "with to_bytes()"),
    ("a long string searched in a loop",
     "{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{% if 'zz' in s %}{% endif %}{% endfor %}",
     "more than 250,000 steps"),
    ("a list made in a loop",
     "{% for i in range(100000) %}{% set x = range(50000)|map('string')|list %}{% endfor %}",
     "more than 250,000 steps"),
]  # fmt: skip


@pytest.mark.parametrize("what, template, words", OVER_BUDGET, ids=[c[0] for c in OVER_BUDGET])
def test_a_render_has_a_fixed_budget_of_work_and_size(tmp_path, what, template, words):
    """Each stops in seconds, on that record (a bad record: ``template_budget``), never on compiling the
    template (Jinja folds constant expressions as it compiles: ``2 ** 1000000000`` too)."""
    start = time.perf_counter()
    encoder = _encoder(tmp_path, template)  # (renders a probe conversation, within the budget)
    with pytest.raises(InputError) as err:
        encode_rows(encoder, [{"messages": LONG}])
    assert time.perf_counter() - start < 20, what
    assert err.value.code == "template_budget", err.value
    assert words in str(err.value), str(err.value)
    assert "rows.jsonl, line 1, field 'messages': the chat template" in str(err.value)


TEMPLATES = {  # what chat templates do, rendered by packtool as by transformers
    "chatml": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "tools and json": (
        "{% if tools %}{{ tools|tojson(indent=2) }}\n{% endif %}{% for m in messages %}"
        "{{ m.role|upper }}: {{ m.content|trim }}{% if not loop.last %}\n{% endif %}{% endfor %}"
    ),
    "reasoning split": (
        "{% for m in messages %}{% set c = m.content %}{% if '</think>' in c %}"
        "{% set c = c.split('</think>')[-1].lstrip('\n') %}{% endif %}{{ '%s> %s|' % (m.role, c) }}"
        "{{ '{:>8}'.format(loop.index) }}{% endfor %}"
    ),
    "filters": (
        "{{ messages|map(attribute='role')|join(', ') }}|{{ messages|length }}|{{ (messages|first).content"
        "|wordwrap(5) }}|{{ 'ab'|center(6) }}|{{ messages[0].content|indent(2, first=True) }}|"
        "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ '%.2f'|format(3.14159) }}|"
        "{{ [3, 1, 2]|sort|join }}|{{ {'b': 1, 'a': 2}|dictsort }}|{{ 'a-b'.replace('-', '+') }}"
    ),
    "macros and namespace": (
        "{% macro turn(m) %}[{{ m.role }}]{{ caller() if caller else '' }}{{ m.content }}{% endmacro %}"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}"
        "{{ turn(m) }}{% endfor %}{{ ns.n }}{{ raise_exception('x') if ns.n < 0 }}"
        "{% for x in [[1, [2]], 3] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}"
        "{% endif %}{% endfor %}"
    ),
    "generation": (
        "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    ),
}


@pytest.mark.parametrize("name", TEMPLATES)
def test_templates_render_as_transformers_renders_them(tmp_path, name):
    from transformers.utils.chat_template_utils import render_jinja_template

    template = TEMPLATES[name]
    encoder = _encoder(tmp_path, template)
    messages = [*LONG, {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "x</think>\ny"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for gen in (False, True):
        want, spans = render_jinja_template([messages], tools=tools, chat_template=template,
                                            return_assistant_tokens_mask=True, add_generation_prompt=gen,
                                            **encoder.template_vars)  # fmt: skip
        got = encoder.render(messages, tools, gen, with_spans=True)
        assert got == (want[0], [tuple(s) for s in spans[0]])
