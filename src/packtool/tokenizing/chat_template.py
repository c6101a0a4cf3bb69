"""A chat template, rendered as ``apply_chat_template`` renders it, and the characters of its trained turns.

The template is the tokenizer's own (a local tokenizer directory whose ``tokenizer_config.json`` or
``chat_template.jinja`` holds one) or a Jinja file given by ``chat_template`` (``--chat-template``). It is
rendered by ``transformers``' ``render_jinja_template``, the function behind ``apply_chat_template``, with
the tokenizer's special tokens (``bos_token``, ``eos_token``, ...) as variables.

Which tokens are trained (``loss_on``):

* ``assistant`` (default): every assistant turn; ``last``: only the last assistant turn; ``all``: every
  token of the conversation.

How assistant turns are found, in characters of the rendered text, then mapped to tokens:

1. If the template marks them with ``{% generation %}`` ... ``{% endgeneration %}``, those spans (what
   ``return_assistant_tokens_mask`` uses).
2. Otherwise by rendering prefixes: assistant message ``j`` spans from the end of
   ``render(messages[:j], add_generation_prompt=True)`` (so the role header is not trained) to the end of
   ``render(messages[:j + 1])``, less trailing whitespace (so for ChatML the turn is ``content<|im_end|>``
   and the newline after it is not trained). Both renders must be prefixes of the whole conversation's
   render; a template that renders earlier turns differently from the last one (e.g. one that drops
   earlier turns' reasoning) fails this check and the record is reported as an error, naming its row.

**Work bound.** Jinja's sandbox keeps a template from Python's internals, not from working without end:
each render runs within a fixed budget of steps and of size (``template_sandbox``: every loop item,
call and lookup takes a step, every value is measured, an over-large one before it is made). A template
that goes over it fails on that record (``template_budget``), naming it, as any failing template does.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError
from packtool.tokenizing.tokenizer import HFTokenizer

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def unrendered_part(messages: list[dict], text: str) -> str | None:
    """What a template left out: ``message j's text part k`` when a text part of a message's content
    list does not appear in the rendered ``text`` (a template written for string contents drops a list
    of parts without a word, as ``apply_chat_template`` would), else ``None``.

    >>> unrendered_part([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "<|user|>\\n")
    "message 0's text part 0"
    """
    at = 0
    for j, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for k, part in enumerate(content):
            piece = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
            if not isinstance(piece, str) or not piece.strip():
                continue
            found = text.find(piece.strip(), at)
            if found < 0:
                return f"message {j}'s text part {k}"
            at = found
    return None


def _checked(messages: list[dict], text: str) -> str:
    """``text``, or ``ValueError`` when the template left out a text part (``unrendered_part``)."""
    missing = unrendered_part(messages, text)
    if missing is not None:
        raise ValueError(
            f"the chat template does not render {missing} (it renders string contents only?): give the "
            "content as a string, or a template that renders content parts"
        )
    return text


def load_chat_template(tokenizer: HFTokenizer, chat_template: str | None) -> tuple[str, str]:
    """The template text and where it came from (the file, or the tokenizer). A ``.json`` file holds it
    under ``chat_template``, as a processor directory's ``chat_template.json`` does."""
    if chat_template:
        path = Path(chat_template)
        if not path.is_file():
            raise ConfigError(f"chat_template {chat_template}: no such file (expected a Jinja template file)")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            try:
                text = json.loads(text)["chat_template"]
            except (ValueError, KeyError, TypeError):
                raise ConfigError(
                    f"chat_template {chat_template}: a JSON file needs a 'chat_template' string"
                ) from None
        return text, str(path)
    template = tokenizer.chat_template
    if not template:
        raise ConfigError(
            f"tokenizer {tokenizer.spec} has no chat template: pass --chat-template FILE (a Jinja template), "
            "or a tokenizer directory whose tokenizer_config.json has a chat_template"
        )
    return template, tokenizer.spec


class ChatTemplate:
    """A chat template, loaded and checked: renders conversations within their budget and finds the
    characters of their trained turns (module docstring)."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        chat_template: str | None = None,
        loss_on: str = "assistant",
    ) -> None:
        try:  # transformers (and jinja2) are an optional extra, packtool[transformers]: chat needs them
            from transformers.utils.chat_template_utils import _compile_jinja_template

            # (the bounded sandbox imports transformers' chat template helpers too)
            from packtool.tokenizing import template_sandbox
        except ImportError:
            raise ConfigError(
                "sample_format chat needs transformers and jinja2 (pip install 'packtool[transformers]')"
            ) from None
        self._sandbox, self._compiled = template_sandbox, _compile_jinja_template
        self._template = None  # the bounded template, compiled in each process on first use
        self.tokenizer, self.loss_on = tokenizer, loss_on
        self.template, self.template_source = load_chat_template(tokenizer, chat_template)
        self.span_method = "generation" if GENERATION_TAG.search(self.template) else "prefix"
        self.template_vars = tokenizer.special_tokens_map()
        try:
            self.render([{"role": "user", "content": "hello"}])
        except Exception as e:
            if type(e).__name__ == "TemplateSyntaxError":
                raise ConfigError(f"chat template from {self.template_source}: {e}") from None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_template": None}  # (a compiled template does not pickle)

    # --- rendering ---------------------------------------------------------------------------------
    def render(
        self,
        messages: list[dict],
        tools: list | None = None,
        add_generation_prompt: bool = False,
        with_spans: bool = False,
    ) -> tuple[str, list[tuple[int, int]]]:
        """Render one conversation within its budget (``template_sandbox``); with ``with_spans``, also the
        ``{% generation %}`` character spans."""
        if self._template is None:  # transformers' environment (of an empty template: Jinja folds the
            # constants of what it compiles, ``2 ** 1000000000`` too), the budget's hooks added
            self._template = self._sandbox.bounded_template(self.template, self._compiled(""))
        return self._sandbox.render_chat(
            self._template, messages, tools, add_generation_prompt, with_spans, self.template_vars
        )

    def trained_spans(
        self, messages: list[dict], tools: list | None = None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the ``[start, end)`` character spans whose tokens are trained.

        Raises ``ValueError`` when the template does not render the conversation prefix by prefix, or
        leaves out the text of a message's content parts (``unrendered_part``).
        """
        if self.loss_on == "all":
            text, _ = self.render(messages, tools)
            return text, [(0, len(_checked(messages, text)))]
        if self.span_method == "generation":
            text, spans = self.render(messages, tools, with_spans=True)
            return _checked(messages, text), spans[-1:] if self.loss_on == "last" else spans
        text, _ = _checked(messages, self.render(messages, tools)[0]), None
        turns = [j for j, m in enumerate(messages) if m.get("role") == "assistant"]
        if self.loss_on == "last":
            turns = turns[-1:]
        spans = []
        for j in turns:
            before, _ = self.render(messages[:j], tools, add_generation_prompt=True)
            through, _ = self.render(messages[: j + 1], tools)
            if not (through.startswith(before) and text.startswith(through)):
                raise ValueError(
                    f"the chat template does not render message {j} as a prefix of the whole conversation, "
                    "so its tokens cannot be located; use a template with {% generation %} markers, "
                    "or --loss-on all"
                )
            spans.append((len(before), max(len(before), len(through.rstrip()))))
        return text, spans

    def identity(self) -> dict[str, Any]:
        """The template's source and digest, and how its assistant turns are found."""
        return {
            "chat_template": self.template_source,
            "chat_template_sha256": hashlib.sha256(self.template.encode()).hexdigest(),
            "assistant_spans": self.span_method,
        }
