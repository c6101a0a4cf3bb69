"""Train a tiny random Llama with ``transformers.Trainer`` on packtool output, a few steps on CPU.

    packtool pack data/demo/train.jsonl -o out/demo --tokenizer data/demo/tokenizer.json \\
        --packed-sequence-size 1024 --long-samples truncate
    python examples/train_hf_trainer.py out/demo --steps 5 --via collator

Two ways in (docs/loader.md, "HF Trainer"); both give the Trainer ``PackedBatch`` objects, which are the
model's keyword arguments as a mapping (``input_ids``, ``position_ids``, the attention mask, ``labels``
and ``shift_labels``: packtool's labels are never shifted twice) and move with their own ``to()``:

* ``--via collator``: the Trainer's own sampler over ``datasets.load_dataset(DIR)``, with
  ``data_collator=collate_packs`` and ``remove_unused_columns=False`` (else the Trainer drops
  ``seq_lens``, which the model's signature does not name, and ``collate_packs`` says so);
* ``--via loader``: ``get_train_dataloader`` returns packtool's loader through
  ``packtool.loader.hf_trainer.trainer_dataloader`` (its order; each batch moved where the model is; its
  state saved in every checkpoint and restored by ``train(resume_from_checkpoint=...)``, exactly).

The masks are the model's: ``attention=model.config`` gives them its sliding window (``--sliding-window W``
trains a tiny Mistral with one) and refuses a path the model would not train on exactly. Checkpoints every
``--save-steps`` steps; ``--resume`` continues from the last one in ``--checkpoints``:

    python examples/train_hf_trainer.py out/demo --via loader --steps 6 --save-steps 2
    python examples/train_hf_trainer.py out/demo --via loader --steps 6 --save-steps 2 --resume
"""

from __future__ import annotations

import argparse
import functools

import datasets
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Trainer,
    TrainingArguments,
)

from packtool import load_manifest, read_packs
from packtool.loader import PackedDataset, collate_packs
from packtool.loader.hf_trainer import trainer_dataloader


class PackedTrainer(Trainer):
    """A ``Trainer`` that reads its training batches through ``packtool.loader``."""

    def __init__(self, *args, packed_dataset: PackedDataset, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.packed_dataset = packed_dataset

    def get_train_dataloader(self):
        return trainer_dataloader(self, self.packed_dataset)


def make_trainer(
    output: str, model, checkpoints: str, steps: int, batch_size: int, via: str, **training: object
) -> Trainer:
    """The Trainer over packtool output ``output`` (``via``: ``collator`` or ``loader``); ``training``
    overrides ``TrainingArguments`` (``save_steps``, ``gradient_accumulation_steps``...)."""
    args = TrainingArguments(**{
        "output_dir": checkpoints, "max_steps": steps, "per_device_train_batch_size": batch_size,
        "learning_rate": 1e-3, "logging_steps": 1, "save_strategy": "no", "report_to": [], "use_cpu": True,
        "disable_tqdm": True, "dataloader_num_workers": 0,
        "remove_unused_columns": False,  # keep seq_lens: collate_packs needs it
        **training,
    })  # fmt: skip
    labels = load_manifest(output).labels  # shifted (packtool's default) or unshifted
    if via == "collator":
        train = datasets.load_dataset(output, split="train", cache_dir=f"{checkpoints}/hf-cache")
        # sdpa: the bool mask; attention=model.config: inside the model's sliding window, if it has one
        collator = functools.partial(collate_packs, mask="dense", labels=labels, attention=model.config)
        return Trainer(model=model, args=args, train_dataset=train, data_collator=collator)
    packs = PackedDataset(
        output, batch_size=batch_size, shuffle=True, seed=0, infinite=True,
        mask="dense", attention=model.config,  # sdpa: the bool mask, inside the model's window if it has one
    )  # fmt: skip
    return PackedTrainer(model=model, args=args, packed_dataset=packs)


def tiny_model(
    output: str, attn: str = "sdpa", dtype: torch.dtype = torch.float32, sliding_window: int | None = None
):
    """A tiny random Llama for the output's vocabulary and pack size; with ``sliding_window``, a Mistral
    whose every layer attends within that window."""
    manifest = load_manifest(output)
    # the tokenizer's vocabulary; pretokenized input has none recorded: the largest id in the packs
    vocab = manifest.vocab_size or 1 + max(int(p["input_ids"].max()) for p in read_packs(output))
    shape = dict(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=manifest.packed_sequence_size,
    )  # fmt: skip
    torch.manual_seed(0)
    if sliding_window is None:
        return LlamaForCausalLM._from_config(LlamaConfig(**shape), attn_implementation=attn, dtype=dtype)
    config = MistralConfig(**shape, sliding_window=sliding_window)
    return MistralForCausalLM._from_config(config, attn_implementation=attn, dtype=dtype)


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="a packtool output directory")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--via", choices=["collator", "loader"], default="collator")
    parser.add_argument("--checkpoints", default="out/hf-trainer")
    parser.add_argument("--sliding-window", type=int, help="train a Mistral with this attention window")
    parser.add_argument("--save-steps", type=int, help="save a checkpoint every this many steps")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    args = parser.parse_args(argv)
    model = tiny_model(args.output, sliding_window=args.sliding_window)
    saving = {"save_strategy": "steps", "save_steps": args.save_steps} if args.save_steps else {}
    trainer = make_trainer(
        args.output, model, args.checkpoints, args.steps, args.batch_size, args.via, **saving
    )
    trainer.train(resume_from_checkpoint=args.resume or None)
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    for step, loss in enumerate(losses):
        print(f"step {step}: loss {loss:.4f}")
    return losses


if __name__ == "__main__":
    main()
