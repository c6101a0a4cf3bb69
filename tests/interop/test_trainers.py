"""The trainers people use, on packtool output, train on each sample alone, token for token.

``transformers.Trainer`` (``examples/train_hf_trainer.py``: ``collate_packs`` as its collator, or
packtool's loader as its dataloader), TRL's padding-free ``SFTTrainer`` (``examples/train_trl_sft.py``
with ``packtool.loader.trl.trl_dataset``) and a plain ``torch.utils.data.DataLoader`` over
``PackedDataset`` each train a tiny random Llama (CPU, float64, sdpa) a few steps. During every training
forward, ``PerTokenCheck`` takes the model's hidden states of the batch the trainer built, and for every
sequence of every row compares (a) the targets the trainer scores with the sample's own next tokens and
(b) each token's loss with that of the sample run alone on the same weights: within 1e-9; also for a
Mistral whose sliding window is shorter than the samples. The example functions are the exact code of
docs/loader.md's sections. ``PackedTrainer`` resumed from its checkpoints (``trainer_dataloader``) trains
on the same batches with the same losses and ends with the same parameters as the run that never stopped.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
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


# each way into the Trainer, and each labels convention (the two in one run each keep the test short); a
# Mistral whose window (16) is shorter than most samples (4-49 tokens), through each way in
HF_TRAINER = [("collator", "shifted", None), ("loader", "unshifted", None), ("loader", "shifted", 16),
              ("collator", "unshifted", 16)]  # fmt: skip


@pytest.mark.parametrize(("via", "labels", "window"), HF_TRAINER)
def test_hf_trainer_trains_on_each_sample_alone(outputs, via, labels, window, tmp_path):
    example = _example("train_hf_trainer")
    model = example.tiny_model(str(outputs[labels]), "sdpa", torch.float64, sliding_window=window)
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

    example = _example("train_hf_trainer")
    model = example.tiny_model(str(outputs["shifted"]), "sdpa", torch.float64)
    rows = trl_dataset(outputs["shifted"], cache_dir=str(tmp_path / "hf"), attention=model.config)
    with pytest.raises(ValueError, match="trl_dataset"):
        collate_packs(list(rows.select(range(2))))
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
    example = _example("train_hf_trainer")
    model = example.tiny_model(str(directory), "sdpa", torch.float64)
    ds = PackedDataset(
        directory, batch_size=B, shuffle=True, seed=1, mask="dense", attention=model.config, lanes=2
    )
    want = [b.pack_index.tolist() for b in get_loader(ds, num_workers=0)]
    assert [b.pack_index.tolist() for b in ds] == want
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen = [batch.pack_index.tolist() for batch in loader if isinstance(batch, PackedBatch)]
    assert seen == want and len(seen) > STEPS
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
    model = example.tiny_model(str(directory), "sdpa", torch.float64).train()
    assert model.config.use_cache
    check = PerTokenCheck(model)
    batch = next(iter(PackedDataset(directory, batch_size=B, shuffle=False, attention=model.config)))
    kwargs = batch.flattened()
    assert kwargs["use_cache"] is False and torch.equal(
        kwargs["shift_labels"], batch.labels.reshape(1, -1).long()
    )
    model(**kwargs).loss.backward()
    assert check.worst < TOL and check.tokens > 20


# --- resuming a Trainer from its checkpoints ---------------------------------------------------------
class Recorder:
    """Every training forward's ``input_ids`` and loss (float64, exact)."""

    def __init__(self, model) -> None:
        self.seen: list[tuple[torch.Tensor, float]] = []
        model.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs, output):
        if module.training:
            self.seen.append((kwargs["input_ids"].clone(), output.loss.item()))


def _packed_trainer(directory: Path, checkpoints: Path, infinite: bool, workers: int = 0, **training):
    """``examples/train_hf_trainer.py``'s ``PackedTrainer`` on a tiny float64 Llama: 8 steps of 3 batches
    (``ACCUMULATE``), a checkpoint every 2 steps."""
    from transformers import TrainingArguments

    example = _example("train_hf_trainer")
    model = example.tiny_model(str(directory), "sdpa", torch.float64)
    args = TrainingArguments(**{
        "output_dir": str(checkpoints), "max_steps": 8, "per_device_train_batch_size": B,
        "gradient_accumulation_steps": ACCUMULATE, "learning_rate": 1e-3, "logging_steps": 1,
        "save_strategy": "steps", "save_steps": 2, "report_to": [], "use_cpu": True, "disable_tqdm": True,
        "dataloader_num_workers": workers, "remove_unused_columns": False, **training,
    })  # fmt: skip
    packs = PackedDataset(
        directory, batch_size=B, shuffle=True, seed=3, mask="dense", attention=model.config, infinite=infinite
    )
    trainer = example.PackedTrainer(model=model, args=args, packed_dataset=packs)
    return trainer, Recorder(model)


ACCUMULATE = 3
EPOCH = 8  # batches: an epoch is 2 steps of 3 batches and a short one of 2
# (infinite loader, checkpoint, DataLoader workers): checkpoint 2 resumes 6 batches into the first epoch,
# 4 one step (3 batches) into the second, after the first epoch's short step
RESUMES = [(True, 2, 0), (False, 4, 0), (True, 4, 2)]


def _batches_before(step: int) -> int:
    """The batches the Trainer has trained on after ``step`` steps."""
    per_epoch = -(-EPOCH // ACCUMULATE)
    return step // per_epoch * EPOCH + step % per_epoch * ACCUMULATE


@pytest.mark.parametrize(("infinite", "checkpoint", "workers"), RESUMES)
def test_packed_trainer_resumes_from_a_checkpoint_as_if_never_stopped(
    outputs, tmp_path, infinite, checkpoint, workers
):
    """``trainer.train(resume_from_checkpoint=...)``, no other argument: the same batches, the same losses
    (float64, exactly) and the same parameters at the end as the run that never stopped."""
    directory = outputs["shifted"]
    assert len(PackedDataset(directory, batch_size=B)) == EPOCH
    whole, seen = _packed_trainer(directory, tmp_path / "whole", infinite, workers)
    whole.train()
    resumed, again = _packed_trainer(directory, tmp_path / "resumed", infinite, workers)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{checkpoint}"))
    after = seen.seen[_batches_before(checkpoint) :]
    assert len(seen.seen) == _batches_before(8) and len(again.seen) == len(after) > 0
    for (ids, loss), (want_ids, want_loss) in zip(again.seen, after, strict=True):
        assert torch.equal(ids, want_ids) and loss == want_loss
    for (name, p), q in zip(resumed.model.named_parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert resumed.state.global_step == whole.state.global_step == 8


def test_resuming_without_the_loader_state_is_refused(outputs, tmp_path):
    """A checkpoint that holds no loader state, and a loader the Trainer's skip cannot handle: one line each,
    never a loader that starts its order again."""
    directory = outputs["shifted"]
    whole, _ = _packed_trainer(directory, tmp_path / "whole", infinite=True, max_steps=2)
    whole.train()
    state_file = tmp_path / "whole" / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["stateful_callbacks"]["LoaderStateCallback"]  # as a checkpoint of the earlier recipe
    state_file.write_text(json.dumps(state))
    resumed, _ = _packed_trainer(directory, tmp_path / "resumed", infinite=True)
    with pytest.raises(ValueError, match="without packtool's loader state"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    # the earlier recipe, packtool's loader given to the Trainer as it is: accelerate's skip cannot rebuild it
    resumed.get_train_dataloader = lambda: get_loader(resumed.packed_dataset, num_workers=0)
    with pytest.raises(AttributeError, match=r"not a torch DataLoader.*hf_trainer.trainer_dataloader"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))


def test_packed_trainer_refuses_masks_that_do_not_fit_the_model(outputs, tmp_path):
    """The Trainer route checks the model itself: its sliding window missing from the dataset's masks (a
    dataset declared for full attention), a mask its attention ignores, and a flattened row its code does
    not keep apart (transformers' GPT-OSS builds its masks without the position_ids)."""
    from transformers import GptOssConfig, GptOssForCausalLM, TrainingArguments

    from packtool.loader.hf_trainer import trainer_dataloader

    directory = outputs["shifted"]
    example = _example("train_hf_trainer")
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1)

    def refused(model, dataset: PackedDataset, match: str) -> None:
        trainer = example.PackedTrainer(model=model, args=args, packed_dataset=dataset)
        with pytest.raises(ValueError, match=match) as said:
            trainer_dataloader(trainer, trainer.packed_dataset)
        assert "\n" not in str(said.value)

    sliding = example.tiny_model(str(directory), "sdpa", torch.float64, sliding_window=16)
    declared = PackedDataset(directory, batch_size=B, mask="dense", attention="causal")
    refused(sliding, declared, r"window 16\).*attention=model.config")
    eager = example.tiny_model(str(directory), "eager", torch.float64)
    with pytest.raises(ValueError, match="mask='dense' does not fit llama with attn_implementation='eager'"):
        PackedDataset(directory, batch_size=B, mask="dense", attention=eager.config)
    refused(eager, declared, r"use mask='additive' \(or 'varlen'\)$")
    config = GptOssConfig(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    gpt_oss = GptOssForCausalLM._from_config(config, attn_implementation="eager")
    flattened = PackedDataset(directory, batch_size=B, mask="varlen")  # cu_seqlens only: no model given
    refused(gpt_oss, flattened, r"^mask='varlen' does not fit gpt_oss .*position_ids.*; use mask='additive'$")
    refused(gpt_oss, declared, r"^mask='dense' does not fit gpt_oss .*: use mask='additive'$")  # not varlen


def test_the_trainers_skip_gets_placeholders_that_cannot_train(outputs):
    """After a restore the stream first yields what the Trainer skips, then the batch after the checkpoint's;
    a placeholder the Trainer did not skip stops training."""
    from packtool.loader.hf_trainer import SkippedBatch, TrainerStream

    def dataset():
        return PackedDataset(outputs["shifted"], batch_size=B, shuffle=True, seed=3, infinite=True)

    before = get_loader(dataset(), num_workers=0)
    assert len(list(itertools.islice(before, 3))) == 3
    state = before.state_dict()  # a checkpoint after 3 batches
    want = [b.pack_index.tolist() for b in itertools.islice(before, 3)]  # the uninterrupted continuation
    stream = TrainerStream(get_loader(dataset(), num_workers=0))
    stream.restore(state, skip=2)
    items = list(itertools.islice(stream, 5))
    assert all(isinstance(item, SkippedBatch) for item in items[:2])
    assert [b.pack_index.tolist() for b in items[2:]] == want
    with pytest.raises(RuntimeError, match="a batch the Trainer was to skip on resume reached training"):
        len(items[0])
    assert not isinstance(next(iter(stream)), SkippedBatch)  # placeholders once, after the restore only
