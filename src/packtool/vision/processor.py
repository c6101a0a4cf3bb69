"""The model's own processor, from a local directory: how many tokens each image becomes, and which.

``load_processor(DIR)`` loads what ``AutoProcessor.from_pretrained(DIR)`` loads, offline
(``local_files_only``; nothing is downloaded), with the PIL/NumPy image-processor backend (``backend="pil"``,
what ``use_fast=False`` was before transformers 5): the torchvision backend needs a torchvision wheel that
matches torch, and packing needs no image tensor at all. Where ``AutoProcessor`` cannot be built (Qwen2-VL's
processor also loads a video processor, which needs torchvision), the same directory's tokenizer and image
processor are loaded alone (``AutoTokenizer``, ``AutoImageProcessor``) and counted by the same rule.

An image of ``height x width`` pixels becomes ``image_tokens`` copies of the image token (``<image>`` for
LLaVA, ``<|image_pad|>`` for Qwen2-VL); the chat template writes one copy per image (Qwen2-VL's between
``<|vision_start|>`` and ``<|vision_end|>``) and ``packtool.vision.sequences`` repeats it. Two families:

* fixed count (LLaVA-1.5: CLIP's resize and center crop to ``crop_size``): ``(crop_h // patch) *
  (crop_w // patch) + num_additional_image_tokens``, less one when ``vision_feature_select_strategy`` is
  ``default`` (the CLS feature dropped): 576 for LLaVA-1.5 (336 / 14 = 24; 24 * 24 + 1 - 1).
* dynamic resolution (Qwen2-VL, Qwen2.5-VL): the image is resized by the *smart-resize* rule to sides that
  are multiples of ``patch_size * merge_size`` (28) with ``min_pixels <= h * w <= max_pixels``, then cut
  into 14 x 14 patches merged 2 x 2: ``(h / 14) * (w / 14) / 4`` tokens.

The counts come from the processor's own code: its ``_get_num_multimodal_tokens(image_sizes=...)`` (what
vLLM calls), or, for the image processor alone, its ``get_number_of_image_patches`` divided by
``merge_size ** 2`` (the line Qwen2-VL's processor runs). ``tests/unit/vision`` checks both against the
processor run on real images.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packtool.encoders.chat import ChatEncoder
from packtool.encoders.text import HFTokenizer
from packtool.errors import ConfigError

CONFIG_FILES = (
    "processor_config.json",
    "preprocessor_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass
class VisionProcessor:
    """A model's processor, as packing needs it.

    Attributes:
        path: the directory it was loaded from.
        family: ``"fixed"`` (one count per image) or ``"dynamic"`` (the count follows the image's size).
        image_token: the token the template writes once per image and the processor repeats.
        image_token_id: its id.
        tokenizer: packtool's ``HFTokenizer`` of the directory.
        chat: the ``ChatEncoder`` of the directory's chat template (renders image parts, finds trained spans).
        image_processor: the transformers image processor (PIL backend), for the loader and the tests.
        processor: the transformers processor when ``AutoProcessor`` could build it, else ``None``.
    """

    path: str
    family: str
    image_token: str
    image_token_id: int
    tokenizer: HFTokenizer
    chat: ChatEncoder
    image_processor: Any
    processor: Any = None
    _counts: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def image_tokens(self, height: int, width: int) -> int:
        """How many image tokens an image of ``height x width`` pixels becomes (a fixed-count model's count
        is the same for every size)."""
        key = (0, 0) if self.family == "fixed" else (int(height), int(width))
        if key not in self._counts:
            self._counts[key] = self._count(int(height), int(width))
        return self._counts[key]

    def image_tokens_of(self, sizes: np.ndarray) -> np.ndarray:
        """``(k,)`` int64 counts of ``(k, 2)`` ``(height, width)`` sizes."""
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        return np.array([self.image_tokens(h, w) for h, w in sizes.tolist()], dtype=np.int64)

    def _count(self, height: int, width: int) -> int:
        try:
            if self.processor is not None and hasattr(self.processor, "_get_num_multimodal_tokens"):
                data = self.processor._get_num_multimodal_tokens(image_sizes=[(height, width)])
                return int(data["num_image_tokens"][0])
            patches = self.image_processor.get_number_of_image_patches(height, width, {})
            return int(patches) // int(self.image_processor.merge_size) ** 2
        except ValueError as e:  # Qwen's smart-resize refuses aspect ratios over 200
            raise ValueError(f"{height}x{width} image: {e}") from None

    def identity(self) -> dict[str, Any]:
        """What a manifest records of the processor: its path, family, image token and a hash of its config
        files (the files of ``CONFIG_FILES`` that exist, in that order)."""
        digest = hashlib.sha256()
        for name in CONFIG_FILES:
            file = Path(self.path) / name
            if file.is_file():
                digest.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
        return {
            "path": self.path,
            "family": self.family,
            "image_token": self.image_token,
            "image_processor": type(self.image_processor).__name__,
            "config_sha256": digest.hexdigest(),
        }


def load_processor(
    directory: str | Path, *, chat_template: str | None = None, loss_on: str = "assistant"
) -> VisionProcessor:
    """The processor of a local model directory; nothing is downloaded. ``chat_template``: a Jinja file
    rendering the conversations instead of the directory's own (``--chat-template``); ``loss_on``: which
    turns are trained (``--loss-on``: ``packtool.encoders.chat``).

    Raises ``ConfigError`` for a directory that is missing, has no image processor, or whose tokenizer
    lacks the image token.
    """
    try:  # transformers is the vision extra's (packtool[vision]), and slow to import
        from transformers import AutoImageProcessor, AutoProcessor
    except ImportError:
        raise ConfigError(
            "--processor needs transformers and Pillow (pip install 'packtool[vision]')"
        ) from None
    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(f"processor {directory}: no such directory (expected a local model directory)")
    try:
        processor = AutoProcessor.from_pretrained(str(path), local_files_only=True, backend="pil")
    except ImportError:  # a part of it needs torchvision (Qwen2-VL's video processor): load the parts
        processor = None
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"processor {directory}: cannot load with AutoProcessor: {_first_line(e)}"
        ) from None
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:
        try:
            image_processor = AutoImageProcessor.from_pretrained(
                str(path), local_files_only=True, backend="pil"
            )
        except (OSError, ValueError, ImportError) as e:
            raise ConfigError(f"processor {directory}: no image processor: {_first_line(e)}") from None
    family = "dynamic" if hasattr(image_processor, "merge_size") else "fixed"
    if family == "fixed" and processor is None:
        raise ConfigError(f"processor {directory}: a fixed-count model needs its processor (AutoProcessor)")
    image_token = getattr(processor, "image_token", None) or _config_image_token(path, family)
    tokenizer = HFTokenizer(str(path))
    token_id = tokenizer.token_to_id(image_token)
    if token_id is None:
        raise ConfigError(f"processor {directory}: the tokenizer has no image token {image_token!r}")
    # the template: the tokenizer's own, else the processor's file (chat_template.jinja or .json)
    files = [path / "chat_template.jinja", path / "chat_template.json"]
    template = None if tokenizer.chat_template else next((str(f) for f in files if f.is_file()), None)
    chat = ChatEncoder(tokenizer, chat_template or template, loss_on=loss_on)
    return VisionProcessor(
        path=str(path),
        family=family,
        image_token=image_token,
        image_token_id=int(token_id),
        tokenizer=tokenizer,
        chat=chat,
        image_processor=image_processor,
        processor=processor,
    )


def _config_image_token(path: Path, family: str) -> str:
    """The image token a directory's ``processor_config.json`` names, else the family's usual one."""
    file = path / "processor_config.json"
    config = json.loads(file.read_text()) if file.is_file() else {}
    return config.get("image_token") or ("<|image_pad|>" if family == "dynamic" else "<image>")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
