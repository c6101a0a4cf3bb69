"""Encoders: raw records -> ``input_ids``/``labels`` (see ``packtool.encoders.base`` for the protocol).

``build_encoder(config, first_batch)`` picks one:

* ``--tokenizer module:callable``: the user's own encoder;
* ``sample_format: pretokenized`` (or ``auto`` with an ``input_ids`` field and no tokenizer or no text
  field): packed as is (ids checked against the tokenizer's vocabulary when one is given);
* ``sample_format: chat`` (or ``auto`` with a ``messages`` or ``conversations`` field): conversations
  through a chat template, loss on the assistant's turns (``packtool.encoders.chat``);
* ``sample_format: prompt_completion`` (or ``auto`` with ``prompt_field`` and ``completion_field``, or a
  ``prompt_template``): loss on the completion only (``packtool.encoders.prompt_completion``);
* ``sample_format: text`` (or ``auto`` otherwise): ``text_field`` through ``--tokenizer``.
"""

from __future__ import annotations

import inspect

from packtool.config import PackConfig
from packtool.encoders.base import Encoder, FunctionEncoder
from packtool.encoders.chat import ChatEncoder
from packtool.encoders.pretokenized import PretokenizedEncoder
from packtool.encoders.prompt_completion import BUILTIN_TEMPLATES, PromptCompletionEncoder, template_fields
from packtool.encoders.text import HFTokenizer, TextEncoder
from packtool.errors import ConfigError
from packtool.plugins import is_plugin_spec, load_plugin

__all__ = ["Encoder", "build_encoder", "fields_read", "resolve_sample_format"]


def resolve_sample_format(config: PackConfig, field_names: list[str]) -> str:
    """Decide ``auto``: pretokenized when the input has ``input_ids`` and no tokenizer is given."""
    if config.sample_format != "auto":
        return config.sample_format
    if "input_ids" in field_names and (not config.tokenizer or config.text_field not in field_names):
        return "pretokenized"
    if "messages" in field_names or "conversations" in field_names:
        return "chat"
    if config.prompt_template is not None or (
        config.prompt_field in field_names and config.completion_field in field_names
    ):
        return "prompt_completion"
    return "text"


# the per-token fields the pretokenized encoder reads; any other list field is named in a warning
PRETOKENIZED_FIELDS = ("input_ids", "labels", "loss_mask", "attention_mask")


def fields_read(config: PackConfig, sample_format: str) -> frozenset[str] | None:
    """The record fields the encoder for ``sample_format`` reads (None: a custom encoder, which sees every
    field). The readers leave out a field outside these whose values cannot be one column, so an encoder
    that starts reading another field must be listed here too."""
    if is_plugin_spec(config.tokenizer):
        return None
    if sample_format == "pretokenized":
        return frozenset(PRETOKENIZED_FIELDS)
    if sample_format == "chat":
        return frozenset({"messages", "conversations", "tools"})
    if sample_format == "prompt_completion":
        fields = {config.prompt_field, config.completion_field, "instruction", "input"}
        if config.prompt_template is not None and config.prompt_template not in BUILTIN_TEMPLATES:
            fields.update(template_fields(config.prompt_template))
        return frozenset(fields)
    return frozenset({config.text_field})


def build_encoder(config: PackConfig, sample_format: str) -> Encoder:
    """Build the encoder named by ``config`` for records of ``sample_format``."""
    if is_plugin_spec(config.tokenizer):
        obj = load_plugin(config.tokenizer, "tokenizer")
        if inspect.isclass(obj):
            obj = obj(**(config.encoder_kwargs or {}))
        if not callable(obj):
            raise ConfigError(f"tokenizer {config.tokenizer} is not callable")
        return FunctionEncoder(obj, config.tokenizer, labels=config.labels)
    if sample_format == "pretokenized":
        vocab = HFTokenizer(config.tokenizer).vocab_size if config.tokenizer else None
        return PretokenizedEncoder(labels=config.labels, vocab_size=vocab, mask_labels=config.mask_labels)
    if not config.tokenizer:
        raise ConfigError(
            "the input holds text: pass --tokenizer (a tokenizer.json, a model directory, "
            "or module:callable), or give pretokenized input_ids"
        )
    if sample_format == "chat":
        for key in ("add_bos", "add_eos"):
            if getattr(config, key):
                raise ConfigError(
                    f"{key} does not apply to sample_format chat: the chat template writes the special tokens"
                )
        return ChatEncoder(
            HFTokenizer(config.tokenizer),
            chat_template=config.chat_template,
            loss_on=config.loss_on,
            labels=config.labels,
            empty_loss=config.empty_loss,
        )
    if sample_format == "prompt_completion":
        return PromptCompletionEncoder(
            HFTokenizer(config.tokenizer),
            prompt_field=config.prompt_field,
            completion_field=config.completion_field,
            prompt_template=config.prompt_template,
            train_on_prompt=config.train_on_prompt,
            add_bos=config.add_bos,
            add_eos=config.add_eos,
            bos_token=config.bos_token,
            eos_token=config.eos_token,
            labels=config.labels,
            empty_loss=config.empty_loss,
        )
    return TextEncoder(
        HFTokenizer(config.tokenizer),
        text_field=config.text_field,
        add_bos=config.add_bos,
        add_eos=config.add_eos,
        bos_token=config.bos_token,
        eos_token=config.eos_token,
        labels=config.labels,
    )
