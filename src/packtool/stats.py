"""The run's statistics in the manifest (``stats``, ``histograms``): what happened to every input sample.

Two accountings have been written, and each is read by its own rules (``Stats.from_dict``):

* **fates** (packtool from f5c97c8 on, format_version 2 to today): every input sample has exactly one fate
  (``whole_samples``, ``split_samples``, ``truncated_samples``, ...), and they add up to the input samples;
  the tokens add up to ``input_tokens`` the same way.
* **counts** (format_version 2 before f5c97c8, e.g. commit 8080027): no ``whole_samples``;
  ``packed_samples`` counts every sample with tokens in the packs and the other counts may overlap it and
  each other (``split_samples`` includes the samples partly cut by ``max_packs``; ``truncated_samples`` and
  ``truncated_tokens`` were counted before ``max_packs`` left samples out). What adds up there is
  ``packed + empty + dropped + left out by max_packs = num_samples``; no ``input_tokens`` was recorded.

Example::

    >>> Stats.from_dict({"num_samples": 3, "packed_samples": 3, "split_samples": 1}).accounting
    'counts'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FATES = "fates"  # one fate per sample (whole_samples recorded)
COUNTS = "counts"  # before the fates: packed_samples and overlapping counts
# what the readers count beside the samples' fates (ErrorSink.notes), each a Stats field of that name
READ_NOTES = (
    "excluded_files", "excluded_dirs", "followed_links", "unfollowed_links", "decoded_records",
    "replaced_characters",
)  # fmt: skip


# --- totals ----------------------------------------------------------------------------------------
def total_stats(n: int, num_packs: int, num_tokens: int) -> dict[str, int | float]:
    """The stats that follow from ``num_packs`` packs of ``n`` tokens holding ``num_tokens`` real tokens
    (``pack`` writes them, ``verify`` and ``inspect --full`` check them).

    >>> total_stats(4, 3, 10)["fill_rate"], total_stats(4, 3, 10)["packs_over_lower_bound"]
    (0.833333, 0)
    """
    lower_bound = -(-num_tokens // n)
    return {
        "num_packs": num_packs,
        "num_tokens": num_tokens,
        "padding_tokens": num_packs * n - num_tokens,
        "fill_rate": round(num_tokens / (num_packs * n), 6) if num_packs else 0.0,
        "lower_bound_packs": lower_bound,
        "packs_over_lower_bound": num_packs - lower_bound,
    }


@dataclass
class SamplesPerPack:
    """Pieces (``sample_index`` entries) per pack."""

    mean: float = 0.0
    min: int = 0
    max: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> SamplesPerPack:
        """Fields this version does not know are ignored."""
        return cls(**{k: v for k, v in d.items() if k in ("mean", "min", "max")})

    @classmethod
    def of(cls, num_packs: int, num_pieces: int, fewest: int, most: int) -> SamplesPerPack:
        """``num_packs`` packs holding ``num_pieces`` pieces, ``fewest`` to ``most`` in one pack."""
        if not num_packs:
            return cls()
        return cls(round(num_pieces / num_packs, 4), fewest, most)


@dataclass
class Stats:
    """What happened to every input sample and token, and what the packs hold.

    Every input sample has one fate (``sample_fates``), and they add up to ``input_samples``; the tokens
    add up the same way (``token_fates``). Any fate but packed whole or split across packs is a loss, and
    ``losses()`` says each one in a line (the pack summary, ``inspect`` and its ``warnings`` show them).
    """

    num_samples: int = 0  # records encoded (bad records skipped under on_error=skip are not among them)
    packed_samples: int = 0  # samples with tokens in the packs (whole, split, truncated or partial)
    num_packs: int = 0
    num_tokens: int = 0  # real tokens in the packs
    input_tokens: int = 0  # tokens of every encoded sample
    padding_tokens: int = 0
    cp_padding_tokens: int = 0  # of the padding, what ends pieces for context parallelism (cp_size)
    fill_rate: float = 0.0
    lower_bound_packs: int = 0
    packs_over_lower_bound: int = 0
    samples_per_pack: SamplesPerPack = field(default_factory=SamplesPerPack)
    # the fates of the samples (one each)
    whole_samples: int = 0  # packed whole, in one pack
    split_samples: int = 0  # packed whole, spread over more than one pack
    truncated_samples: int = 0  # packed cut to N (long_samples=truncate)
    truncated_tokens: int = 0
    partial_samples: int = 0  # packed, partly cut off by max_packs
    samples_over_max_packs: int = 0  # left out wholly by max_packs
    tokens_over_max_packs: int = 0
    dropped_samples: int = 0  # longer than N, left out (long_samples=drop)
    dropped_tokens: int = 0
    empty_samples: int = 0  # encoded to no tokens: left out
    empty_loss_samples: int = 0  # tokens but nothing to learn (the empty_loss policy says what happened)
    empty_loss_dropped: int = 0  # ... of them left out (empty_loss=drop)
    empty_loss_tokens: int = 0  # tokens of those left out
    skipped_samples: int = 0  # bad records left out under on_error=skip, by reason below
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    # what the listing and the reading did beside (readers.listing, readers.decode): no sample's fate
    excluded_files: int = 0  # files --include/--exclude left out
    excluded_dirs: int = 0  # directories --exclude left out (not gone into)
    followed_links: int = 0  # symbolic links to directories followed (--follow-symlinks)
    unfollowed_links: int = 0  # ... not followed: all without it, loops and second paths with it
    decoded_records: int = 0  # records that were not UTF-8, read by --decode (replace or an encoding)
    replaced_characters: int = 0  # characters of them replaced by U+FFFD (--decode replace)
    policy_token_delta: int = 0  # tokens a custom pack_selected_samples added (+) or removed (-)
    policy_packs: int = 0  # packs a custom pack_selected_samples made: their tokens are the policy's

    # how the counts above were written (not a manifest field: ``from_dict`` tells by the fields present)
    accounting: str = field(default=FATES, compare=False)

    @classmethod
    def from_dict(cls, d: dict) -> Stats:
        """The stats of a manifest, by the rules of the accounting that wrote them (the module's docstring);
        fields this version does not know are ignored.

        >>> Stats.from_dict({"num_samples": 2, "packed_samples": 2, "whole_samples": 2, "new": 1}).check()
        []
        """
        known = {f.name for f in dataclasses.fields(cls)} - {"accounting"}
        values = {k: v for k, v in d.items() if k in known}
        values["samples_per_pack"] = SamplesPerPack.from_dict(d.get("samples_per_pack") or {})
        values["skipped_by_reason"] = dict(d.get("skipped_by_reason") or {})
        stats = cls(**values)
        if "whole_samples" not in d and stats.packed_samples:
            stats.accounting = COUNTS
            if "input_tokens" not in d:  # not recorded then: the token fates are all there is
                stats.input_tokens = sum(stats.token_fates().values())
        return stats

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["accounting"]
        return out

    @property
    def input_samples(self) -> int:
        """Records read: encoded ones and bad ones skipped."""
        return self.num_samples + self.skipped_samples

    def sample_fates(self) -> dict[str, int]:
        """Input samples by fate, one fate each: the values add up to ``input_samples``.

        >>> Stats(num_samples=5, whole_samples=3, empty_samples=1, skipped_samples=1,
        ...       dropped_samples=1).sample_fates()["packed whole"]
        3

        Stats of the ``counts`` accounting have no fate per packed sample: they give ``packed`` (whole,
        split, truncated or partly cut by max_packs) in its place.
        """
        if self.accounting == COUNTS:
            return {
                "packed (whole, split, truncated or partly cut)": self.packed_samples,
                "left out by max_packs": self.samples_over_max_packs,
                "too long, dropped": self.dropped_samples,
                "empty, left out": self.empty_samples,
                "bad record, skipped": self.skipped_samples,
            }
        return {
            "packed whole": self.whole_samples,
            "split across packs": self.split_samples,
            "truncated": self.truncated_samples,
            "partly cut by max_packs": self.partial_samples,
            "left out by max_packs": self.samples_over_max_packs,
            "too long, dropped": self.dropped_samples,
            "empty, left out": self.empty_samples,
            "nothing to learn, left out": self.empty_loss_dropped,
            "bad record, skipped": self.skipped_samples,
        }

    def token_fates(self) -> dict[str, int]:
        """Input tokens by fate: the values add up to ``input_tokens`` (+ ``policy_token_delta``)."""
        return {
            "packed": self.num_tokens,
            "cut by truncation": self.truncated_tokens,
            "cut by max_packs": self.tokens_over_max_packs,
            "in dropped samples": self.dropped_tokens,
            "in samples with nothing to learn": self.empty_loss_tokens,
        }

    def check(self) -> list[str]:
        """What does not add up (a damaged manifest, or a packtool bug); empty when all is well."""
        wrong = []
        fates = sum(self.sample_fates().values())
        if fates != self.input_samples:
            wrong.append(f"sample fates add up to {fates:,}, not the {self.input_samples:,} input samples")
        tokens = sum(self.token_fates().values())
        if tokens != self.input_tokens + self.policy_token_delta:
            wrong.append(
                f"token fates add up to {tokens:,}, not the {self.input_tokens + self.policy_token_delta:,} "
                "input tokens"
            )
        if self.accounting == COUNTS:  # what that accounting made add up: the sample fates above
            return wrong
        packed = self.whole_samples + self.split_samples + self.truncated_samples + self.partial_samples
        if packed != self.packed_samples:
            wrong.append(f"packed_samples is {self.packed_samples:,}, its fates add up to {packed:,}")
        return wrong

    def losses(self, n: int, max_packs: int | None = None) -> list[str]:
        """One line per kind of loss (every sample not packed whole, with its tokens), in input terms, for
        packs of ``n`` tokens and the run's ``max_packs``.

        >>> Stats(num_samples=10, dropped_samples=2, dropped_tokens=900).losses(256)
        ['2 of 10 samples longer than 256 tokens were dropped (900 tokens; long_samples=drop)']
        """
        total = self.input_samples
        out = []
        if self.truncated_samples:
            out.append(
                f"{self.truncated_samples:,} of {total:,} samples were truncated to {n} tokens "
                f"({self.truncated_tokens:,} tokens cut; long_samples=truncate)"
            )
        if self.dropped_samples:
            out.append(
                f"{self.dropped_samples:,} of {total:,} samples longer than {n} tokens were dropped "
                f"({self.dropped_tokens:,} tokens; long_samples=drop)"
            )
        if self.samples_over_max_packs or self.partial_samples:
            part = f", {self.partial_samples:,} more cut short" if self.partial_samples else ""
            out.append(
                f"{self.samples_over_max_packs:,} of {total:,} samples were left out by max_packs "
                f"{max_packs}{part} ({self.tokens_over_max_packs:,} tokens)"
            )
        if self.empty_samples:
            out.append(f"{self.empty_samples:,} of {total:,} samples were empty (no tokens) and left out")
        if self.empty_loss_dropped:
            out.append(
                f"{self.empty_loss_dropped:,} of {total:,} samples had nothing to learn (every label -100) "
                f"and were left out ({self.empty_loss_tokens:,} tokens; empty_loss=drop)"
            )
        if self.skipped_samples:
            reasons = ", ".join(f"{k} {v:,}" for k, v in self.skipped_by_reason.items())
            out.append(
                f"{self.skipped_samples:,} of {total:,} records were bad and skipped ({reasons}; "
                "on_error=skip, first ones in errors.jsonl)"
            )
        return out

    def lost_totals(self) -> tuple[int, int]:
        """(samples not packed whole, input tokens not in the packs), of the ``fates`` accounting."""
        kept = self.whole_samples + self.split_samples
        lost_tokens = sum(v for k, v in self.token_fates().items() if k != "packed")
        return self.input_samples - kept, lost_tokens


@dataclass
class Histogram:
    """Counts per bin: ``counts[i]`` values in ``[edges[i], edges[i + 1])`` (the last bin closed);
    ``quantiles`` (sample lengths only): ``{"p50", "p90", "p99", "max"}`` of the values (None: not
    recorded, as in the manifests of packtool before the sample lengths' geometric bins).

    >>> Histogram.from_dict({"edges": [0, 4, 8], "counts": [1, 2]}).to_dict()
    {'edges': [0, 4, 8], 'counts': [1, 2]}
    """

    edges: list[int]
    counts: list[int]
    quantiles: dict[str, int] | None = None

    @classmethod
    def from_dict(cls, d: dict) -> Histogram:
        """Fields this version does not know are ignored."""
        quantiles = d.get("quantiles")
        return cls(
            list(d.get("edges", [])),
            list(d.get("counts", [])),
            dict(quantiles) if isinstance(quantiles, dict) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The manifest's record (``quantiles`` only where there are some)."""
        out: dict[str, Any] = {"edges": list(self.edges), "counts": list(self.counts)}
        if self.quantiles is not None:
            out["quantiles"] = dict(self.quantiles)
        return out

    @classmethod
    def of(cls, values: np.ndarray, edges: np.ndarray) -> Histogram:
        counts, edges = np.histogram(values, bins=edges)
        return cls([int(e) for e in edges], [int(c) for c in counts])

    # the manifest's histograms (``pack`` writes them, ``inspect --full`` recomputes them)
    @classmethod
    def lengths(cls, lengths: np.ndarray, at_least: int) -> Histogram:
        """Lengths in about 32 bins growing geometrically from 1 to the longest (``at_least`` at least),
        so that a long tail (a few samples 100 times the median) does not put nearly every sample into
        the first bin; with the quantiles p50/p90/p99/max.

        >>> Histogram.lengths(np.array([3, 5, 8, 1000]), 16).quantiles
        {'p50': 5, 'p90': 8, 'p99': 8, 'max': 1000}
        """
        top = max(int(lengths.max()) if len(lengths) else 1, at_least)
        edges = np.unique(np.concatenate([[0, 1], np.ceil(np.geomspace(1, top, 32))]).astype(np.int64))
        hist = cls.of(lengths, edges)
        if len(lengths):
            q = np.percentile(lengths, [50, 90, 99], method="lower")  # lengths a sample has
            hist.quantiles = {
                **{k: int(round(float(v))) for k, v in zip(("p50", "p90", "p99"), q, strict=True)},
                "max": int(lengths.max()),
            }
        return hist

    @classmethod
    def pack_fill(cls, pack_tokens: np.ndarray, n: int) -> Histogram:
        """Real tokens per pack in 20 bins from 0 to N."""
        return cls.of(pack_tokens, np.linspace(0, n, 21).astype(int))

    @classmethod
    def per_pack(cls, counts: np.ndarray) -> Histogram:
        """Pieces per pack, one bin per count."""
        return cls.of(counts, np.arange(0, (int(counts.max()) if len(counts) else 1) + 2))


# --- images (vision-language outputs: docs/vision.md) ------------------------------------------------
def step_spread(image_tokens_in_order: np.ndarray, ranks: int) -> np.ndarray:
    """``(num_full_steps,)`` int64: per step of ``ranks`` consecutive packs (one pack per data-parallel
    rank), the most image tokens less the fewest.

    >>> step_spread(np.array([0, 90, 5, 100, 3]), 2).tolist()
    [90, 95]
    """
    tokens = np.asarray(image_tokens_in_order, dtype=np.int64)
    steps = tokens[: len(tokens) // ranks * ranks].reshape(-1, ranks)
    return steps.max(axis=1) - steps.min(axis=1)


def image_stats(
    image_length: np.ndarray, image_offsets: np.ndarray, pack_tokens: np.ndarray, ranks: int = 8
) -> dict[str, Any]:
    """Image statistics of packs in their order: the images and image tokens in all, the image tokens'
    share of the packs' tokens, images per pack (mean, max, and a histogram of counts), image tokens per
    image (min, mean, max), and the spread of image tokens across steps of ``ranks`` consecutive packs
    (``step_spread``: mean and max). Plain ints and floats (the manifest's ``vision.images``, ``inspect``).

    Args:
        image_length: flat image tokens of every image, pack after pack.
        image_offsets: ``(num_packs + 1,)`` where each pack's images start in ``image_length``.
        pack_tokens: ``(num_packs,)`` tokens of each pack (``N``, padding included).

    >>> s = image_stats(np.array([3, 2]), np.array([0, 2, 2]), np.array([8, 8]), ranks=2)
    >>> s["images"], s["image_tokens"], s["image_token_share"], s["images_per_pack_histogram"]
    (2, 5, 0.3125, {0: 1, 2: 1})
    >>> s["step_spread_max"]
    5
    """
    flat = np.asarray(image_length, dtype=np.int64)
    offsets = np.asarray(image_offsets, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(flat)])
    tokens_per_pack = cum[offsets[1:]] - cum[offsets[:-1]]
    smallest, largest = (int(flat.min()), int(flat.max())) if flat.size else (0, 0)
    return image_stats_of(np.diff(offsets), tokens_per_pack, smallest, largest, pack_tokens, ranks)


def image_stats_of(
    images_per_pack: np.ndarray,
    tokens_per_pack: np.ndarray,
    smallest: int,
    largest: int,
    pack_tokens: np.ndarray,
    ranks: int = 8,
) -> dict[str, Any]:
    """``image_stats`` from what it is made of: per pack (in order) its images and their tokens, the
    fewest and most tokens of one image (0 without images), and ``pack_tokens``: so that a run can gather
    them a block of packs at a time rather than every image at once.

    >>> image_stats_of(np.array([2, 0]), np.array([5, 0]), 2, 3, np.array([8, 8]), 2)["tokens_per_image_mean"]
    2.5
    """
    per_pack = np.asarray(images_per_pack, dtype=np.int64)
    tokens_per_pack = np.asarray(tokens_per_pack, dtype=np.int64)
    images, image_tokens = int(per_pack.sum()), int(tokens_per_pack.sum())
    counts, frequency = np.unique(per_pack, return_counts=True)
    spread = step_spread(tokens_per_pack, ranks) if len(tokens_per_pack) >= ranks else np.zeros(0, np.int64)
    total = int(np.asarray(pack_tokens, dtype=np.int64).sum())
    return {
        "packs": int(len(per_pack)),
        "images": images,
        "image_tokens": image_tokens,
        "image_token_share": float(image_tokens / max(1, total)),
        "images_per_pack_mean": float(per_pack.mean()) if len(per_pack) else 0.0,
        "images_per_pack_max": int(per_pack.max()) if len(per_pack) else 0,
        "images_per_pack_histogram": {int(c): int(f) for c, f in zip(counts, frequency, strict=True)},
        "tokens_per_image_min": int(smallest) if images else 0,
        "tokens_per_image_mean": float(image_tokens / images) if images else 0.0,
        "tokens_per_image_max": int(largest) if images else 0,
        "ranks": int(ranks),
        "step_spread_mean": float(spread.mean()) if spread.size else 0.0,
        "step_spread_max": int(spread.max()) if spread.size else 0,
    }
