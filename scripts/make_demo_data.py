"""Build the small demo dataset and tokenizer that ship in ``data/demo/`` (run once; outputs are committed).

The texts are synthetic (sentences drawn from a fixed word list, lengths lognormal like real documents),
so the repository needs no download. The tokenizer is a byte-level BPE trained on them with the
``tokenizers`` library, with ``<|endoftext|>`` as its EOS token.

    python scripts/make_demo_data.py [--out data/demo]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

WORDS = """the of and to in is that for it as was with be by on not he this are or his from at which but have
an had they you were their one all we can her has there been if more when will would who so no she other its
may these about into than them only could new some time two first then do any like my now over such our
man me even most made after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see men work long get here
between both life being under never day same another know while last might us great old year off come since
against go came right used take three small large place number part found point form water line house word
system program data model token sequence training pack padding attention layer batch loss gradient learning
rate memory device kernel shard index sample length window buffer stream reader writer encoder decoder vector
matrix tensor value key query head block mask causal document boundary position label target language text
river mountain forest city garden window table chair music story paper letter market bridge island harbor
quick brown lazy bright quiet heavy gentle careful simple clear strong warm cold early late open""".split()


def sentence(rng: np.random.Generator) -> str:
    n = int(rng.integers(5, 18))
    words = rng.choice(WORDS, size=n)
    s = " ".join(words)
    return s[0].upper() + s[1:] + rng.choice([".", ".", ".", "?", "!"])


def document(rng: np.random.Generator, target_words: int) -> str:
    out, count = [], 0
    while count < target_words:
        s = sentence(rng)
        out.append(s)
        count += s.count(" ") + 1
    return " ".join(out)


def chat(rng: np.random.Generator) -> dict:
    turns = int(rng.integers(1, 4))
    messages = [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.5 else []
    for _ in range(turns):
        messages.append({"role": "user", "content": document(rng, int(rng.integers(5, 30)))})
        messages.append({"role": "assistant", "content": document(rng, int(rng.integers(10, 80)))})
    return {"messages": messages}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/demo")
    ap.add_argument("--num-samples", type=int, default=1000)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    lengths = np.clip(rng.lognormal(mean=4.3, sigma=0.9, size=args.num_samples), 3, 2000).astype(int)
    with open(out / "train.jsonl", "w") as f:
        for i, n in enumerate(lengths):
            f.write(json.dumps({"id": i, "text": document(rng, int(n))}) + "\n")
    with open(out / "chat.jsonl", "w") as f:
        for _ in range(200):
            f.write(json.dumps(chat(rng)) + "\n")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [json.loads(line)["text"] for line in open(out / "train.jsonl")]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    print(
        f"wrote {out}/train.jsonl ({len(texts)} samples), chat.jsonl, tokenizer.json "
        f"(vocab {tok.get_vocab_size()})"
    )


if __name__ == "__main__":
    main()
