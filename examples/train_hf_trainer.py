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
* ``--via loader``: ``get_train_dataloader`` returns packtool's loader (its order, exact resume
  state, ``device=`` moving each batch where the model is).
"""

from __future__ import annotations

import argparse
import functools

import datasets
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from packtool import load_manifest, read_packs
from packtool.loader import PackedDataset, collate_packs, get_loader


class PackedTrainer(Trainer):
    """A ``Trainer`` that reads its training batches through ``packtool.loader``."""

    def __init__(self, *args, packed_dataset: PackedDataset, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.packed_dataset = packed_dataset

    def get_train_dataloader(self):
        workers = self.args.dataloader_num_workers
        return get_loader(self.packed_dataset, num_workers=workers, device=self.args.device)


def make_trainer(output: str, model, checkpoints: str, steps: int, batch_size: int, via: str) -> Trainer:
    """The Trainer over packtool output ``output`` (``via``: ``collator`` or ``loader``)."""
    args = TrainingArguments(
        output_dir=checkpoints, max_steps=steps, per_device_train_batch_size=batch_size,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0,
        remove_unused_columns=False,  # keep seq_lens: collate_packs needs it
    )  # fmt: skip
    labels = load_manifest(output).labels  # shifted (packtool's default) or unshifted
    if via == "collator":
        train = datasets.load_dataset(output, split="train", cache_dir=f"{checkpoints}/hf-cache")
        collator = functools.partial(collate_packs, mask="dense", labels=labels)  # sdpa: the bool mask
        return Trainer(model=model, args=args, train_dataset=train, data_collator=collator)
    packs = PackedDataset(output, batch_size=batch_size, shuffle=True, seed=0, mask="dense", infinite=True)
    return PackedTrainer(model=model, args=args, packed_dataset=packs)


def tiny_llama(output: str, attn: str = "sdpa", dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A tiny random Llama for the output's vocabulary and pack size."""
    manifest = load_manifest(output)
    # the tokenizer's vocabulary; pretokenized input has none recorded: the largest id in the packs
    vocab = manifest.vocab_size or 1 + max(int(p["input_ids"].max()) for p in read_packs(output))
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=manifest.packed_sequence_size,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn, dtype=dtype)


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="a packtool output directory")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--via", choices=["collator", "loader"], default="collator")
    parser.add_argument("--checkpoints", default="out/hf-trainer")
    args = parser.parse_args(argv)
    trainer = make_trainer(
        args.output, tiny_llama(args.output), args.checkpoints, args.steps, args.batch_size, args.via
    )
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    for step, loss in enumerate(losses):
        print(f"step {step}: loss {loss:.4f}")
    return losses


if __name__ == "__main__":
    main()
