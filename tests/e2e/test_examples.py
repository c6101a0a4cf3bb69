"""examples/: the training example runs a few steps on packtool output and its loss goes down."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT
from tests.fixtures.loader_outputs import packed  # noqa: F401 - fixtures


def _example():
    spec = importlib.util.spec_from_file_location(
        "train_tiny_llama", ROOT / "examples" / "train_tiny_llama.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("attn", ["sdpa", "eager", "flat"])
def test_train_tiny_llama_learns(packed, attn, capsys):
    losses = _example().main([str(packed), "--steps", "8", "--attn", attn])
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert "step 7: loss" in capsys.readouterr().out
