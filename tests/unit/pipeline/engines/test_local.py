"""LocalEngine: results in task order, errors in task order, and a run's worker state built once."""

from __future__ import annotations

import os

import pytest

from packtool import run_pack
from packtool.config import PackConfig
from packtool.pipeline.engines.local import LocalEngine
from tests.conftest import DEMO, DEMO_TOKENIZER


def _square(task: int) -> tuple[int, int]:
    return task * task, os.getpid()


def _fails_on_3(task: int) -> int:
    if task == 3:
        raise ValueError(f"task {task} failed")
    return task


@pytest.mark.parametrize("num_proc", [1, 2])
def test_results_come_back_in_task_order(num_proc):
    with LocalEngine(num_proc) as engine:
        results = list(engine.map(_square, range(40)))
    assert [r for r, _ in results] == [t * t for t in range(40)]
    in_driver = {pid == os.getpid() for _, pid in results}
    assert in_driver == ({True} if num_proc == 1 else {False})


@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_failing_task_raises_in_task_order(num_proc):
    got = []
    with LocalEngine(num_proc) as engine, pytest.raises(ValueError, match="task 3 failed"):
        for r in engine.map(_fails_on_3, range(20)):
            got.append(r)
    assert got == [0, 1, 2]


def test_a_run_builds_its_encoder_once_in_the_driver(monkeypatch, tmp_path):
    """The driver builds the run's encoder to fail fast on a bad tokenizer; with --num-proc 1 it also runs
    the tasks, and finds that state built (``pipeline.encode.worker``) instead of loading the tokenizer
    again."""
    from packtool.pipeline import encode

    built = []
    real = encode.build_encoder
    monkeypatch.setattr(encode, "build_encoder", lambda *a: built.append(a) or real(*a))
    config = PackConfig.from_dict(
        {
            "inputs": [str(DEMO / "train.jsonl")],
            "output": str(tmp_path / "out"),
            "tokenizer": str(DEMO_TOKENIZER),
            "packed_sequence_size": 1024,
            "long_samples": "truncate",
            "num_proc": 1,
            "quiet": True,
        }
    )
    run_pack(config, progress=False)
    assert len(built) == 1
