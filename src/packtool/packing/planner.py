"""Packing: sample lengths -> ``PackPlan``.

``make_plan(lengths, options, locate)`` applies the long-sample policy, leaves out empty samples, runs the
strategy named by ``options.strategy`` and cuts the plan at ``max_packs``. Every sample that is not packed
whole is counted in ``plan.stats``. Samples with spans that must stay whole (an image's tokens: ``blocks``)
are cut by ``long_samples=split`` only between them (``cut_outside``).

Strategies: ``bfd`` (default, ``packtool.packing.bfd``), ``sequential`` (NeMo ``PackedSequence`` order,
``packtool.packing.sequential``) and ``module:callable`` custom policies (``packtool.packing.custom``).
``position_ids`` left unset in the options means ``nemo`` for ``sequential`` and ``restart`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from packtool.errors import ConfigError, InputError
from packtool.packing.bfd import cut_long, plan_bfd
from packtool.packing.custom import Fetch, StorePacks, plan_custom
from packtool.packing.options import STRATEGIES as STRATEGY_NAMES
from packtool.packing.options import PackingOptions
from packtool.packing.plan import PackPlan, PackStats, empty_plan
from packtool.packing.sequential import plan_sequential
from packtool.plugins import is_plugin_spec
from packtool.schema import pack_of_piece

__all__ = [
    "PackPlan",
    "PackStats",
    "STRATEGIES",
    "account",
    "cut_outside",
    "hold_out",
    "make_plan",
    "resolve_position_ids",
    "too_long_message",
]


def _sequential(lengths, samples, n, split_across_pack, position_ids, options: PackingOptions) -> PackPlan:
    return plan_sequential(lengths, samples, n, split_across_pack, position_ids)


def _bfd(lengths, samples, n, split_across_pack, position_ids, options: PackingOptions) -> PackPlan:
    seed = options.seed if options.bfd.shuffle_packs else None
    return plan_bfd(
        lengths, samples, n, split_across_pack, position_ids, options.buffer.packing_buffer_size, seed
    )


# name -> fn(lengths, samples, n, split_across_pack, position_ids, options) -> PackPlan
STRATEGIES: dict[str, Callable[..., PackPlan]] = {"bfd": _bfd, "sequential": _sequential}
assert tuple(STRATEGIES) == STRATEGY_NAMES  # options validates the names, this dispatches on them


def too_long_message(
    length: int, n: int, lengths: np.ndarray | None = None, among: str = "", cuts: str = "anywhere"
) -> str:
    """What ``long_samples=error`` says of a sample of ``length`` tokens; with ``lengths`` (the samples
    known so far, ``among`` says which: ``"all"``, ``"the first chunk's"``), also how many of them are
    longer than ``n`` and by how many tokens, so that the option is chosen knowing what it costs. The
    options it offers are those that apply (``cuts``): ``anywhere`` (text), ``between_images``
    (interleaved documents: ``long_samples=split`` only) or ``never`` (conversations with images).

    >>> too_long_message(3000, 2048, np.array([3000, 10, 2100, 5]), "all")  # doctest: +ELLIPSIS
    'sample has 3000 tokens, more than ... (2 of all 4 samples are longer: 50.0%; 1,004 of the 5,115 ...'
    >>> too_long_message(130, 120, cuts="never")  # doctest: +ELLIPSIS
    'sample has 130 tokens, ...; use --long-samples drop, or a larger --packed-sequence-size (a sample w...'
    """
    counts = ""
    if lengths is not None and len(lengths):
        long = lengths[lengths > n]
        counts = (
            f" ({len(long):,} of {among} {len(lengths):,} samples are longer: "
            f"{len(long) / len(lengths):.1%}; "
            f"{int(long.sum()) - n * len(long):,} of the {int(lengths.sum()):,} tokens lie beyond N)"
        )
    if cuts == "between_images":
        return (
            f"sample has {length} tokens, more than packed_sequence_size {n}{counts}; use --long-samples "
            "split (a document is cut between its images) or drop, or a larger --packed-sequence-size"
        )
    if cuts == "never":
        return (
            f"sample has {length} tokens, more than packed_sequence_size {n}{counts}; use --long-samples "
            "drop, or a larger --packed-sequence-size (a sample with images is never cut)"
        )
    return (
        f"sample has {length} tokens, more than packed_sequence_size {n}{counts}; use "
        "--split-across-pack, --long-samples drop|truncate|split, or a larger --packed-sequence-size"
    )


def resolve_position_ids(options: PackingOptions) -> str:
    """``options.position_ids``, or when unset ``nemo`` for ``sequential`` and ``restart`` otherwise."""
    if options.position_ids is not None:
        return options.position_ids
    return "nemo" if options.strategy == "sequential" else "restart"


Locate = Callable[[int, str, str], InputError]
# (sample indices) -> (offsets, starts, ends): the spans that each sample's pieces must hold whole,
# ``[start, end)`` in the sample, disjoint or equal, sample ``j``'s at ``offsets[j]:offsets[j + 1]``, in order
Blocks = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


def _plain_locate(i: int, field: str, message: str) -> InputError:
    return InputError(f"sample {i}: {message}", field=field)


def make_plan(
    lengths: np.ndarray,
    options: PackingOptions,
    locate: Locate | None = None,
    fetch: Fetch | None = None,
    store_packs: StorePacks | None = None,
    blocks: Blocks | None = None,
) -> PackPlan:
    """Plan packs for samples of token counts ``lengths`` (``(num_samples,)``, in input order).

    Args:
        lengths: tokens per sample; 0 for a sample that encoded to nothing.
        options: uses ``packed_sequence_size``, ``strategy``, ``split_across_pack``, ``max_packs``,
            ``long_samples`` and ``position_ids``.
        locate: ``locate(i, field, message) -> InputError`` naming sample ``i``'s file and row.
        fetch, store_packs: for custom (``module:callable``) strategies only: how the policy gets its
            samples' tokens, and where the packs its ``pack_selected_samples`` makes are kept
            (``packing.custom``).
        blocks: the spans of samples that ``long_samples=split`` never cuts through (``Blocks``: an
            image's tokens), ``None``: there are none.

    Example::

        >>> cfg = PackingOptions(packed_sequence_size=8, strategy="sequential")
        >>> plan = make_plan(np.array([5, 3, 6]), cfg)
        >>> plan.num_packs, plan.pack_tokens().tolist()
        (2, [8, 6])
    """
    n = options.packed_sequence_size
    lengths = np.asarray(lengths, dtype=np.int64)
    custom = is_plugin_spec(options.strategy)
    if not custom and options.strategy not in STRATEGIES:
        raise ConfigError(
            f"strategy must be one of {', '.join(STRATEGIES)} or module:callable, got {options.strategy!r}"
        )
    if custom and options.split_across_pack:
        raise ConfigError("split_across_pack is not available with a custom strategy (module:callable)")
    if custom and (fetch is None or store_packs is None):
        raise ConfigError(
            "a custom strategy (module:callable) needs the encoded samples (fetch, store_packs)"
        )
    position_ids = resolve_position_ids(options)
    lengths_in = lengths
    stats = PackStats(num_samples=len(lengths))
    keep = lengths > 0
    stats.empty_samples = int((~keep).sum())
    long = lengths > n
    if long.any() and not options.split_across_pack:
        if options.long_samples == "error":
            i = int(np.flatnonzero(long)[0])
            message = too_long_message(int(lengths[i]), n, lengths, "all")
            if locate is not None:
                raise locate(i, "input_ids", message)
            raise InputError(f"sample {i}: {message}")
        if options.long_samples == "drop":
            stats.dropped_samples = int(long.sum())
            stats.dropped_tokens = int(lengths[long].sum())
            keep &= ~long
        elif options.long_samples == "truncate":
            lengths = np.minimum(lengths, n)
    samples = np.flatnonzero(keep).astype(np.int64)
    cut_only_long = options.long_samples == "split" and not options.split_across_pack and bool(long.any())
    if len(samples) == 0:
        return empty_plan(n, position_ids, stats)
    if custom:
        plan = plan_custom(
            lengths[samples],
            samples,
            n,
            options.strategy,
            fetch,
            store_packs,
            locate or _plain_locate,
            position_ids,
            options.buffer.packing_buffer_size,
            options.seed,
        )
    elif cut_only_long and blocks is not None:
        cut = cut_outside(lengths[samples], samples, n, blocks, locate or _plain_locate)
        plan = _plan_items(cut[2], cut[0], cut[1], n, position_ids, options)
    elif cut_only_long:
        piece_sample, piece_start, piece_length = cut_long(lengths[samples], samples, n)
        plan = _plan_items(piece_length, piece_sample, piece_start, n, position_ids, options)
    elif options.cp_size > 1:
        zero = np.zeros(len(samples), dtype=np.int64)
        plan = _plan_items(lengths[samples], samples, zero, n, position_ids, options)
    else:
        plan = STRATEGIES[options.strategy](
            lengths[samples], samples, n, options.split_across_pack, position_ids, options
        )
    full = plan
    truncating = options.long_samples == "truncate" and not options.split_across_pack
    if options.max_packs is not None and plan.num_packs > options.max_packs:
        plan = plan.slice(0, options.max_packs)
    account(stats, full, plan, lengths, cut=lengths_in - lengths if truncating else None)
    stats.policy_packs = plan.num_packs if full.members is not None else 0
    plan.stats = stats
    plan.validate()
    return plan


def cut_outside(
    lengths: np.ndarray, samples: np.ndarray, n: int, blocks: Blocks, locate: Locate = _plain_locate
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sample, start, length)`` of the pieces of ``samples`` (of ``lengths`` tokens): each sample of at
    most ``n`` tokens whole, each longer one cut into pieces of at most ``n`` tokens, each as long as it
    can be without ending inside one of the sample's ``blocks`` (``[start, end)`` spans kept whole: cut
    before the block instead). Pieces come in sample order. A block longer than ``n`` cannot be kept
    whole: ``InputError`` (``locate``) naming its sample.

    >>> blocks = lambda s: (np.array([0, 2]), np.array([3, 9]), np.array([7, 10]))
    >>> [a.tolist() for a in cut_outside(np.array([4, 12]), np.array([5, 6]), 5, blocks)]
    [[5, 6, 6, 6], [0, 0, 3, 8], [4, 3, 5, 4]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    samples = np.asarray(samples, dtype=np.int64)
    long = np.flatnonzero(lengths > n)
    offsets, starts, ends = blocks(samples[long])
    cut_sample, cut_start = [], []
    for j, i in enumerate(long.tolist()):
        s, e = starts[offsets[j] : offsets[j + 1]], ends[offsets[j] : offsets[j + 1]]
        at, size = 0, int(lengths[i])
        while True:
            cut_sample.append(i)
            cut_start.append(at)
            if size - at <= n:
                break
            cut = at + n
            inside = (s < cut) & (cut < e)
            if inside.any():
                cut = int(s[inside].min())
            if cut <= at:  # the block from here on is longer than n
                k = int(np.flatnonzero(s == at)[0])
                raise locate(int(samples[i]), "images", f"image {k}'s tokens (with what the processor "
                             f"writes around them) take {int(e[k] - s[k])}, more than packed_sequence_size "
                             f"{n}: it cannot go whole into a piece")  # fmt: skip
            at = cut
    short = np.flatnonzero(lengths <= n)
    local = np.concatenate([short, np.asarray(cut_sample, dtype=np.int64)])
    start = np.concatenate([np.zeros(len(short), dtype=np.int64), np.asarray(cut_start, dtype=np.int64)])
    order = np.lexsort((start, local))
    local, start = local[order], start[order]
    last = np.r_[local[1:] != local[:-1], True]  # a sample's last piece ends at its end
    end = np.where(last, lengths[local], np.r_[start[1:], 0])
    return samples[local], start, end - start


def hold_out(plan: PackPlan, fraction: float, seed: int) -> tuple[PackPlan, int]:
    """The packs of ``plan`` with ``round(fraction * num_packs)`` of them (at least one when ``fraction``
    > 0), chosen at random by ``seed``, moved to the end as the validation split; returns the reordered
    plan and the number of training packs before them. Both splits keep their packs' relative order.

    Raises ``ConfigError`` when the holdout would leave no training pack.

    >>> cfg = PackingOptions(packed_sequence_size=8, strategy="sequential")
    >>> plan, train = hold_out(make_plan(np.array([8, 8, 8, 8, 8]), cfg), 0.4, seed=0)
    >>> train, plan.sample.tolist()
    (3, [1, 3, 4, 0, 2])
    """
    k = plan.num_packs
    if fraction <= 0:
        return plan, k
    val = max(1, round(fraction * k))
    if val >= k:
        raise ConfigError(f"val_fraction {fraction} of {k} packs leaves no training pack")
    held = np.zeros(k, dtype=bool)
    held[np.random.default_rng([seed, 0x76616C]).choice(k, size=val, replace=False)] = True
    order = np.concatenate([np.flatnonzero(~held), np.flatnonzero(held)])
    return plan.permute(order), k - val


def _plan_items(
    length: np.ndarray,
    sample: np.ndarray,
    start: np.ndarray,
    n: int,
    position_ids: str,
    options: PackingOptions,
) -> PackPlan:
    """Plan items that are never split further: pieces ``(sample, start, length)`` of at most ``n`` tokens
    (whole samples, or the N-token pieces of ``long_samples=split``, TRL's ``bfd_split``).

    With ``cp_size > 1`` each item takes its length rounded up to a multiple of ``2 * cp_size`` in its pack
    (NeMo AutoModel's ``pack_dataset(cp_size=...)``): the strategy plans those spans, and the plan keeps
    both (``PackPlan.span``).

    >>> cfg = PackingOptions(packed_sequence_size=8, strategy="sequential", cp_size=2)
    >>> p = _plan_items(np.array([3, 2, 5]), np.arange(3), np.zeros(3, int), 8, "restart", cfg)
    >>> p.pack_offsets.tolist(), p.length.tolist(), p.span.tolist()
    ([0, 2, 3], [3, 2, 5], [4, 4, 8])
    """
    align = 2 * options.cp_size if options.cp_size > 1 else 1
    span = -(-length // align) * align
    items = np.arange(len(sample), dtype=np.int64)
    plan = STRATEGIES[options.strategy](span, items, n, False, position_ids, options)
    item = plan.sample  # whole items: plan.start is 0 and plan.length their span
    return PackPlan(
        n,
        plan.pack_offsets,
        sample[item],
        start[item],
        length[item],
        position_ids,
        span=plan.length if align > 1 else None,
    )


def account(
    stats: PackStats, full: PackPlan, kept: PackPlan, lengths: np.ndarray, cut: np.ndarray | None
) -> None:
    """Give every planned sample its one fate in ``stats`` (whole, split, truncated, partly or wholly cut
    by ``max_packs``), and each fate the tokens its samples lost, from the strategy's plan ``full`` and
    the ``kept`` packs (``full`` cut at ``max_packs``). ``lengths`` are the samples' lengths as planned
    (after truncation); ``cut`` the tokens truncation took from each sample (``None``: none).

    A truncated sample that ``max_packs`` then cut or left out has that fate, and all it lost, its
    truncated tail included, is in ``tokens_over_max_packs``: ``truncated_tokens`` is the cut of the
    samples counted in ``truncated_samples`` only. A sample a custom ``pack_selected_samples`` merged
    into a pack without naming it (``full.members``) counts as packed whole, its tokens in the policy's
    delta.

    >>> cfg = PackingOptions(
    ...     packed_sequence_size=8, strategy="sequential", max_packs=1, long_samples="truncate"
    ... )
    >>> s = make_plan(np.array([11, 20]), cfg).stats
    >>> (s.truncated_samples, s.truncated_tokens), (s.samples_over_max_packs, s.tokens_over_max_packs)
    ((1, 3), (1, 20))
    """
    num = len(lengths)
    full_in, kept_in = full.input_index, kept.input_index
    full_tokens = np.bincount(full_in, weights=full.length, minlength=num)[:num].astype(np.int64)
    kept_tokens = np.bincount(kept_in, weights=kept.length, minlength=num)[:num].astype(np.int64)
    placed, packed = full_tokens > 0, kept_tokens > 0
    if full.members is not None:  # samples a custom pack_selected_samples merged into its packs
        offsets, members = full.members
        placed[members] = True
        packed[members[: offsets[kept.num_packs]]] = True
    partial = packed & (kept_tokens < full_tokens)
    over = placed & ~packed
    split = _split_samples(full, num) & packed & ~partial
    truncated = np.zeros(num, dtype=bool) if cut is None else (cut > 0) & packed & ~partial
    cut_by_max_packs = 0 if cut is None else int(cut[over | partial].sum())
    stats.samples_over_max_packs = int(over.sum())
    stats.partial_samples = int(partial.sum())
    stats.tokens_over_max_packs = full.num_tokens - kept.num_tokens + cut_by_max_packs
    stats.truncated_samples = int(truncated.sum())
    stats.truncated_tokens = 0 if cut is None else int(cut.sum()) - cut_by_max_packs
    stats.split_samples = int((split & ~truncated).sum())
    stats.whole_samples = int((packed & ~partial & ~split & ~truncated).sum())
    stats.policy_token_delta = full.num_tokens - int(lengths[placed].sum())


def _split_samples(plan: PackPlan, num_samples: int) -> np.ndarray:
    """``(num_samples,)`` bool: the samples whose pieces the plan puts in more than one pack."""
    split = np.zeros(num_samples, dtype=bool)
    if plan.num_packs == 0:
        return split
    pieces = np.bincount(plan.input_index, minlength=num_samples)
    several = pieces[plan.input_index] > 1  # only the pieces of samples in more than one piece
    if not several.any():
        return split
    pack = pack_of_piece(plan.pack_offsets)
    # distinct (sample, pack) of those pieces
    sample_pack = np.unique(plan.input_index[several] * plan.num_packs + pack[several])
    packs_per_sample = np.bincount(sample_pack // plan.num_packs, minlength=num_samples)
    split[:] = packs_per_sample[:num_samples] > 1
    return split
