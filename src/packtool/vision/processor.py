"""The model's own processor, from a local directory: what it writes for each image, exactly, or a refusal.

``load_processor(DIR)`` loads what ``AutoProcessor.from_pretrained(DIR)`` loads, offline
(``local_files_only``; nothing is downloaded), with the image processor on the PIL/NumPy backend
(``backend="pil"``): the torchvision backend needs a torchvision wheel that matches torch. A processor
whose only part that needs torchvision is its *video* processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, SmolVLM,
LLaVA-OneVision, InternVL, GLM-4V, MiniCPM-V, Gemma 4) is built by its own class with the video processor
left out (packtool packs images, not videos; the identity says so) and its other parts loaded as
``AutoProcessor`` loads them (Gemma 4's audio feature extractor too). A processor that cannot be built
without torchvision (Pixtral, Mistral 3: their processor class itself requires it) is refused, with
transformers' own reason.

What the processor writes for each image comes from the processor itself (``packtool.vision.expansion``:
its replacement text for each image size, its layout of the text, its tokenizer), checked at load time on
probe images; a processor whose text packtool cannot reproduce exactly is refused in one line naming the
family and why (``ConfigError``, exit 2). So is a configuration with a value no image can be counted with
(``patch_size: 0``, a negative size or ``num_additional_image_tokens``, an unknown
``vision_feature_select_strategy``), naming the file and the field.

The conversation is rendered with ``chat_template`` (``--chat-template``) when given, else the
processor's own template (``chat_template.jinja`` / ``.json`` of the directory), else the tokenizer's.
As ``processor.apply_chat_template(..., tokenize=True)`` does, the tokenizer adds its own special tokens
(a BOS) unless the rendered text already starts with its BOS. Interleaved documents have no conversation:
their processor is loaded for them (``conversations=False``), and their text holds at each image what the
model's text has for one (``VisionProcessor.image_placeholder``): what the chat template writes for an
image part, without the whitespace around it (Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``,
which its model needs between two images side by side), where it holds the processor's placeholder once;
else the processor's placeholder alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError
from packtool.tokenizing.chat_template import ChatTemplate
from packtool.tokenizing.tokenizer import HFTokenizer
from packtool.vision.expansion import Expander, Expansion, Refused, first_line

CONFIG_FILES = (
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
)
CHECKED_CONFIGS = ("processor_config.json", "preprocessor_config.json")
# a processor config's fields that count pixels or tokens: > 0 (a size of 0 divides by zero or gives no
# image), or >= 0 for those that may be 0
POSITIVE = re.compile(
    r"(patch_size|merge_size|downsample_factor|image_seq_len|image_seq_length|num_image_tokens|img_size|height"
    r"|width|shortest_edge|longest_edge|max_image_tiles|max_patches|min_patches|max_pixels"
    r"|pan_and_scan_min_crop_size|pan_and_scan_max_num_crops|image_grid_pinpoints)"
)
NON_NEGATIVE = re.compile(r"(num_additional_image_tokens|min_pixels)")
SELECT_STRATEGIES = ("default", "full")


@dataclass
class VisionProcessor:
    """A model's processor, as packing needs it.

    Attributes:
        path: the directory it was loaded from.
        family: the model family and processor class, e.g. ``"gemma3 (Gemma3Processor)"``.
        image_token: the placeholder the chat template writes once per image and the processor replaces
            (``<image>``, ``<|image_pad|>``, Gemma 3's ``<start_of_image>``).
        image_token_ids: ``(m,)`` int64, the processor's image tokens (``image_token_ids``: what its
            ``mm_token_type_ids`` marks); an image's span runs from the first to the last of them.
        tokenizer: packtool's ``HFTokenizer`` over the processor's own tokenizer.
        chat: the ``ChatTemplate`` (renders image parts, finds trained spans); ``None`` for a processor
            loaded for interleaved documents (``load_processor(conversations=False)``).
        image_processor: the transformers image processor (PIL backend), for the loader.
        processor: the transformers processor.
        expander: its expansion, reproduced (``packtool.vision.expansion``).
        video: ``None``, or why its video processor was not loaded.
        document_image: what an interleaved document's text holds at each image, for a processor loaded
            for documents (``image_placeholder``).
        loaded_with: the arguments ``load_processor`` took (a pickled processor is loaded again from them,
            as a DataLoader worker started with ``spawn`` does: the processor itself may hold a class built
            at load time).
    """

    path: str
    family: str
    image_token: str
    image_token_ids: np.ndarray
    tokenizer: HFTokenizer
    chat: ChatTemplate | None
    image_processor: Any
    processor: Any
    expander: Expander
    video: str | None = None
    document_image: str | None = None
    loaded_with: dict[str, Any] = field(default_factory=dict, repr=False)
    _config_sha256: str = field(default="", repr=False)

    def __reduce__(self):
        return _load_again, (self.loaded_with,)

    def expansion(self, height: int, width: int, images: int = 1, mode: str = "RGB") -> Expansion:
        """What the processor writes for an image of ``height x width`` pixels (of Pillow's ``mode``) in a
        sample of ``images`` images (``Expansion``: its text, its span's ids); ``ValueError`` for an image
        the processor refuses (its size, or its mode at that size: ``Expander.takes``).

        >>> vp.expansion(480, 640).span_length  # doctest: +SKIP
        576
        """
        self.expander.takes(mode, height, width)
        return self.expander.expansion(height, width, images)

    def proofs(self) -> dict[str, Any]:
        """What probing this processor found, with its configuration's digest (``load_processor``'s
        ``proven``)."""
        return {**self.expander.proofs(), "config_sha256": self._config_sha256}

    def prefetch(self, sizes: list[tuple[int, int]]) -> None:
        """Count the images of ``sizes`` in one call of the processor where it can (``Expander.prefetch``):
        ``expansion`` then finds them counted."""
        self.expander.prefetch(sizes)

    @property
    def cross_attention(self) -> bool:
        """Whether the model attends to the images from cross-attention layers (Mllama: its processor gives a
        ``cross_attention_mask``; one image token per image), not in its token sequence."""
        return self.expander.cross_attention

    @property
    def image_placeholder(self) -> str:
        """What an interleaved document's text holds at each image, whose placeholder the processor
        replaces by its tokens for the image (``processor(text=..., images=...)``): for a processor loaded
        for documents, the text its chat template writes for an image part (module docstring), else the
        placeholder as the processor takes it in a text (``placeholders(1)``: HunYuan-VL's wrapped).

        >>> vp.image_placeholder  # doctest: +SKIP
        '<|vision_start|><|image_pad|><|vision_end|>'
        """
        return self.document_image or self.expander.written

    @property
    def image_token_id(self) -> int:
        """The processor's ``image_token_id`` (the token LLaVA, Qwen2-VL, Idefics3 repeat; Gemma 3's
        ``<start_of_image>``), else its image token's id (Janus's processor has no ``image_token_id``)."""
        own = getattr(self.processor, "image_token_id", None)
        return int(own if own is not None else self.tokenizer.token_to_id(self.image_token))

    def placeholders(self, images: int) -> str:
        """``images`` image placeholders as the processor takes them in a text (``<image><image>``;
        HunYuan-VL's ``<start><image><end>`` each, as its chat template writes them)."""
        return self.expander.written * images

    def image_tokens(self, height: int, width: int, images: int = 1) -> int:
        """How many tokens the span of an image of ``height x width`` takes (``expansion().span_length``)."""
        return self.expansion(height, width, images).span_length

    def layout(self, text: str, images: int) -> str:
        """``text`` as the processor lays it out before it replaces the placeholders
        (``prepare_inputs_layout``)."""
        return self.expander.layout(text, images)

    def adds_special_tokens(self, text: str) -> bool:
        """Whether the tokenizer adds its special tokens to ``text`` (``apply_chat_template``'s rule: as the
        processor's own call does, unless the rendered text starts with the BOS)."""
        return self.expander.special_tokens and not self._starts_with_bos(text)

    def _starts_with_bos(self, text: str) -> bool:
        bos = self.tokenizer.declared_token("bos")
        return bos is not None and text.startswith(bos)

    def encode_rendered(
        self, texts: list[str], special: list[bool]
    ) -> list[tuple[list[int], list[tuple[int, int]], np.ndarray]]:
        """Each text tokenized by the processor's tokenizer, with its special tokens where ``special``:
        ``(ids, (start, end) character offsets, (L,) bool: the token is of the text, not a special token
        the tokenizer added)``."""
        out: list[Any] = [None] * len(texts)
        for flag in (False, True):
            index = [i for i, s in enumerate(special) if s == flag]
            if not index:
                continue
            encodings = self.expander.encode([texts[i] for i in index], flag)
            for i, e in zip(index, encodings, strict=True):
                if flag:  # the tokens the tokenizer added have no sequence
                    in_text = np.fromiter((s is not None for s in e.sequence_ids), bool, count=len(e.ids))
                else:
                    in_text = np.ones(len(e.ids), dtype=bool)
                out[i] = (e.ids, e.offsets, in_text)
        return out

    def identity(self) -> dict[str, Any]:
        """What a manifest records of the processor (and the run id hashes): everything the ids depend on.
        ``config_sha256`` hashes the directory's files of ``CONFIG_FILES`` that exist, in that order."""
        import transformers  # noqa: PLC0415 - loaded already by load_processor; only its version is read

        mode, chat = "per image size", self.chat
        if self.expander.arithmetic is not None:
            mode = "arithmetic (the processor's _get_num_multimodal_tokens), spot-checked"
        elif self.expander.per_image_count:
            mode = "per image size and images per sample"
        return {
            "path": self.path,
            "family": self.family,
            "image_token": self.image_token,
            "image_token_ids": self.image_token_ids.tolist(),
            "image_processor": type(self.image_processor).__name__,
            "video_processor": self.video or type(getattr(self.processor, "video_processor", None)).__name__,
            "expansion": mode,
            "chat_template": chat and chat.template_source,  # (None: loaded for interleaved documents)
            "chat_template_sha256": chat and hashlib.sha256(chat.template.encode()).hexdigest(),
            "loss_on": chat and chat.loss_on,
            "transformers": transformers.__version__,
            "config_sha256": self._config_sha256,
        } | ({} if chat else {"image_placeholder": self.image_placeholder})


def load_processor(
    directory: str | Path,
    *,
    chat_template: str | None = None,
    loss_on: str = "assistant",
    proven: dict[str, Any] | None = None,
    conversations: bool = True,
) -> VisionProcessor:
    """The processor of a local model directory; nothing is downloaded (module docstring).

    Args:
        directory: the model directory.
        chat_template: a Jinja template file (``--chat-template``) used instead of the directory's.
        loss_on: ``assistant``, ``last`` or ``all`` (``--loss-on``; ``packtool.tokenizing.chat_template``).
        proven: ``VisionProcessor.proofs()`` of the same directory, loaded by another process (a run's
            driver, for its workers): taken instead of probing the processor again when the directory's
            configuration files still give the digest they had there.
        conversations: load the chat template (``False``: for interleaved documents, which have none;
            ``chat`` is then ``None``).

    Raises ``ConfigError``: a directory that is missing or holds no processor, a bad configuration value,
    a family packtool refuses (one line naming it and why).
    """
    try:  # transformers is the vision extra's (packtool[vision]), and slow to import
        from transformers import AutoProcessor
    except ImportError:
        raise ConfigError(
            "--processor needs transformers and Pillow (pip install 'packtool[vision]')"
        ) from None
    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(f"processor {directory}: no such directory (expected a local model directory)")
    check_config_values(path)
    video = None
    try:
        processor = AutoProcessor.from_pretrained(str(path), local_files_only=True, backend="pil")
    except ImportError as e:  # a part needs torchvision: without the video processor, else refused
        processor, video = _without_video(path, e)
    except Exception as e:  # noqa: BLE001 - its constructors run on the directory's values: the user's to fix
        what = (
            first_line(e)
            if isinstance(e, OSError | ValueError | TypeError | KeyError)
            else (f"{type(e).__name__}: {first_line(e)}")
        )
        raise ConfigError(f"processor {directory}: cannot load with AutoProcessor: {what}") from None
    family = _family(processor)
    if not hasattr(processor, "image_processor"):
        raise ConfigError(f"processor {directory}: {family} has no image processor")
    image_token = getattr(processor, "image_token", None)
    backend = getattr(getattr(processor, "tokenizer", None), "_tokenizer", None)
    if not isinstance(image_token, str) or backend is None:
        what = "no image token" if not isinstance(image_token, str) else "no fast tokenizer (tokenizer.json)"
        raise ConfigError(f"processor {directory}: {family} is refused: its processor has {what}")
    if backend.token_to_id(image_token) is None:
        raise ConfigError(f"processor {directory}: the tokenizer has no image token {image_token!r}")
    tokenizer = HFTokenizer.of_loaded(str(path), processor.tokenizer)
    backend.encode_special_tokens = bool(getattr(processor.tokenizer, "split_special_tokens", False))
    expander = Expander(processor, backend)
    digest = _config_digest(path)
    try:
        if proven is not None and proven.get("config_sha256") == digest:  # probed by the run's driver
            expander.adopt(proven)
        else:
            expander.probe()
    except Refused as e:
        raise ConfigError(f"processor {directory}: {family} is refused: {e}") from None
    except Exception as e:  # noqa: BLE001 - a configuration no image can be processed with: the user's to fix
        raise ConfigError(
            f"processor {directory}: {family} fails on a probe image: {type(e).__name__}: {first_line(e)}"
        ) from None
    template = chat_template or _processor_template(path)
    chat = ChatTemplate(tokenizer, template, loss_on) if conversations else None
    document_image = None if conversations else _image_markup(tokenizer, template, expander.placeholder)
    return VisionProcessor(
        path=str(path),
        family=family,
        image_token=image_token,
        image_token_ids=expander.image_ids,
        tokenizer=tokenizer,
        chat=chat,
        image_processor=processor.image_processor,
        processor=processor,
        expander=expander,
        video=video,
        document_image=document_image,
        loaded_with={
            "directory": str(directory),
            "chat_template": chat_template,
            "loss_on": loss_on,
            "conversations": conversations,
        },
        _config_sha256=digest,
    )


def _image_markup(tokenizer: HFTokenizer, template: str | None, placeholder: str) -> str | None:
    """What the chat template (``template``, else the tokenizer's) writes for one image part between two
    text parts, without the whitespace around it, where it holds ``placeholder`` once; ``None`` where there
    is no template, it fails, or it writes something else."""
    before, after = "packtool-text-before", "packtool-text-after"
    parts = [{"type": "text", "text": before}, {"type": "image"}, {"type": "text", "text": after}]
    try:
        text, _ = ChatTemplate(tokenizer, template).render([{"role": "user", "content": parts}])
    except Exception:  # noqa: BLE001 - no template, or one that fails on this: the placeholder alone
        return None
    start, end = text.find(before), text.find(after)
    markup = text[start + len(before) : end].strip() if 0 <= start < end else ""
    return markup if markup.count(placeholder) == 1 else None


def _load_again(arguments: dict[str, Any]) -> VisionProcessor:
    """``load_processor(**arguments)``: how a pickled ``VisionProcessor`` comes back."""
    directory = arguments["directory"]
    return load_processor(
        directory,
        chat_template=arguments["chat_template"],
        loss_on=arguments["loss_on"],
        conversations=arguments.get("conversations", True),
    )


def _without_video(path: Path, error: ImportError) -> tuple[Any, str]:
    """The directory's processor built by its own class with the parts AutoProcessor loads, but its video
    processor (which needs torchvision) left out; ``ConfigError`` naming ``error`` if that is not the part."""
    import transformers  # noqa: PLC0415 - imported by load_processor already
    from transformers import (  # noqa: PLC0415 - as above
        AutoFeatureExtractor,
        AutoImageProcessor,
        AutoTokenizer,
    )

    name = _processor_class_name(path)
    try:  # a class that needs torchvision is a stand-in whose every attribute raises ImportError
        cls = getattr(transformers, name, None) if name else None
        attributes = cls.get_attributes() if cls is not None else []
    except ImportError:
        cls, attributes = None, []
    family = f"{_model_type_of(name, path)} ({name})" if name else "an unknown family"
    reason = f"processor {path}: {family} is refused: it cannot be built here ({_first_sentence(error)})"
    if cls is None or "video_processor" not in attributes:
        raise ConfigError(reason) from None
    try:
        processor_dict, init_kwargs = cls.get_processor_dict(str(path), local_files_only=True)
        args = []
        for attribute in attributes:
            if attribute == "tokenizer":
                args.append(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
            elif attribute == "image_processor":
                args.append(
                    AutoImageProcessor.from_pretrained(str(path), local_files_only=True, backend="pil")
                )
            elif attribute == "video_processor":
                args.append(_NoVideo(**_video_config(path, processor_dict)))
            elif attribute == "feature_extractor":  # an audio part (Gemma 4's), loaded as AutoProcessor would
                args.append(AutoFeatureExtractor.from_pretrained(str(path), local_files_only=True))
            else:
                raise ImportError(f"its {attribute} is not loaded by packtool")
        processor = _images_only(cls).from_args_and_dict(args, processor_dict, **init_kwargs)
    except ImportError as e:
        raise ConfigError(f"{reason[: reason.rindex('(')]}({_first_sentence(e)})") from None
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"processor {path}: cannot load {family}: {first_line(e)}") from None
    return processor, "not loaded (needs torchvision; packtool packs images only)"


class _NoVideo(dict):
    """Stands for a video processor that needs torchvision: its configuration (a dict, so that the
    processor's ``to_dict`` writes it) with its values as attributes (a processor may read them when it is
    built), and an error if it is ever asked to process a video."""

    model_input_names: list[str] = []  # it gives the model nothing

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError("packtool did not load this processor's video processor (it needs torchvision)")


def _images_only(cls: type) -> type:
    """``cls`` (a processor class, its name and module kept) taking ``_NoVideo`` as its video processor."""

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor" and isinstance(argument, _NoVideo):
            return _NoVideo
        return cls.check_argument_for_proper_class(self, argument_name, argument)

    members = {
        "check_argument_for_proper_class": check_argument_for_proper_class,
        "__module__": cls.__module__,
    }
    return type(cls.__name__, (cls,), members)


def _video_config(path: Path, processor_dict: dict) -> dict:
    file = path / "video_preprocessor_config.json"
    config = _json(file) if file.is_file() else processor_dict.get("video_processor", {})
    return {k: v for k, v in config.items() if isinstance(k, str) and k.isidentifier()}


def _processor_class_name(path: Path) -> str | None:
    """The processor class a directory names (``processor_class`` of its configs, else its model type's)."""
    for name in ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                 "tokenizer_config.json"):  # fmt: skip
        config = _json(path / name)
        if isinstance(config.get("processor_class"), str):
            return config["processor_class"]
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES  # noqa: PLC0415

    return PROCESSOR_MAPPING_NAMES.get(_json(path / "config.json").get("model_type"))


def _model_type_of(name: str, path: Path) -> str:
    """The model type of a processor class name: the directory's ``config.json``'s, else the first model
    type transformers maps to that class."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES  # noqa: PLC0415

    own = _json(path / "config.json").get("model_type")
    return own or next((t for t, n in PROCESSOR_MAPPING_NAMES.items() if n == name), "unknown")


def _model_type(cls: type | None) -> str:
    """``gemma3`` of ``transformers.models.gemma3.processing_gemma3.Gemma3Processor``."""
    parts = (cls.__module__ if cls is not None else "").split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "models" else "unknown"


def _family(processor: Any) -> str:
    return f"{_model_type(type(processor))} ({type(processor).__name__})"


def _processor_template(path: Path) -> str | None:
    """The file of the processor's own chat template (``None``: the tokenizer's; ``ChatTemplate`` refuses
    when neither has one)."""
    for name in ("chat_template.jinja", "chat_template.json"):
        if (path / name).is_file():
            return str(path / name)
    if isinstance(_json(path / "processor_config.json").get("chat_template"), str):
        return str(path / "processor_config.json")
    return None


def check_config_values(path: Path) -> None:
    """``ConfigError`` naming the file and field of a value no image can be counted with."""
    for name in CHECKED_CONFIGS:
        file = path / name
        if not file.is_file():
            continue
        try:
            config = json.loads(file.read_text(encoding="utf-8"))
            leaves = list(_numbers(config, ""))
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"processor {path}: {name} is not valid JSON: {first_line(e)}") from None
        except RecursionError:
            raise ConfigError(f"processor {path}: {name} is nested too deep for a configuration") from None
        if not isinstance(config, dict):
            raise ConfigError(f"processor {path}: {name} is not a JSON object")
        token = config.get("image_token")
        if token is not None and (not isinstance(token, str) or not token):
            raise ConfigError(
                f"processor {path}: {name} field 'image_token' is {token!r}: expected the image token's text"
            )
        for where, value in leaves:
            key = where.rsplit(".", 1)[-1].split("[")[0]
            if isinstance(value, str) and (POSITIVE.fullmatch(key) or NON_NEGATIVE.fullmatch(key)):
                raise ConfigError(f"processor {path}: {name} field {where!r} is {value!r}: expected a number")
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            if POSITIVE.fullmatch(key) and value <= 0:
                raise ConfigError(f"processor {path}: {name} field {where!r} is {value}: must be positive")
            if NON_NEGATIVE.fullmatch(key) and value < 0:
                raise ConfigError(
                    f"processor {path}: {name} field {where!r} is {value}: must not be negative"
                )
        strategy = config.get("vision_feature_select_strategy")
        if strategy is not None and strategy not in SELECT_STRATEGIES:
            raise ConfigError(
                f"processor {path}: {name} field 'vision_feature_select_strategy' is {strategy!r}: expected "
                + " or ".join(SELECT_STRATEGIES)
            )


def _numbers(value: Any, where: str):
    """``(dotted path, value)`` of every leaf of a JSON value (list items as ``name[i]``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{where}[{i}]")
    else:
        yield where, value


def _json(file: Path) -> dict:
    try:
        value = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    except (ValueError, UnicodeDecodeError, RecursionError):  # (transformers says what is wrong with it)
        return {}
    return value if isinstance(value, dict) else {}


def _config_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for name in CONFIG_FILES:
        file = path / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def _first_sentence(e: BaseException) -> str:
    """The first sentence of an error's first line (transformers' import errors go on with instructions)."""
    return first_line(e).split(". ")[0].rstrip(".")
