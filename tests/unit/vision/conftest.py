"""The tiny processors, built once for the vision tests."""

from __future__ import annotations

import pytest

from packtool.vision.processor import load_processor
from tests.fixtures.vision_processors import build_llava, build_qwen2vl


@pytest.fixture(scope="session")
def processors(tmp_path_factory):
    """``{"llava": VisionProcessor, "qwen2vl": VisionProcessor}``, loaded from directories built offline."""
    tmp = tmp_path_factory.mktemp("processors")
    return {
        "llava": load_processor(build_llava(tmp / "llava")),
        "qwen2vl": load_processor(build_qwen2vl(tmp / "qwen2vl")),
    }
