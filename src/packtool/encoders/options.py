"""The encoding stage's options: the tokenizer and the labels convention, and each sample format's
encoder's own options (they apply only to that ``--sample-format``, once ``auto`` is decided)."""

from __future__ import annotations

from typing import Literal

import msgspec

from packtool.conventions import LABELS, MAX_TOKEN_ID
from packtool.errors import ConfigError
from packtool.option_types import Applies, OptionGroup, option

SAMPLE_FORMATS = ("auto", "text", "pretokenized", "prompt_completion", "chat", "vision", "interleaved")
# the sample formats of images with their tokens, through a model's processor (docs/vision.md): conversations
# (``vision``) and interleaved image-text documents (``interleaved``)
VISION_FORMATS = frozenset({"vision", "interleaved"})
LOSS_ON = ("assistant", "last", "all")
EMPTY_LOSS_POLICIES = ("drop", "keep", "error")


class SpecialTokenOptions(OptionGroup):
    """BOS and EOS around every sample: the text, prompt_completion and interleaved encoders and a
    module:callable encoder (a chat template writes its own special tokens; pretokenized samples are taken
    as they are)."""

    section = "encoding"
    applies = Applies("sample_format", ("text", "prompt_completion", "interleaved"))

    add_bos: option(bool, "Prepend the BOS token to every sample.") = False
    add_eos: option(bool, "Append the EOS token to every sample.") = False
    bos_token: option(str | None, "BOS token text (with --add-bos) [default: the tokenizer's].") = None
    eos_token: option(str | None, "EOS token text (with --add-eos) [default: the tokenizer's].") = None
    bos_token_id: option(
        int | None,
        "BOS token id (with --add-bos), e.g. for a module:callable encoder.",
        ge=0,
        le=MAX_TOKEN_ID,
    ) = None
    eos_token_id: option(
        int | None,
        "EOS token id (with --add-eos), e.g. for a module:callable encoder.",
        ge=0,
        le=MAX_TOKEN_ID,
    ) = None


class PretokenizedOptions(OptionGroup):
    """``--sample-format pretokenized``'s own options."""

    section = "encoding"
    applies = Applies("sample_format", ("pretokenized",))

    mask_labels: option(
        bool,
        "Where the input gives labels and a loss_mask, write -100 into the labels where loss_mask is 0 "
        "(as NeMo AutoModel's pack_dataset does).",
    ) = False


class PromptCompletionOptions(OptionGroup):
    """``--sample-format prompt_completion``'s own options (``packtool.encoders.prompt_completion``)."""

    section = "encoding"
    applies = Applies("sample_format", ("prompt_completion",))

    prompt_field: option(str, "Field holding the prompt.") = "prompt"
    completion_field: option(str, "Field holding the completion.") = "completion"
    prompt_template: option(
        str | None, "'alpaca' (instruction/input) or a format string over fields ('Q: {question}')."
    ) = None
    train_on_prompt: option(bool, "Train on the prompt too.") = False


class ChatOptions(OptionGroup):
    """``--sample-format chat``'s own options (``packtool.encoders.chat``), which vision-language
    conversations honour too."""

    section = "encoding"
    applies = Applies("sample_format", ("chat", "vision"))

    chat_template: option(str | None, "Jinja template file [default: the tokenizer directory's own].") = None


class LossOptions(OptionGroup):
    """Which tokens of a conversation or an interleaved document are trained (``packtool.encoders.chat``;
    an interleaved document's texts by default, ``all`` also what the processor writes around its images
    outside their spans: ``packtool.vision.sequences``)."""

    section = "encoding"
    applies = Applies("sample_format", ("chat", "vision", "interleaved"))

    loss_on: option(
        Literal[LOSS_ON],
        "Train on every assistant turn, the last one only, or all tokens (interleaved documents: their "
        "texts by default; all: every token outside the images' spans).",
    ) = "assistant"


class FineTuningOptions(OptionGroup):
    """The fine-tuning formats' options (prompt_completion, chat and vision: samples may have nothing to
    learn)."""

    section = "encoding"
    applies = Applies("sample_format", ("prompt_completion", "chat", "vision", "interleaved"))

    empty_loss: option(
        Literal[EMPTY_LOSS_POLICIES], "Samples with nothing to learn: drop (counted), keep, or error."
    ) = "drop"


class VisionOptions(OptionGroup):
    """``--sample-format vision`` and ``interleaved``'s own options: images with their tokens
    (docs/vision.md). With ``--processor`` and ``--sample-format auto`` the samples are vision samples:
    conversations, or interleaved documents when the records have ``texts`` and ``images``."""

    section = "encoding"
    applies = Applies("sample_format", ("vision", "interleaved"))

    processor: option(
        str | None,
        "Vision-language samples: the model's processor directory (what AutoProcessor loads, offline); its "
        "tokenizer, chat template and its own text for each image make the samples' tokens (interleaved "
        "image-text documents: no chat template).",
    ) = None
    balance_visual_tokens: option(
        int | None,
        "Order the packs so that each run of this many consecutive packs (one step of that many "
        "data-parallel ranks) carries similar image tokens; before --val-fraction's hold-out.",
        gt=0,
    ) = None


class EncodingOptions(OptionGroup):
    """How records become input_ids, labels and loss_mask."""

    section = "encoding"

    sample_format: option(Literal[SAMPLE_FORMATS], "How records are encoded.") = "auto"
    tokenizer: option(
        str | None, "tokenizer.json, a local model directory, or a module:callable encoder."
    ) = None
    text_field: option(str, "Field holding the text (text input; .txt files are read into it).") = "text"
    labels: option(
        Literal[LABELS],
        "shifted: labels[i] is the target of input_ids[i]; unshifted: labels = input_ids (the model shifts).",
    ) = "shifted"
    encoder_kwargs: option(
        dict | None, "Keyword arguments for a module:callable encoder class.", flag=False
    ) = None
    tokens: SpecialTokenOptions = msgspec.field(default_factory=SpecialTokenOptions)
    pretokenized: PretokenizedOptions = msgspec.field(default_factory=PretokenizedOptions)
    prompt_completion: PromptCompletionOptions = msgspec.field(default_factory=PromptCompletionOptions)
    chat: ChatOptions = msgspec.field(default_factory=ChatOptions)
    loss: LossOptions = msgspec.field(default_factory=LossOptions)
    fine_tuning: FineTuningOptions = msgspec.field(default_factory=FineTuningOptions)
    vision: VisionOptions = msgspec.field(default_factory=VisionOptions)

    @property
    def is_vision(self) -> bool:
        """Whether the samples are vision-language ones: ``--sample-format vision`` or ``interleaved``, or
        ``auto`` with a ``--processor``."""
        auto = self.sample_format == "auto" and self.vision.processor is not None
        return self.sample_format in VISION_FORMATS or auto

    def check(self) -> None:
        """``ConfigError`` for a token named for BOS or EOS that nothing adds."""
        for end in ("bos", "eos"):
            token, token_id = getattr(self.tokens, f"{end}_token"), getattr(self.tokens, f"{end}_token_id")
            if token is not None and token_id is not None:
                raise ConfigError(
                    f"--{end}-token {token} and --{end}-token-id {token_id} conflict: both name the token "
                    f"--add-{end} adds; drop one"
                )
            for name, value in ((f"{end}-token", token), (f"{end}-token-id", token_id)):
                if value is not None and not getattr(self.tokens, f"add_{end}"):
                    raise ConfigError(
                        f"--{name} {value} and --add-{end} off conflict: --{name} names the token "
                        f"--add-{end} adds; drop one"
                    )
        if self.sample_format in VISION_FORMATS and not self.vision.processor:
            raise ConfigError(
                f"--sample-format {self.sample_format} needs --processor DIR (the model's processor "
                "directory)"
            )
        if self.is_vision and self.tokenizer:
            raise ConfigError(
                "--tokenizer does not apply to vision samples: the --processor directory's tokenizer "
                "encodes them; drop it"
            )
