"""Train a tiny random Llama on packtool output for a few steps, on CPU: the loop a real run uses.

    packtool pack data/demo/train.jsonl -o out/demo --tokenizer data/demo/tokenizer.json \\
        --packed-sequence-size 1024 --long-samples truncate
    python examples/train_tiny_llama.py out/demo --steps 5 --attn sdpa

Each transformers attention implementation gets the mask it takes (docs/loader.md, "transformers
models"): eager the additive float mask, sdpa the bool mask, flex_attention the BlockMask; "flat" feeds
the batch as one flattened row (``batch.flattened()``), whose boundaries sdpa finds from position_ids.
packtool's labels are already shifted, so they go in as ``shift_labels`` too (the model must not shift
them again). Resume with ``loader.state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from packtool import load_manifest, read_packs
from packtool.loader import PackedDataset, get_loader

MASK = {"eager": "additive", "sdpa": "dense", "flex_attention": "flex", "flat": "varlen"}


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="a packtool output directory")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--attn", choices=sorted(MASK), default="sdpa")
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
    model = LlamaForCausalLM._from_config(config, attn_implementation=attn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    ds = PackedDataset(
        args.output, batch_size=args.batch_size, shuffle=True, seed=0, mask=MASK[args.attn], infinite=True
    )
    loader = get_loader(ds, num_workers=0)
    losses = []
    for step, batch in zip(range(args.steps), loader, strict=False):
        batch = batch.to("cpu")  # .to("cuda") on a GPU: the mask is built there
        if args.attn == "flat":
            labels = batch.labels.reshape(1, -1)
            out = model(**batch.flattened(), labels=labels, shift_labels=labels, use_cache=False)
        else:
            mask = batch.block_mask if args.attn == "flex_attention" else batch.attention_mask
            out = model(
                input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=mask,
                labels=batch.labels, shift_labels=batch.labels, use_cache=False,
            )  # fmt: skip
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(out.loss.item())
        print(f"step {step}: loss {out.loss.item():.4f}")
    return losses


if __name__ == "__main__":
    main()
