"""examples/: each training example runs a few steps on packtool output (every choice it offers), and the
tiny Llama's loss goes down. tests/interop/test_trainers.py checks the loss of the Trainer and TRL
examples token by token."""

from __future__ import annotations

import importlib.util
import math

import pytest

from tests.conftest import DEMO_TOKENIZER, ROOT
from tests.fixtures.loader_outputs import packed  # noqa: F401 - fixtures


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("attn", _example("train_tiny_llama").attn_choices("cpu"))
def test_train_tiny_llama_learns(packed, attn, capsys):
    losses = _example("train_tiny_llama").main([str(packed), "--steps", "8", "--attn", attn])
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert "step 7: loss" in capsys.readouterr().out


def test_train_tiny_llama_offers_no_choice_that_cannot_run_here(packed, capsys):
    """flex_attention has no backward on CPU: the script does not offer it there."""
    assert "flex_attention" not in _example("train_tiny_llama").attn_choices("cpu")
    if not _example("train_tiny_llama").torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            _example("train_tiny_llama").main([str(packed), "--attn", "flex_attention"])
        assert e.value.code == 2 and "invalid choice: 'flex_attention'" in capsys.readouterr().err


# the packs' tokens are uniform random ids: the loss starts at log(vocab) with nothing more to learn, so
# these check that the scripts train their steps (test_trainers.py checks every token's loss)
def test_train_hf_trainer_runs(packed, tmp_path, capsys):
    """(``--via loader`` is trained by test_trainers.py through the same make_trainer.)"""
    argv = [str(packed), "--steps", "3", "--via", "collator", "--checkpoints", str(tmp_path)]
    losses = _example("train_hf_trainer").main(argv)
    assert len(losses) == 3 and all(abs(loss - math.log(1000)) < 0.1 for loss in losses)
    assert "step 2: loss" in capsys.readouterr().out


def test_train_trl_sft_runs(packed, tmp_path, capsys):
    argv = [str(packed), "--steps", "3", "--tokenizer", str(DEMO_TOKENIZER), "--checkpoints", str(tmp_path)]
    losses = _example("train_trl_sft").main(argv)
    assert len(losses) == 3 and all(abs(loss - math.log(1000)) < 0.1 for loss in losses)
    assert "step 2: loss" in capsys.readouterr().out


def _code_lines(text: str) -> list[str]:
    """The code of ``text`` line by line, stripped of indentation and trailing comments."""
    lines = (line.split("  #")[0].split(" # ")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.parametrize(
    ("section", "source"),
    [
        ("### HF Trainer", "examples/train_hf_trainer.py"),
        ("### TRL", "examples/train_trl_sft.py"),
        ("### Accelerate, Lightning", "tests/interop/test_trainers.py"),
    ],
)
def test_the_trainer_sections_of_docs_loader_are_the_code_the_tests_run(section, source):
    text = (ROOT / "docs" / "loader.md").read_text()
    body = text[text.index(section) :].split("\n### ")[0]
    blocks = body.split("```python\n")[1:]
    assert blocks, section
    code = set(_code_lines((ROOT / source).read_text()))
    for block in blocks:
        for line in _code_lines(block.split("```")[0]):
            assert line in code, f"{section}: {line!r} is not in {source}"
