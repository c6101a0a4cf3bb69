"""Encoders: raw records -> ``input_ids``/``labels`` (see ``packtool.encoders.base`` for the protocol).

``build_encoder(options, sample_format)`` picks one (``options``: the stage's ``EncodingOptions``):

* ``--tokenizer module:callable``: the user's own encoder;
* ``sample_format: pretokenized`` (or ``auto`` with an ``input_ids`` field and no tokenizer or no text
  field): packed as is (ids checked against the tokenizer's vocabulary when one is given);
* ``sample_format: chat`` (or ``auto`` with a ``messages`` or ``conversations`` field): conversations
  through a chat template, loss on the assistant's turns (``packtool.encoders.chat``);
* ``sample_format: prompt_completion`` (or ``auto`` with ``prompt_field`` and ``completion_field``, or a
  ``prompt_template``): loss on the completion only (``packtool.encoders.prompt_completion``);
* ``sample_format: vision`` (or ``auto`` with a ``--processor``): vision-language records through the
  model's processor (``packtool.encoders.vision``, the ``vision`` extra);
* ``sample_format: interleaved`` (or ``auto`` with a ``--processor`` and records of ``texts`` and
  ``images``, or WebDataset samples whose image members are named after their key, ``KEY.0.jpg``):
  interleaved image-text documents through the model's processor, no chat template;
* ``sample_format: text`` (or ``auto`` otherwise): ``text_field`` through ``--tokenizer``.
"""

from __future__ import annotations

import inspect

from packtool.encoders.base import Encoder, FunctionEncoder, special_ids
from packtool.encoders.chat import ChatEncoder
from packtool.encoders.options import VISION_FORMATS, EncodingOptions
from packtool.encoders.pretokenized import PretokenizedEncoder
from packtool.encoders.prompt_completion import BUILTIN_TEMPLATES, PromptCompletionEncoder, template_fields
from packtool.encoders.text import TextEncoder, token_of
from packtool.errors import ConfigError
from packtool.fileio import file_sha256
from packtool.plugins import is_plugin_spec, load_plugin, plugin_file
from packtool.tokenizing.tokenizer import HFTokenizer

__all__ = [
    "SLOW_TO_BUILD",
    "VISION_FORMATS",
    "Encoder",
    "build_encoder",
    "fields_read",
    "resolve_sample_format",
]

# sample formats whose encoder takes seconds to build (a processor: transformers and torch imported, its
# files read): a run whose workers encode has one of them build it first, and its driver never does
SLOW_TO_BUILD = VISION_FORMATS


def resolve_sample_format(options: EncodingOptions, field_names: list[str]) -> str:
    """Decide ``auto``: with a ``--processor`` interleaved documents (``is_interleaved``), else vision;
    pretokenized when the input has ``input_ids`` and no tokenizer is given; chat, prompt_completion or text
    by the fields."""
    if options.sample_format != "auto":
        return options.sample_format
    if options.vision.processor is not None:
        return "interleaved" if is_interleaved(field_names) else "vision"
    if "input_ids" in field_names and (not options.tokenizer or options.text_field not in field_names):
        return "pretokenized"
    if "messages" in field_names or "conversations" in field_names:
        return "chat"
    if options.prompt_completion.prompt_template is not None or (
        options.prompt_completion.prompt_field in field_names
        and options.prompt_completion.completion_field in field_names
    ):
        return "prompt_completion"
    return "text"


# the per-token fields the pretokenized encoder reads; any other list field is named in a warning
PRETOKENIZED_FIELDS = ("input_ids", "labels", "loss_mask", "attention_mask")
# what the vision encoder reads: LLaVA, chat and WebDataset captioning records (``vision.samples``)
VISION_FIELDS = frozenset({"conversations", "messages", "image", "images", "__key__", "txt", "json",
                           "jpg", "jpeg", "png", "webp"})  # fmt: skip


# what the interleaved encoder reads: ``texts`` and ``images``, or a WebDataset sample's ``json`` (and the
# image members it names: ``vision.samples.batch_samples``)
INTERLEAVED_FIELDS = frozenset({"texts", "images", "__key__", "json"})
MEMBER_IMAGES = ("jpg", "jpeg", "png", "webp", "gif")  # a WebDataset member named ``KEY.NAME.jpg``


def is_interleaved(field_names: list[str]) -> bool:
    """Whether records of ``field_names`` are interleaved documents: ``texts`` and ``images`` and no
    conversation, or WebDataset samples with a ``json`` and an image member named after the key
    (``KEY.0.jpg``: a field ``0.jpg``; a captioning sample's image is ``KEY.jpg``).

    >>> is_interleaved(["texts", "images"]), is_interleaved(["__key__", "json", "0.jpg"])
    (True, True)
    >>> is_interleaved(["__key__", "jpg", "txt"]), is_interleaved(["messages", "images"])
    (False, False)
    """
    names = set(field_names)
    if {"texts", "images"} <= names:
        return not names & {"messages", "conversations"}
    named = any("." in n and n.rsplit(".", 1)[1] in MEMBER_IMAGES for n in names)
    return {"__key__", "json"} <= names and named


def fields_read(options: EncodingOptions, sample_format: str) -> frozenset[str] | None:
    """The record fields the encoder for ``sample_format`` reads (None: a custom encoder, which sees every
    field). The readers leave out a field outside these whose values cannot be one column, so an encoder
    that starts reading another field must be listed here too."""
    if is_plugin_spec(options.tokenizer):
        return None
    if sample_format == "pretokenized":
        return frozenset(PRETOKENIZED_FIELDS)
    if sample_format == "chat":
        return frozenset({"messages", "conversations", "tools"})
    if sample_format == "vision":
        return VISION_FIELDS
    if sample_format == "interleaved":
        return INTERLEAVED_FIELDS
    if sample_format == "prompt_completion":
        fields = {
            options.prompt_completion.prompt_field,
            options.prompt_completion.completion_field,
            "instruction",
            "input",
        }
        if (
            options.prompt_completion.prompt_template is not None
            and options.prompt_completion.prompt_template not in BUILTIN_TEMPLATES
        ):
            fields.update(template_fields(options.prompt_completion.prompt_template))
        return frozenset(fields)
    return frozenset({options.text_field})


def build_encoder(
    options: EncodingOptions, sample_format: str, packed_sequence_size: int, state: dict | None = None
) -> Encoder:
    """Build the encoder named by ``options`` for records of ``sample_format`` (``packed_sequence_size``:
    the most tokens one image may take, for vision samples; ``state``: what the run's driver found
    building the same encoder, ``encoder.state()``, for a worker to take instead of finding it again)."""
    if sample_format in VISION_FORMATS:
        try:  # the vision extra (Pillow, transformers): imported by runs of images only
            from packtool.encoders.vision import DocumentTokens, VisionEncoder
        except ImportError as e:
            raise ConfigError(
                f"--processor needs transformers and Pillow (pip install 'packtool[vision]'): {e}"
            ) from None

        documents = None
        if sample_format == "interleaved":
            if options.loss.loss_on == "last":
                raise ConfigError(
                    "--loss-on last does not apply to interleaved documents (they have no turns): they "
                    "train on their texts, or with --loss-on all on every token but their images' own"
                )
            documents = DocumentTokens.of(options.tokens, options.loss.loss_on)
        return VisionEncoder(
            options.vision.processor,
            packed_sequence_size,
            chat_template=options.chat.chat_template,
            loss_on=options.loss.loss_on,
            labels=options.labels,
            empty_loss=options.fine_tuning.empty_loss,
            fields=VISION_FIELDS if documents is None else INTERLEAVED_FIELDS,
            proven=state,
            documents=documents,
        )
    tokens = options.tokens
    if is_plugin_spec(options.tokenizer):
        obj = load_plugin(options.tokenizer, "tokenizer")
        if inspect.isclass(obj):
            obj = obj(**(options.encoder_kwargs or {}))
        if not callable(obj):
            raise ConfigError(f"tokenizer {options.tokenizer} is not callable")
        ids = {
            kind: special_ids(
                obj,
                options.tokenizer,
                getattr(tokens, f"add_{kind}"),
                kind,
                getattr(tokens, f"{kind}_token"),
                getattr(tokens, f"{kind}_token_id"),
            )
            for kind in ("bos", "eos")
        }
        source = plugin_file(options.tokenizer)
        return FunctionEncoder(
            obj, options.tokenizer, options.labels, ids["bos"], ids["eos"], source and file_sha256(source)
        )
    if sample_format == "pretokenized":
        vocab = HFTokenizer(options.tokenizer).vocab_size if options.tokenizer else None
        return PretokenizedEncoder(
            labels=options.labels, vocab_size=vocab, mask_labels=options.pretokenized.mask_labels
        )
    if not options.tokenizer:
        raise ConfigError(
            "the input holds text: pass --tokenizer (a tokenizer.json, a model directory, "
            "or module:callable), or give pretokenized input_ids"
        )
    if sample_format == "chat":  # (--add-bos/--add-eos do not apply: the template writes them)
        return ChatEncoder(
            HFTokenizer(options.tokenizer),
            chat_template=options.chat.chat_template,
            loss_on=options.loss.loss_on,
            labels=options.labels,
            empty_loss=options.fine_tuning.empty_loss,
        )
    tokenizer = HFTokenizer(options.tokenizer)
    bos_token = token_of(tokenizer, "bos", tokens.bos_token, tokens.bos_token_id)
    eos_token = token_of(tokenizer, "eos", tokens.eos_token, tokens.eos_token_id)
    if sample_format == "prompt_completion":
        return PromptCompletionEncoder(
            tokenizer,
            prompt_field=options.prompt_completion.prompt_field,
            completion_field=options.prompt_completion.completion_field,
            prompt_template=options.prompt_completion.prompt_template,
            train_on_prompt=options.prompt_completion.train_on_prompt,
            add_bos=tokens.add_bos,
            add_eos=tokens.add_eos,
            bos_token=bos_token,
            eos_token=eos_token,
            labels=options.labels,
            empty_loss=options.fine_tuning.empty_loss,
        )
    return TextEncoder(
        tokenizer,
        text_field=options.text_field,
        add_bos=tokens.add_bos,
        add_eos=tokens.add_eos,
        bos_token=bos_token,
        eos_token=eos_token,
        labels=options.labels,
    )
