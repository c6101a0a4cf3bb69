"""The trainers people use, on packtool output, train on each sample alone, token for token.

``transformers.Trainer`` (``examples/train_hf_trainer.py``: ``collate_packs`` as its collator, or
packtool's loader as its dataloader), TRL's padding-free ``SFTTrainer`` (``examples/train_trl_sft.py``
with ``packtool.loader.trl.trl_dataset``) and a plain ``torch.utils.data.DataLoader`` over
``PackedDataset`` each train a tiny random Llama (CPU, float64, sdpa) a few steps. During every training
forward, ``PerTokenCheck`` takes the model's hidden states of the batch the trainer built, and for every
sequence of every row compares (a) the targets the trainer scores with the sample's own next tokens and
(b) each token's loss with that of the sample run alone on the same weights: within 1e-9. The example
functions are the exact code of docs/loader.md's sections.
"""

from __future__ import annotations

import importlib.util
import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packtool import run_pack
from packtool.loader import PackedBatch, PackedDataset, collate_packs, get_loader
from packtool.options import PackOptions
from tests.conftest import ROOT, write_jsonl

N = 64
B = 2
STEPS = 3
TOL = 1e-9


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """Pretokenized samples (ids 1..99, 4-49 tokens) packed with shifted and with unshifted labels."""
    tmp = tmp_path_factory.mktemp("trainers")
    rng = np.random.default_rng(5)
    rows = [{"input_ids": rng.integers(1, 100, int(n)).tolist()} for n in rng.integers(4, 50, 40)]
    src = [str(write_jsonl(tmp / "in.jsonl", rows))]
    out = {}
    for labels in ("shifted", "unshifted"):
        out[labels] = tmp / labels
        run_pack(
            PackOptions.of(
                inputs=src, output=str(out[labels]), packed_sequence_size=N, labels=labels, quiet=True
            )
        )
    return out


class PerTokenCheck:
    """Hooks on a ``...ForCausalLM``: each training forward's per-token loss against each sequence alone.

    The sequences of a row are found from its ``position_ids`` (each starts at 0); a sequence's true
    targets are its own next tokens (-100 at its last token, and everywhere in the padding, id 0).
    """

    def __init__(self, model) -> None:
        self.model, self.inputs, self.busy = model, None, False
        self.tokens, self.worst, self.losses = 0, 0.0, []
        model.register_forward_pre_hook(self._inputs, with_kwargs=True)
        model.model.register_forward_hook(self._check)

    def _inputs(self, module, args, kwargs):
        if not self.busy:
            self.inputs = kwargs

    def _alone(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model.model(input_ids=ids.view(1, -1), use_cache=False).last_hidden_state
        return self.model.lm_head(hidden)[0]

    def _check(self, module, args, output):
        if self.busy or not self.model.training:
            return
        kw = self.inputs
        ids, positions = kw["input_ids"], kw["position_ids"]
        if kw.get("shift_labels") is not None:
            targets = kw["shift_labels"]
        else:  # the model shifts: token i is scored against labels[i + 1]
            targets = F.pad(kw["labels"], (0, 1), value=-100)[:, 1:]
        hidden = output.last_hidden_state.detach()
        losses = []
        self.busy = True
        with torch.no_grad():
            logits = self.model.lm_head(hidden)
            packed = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="none")
            for r in range(ids.shape[0]):
                starts = torch.nonzero(positions[r] == 0).flatten().tolist()
                for a, b in zip(starts, [*starts[1:], ids.shape[1]], strict=True):
                    seq = ids[r, a:b]
                    want = torch.full_like(seq, -100)
                    if seq.any():  # not the padding
                        want[:-1] = seq[1:]
                    assert torch.equal(targets[r, a:b], want), "the trainer scores other targets"
                    alone = F.cross_entropy(self._alone(seq), want, ignore_index=-100, reduction="none")
                    self.worst = max(self.worst, (packed[r, a:b] - alone).abs().max().item())
                    self.tokens += int((want != -100).sum())
                    losses.append(packed[r, a:b][want != -100])
        self.busy = False
        self.losses.append(torch.cat(losses).mean().item())


def _trained(trainer, check: PerTokenCheck) -> None:
    trainer.train()
    logged = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(logged) == len(check.losses) == STEPS
    assert np.allclose(logged, check.losses, atol=1e-3)  # the loss it trained on (the logs round it)
    assert check.worst < TOL and check.tokens > STEPS * B * 15


# each way into the Trainer, and each labels convention (the two in one run each keep the test short)
@pytest.mark.parametrize(("via", "labels"), [("collator", "shifted"), ("loader", "unshifted")])
def test_hf_trainer_trains_on_each_sample_alone(outputs, via, labels, tmp_path):
    example = _example("train_hf_trainer")
    model = example.tiny_llama(str(outputs[labels]), "sdpa", torch.float64)
    check = PerTokenCheck(model)
    _trained(example.make_trainer(str(outputs[labels]), model, str(tmp_path), STEPS, B, via), check)


@pytest.mark.parametrize("labels", ["shifted"])  # TRL's rows are unshifted: shifted labels are converted
def test_trl_sft_trainer_padding_free_trains_on_each_sample_alone(outputs, labels, tmp_path):
    from transformers import PreTrainedTokenizerFast

    example = _example("train_trl_sft")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(ROOT / "data/demo/tokenizer.json"), pad_token="<|pad|>"
    )
    model = example.tiny_llama(str(outputs[labels]), torch.float64)
    check = PerTokenCheck(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no target is left out of these packs
        trainer = example.make_trainer(str(outputs[labels]), model, tokenizer, str(tmp_path), STEPS, B)
    _trained(trainer, check)


def test_trl_rows_are_refused_by_collate_packs_and_trainer_columns_named(outputs, tmp_path):
    """The wrong combinations packtool sees: TRL's rows given to collate_packs, and packtool's rows with
    seq_lens dropped by transformers.Trainer's remove_unused_columns."""
    from packtool.loader.trl import trl_dataset

    rows = list(trl_dataset(outputs["shifted"], cache_dir=str(tmp_path / "hf")).select(range(2)))
    with pytest.raises(ValueError, match="trl_dataset"):
        collate_packs(rows)
    example = _example("train_hf_trainer")
    model = example.tiny_llama(str(outputs["shifted"]), "sdpa", torch.float64)
    trainer = example.make_trainer(str(outputs["shifted"]), model, str(tmp_path), STEPS, B, "collator")
    trainer.args.remove_unused_columns = True
    with pytest.raises(ValueError, match=r"remove_unused_columns=False"):
        trainer.train()


def test_a_plain_dataloader_over_packed_dataset_trains_on_each_sample_alone(outputs):
    """What Lightning and accelerate build from a dataset: DataLoader(ds, batch_size=None); and iterating
    the dataset itself. Both give PackedBatch objects, the loader's batches in its order; with a model
    and optimizer prepared by accelerate, it trains on each sample alone."""
    from accelerate import Accelerator

    directory = outputs["unshifted"]
    ds = PackedDataset(directory, batch_size=B, shuffle=True, seed=1, mask="dense", lanes=2)
    want = [b.pack_index.tolist() for b in get_loader(ds, num_workers=0)]
    assert [b.pack_index.tolist() for b in ds] == want
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen = [batch.pack_index.tolist() for batch in loader if isinstance(batch, PackedBatch)]
    assert seen == want and len(seen) > STEPS
    example = _example("train_hf_trainer")
    model = example.tiny_llama(str(directory), "sdpa", torch.float64)
    check = PerTokenCheck(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader: packtool shards by rank
    model.train()
    for batch in itertools.islice(loader, STEPS):
        loss = model(**batch.to(accelerator.device)).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    assert len(check.losses) == STEPS
    assert check.worst < TOL and check.tokens > STEPS * B * 15


def test_flattened_is_complete_whatever_the_models_cache_default(outputs):
    """``model(**batch.flattened())`` with the model's own use_cache default (True for Llama): without
    use_cache=False transformers builds a cache and attends across the row's samples."""
    directory = outputs["shifted"]
    example = _example("train_hf_trainer")
    model = example.tiny_llama(str(directory), "sdpa", torch.float64).train()
    assert model.config.use_cache
    check = PerTokenCheck(model)
    batch = next(iter(PackedDataset(directory, batch_size=B, shuffle=False)))
    kwargs = batch.flattened()
    assert kwargs["use_cache"] is False and torch.equal(
        kwargs["shift_labels"], batch.labels.reshape(1, -1).long()
    )
    model(**kwargs).loss.backward()
    assert check.worst < TOL and check.tokens > 20
