"""``transformers.Trainer`` on a mixture of outputs (``PackedDataset({dir: weight, ...})`` through
``trainer_dataloader``), resumed from its checkpoints: the same batches, the same losses (float64,
exactly) and the same parameters as the run that never stopped; and TRL's rows of a mixture."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from packtool import run_pack
from packtool.loader import PackedDataset
from packtool.options import PackOptions
from packtool.reading import read_packs
from tests.conftest import write_jsonl
from tests.interop.test_trainers import Recorder, _example

N = 64
B = 2
ACCUMULATE = 3
STEPS = 8


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[Path]:
    """Two outputs of pretokenized samples (ids 1..99, 4-49 tokens): 40 and 30 samples."""
    tmp = tmp_path_factory.mktemp("mixture-trainers")
    out = []
    for name, count, seed in (("a", 40, 5), ("b", 30, 6)):
        rng = np.random.default_rng(seed)
        rows = [
            {"input_ids": [99, *rng.integers(1, 100, int(n)).tolist()]} for n in rng.integers(4, 50, count)
        ]
        src = write_jsonl(tmp / f"{name}.jsonl", rows)
        run_pack(
            PackOptions.of(inputs=[str(src)], output=str(tmp / name), packed_sequence_size=N, quiet=True)
        )
        out.append(tmp / name)
    return out


def _trainer(mixture: dict, checkpoints: Path, infinite: bool, workers: int):
    """``examples/train_hf_trainer.py``'s ``PackedTrainer`` on a tiny float64 Llama over the mixture: 8
    steps of 3 batches, a checkpoint every 2 steps."""
    from transformers import TrainingArguments

    example = _example("train_hf_trainer")
    model = example.tiny_model(next(iter(mixture)), "sdpa", torch.float64)
    args = TrainingArguments(**{
        "output_dir": str(checkpoints), "max_steps": STEPS, "per_device_train_batch_size": B,
        "gradient_accumulation_steps": ACCUMULATE, "learning_rate": 1e-3, "logging_steps": 1,
        "save_strategy": "steps", "save_steps": 2, "report_to": [], "use_cpu": True, "disable_tqdm": True,
        "dataloader_num_workers": workers, "remove_unused_columns": False,
    })  # fmt: skip
    packs = PackedDataset(mixture, batch_size=B, shuffle=True, seed=3, mask="dense", infinite=infinite,
                          attention=model.config)  # fmt: skip
    return example.PackedTrainer(model=model, args=args, packed_dataset=packs), Recorder(model)


def _batches_before(step: int, per_epoch: int) -> int:
    """The batches the Trainer has trained on after ``step`` steps, ``per_epoch`` batches an epoch."""
    steps = -(-per_epoch // ACCUMULATE)
    return step // steps * per_epoch + step % steps * ACCUMULATE


# (infinite loader, checkpoint, DataLoader workers)
RESUMES = [(True, 4, 0), pytest.param(False, 2, 2, marks=pytest.mark.slow)]


@pytest.mark.parametrize(("infinite", "checkpoint", "workers"), RESUMES)
def test_a_trainer_on_a_mixture_resumes_as_if_never_stopped(sources, tmp_path, infinite, checkpoint, workers):
    mixture = {str(sources[0]): 0.6, str(sources[1]): 0.4}
    per_epoch = len(PackedDataset(mixture, batch_size=B))
    whole, seen = _trainer(mixture, tmp_path / "whole", infinite, workers)
    whole.train()
    resumed, again = _trainer(mixture, tmp_path / "resumed", infinite, workers)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{checkpoint}"))
    after = seen.seen[_batches_before(checkpoint, per_epoch) :]
    assert len(seen.seen) == _batches_before(STEPS, per_epoch) and len(again.seen) == len(after) > 0
    for (ids, loss), (want_ids, want_loss) in zip(again.seen, after, strict=True):
        assert torch.equal(ids, want_ids) and loss == want_loss
    for (name, p), q in zip(resumed.model.named_parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert resumed.state.global_step == whole.state.global_step == STEPS


def test_trl_rows_of_a_mixture_are_its_first_epochs_packs(sources, tmp_path):
    """``repeat: 2`` gives each pack of the source twice, ``repeat: 0.5`` half of them once."""
    from packtool.loader.trl import trl_dataset

    mixture = [{"path": str(sources[0]), "repeat": 2}, {"path": str(sources[1]), "repeat": 0.5}]
    rows = list(trl_dataset(mixture, cache_dir=str(tmp_path / "hf"), attention="causal"))
    packs = [[p["input_ids"].tolist() for p in read_packs(d)] for d in sources]
    assert len(rows) == 2 * len(packs[0]) + len(packs[1]) // 2
    first = [r["input_ids"] for r in rows[: 2 * len(packs[0])]]
    assert sorted(first) == sorted(packs[0] * 2)
    rest = [r["input_ids"] for r in rows[2 * len(packs[0]) :]]
    assert len({tuple(r) for r in rest}) == len(rest) and all(r in packs[1] for r in rest)
