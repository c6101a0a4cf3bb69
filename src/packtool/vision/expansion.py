"""What a processor writes for each image: its own expansion, run once per distinct image size and kept.

A vision-language processor turns ``text`` with one placeholder per image (``<image>``, ``<|image_pad|>``,
``<start_of_image>``, ...) into the model's tokens in three steps of its own code: it lays the text out
(``prepare_inputs_layout``: PaliGemma puts ``<bos>`` after the last image and a line break at the end;
most processors leave the text as it is), replaces the k-th placeholder by the text it writes for the
k-th image (``replace_image_token``: LLaVA ``<image>`` x 576; Idefics3 tiles, each
``<fake_token_around_image><row_i_col_j><image>`` x 64, and the global image; Gemma 3
``\\n\\n<start_of_image>`` + 256 x ``<image_soft_token>`` + ``<end_of_image>\\n\\n``), and tokenizes the whole
text. ``Expander`` reproduces the three steps exactly:

* **The replacement** comes from the processor itself: it is run on a gray image of the size asked
  (``processor(text=[placeholder], images=[dummy])``) with its ``get_text_with_replacements`` and its
  tokenizer watched, and the text it writes is kept per size (``Expansion``), so that each distinct size
  costs one run of the image processor. Where the processor proves, on probe sizes at load time, that its
  text is a constant prefix + one token repeated + a constant suffix and that its
  ``_get_num_multimodal_tokens`` gives the repeat count (LLaVA, LLaVA-NeXT, Qwen2-VL, Gemma 3,
  InternVL, ...), the count comes from that arithmetic instead, and the first ``SPOT_CHECKS`` sizes of a
  run are still run both ways and must agree.
* **The layout** is the processor's own ``prepare_inputs_layout``, called on each sample's text.
* **The tokens**: the laid-out text with each placeholder replaced is tokenized whole by the processor's
  tokenizer (so a ``\\n\\n`` the processor writes merges with the template's newlines as it does in the
  processor), except that each run of a repeated image token is written once and repeated after
  tokenizing (an added token is cut out before the rest is tokenized, so one copy or 576 give the same
  tokens around it).

The probes write each image as the processor takes it in a text (``Expander.written``: its placeholder,
or the placeholder between its ``image_start_token`` and ``image_end_token`` where it refuses the bare one,
as HunYuan-VL does), and note whether its call has the tokenizer add its special tokens
(``special_tokens``: HunYuan-VL's does not) and which image modes it takes as it takes RGB
(``modes_taken``). An image of another mode is run through the processor once per size and mode
(``takes``): one it fails on (DeepSeek-VL's image processor takes 3-channel images only) is that
image's record's bad input, not a reason to refuse the family.

What packtool cannot reproduce exactly is refused at load time (``ConfigError``, one line naming the
family and why): text for an image that depends on its pixels or its mode (two probe images of one size
and different content or mode), a layout or replacement that the steps above do not give back on probe
texts (the refusal shows where the two texts part), an image token that is not an added token of the
tokenizer. A model whose images are not in the token sequence (cross-attention, Mllama: its processor gives a
``cross_attention_mask``; ``cross_attention``) keeps its one placeholder token per image, each image's span.

**An image's span** (``Expansion.span``): the tokens from the first to the last token of the processor's
``image_token_ids`` (what ``mm_token_type_ids`` marks: ``<image>``, ``<|image_pad|>``, Gemma 3's
``<image_soft_token>``, InternVL's ``<img>``, ``<IMG_CONTEXT>`` and ``</img>``) among those written for
the image: one contiguous run of the sample's tokens. For one repeated token (LLaVA, Qwen2-VL) it is that
run; for tiles (Idefics3) it runs from the first tile's first ``<image>`` to the global image's last and
holds the tile tags and line breaks between; text the processor writes around it (Gemma 3's
``\\n\\n<start_of_image>``) is outside. Its ids depend on nothing but the image's size (every token in it
lies between two added tokens), and each sample's are checked against them.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from packtool.errors import ConfigError

# distinct image sizes whose expansion a process keeps (the least recently used goes first): an expansion
# holds its text (up to tens of kB for a large image), and a dataset can have a size per image
CACHED_SIZES = 4096
# (height, width) of the probe images: small, square, wide, tall, large, extreme aspect ratios
PROBE_SIZES = (
    (40, 60),
    (61, 37),
    (28, 28),
    (1, 1),
    (9, 300),
    (300, 9),
    (480, 640),
    (1024, 768),
    (1500, 2000),
)
SPOT_CHECKS = 8  # sizes of a run whose arithmetic count is checked against the processor's own expansion
# image modes the probes try (gray fills): a processor that fails on one leaves it to be checked per image
# size (``Expander.takes``), as is any mode not probed (CMYK, 16-bit gray, bilevel, ...)
PROBE_MODES = (("L", 128), ("LA", (128, 255)), ("RGBA", (128, 128, 128, 255)), ("P", 3))


@dataclass(frozen=True)
class Expansion:
    """The text a processor writes for one image of a given size, and its tokens.

    Attributes:
        text: the replacement text with each run of a repeated image token written once.
        runs: ``((char offset in text, token id, count), ...)``: the runs written once.
        span_start: char offset in ``text`` of the span's first token.
        span_ids, span_counts: the tokens of ``text`` the span covers and how many times each is repeated
            (``(r,)`` int64: a run's count, else 1).
        span_length: ``span_counts.sum()``, the span's tokens.
    """

    text: str
    runs: tuple[tuple[int, int, int], ...]
    span_start: int
    span_ids: np.ndarray
    span_counts: np.ndarray
    span_length: int

    def span(self) -> np.ndarray:
        """``(span_length,)`` int32: the span's token ids."""
        return np.repeat(self.span_ids, self.span_counts).astype(np.int32)


class Refused(Exception):
    """A processor packtool cannot reproduce: the reason (``load_processor`` names the family)."""


class _Watched:
    """A tokenizer that records the texts it is asked to tokenize (and its output), then tokenizes them."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer, self.calls = tokenizer, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._tokenizer(*args, **kwargs)
        text = kwargs.get("text", args[0] if args else None)
        self.calls.append((text, kwargs, out))
        return out


class Expander:
    """A processor's expansion, reproduced (module docstring).

    Args:
        processor: the transformers processor (image processor on the PIL backend).
        backend: its tokenizer's ``tokenizers.Tokenizer`` (truncation and padding off).
    """

    def __init__(self, processor: Any, backend: Any) -> None:
        self.processor, self.backend = processor, backend
        self.placeholder: str = processor.image_token
        ids = [i for i in getattr(processor, "image_token_ids", None) or [] if i is not None]
        ids = ids or [backend.token_to_id(self.placeholder)]  # Janus's processor names no image token id
        unk = getattr(processor.tokenizer, "unk_token_id", None)
        self.image_ids = np.array(sorted({int(i) for i in ids if i != unk}), dtype=np.int64)
        self.pattern = re.compile(re.escape(self.placeholder))
        self.run_tokens = [backend.id_to_token(int(i)) for i in self.image_ids]
        self.written = self.placeholder  # an image in a text the processor takes (HunYuan-VL: wrapped)
        self.special_tokens = True  # the processor's own call has its tokenizer add its special tokens
        self.modes_taken: tuple[str, ...] = ("RGB",)  # image modes whose text is the RGB image's, proven
        self.per_image_count = False  # the text of an image depends on how many images its sample has
        self.arithmetic: tuple[str, str, str, int] | None = None  # (prefix, token, suffix, count offset)
        self.cross_attention = False
        self._cache: OrderedDict[tuple[int, int, int], Expansion] = OrderedDict()  # most recent last
        self._counts: dict[tuple[int, int], int] = {}  # counts asked for ahead (``prefetch``), not used yet
        self._template: tuple[Expansion, int, int] | None | bool = None  # the arithmetic shape's (below)
        self._spot_checked = 0
        self._modes_checked: OrderedDict[tuple[str, int, int], str | None] = OrderedDict()  # -> why not
        self._dummy_small = Image.new("RGB", (1, 1))
        self.last_call: dict[str, Any] = {}  # the options of ``run``'s last call of the tokenizer

    def encode(self, texts: list[str], special: bool = False) -> list[Any]:
        """``texts`` through the tokenizer, with its special tokens or not, never cut or padded (the
        processor's own calls leave its text options, Aya Vision's left padding, set on the tokenizer)."""
        self.backend.no_padding()
        self.backend.no_truncation()
        return self.backend.encode_batch(texts, add_special_tokens=special)

    # --- running the processor ----------------------------------------------------------------------
    def run(self, text: str, images: list[Image.Image]) -> tuple[list[str], str, list[int], dict]:
        """The processor on one sample (``text``, ``images``) with its steps watched: the replacement text
        of each image, the text it tokenized, its ids, its outputs (and, in ``last_call``, the options it
        passed its tokenizer)."""
        watched = copy.copy(self.processor)
        watched.tokenizer = _Watched(self.processor.tokenizer)
        replacements: list[list[str]] = []
        own = self.processor.get_text_with_replacements

        def recorded(text_in: list[str], images_replacements: list[str] = (), *args: Any, **kw: Any):
            replacements.append(list(images_replacements))
            return own(text_in, images_replacements, *args, **kw)

        watched.get_text_with_replacements = recorded
        # one sample: its images nested in one list, as apply_chat_template passes a conversation's
        out = watched(text=[text], images=[images] if images else None)
        calls = [c for c in watched.tokenizer.calls if isinstance(c[0], list)]
        if not calls:
            raise Refused("its text is not tokenized by its tokenizer in one call")
        final, self.last_call, tokenized = calls[-1]
        return (replacements[-1] if replacements else [], final[0], list(tokenized["input_ids"][0]), out)

    def layout(self, text: str, images: int) -> str:
        """``text`` laid out by the processor's own ``prepare_inputs_layout`` (for ``images`` images)."""
        dummies = [self._dummy_small] * images if images else None
        laid = self.processor.prepare_inputs_layout(images=dummies, text=[text])
        return laid[1][0]

    def _replacement(self, height: int, width: int, images: int, fill: Any = 128, mode: str = "RGB") -> str:
        """What the processor writes for an image of ``height x width`` (the first of ``images`` of that
        size in a sample), from one run of the processor."""
        dummy = Image.new(mode, (width, height), fill) if not callable(fill) else fill(height, width)
        text = self.written * images
        replacements, final, _, _ = self.run(text, [dummy] * images)
        if not replacements:  # the processor leaves the placeholder in the text (cross-attention models)
            return self.placeholder
        return replacements[0]

    # --- probing at load time -----------------------------------------------------------------------
    def proofs(self) -> dict[str, Any]:
        """What ``probe`` found, as JSON: a process loading the same processor again (a run's worker) may
        ``adopt`` it instead of probing again (a third of a second of running the processor)."""
        return {
            "written": self.written,
            "special_tokens": self.special_tokens,
            "modes_taken": list(self.modes_taken),
            "per_image_count": self.per_image_count,
            "cross_attention": self.cross_attention,
            "arithmetic": None if self.arithmetic is None else list(self.arithmetic),
        }

    def adopt(self, proofs: dict[str, Any]) -> None:
        """Take ``probe``'s findings from ``proofs`` (``proofs()`` of the same processor)."""
        self.written = str(proofs["written"])
        self.special_tokens = bool(proofs["special_tokens"])
        self.modes_taken = tuple(str(m) for m in proofs["modes_taken"])
        self.per_image_count = bool(proofs["per_image_count"])
        self.cross_attention = bool(proofs["cross_attention"])
        arithmetic = proofs["arithmetic"]
        self.arithmetic = None if arithmetic is None else tuple(arithmetic)

    def probe(self) -> None:
        """Check on probe texts and sizes that the processor's expansion is reproduced exactly, find what
        it depends on, and whether its count is arithmetic; ``Refused`` with the reason if not."""
        logger = logging.getLogger("transformers")  # its warnings on the 1 x 1 probe image are not the user's
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            self._probe()
        finally:
            logger.setLevel(level)

    def _probe(self) -> None:
        self.written = self._written()
        alone: dict[tuple[int, int], str] = {}
        failed: list[BaseException] = []
        for h, w in PROBE_SIZES:
            try:
                alone[(h, w)] = self._replacement(h, w, 1)
            except (ValueError, ZeroDivisionError) as e:  # a size it refuses (Qwen: an aspect ratio over 200)
                failed.append(e)
        sizes = list(alone)
        if len(sizes) < 3:
            e = failed[-1]
            raise Refused(
                f"it fails on {len(failed)} of {len(PROBE_SIZES)} probe images "
                f"({type(e).__name__}: {first_line(e)})"
            )
        self._probe_pixels(sizes[0], alone[sizes[0]])
        self._probe_layout(sizes[0], sizes[1])
        small = [s for s in sizes if s[0] * s[1] <= 1024 * 768]
        among = {s: self._replacement(*s, 2) for s in small}
        self.per_image_count = any(alone[s] != among[s] for s in small)  # LLaVA-OneVision's several images
        seen = among if self.per_image_count else alone
        a = small[0]
        b = next((s for s in small[::-1] if seen[s] != seen[a]), small[-1])
        if self._of_pair(a, b) != [seen[a], seen[b]]:
            raise Refused("the text it writes for an image depends on the other images of its sample")
        self._probe_collapse([alone[s] for s in sizes])
        self.arithmetic = self._prove_arithmetic(alone)

    def _written(self) -> str:
        """The placeholder as the processor takes it in a text: alone, or between its
        ``image_start_token`` and ``image_end_token`` where it demands them (HunYuan-VL; its chat
        template writes them)."""
        start, end = (getattr(self.processor, f"image_{k}_token", None) for k in ("start", "end"))
        if not (isinstance(start, str) and isinstance(end, str)):
            return self.placeholder
        try:
            self.run(self.placeholder, [Image.new("RGB", (28, 28), 128)])
        except ValueError:  # (a processor that fails either way is named by the probes)
            return start + self.placeholder + end
        return self.placeholder

    def _of_pair(self, a: tuple[int, int], b: tuple[int, int]) -> list[str]:
        images = [Image.new("RGB", (w, h), 128) for h, w in (a, b)]
        replacements, _, _, _ = self.run(self.written * 2, images)
        return replacements or [self.placeholder] * 2

    def _probe_pixels(self, size: tuple[int, int], gray: str) -> None:
        rng = np.random.default_rng(0)

        def noise(h: int, w: int) -> Image.Image:
            return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))

        if self._replacement(*size, 1, fill=noise) != gray or self._replacement(*size, 1, fill=0) != gray:
            raise Refused("the text it writes for an image depends on the image's pixels")
        taken = ["RGB"]
        for mode, fill in PROBE_MODES:
            try:
                text = self._replacement(*size, 1, fill=fill, mode=mode)
            except Exception:  # noqa: BLE001 - an image it cannot take is its record's (``takes``), not the family's
                continue
            if text != gray:
                raise Refused(f"the text it writes for an image depends on the image's mode ({mode})")
            taken.append(mode)
        self.modes_taken = tuple(taken)

    def _probe_layout(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        """Probe texts laid out and replaced as packtool does give the text the processor tokenizes, and
        whether its call has the tokenizer add its special tokens (HunYuan-VL's does not)."""
        ph, w = self.placeholder, self.written
        specials = set()
        for text, sizes in ((f"x{w} y\n{w}z\n", [a, b]), (f"{w}{w}\n\nq", [b, a]), ("plain\n", [])):
            images = [Image.new("RGB", (w, h), 128) for h, w in sizes]
            try:
                replacements, final, _, out = self.run(text, images)
            except ValueError:
                if images:
                    raise
                continue  # a processor that takes no text without images (PaliGemma)
            if "cross_attention_mask" in out:
                self.cross_attention = True
            specials.add(bool(self.last_call.get("add_special_tokens", True)))
            laid = self.layout(text, len(images))
            if not replacements:
                replacements = [ph] * len(images)
            pieces = self.pattern.split(laid)
            if len(pieces) != len(replacements) + 1:
                raise Refused("its layout of the text changes the number of image placeholders")
            want = "".join(p + r for p, r in zip(pieces, [*replacements, ""], strict=True))
            if want != final:
                at = len(os.path.commonprefix([want, final]))
                raise Refused(
                    f"the text it tokenizes is not its layout with each placeholder replaced: from character "
                    f"{at} it is {_excerpt(final, at)} where the layout gives {_excerpt(want, at)}"
                )
        if len(specials) > 1:
            raise Refused("its call adds its tokenizer's special tokens to some texts and not to others")
        self.special_tokens = specials.pop()

    def _probe_collapse(self, replacements: list[str]) -> None:
        """Writing each run of an image token once, then repeating its id, gives the tokens of the whole
        text (the image tokens are added tokens, cut out before the text around them is tokenized)."""
        for replacement in replacements:
            text = f"a\n{replacement}\nb"
            collapsed, runs = self.collapse(text)
            whole, enc = (e.ids if i == 0 else e for i, e in enumerate(self.encode([text, collapsed])))
            if expand_runs(np.asarray(enc.ids), np.asarray(enc.offsets)[:, 0], runs).tolist() != whole:
                raise Refused("its image tokens are not added tokens of its tokenizer (they merge with text)")

    def _prove_arithmetic(self, alone: dict[tuple[int, int], str]) -> tuple[str, str, str, int] | None:
        """``(prefix, token, suffix, offset)`` where every probe size's text is
        ``prefix + token * (n - offset) + suffix``, ``n`` the processor's ``_get_num_multimodal_tokens``
        count; else ``None``."""
        counter = getattr(self.processor, "_get_num_multimodal_tokens", None)
        if counter is None or self.per_image_count or self.cross_attention:
            return None
        found = None
        for (h, w), text in alone.items():
            best = None
            for token in self.run_tokens:
                m = re.fullmatch(f"(.*?)((?:{re.escape(token)})+)(.*)", text, re.S)
                if m and (best is None or len(m.group(2)) > len(best[1])):
                    best = (m.group(1), m.group(2), m.group(3), token)
            if best is None or any(t in best[0] + best[2] for t in self.run_tokens if t == best[3]):
                return None
            try:
                n = int(counter(image_sizes=[(h, w)])["num_image_tokens"][0])
            except Exception:  # noqa: BLE001 - the processor's arithmetic is only a shortcut: not taken
                return None
            k = len(best[1]) // len(best[3])
            shape = (best[0], best[3], best[2], n - k)
            outside = len(self.encode([best[0] + best[2]])[0].ids)
            if (found is not None and shape != found) or shape[3] not in (0, outside):
                return None
            found = shape
        return found

    # --- the expansion of one size ------------------------------------------------------------------
    def prefetch(self, sizes: list[tuple[int, int]]) -> None:
        """Ask the processor for the counts of ``sizes`` (``(height, width)``) it has no expansion of yet in
        one call, where its arithmetic holds: its ``_get_num_multimodal_tokens`` costs about as much for one
        size as for hundreds (its keyword arguments are merged and checked on every call). A size the
        processor refuses is left to ``expansion``, which names it."""
        if self.arithmetic is None or self.per_image_count:
            return
        todo = list(dict.fromkeys((int(h), int(w)) for h, w in sizes))
        todo = [k for k in todo if (*k, 1) not in self._cache and k not in self._counts]
        if not todo:
            return
        try:
            counts = self.processor._get_num_multimodal_tokens(image_sizes=todo)["num_image_tokens"]
        except Exception:  # noqa: BLE001 - one size refused: each is asked alone, and named, by expansion
            return
        self._counts.update(zip(todo, (int(n) for n in counts), strict=True))

    def expansion(self, height: int, width: int, images: int = 1) -> Expansion:
        """What the processor writes for an image of ``height x width`` in a sample of ``images`` images.
        ``ValueError`` where the processor refuses the size (its message)."""
        key = (int(height), int(width), int(images) if self.per_image_count else 1)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        n = self._count(key[0], key[1]) if self.arithmetic is not None else None
        out = self._from_template(n) if n is not None and self._spot_checked >= SPOT_CHECKS else None
        if out is not None:
            return self._keep(key, out)
        text = None if n is None else self._arithmetic_text(n)
        if text is None or self._spot_checked < SPOT_CHECKS:
            own = self._own_text(*key)
            if text is not None:
                self._spot_checked += 1
                if own != text:
                    raise ConfigError(
                        f"processor {type(self.processor).__name__}: its _get_num_multimodal_tokens "
                        f"disagrees with the text it writes for a {height}x{width} image: packtool cannot "
                        "count it exactly"
                    )
            text = own
        return self._keep(key, self._expansion_of(text))

    def takes(self, mode: str, height: int, width: int) -> None:
        """``ValueError`` saying why, where the processor cannot take an image of ``mode`` and that size
        (DeepSeek-VL fails on a non-square grayscale image) or writes other text for it than for an RGB
        one; a mode the probes proved is taken at once, any other is run once per size."""
        if mode in self.modes_taken:
            return
        key = (mode, int(height), int(width))
        if key not in self._modes_checked:
            try:
                own = self._replacement(height, width, 1, fill=0, mode=mode)
                same = own == self._replacement(height, width, 1)
                why = None if same else f"the processor writes other tokens for it (mode {mode}) than for RGB"
            except Exception as e:  # noqa: BLE001 - any failure of the processor on it is this image's
                why = f"the processor fails on it (mode {mode}): {type(e).__name__}: {first_line(e)}"
            self._modes_checked[key] = why
            if len(self._modes_checked) > CACHED_SIZES:
                self._modes_checked.popitem(last=False)
        if self._modes_checked[key] is not None:
            raise ValueError(self._modes_checked[key])

    def _keep(self, key: tuple[int, int, int], out: Expansion) -> Expansion:
        self._cache[key] = out
        if len(self._cache) > CACHED_SIZES:  # a worker's memory stays bounded however many sizes it meets
            self._cache.popitem(last=False)
        return out

    def _count(self, height: int, width: int) -> int:
        """The processor's ``_get_num_multimodal_tokens`` count for the size (asked ahead, or now)."""
        n = self._counts.pop((height, width), None)
        if n is None:
            n = self.processor._get_num_multimodal_tokens(image_sizes=[(height, width)])["num_image_tokens"][
                0
            ]
        return int(n)

    def _arithmetic_text(self, n: int) -> str:
        prefix, token, suffix, offset = self.arithmetic
        return prefix + token * (n - offset) + suffix

    def _from_template(self, n: int) -> Expansion | None:
        """The expansion of a size whose count is ``n``, from the arithmetic shape's: ``prefix + token x
        copies + suffix`` collapses to the same text, with the same tokens, for any ``copies`` of 2 or more,
        and differs only in that run's count (checked once, on 2 and 3 copies); ``None`` where that does
        not hold (fewer copies, or a shape whose expansions differ otherwise)."""
        copies = n - self.arithmetic[3]
        if copies < 2 or self._template is False:
            return None
        if self._template is None:
            two, three = (self._expansion_of(self._arithmetic_text(k + self.arithmetic[3])) for k in (2, 3))
            runs = [i for i, (a, b) in enumerate(zip(two.runs, three.runs, strict=True)) if a != b]
            counts = np.flatnonzero(two.span_counts != three.span_counts)
            same = (two.text, two.span_start, two.span_ids.tolist()) == (
                three.text, three.span_start, three.span_ids.tolist()
            )  # fmt: skip
            if not (same and len(two.runs) == len(three.runs) and len(runs) == 1 and len(counts) == 1):
                self._template = False
                return None
            self._template = (two, runs[0], int(counts[0]))
        base, r, c = self._template
        runs = list(base.runs)
        runs[r] = (runs[r][0], runs[r][1], copies)
        span_counts = base.span_counts.copy()
        span_counts[c] = copies
        return Expansion(
            base.text, tuple(runs), base.span_start, base.span_ids, span_counts, int(span_counts.sum())
        )

    def _own_text(self, height: int, width: int, images: int) -> str:
        try:
            return self._replacement(height, width, images)
        except ValueError as e:
            raise ValueError(first_line(e)) from None
        except Exception as e:  # noqa: BLE001 - any failure of the processor on this size is this image's
            raise ValueError(f"the processor fails on it: {type(e).__name__}: {first_line(e)}") from None

    def _expansion_of(self, text: str) -> Expansion:
        collapsed, runs = self.collapse(text)
        enc = self.encode([collapsed])[0]
        ids = np.asarray(enc.ids, dtype=np.int64)
        starts = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
        repeats = run_repeats(len(ids), starts, runs)
        where = np.flatnonzero(np.isin(ids, self.image_ids))  # the runs are of image tokens: same ends
        if not len(where):  # the processor writes no image token (a model without image tokens)
            raise ConfigError(
                f"processor {type(self.processor).__name__}: it writes no image token for an image"
            )
        counts = repeats[where[0] : where[-1] + 1]
        return Expansion(
            text=collapsed,
            runs=tuple(runs),
            span_start=int(starts[where[0]]),
            span_ids=ids[where[0] : where[-1] + 1],
            span_counts=counts,
            span_length=int(counts.sum()),
        )

    def collapse(self, text: str) -> tuple[str, list[tuple[int, int, int]]]:
        """``text`` with each run of one image token (two or more copies) written once, and the runs:
        ``(char offset in the new text, token id, copies)``."""
        if not self.run_tokens:
            return text, []
        alternatives = "|".join(f"(?:{re.escape(t)}){{2,}}" for t in self.run_tokens)
        pieces, runs, at, last = [], [], 0, 0
        for m in re.finditer(alternatives, text):
            token = next(t for t in self.run_tokens if m.group().startswith(t))
            pieces.append(text[last : m.start()])
            at += m.start() - last
            runs.append((at, int(self.backend.token_to_id(token)), len(m.group()) // len(token)))
            pieces.append(token)
            at += len(token)
            last = m.end()
        pieces.append(text[last:])
        return "".join(pieces), runs


def run_repeats(n: int, starts: np.ndarray, runs: list[tuple[int, int, int]]) -> np.ndarray:
    """``(n,)`` int64 copies of each of ``n`` tokens (starting at chars ``starts``): ``count`` for a run's."""
    repeats = np.ones(n, dtype=np.int64)
    if runs:
        at = np.array([r[0] for r in runs], dtype=np.int64)
        index = np.searchsorted(starts, at, side="left")
        repeats[index] = [r[2] for r in runs]
    return repeats


def expand_runs(ids: np.ndarray, starts: np.ndarray, runs: list[tuple[int, int, int]]) -> np.ndarray:
    """``ids`` with the token of each run (found by its char offset among ``starts``) repeated."""
    return np.repeat(ids, run_repeats(len(ids), starts, runs))


def _excerpt(text: str, at: int, width: int = 30) -> str:
    """``text`` around character ``at`` (``width`` either side), quoted, with ``...`` where it goes on."""
    part = repr(text[max(0, at - width) : at + width])
    return ("..." if at > width else "") + part + ("..." if at + width < len(text) else " (its end)")


def first_line(e: BaseException) -> str:
    """An error's first line (a library's message may go on for many), or its type's name if it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
