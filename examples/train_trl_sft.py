"""Train a tiny random Llama with TRL's padding-free ``SFTTrainer`` on packtool output, a few steps on CPU.

    packtool pack data/demo/train.jsonl -o out/demo --tokenizer data/demo/tokenizer.json \\
        --packed-sequence-size 1024 --long-samples truncate
    python examples/train_trl_sft.py out/demo --steps 5 --tokenizer data/demo/tokenizer.json

TRL's padding-free collator reads a packed row's boundaries from ``seq_lengths`` and shifts the labels
itself: ``packtool.loader.trl.trl_dataset`` gives each pack in that form (labels unshifted, whatever the
output's convention), so the loss is each sample's alone (docs/loader.md, "TRL"). TRL's batch is one
flattened row, which not every model's code keeps apart: ``trl_dataset(..., attention=model.config)``
checks the model (a Llama does; transformers' GPT-OSS does not, and is refused naming what works).
``max_length=None``: the packs are already N tokens; TRL would otherwise cut them to its default 1024
without their ``seq_lengths``.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from packtool import load_manifest, read_packs
from packtool.loader.trl import trl_dataset


def make_trainer(output: str, model, tokenizer, checkpoints: str, steps: int, batch_size: int) -> SFTTrainer:
    """TRL's SFTTrainer, padding-free, over packtool output ``output``."""
    args = SFTConfig(
        output_dir=checkpoints, max_steps=steps, per_device_train_batch_size=batch_size,
        padding_free=True, max_length=None,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    train = trl_dataset(output, cache_dir=f"{checkpoints}/hf-cache", attention=model.config)
    return SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)


def tiny_llama(output: str, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A tiny random Llama for the output's vocabulary and pack size (sdpa: it finds each sequence of the
    flattened row from the position_ids)."""
    manifest = load_manifest(output)
    # the tokenizer's vocabulary; pretokenized input has none recorded: the largest id in the packs
    vocab = manifest.vocab_size or 1 + max(int(p["input_ids"].max()) for p in read_packs(output))
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=manifest.packed_sequence_size,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="a packtool output directory")
    parser.add_argument("--tokenizer", required=True, help="the run's tokenizer.json (TRL asks for its pad)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--checkpoints", default="out/trl-sft")
    args = parser.parse_args(argv)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer, pad_token="<|pad|>")
    model = tiny_llama(args.output)
    trainer = make_trainer(args.output, model, tokenizer, args.checkpoints, args.steps, args.batch_size)
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    for step, loss in enumerate(losses):
        print(f"step {step}: loss {loss:.4f}")
    return losses


if __name__ == "__main__":
    main()
