"""Train a tiny random Llama on packtool output for a few steps, on CPU: the loop a real run uses.

    packtool pack data/demo/train.jsonl -o out/demo --tokenizer data/demo/tokenizer.json \\
        --packed-sequence-size 1024 --long-samples truncate
    python examples/train_tiny_llama.py out/demo --steps 5 --attn sdpa

Each transformers attention implementation gets the mask it takes (docs/loader.md, "transformers
models"): eager the additive float mask, sdpa the bool mask, flex_attention the BlockMask (offered only
where a GPU is: flex_attention has no backward on CPU); "flat" feeds the batch as one flattened row
(``batch.flattened()``), whose boundaries sdpa finds from position_ids. ``model(**batch)`` gives the model
the batch's keyword arguments (``PackedBatch.model_inputs``): the mask, and packtool's labels as
``shift_labels`` too (the model must not shift them again). ``attention=model.config`` (required for the
masks: they are the model's) gives them the model's sliding window, for a model that has one (Mistral,
Gemma 2/3...), and refuses a path the model would not train on exactly. Resume with
``loader.state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from packtool import load_manifest, read_packs
from packtool.loader import PackedDataset, get_loader

MASK = {"eager": "additive", "sdpa": "dense", "flex_attention": "flex", "flat": "varlen"}


def attn_choices(device: str) -> list[str]:
    """The ``--attn`` choices that train on ``device``: flex_attention has no backward on CPU."""
    return sorted(a for a in MASK if a != "flex_attention" or device != "cpu")


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="a packtool output directory")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=4)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--attn", choices=attn_choices(device), default="sdpa")
    args = parser.parse_args(argv)

    manifest = load_manifest(args.output)
    # the tokenizer's vocabulary; pretokenized input has none recorded: the largest id in the packs
    vocab = manifest.vocab_size or 1 + max(int(p["input_ids"].max()) for p in read_packs(args.output))
    n = manifest.packed_sequence_size
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=n,
    )  # fmt: skip
    torch.manual_seed(0)
    attn = "sdpa" if args.attn == "flat" else args.attn
    model = LlamaForCausalLM._from_config(config, attn_implementation=attn).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    ds = PackedDataset(
        args.output, batch_size=args.batch_size, shuffle=True, seed=0, infinite=True,
        mask=MASK[args.attn], attention=model.config,  # the model's sliding window (a Llama has none)
    )  # fmt: skip
    loader = get_loader(ds, num_workers=0)
    losses = []
    for step, batch in zip(range(args.steps), loader, strict=False):
        batch = batch.to(device)  # int64 tokens, and the mask built there
        out = model(**batch)  # the batch's model_inputs(): the mask, position_ids, labels, shift_labels
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
        print(f"step {step}: loss {out.loss.item():.4f}")
    return losses


if __name__ == "__main__":
    main()
