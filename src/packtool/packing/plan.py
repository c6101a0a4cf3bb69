"""``PackPlan``: which piece of which sample goes where, computed from sample lengths alone.

A *piece* is a run of consecutive tokens of one sample (the whole sample unless it was split or
truncated). Pieces of pack ``k`` are ``pieces[pack_offsets[k]:pack_offsets[k + 1]]``, laid out from the
start of the pack in that order; the rest of the pack is padding. Token lists never enter the plan, so a
plan for 100M samples is a few arrays of 100M integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class PackStats:
    """What happened to every sample while planning. Never silent: all go to the manifest.

    Each sample has exactly one fate, so ``whole_samples + split_samples + truncated_samples +
    partial_samples + samples_over_max_packs + dropped_samples + empty_samples == num_samples``; and the
    tokens add up: packed tokens ``+ truncated_tokens + dropped_tokens + tokens_over_max_packs ==`` the
    samples' tokens ``+ policy_token_delta``.
    """

    num_samples: int = 0  # samples planned (records encoded)
    whole_samples: int = 0  # packed whole, in one pack
    split_samples: int = 0  # packed whole, spread over more than one pack (split_across_pack)
    truncated_samples: int = 0  # packed cut to packed_sequence_size (long_samples=truncate)
    truncated_tokens: int = 0  # tokens cut off by truncation
    partial_samples: int = 0  # packed, but partly cut off by max_packs
    samples_over_max_packs: int = 0  # left out wholly because of max_packs
    tokens_over_max_packs: int = 0  # tokens left out because of max_packs (partial samples' included)
    dropped_samples: int = 0  # longer than packed_sequence_size, left out (long_samples=drop)
    dropped_tokens: int = 0
    empty_samples: int = 0  # no tokens: left out
    policy_token_delta: int = 0  # tokens a custom pack_selected_samples added (+) or removed (-)
    policy_packs: int = 0  # packs a custom pack_selected_samples made: their tokens are the policy's

    def to_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}


@dataclass
class PackPlan:
    """The packing plan.

    Attributes:
        packed_sequence_size: N, the length of every pack.
        pack_offsets: ``(num_packs + 1,)`` int64, CSR offsets into the piece arrays.
        sample: ``(num_pieces,)`` int64, global index of the sample each piece comes from.
        start: ``(num_pieces,)`` int64, offset of the piece's first token inside its sample.
        length: ``(num_pieces,)`` int64, tokens in the piece (1..N).
        position_ids: ``"nemo"`` (positions run on over a split sample, modulo N, and padding continues the
            last position, clamped to N-1) or ``"restart"`` (every piece and the padding start at 0).
        origin: ``(num_pieces,)`` int64, the input index each piece comes from, when it differs from
            ``sample`` (pieces a custom ``pack_selected_samples`` made are new samples); else ``None``.
        span: ``(num_pieces,)`` int64, tokens each piece takes in its pack: ``length`` plus its
            context-parallel padding (``cp_size``); ``None`` when there is none (span == length).
        members: ``(num_packs + 1,)`` offsets and the input indices of every sample each pack took, when
            a custom ``pack_selected_samples`` may name fewer of them in its pieces (it merged some);
            the accounting gives those their fate. ``None`` otherwise (``permute`` drops it).
    """

    packed_sequence_size: int
    pack_offsets: np.ndarray
    sample: np.ndarray
    start: np.ndarray
    length: np.ndarray
    position_ids: str = "nemo"
    stats: PackStats = field(default_factory=PackStats)
    origin: np.ndarray | None = None
    span: np.ndarray | None = None
    members: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def input_index(self) -> np.ndarray:
        """``(num_pieces,)`` int64: the input sample each piece comes from."""
        return self.sample if self.origin is None else self.origin

    @property
    def num_packs(self) -> int:
        return len(self.pack_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.length.sum())

    @property
    def spans(self) -> np.ndarray:
        """``(num_pieces,)`` int64: tokens each piece takes in its pack, its context-parallel padding
        included (``length`` when there is none)."""
        return self.length if self.span is None else self.span

    def pack_tokens(self) -> np.ndarray:
        """``(num_packs,)`` real tokens in each pack."""
        cs = np.concatenate([[0], np.cumsum(self.length)])
        return np.diff(cs[self.pack_offsets])

    def pack_spans(self) -> np.ndarray:
        """``(num_packs,)`` tokens each pack's pieces take, context-parallel padding included."""
        cs = np.concatenate([[0], np.cumsum(self.spans)])
        return np.diff(cs[self.pack_offsets])

    def slice(self, first: int, last: int) -> PackPlan:
        """The plan for packs ``first..last-1`` (piece arrays are views)."""
        lo, hi = self.pack_offsets[first], self.pack_offsets[last]
        return PackPlan(
            self.packed_sequence_size,
            self.pack_offsets[first : last + 1] - lo,
            self.sample[lo:hi],
            self.start[lo:hi],
            self.length[lo:hi],
            self.position_ids,
            origin=None if self.origin is None else self.origin[lo:hi],
            span=None if self.span is None else self.span[lo:hi],
            members=None if self.members is None else _cut(*self.members, first, last),
        )

    def packed_inputs(self) -> np.ndarray:
        """The input indices with tokens in the packs (sorted, once each), merged ``members`` included."""
        held = (
            self.input_index if self.members is None else np.concatenate([self.input_index, self.members[1]])
        )
        return np.flatnonzero(np.bincount(held)) if len(held) else np.zeros(0, dtype=np.int64)  # no sort

    def permute(self, order: np.ndarray) -> PackPlan:
        """The same packs in the order ``order`` (a permutation of pack indices)."""
        counts = np.diff(self.pack_offsets)[order]
        starts = self.pack_offsets[:-1][order]
        new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(counts, out=new_offsets[1:])
        idx = np.repeat(starts - new_offsets[:-1], counts) + np.arange(new_offsets[-1])
        return PackPlan(
            self.packed_sequence_size,
            new_offsets,
            self.sample[idx],
            self.start[idx],
            self.length[idx],
            self.position_ids,
            self.stats,
            None if self.origin is None else self.origin[idx],
            None if self.span is None else self.span[idx],
        )

    def validate(self) -> None:
        """Internal consistency; raises AssertionError (a packtool bug, not bad input)."""
        n = self.packed_sequence_size
        assert self.pack_offsets[0] == 0 and np.all(np.diff(self.pack_offsets) >= 1)
        assert np.all(self.length >= 1) and np.all(self.length <= n)
        assert np.all(self.pack_spans() <= n)
        assert self.span is None or np.all(self.span >= self.length)


def _cut(offsets: np.ndarray, values: np.ndarray, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``first..last-1`` of the CSR ``(offsets, values)``."""
    return offsets[first : last + 1] - offsets[first], values[offsets[first] : offsets[last]]


def empty_plan(n: int, position_ids: str, stats: PackStats) -> PackPlan:
    z = np.zeros(0, dtype=np.int64)
    return PackPlan(n, np.zeros(1, dtype=np.int64), z, z, z, position_ids, stats)
