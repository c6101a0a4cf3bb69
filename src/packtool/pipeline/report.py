"""What ``packtool pack`` says of a finished run beside the manifest: the summary line, the special
tokens it put in the packs by name, and a warning for a token it had to guess."""

from __future__ import annotations

from packtool.manifest import Manifest
from packtool.stats import Stats
from packtool.tokenizing.tokenizer import WEAK_GUESSES


def name_special_tokens(
    identity: dict, encoder, named: dict[str, str | None], pad_token_id: int
) -> tuple[dict, list[str]]:
    """``identity`` with the text of the BOS/EOS tokens the encoder adds and of the pad token
    ``pad_token_id`` (``bos_token``, ``eos_token``, ``pad_token``), and a warning for each BOS/EOS chosen
    by a name that is something else first (``[SEP]`` as EOS: a BERT tokenizer declares no EOS).
    ``named``: the BOS/EOS the user named (``{"bos": None, "eos": "</s>"}``: ``--bos-token``,
    ``--eos-token``); a token named there or declared by the tokenizer is no guess.

    Encoders without a tokenizer (pretokenized, a plugin) add no token: ``identity`` comes back as it is.
    """
    tokenizer = getattr(encoder, "tokenizer", None)
    if not hasattr(tokenizer, "id_to_token"):
        return identity, []
    names, warnings = {}, []
    for kind in ("bos", "eos"):
        token_id = identity.get(f"{kind}_token_id")
        if token_id is None:
            continue
        names[f"{kind}_token"] = token = tokenizer.id_to_token(token_id)
        chosen = named.get(kind) or tokenizer.declared_token(kind)
        if not chosen and token in WEAK_GUESSES:
            names.setdefault("guessed_tokens", []).append(kind)
            warnings.append(
                f"--add-{kind}: the tokenizer declares no {kind.upper()} token; {token!r} (id {token_id}) "
                f"was chosen by its name: if it does not {'end' if kind == 'eos' else 'begin'} a sample for "
                f"your model, name the right one with --{kind}-token"
            )
    pad = tokenizer.id_to_token(pad_token_id)
    if pad is not None:
        names["pad_token"] = pad
    return {**identity, **names}, warnings


def special_tokens_line(manifest: Manifest) -> str | None:
    """``tokens: eos '</s>' (id 2) ends every sample; pad '<unk>' (id 0)``: the tokens packtool put in
    the packs, by name; None when it knows no names (pretokenized input)."""
    details = manifest.tokenizer.details
    parts = []
    for kind, where in (("bos", "begins"), ("eos", "ends")):
        if details.get(f"{kind}_token") is not None:
            parts.append(
                f"{kind} {details[f'{kind}_token']!r} (id {details[f'{kind}_token_id']}) {where} every sample"
            )
    if details.get("pad_token") is not None:
        parts.append(f"pad {details['pad_token']!r} (id {manifest.pad_token_id}) fills the packs")
    return "tokens: " + "; ".join(parts) if parts else None


def summary_line(manifest: Manifest, output: str) -> str:
    """The line ``pack`` ends with: the samples packed whole (in one pack), those split across packs
    apart from them, the packs, fill rate and lower bound. What was lost is said by the warnings after it.

    >>> summary_line(manifest, "out")  # doctest: +SKIP
    'packed 20,741 of 23,129 samples whole and 2,388 split across packs into 8,016 packs of 2048 tokens
    (fill rate 99.41%, lower bound 7,969 packs) -> out'
    """
    s = manifest.stats
    split = f" and {s.split_samples:,} split across packs" if s.split_samples else ""
    val = sum(e.num_packs for _, e in manifest.split_shards("val"))
    held = f"; {val:,} of them held out as validation in val-* shards" if val else ""
    images = images_part(manifest)
    return (
        f"packed {s.whole_samples:,} of {s.input_samples:,} samples whole{split}{images} into "
        f"{s.num_packs:,} packs of {manifest.packed_sequence_size} tokens (fill rate {s.fill_rate:.2%}, "
        f"lower bound {s.lower_bound_packs:,} packs{held}) -> {output}"
    ) + (f"\n{tokens}" if (tokens := special_tokens_line(manifest)) else "")


def images_part(manifest: Manifest) -> str:
    """`` with 3 of 5 images (20 image tokens, 11.11% of the packs' tokens, 2 left out with their
    samples)``: a vision-language output's images in the summary line (the warnings say why samples were
    left out; images of skipped bad records are not counted, their records are); empty for text."""
    vision = manifest.vision
    if not isinstance(vision, dict) or not isinstance(vision.get("images"), dict):
        return ""
    images = vision["images"]
    dropped = vision.get("dropped_images") or 0
    left = f", {dropped:,} left out with their samples" if dropped else ""
    return (
        f" with {vision.get('packed_images', 0):,} of {vision.get('input_images', 0):,} images "
        f"({images.get('image_tokens', 0):,} image tokens, {images.get('image_token_share', 0):.2%} of the "
        f"packs' tokens{left})"
    )


def losses_line(s: Stats) -> str:
    """The line that sums up what the packs miss (after each loss's own warning): samples not packed whole
    and tokens not in the packs, and the bad records skipped, whose tokens are not known (never encoded).

    >>> from packtool.stats import Stats
    >>> stats = Stats(num_samples=3, whole_samples=3, skipped_samples=1, input_tokens=9, num_tokens=9)
    >>> losses_line(stats)  # doctest: +ELLIPSIS
    'in all 1 of 4 samples were not packed whole and 0 of 9 tokens ..., and 1 bad record was skipped ...'
    """
    samples, tokens = s.lost_totals()
    line = (
        f"in all {samples:,} of {s.input_samples:,} samples were not packed whole and {tokens:,} of "
        f"{s.input_tokens:,} tokens are not in the packs"
    )
    if s.skipped_samples:
        what = "bad record was skipped (its" if s.skipped_samples == 1 else "bad records were skipped (their"
        line += f", and {s.skipped_samples:,} {what} tokens not known: never encoded)"
    return line + " (--strict makes this an error)"
