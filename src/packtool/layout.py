"""The storage layouts (``--columns``), and the one place every reader rebuilds what a layout leaves out.

``full`` stores every column a reader gives (``packtool.packs``). ``minimal`` stores ``input_ids``,
``seq_lens``, ``sample_index``, ``sample_offset`` and only what carries information
(``manifest.column_names``):

* ``position_ids`` are never stored: they follow from ``seq_lens``, ``sample_offset`` and the
  manifest's ``position_ids`` convention (``packs.pack_position_ids``, the function the writer uses);
* ``loss_mask`` is stored as ``loss_mask_bits``, 8 tokens a byte (``numpy.packbits``);
* ``labels`` are rebuilt by **the rule**, when the input's labels follow it (every encoder's do; a
  pretokenized input's own ``labels`` are checked, chunk by chunk, as they are encoded:
  ``labels_follow_rule``), else stored as they are. The rule, with ``loss_mask`` all 1 when the data has
  none: ``labels[j] = input_ids[j + 1]`` (``shifted``; ``input_ids[j]`` when ``unshifted``) where
  ``loss_mask[j]`` is 1, else ``-100``; ``-100`` on the padding. With ``shifted`` labels the last token
  of a piece is the exception: its label is the first token of the sample's next piece (a split
  sample: that token is in another pack), a token cut off (a truncated sample) or ``-100`` (the end of
  the sample), so it is stored, one ``next_label`` per piece.

``rebuild`` turns packs as a shard stores them into packs as readers give them, with NumPy over whole
runs of packs (no per-token Python): ``read_packs``, the loader, ``inspect`` and ``verify`` all read
through it (``formats.base.UnitReader.read``, ``ShardReader.read_pack``, ``verify.packs.check_packs``),
so both layouts give the same packs, bit for bit. ``to_stored`` is the writer's side.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterable

import numpy as np

from packtool.arrays import ranges
from packtool.manifest import COLUMNS, IGNORE_INDEX, Manifest, column_names
from packtool.packs import PackArrays, pack_position_ids
from packtool.schema import pack_of_piece, per_pack_sum, piece_starts

# what a reader must read to rebuild a column a layout does not store (those of them the layout stores)
NEEDS = {
    "labels": ("input_ids", "seq_lens", "sample_offset", "next_label", "loss_mask_bits", "cp_padding"),
    "position_ids": ("seq_lens", "sample_offset"),
    "loss_mask": ("loss_mask_bits",),
}


def columns_problem(stored: list[str], labels: str) -> str | None:
    """What stored columns ``stored`` (a manifest's ``columns``) lack to give every training column under
    the ``labels`` convention, or None: a column left out must be rebuilt from the ones it needs.

    >>> columns_problem(["input_ids", "position_ids", "seq_lens"], "shifted")
    'columns store neither labels nor next_label, which rebuilds them'
    >>> columns_problem(["input_ids", "labels", "position_ids", "seq_lens", "sample_index", "sample_offset"],
    ...                 "shifted") is None
    True
    """
    need = {"input_ids": "input_ids", "seq_lens": "seq_lens"}
    if "labels" not in stored and labels == "shifted":
        need["next_label"] = "labels nor next_label, which rebuilds them"
    if "position_ids" not in stored:
        need["sample_offset"] = "position_ids nor sample_offset, which rebuilds them"
    missing = [what for name, what in need.items() if name not in stored]
    if missing:
        return f"columns store neither {missing[0]}"
    if list(stored) not in written_column_lists():
        return f"columns {list(stored)} are not a list of columns packtool writes"
    return None


@functools.cache
def written_column_lists() -> list[list[str]]:
    """Every ``columns`` list a packtool output may have: ``column_names`` for each layout and option, and
    the first four columns (what a manifest without ``columns`` is read as)."""
    out = [column_names(False)[:4]]
    for mask, cp, rebuilt, shifted in itertools.product((False, True), repeat=4):
        for layout in ("full", "minimal"):
            names = column_names(mask, layout, labels_rebuilt=rebuilt, shifted=shifted, has_cp_padding=cp)
            out += [names] if names not in out else []
    return out


def stored_columns(stored: list[str], wanted: Iterable[str]) -> list[str]:
    """The stored columns (of ``stored``, a manifest's ``columns``) to read to give the columns
    ``wanted``, in stored order.

    >>> stored_columns(["input_ids", "seq_lens", "sample_index", "sample_offset", "next_label"],
    ...                ["input_ids", "labels", "position_ids", "seq_lens", "loss_mask"])
    ['input_ids', 'seq_lens', 'sample_offset', 'next_label']
    """
    need = set()
    for name in wanted:
        need.update([name] if name in stored else NEEDS.get(name, ()))
    return [c for c in stored if c in need]


def to_stored(packs: PackArrays, columns: list[str]) -> PackArrays:
    """The packs as a layout storing ``columns`` holds them (the writer's side of ``rebuild``): the other
    columns left out, ``loss_mask`` packed into ``loss_mask_bits``, ``next_label`` taken from the labels
    when it is asked for and not given."""
    out = dataclasses.replace(packs, **{c: None for c in COLUMNS if c not in columns})
    if "loss_mask_bits" in columns and packs.loss_mask_bits is None and packs.loss_mask is not None:
        out.loss_mask_bits = np.packbits(packs.loss_mask, axis=1)
    if "next_label" in columns and packs.next_label is None:
        k, n = packs.labels.shape
        out.next_label = packs.labels.reshape(-1)[_pieces(packs, n)[0]]
    return out


def rebuild(
    packs: PackArrays, manifest: Manifest, wanted: Iterable[str] | None = None, ok: np.ndarray | None = None
) -> PackArrays:
    """Packs as readers give them from packs as the output's shards store them (``manifest.columns``).

    ``wanted``: the columns to give (default: all); the ones the layout does not store are rebuilt (see
    the module docstring), from columns ``stored_columns`` names. ``ok``: ``(num_packs,)`` bool, the packs
    whose layout is sound (``verify`` rebuilds a batch in which some are not): the others get ``-100``
    labels and 0 positions. The columns that stand for others (``next_label``, ``loss_mask_bits``) are
    left out of the result. A ``full`` output's packs come back as they are.
    """
    stored = manifest.columns
    wanted = set(COLUMNS if wanted is None else wanted)
    out = dataclasses.replace(packs, next_label=None, loss_mask_bits=None)
    n = manifest.packed_sequence_size
    todo = [c for c in ("labels", "position_ids") if c in wanted and c not in stored]
    if packs.loss_mask_bits is not None and ("loss_mask" in wanted or "labels" in todo):
        out.loss_mask = mask_from_bits(packs.loss_mask_bits, n)
    if not todo:
        out.loss_mask = out.loss_mask if "loss_mask" in wanted else None
        return out
    if ok is not None and not ok.all():
        rows = np.flatnonzero(ok)
        part = rebuild(packs.take(rows), manifest, todo)
        for name, fill in (("labels", IGNORE_INDEX), ("position_ids", 0)):
            if name in todo:
                full = np.full(packs.input_ids.shape, fill, dtype=np.int32)
                full[rows] = getattr(part, name)
                setattr(out, name, full)
    else:
        if "position_ids" in todo:
            out.position_ids = pack_position_ids(
                packs.seq_lens,
                packs.seq_lens_offsets,
                packs.sample_index_offsets,
                packs.sample_offset,
                n,
                manifest.position_ids,
            )
        if "labels" in todo:
            out.labels = rule_labels(packs, out.loss_mask, manifest.labels == "shifted")
    out.loss_mask = out.loss_mask if "loss_mask" in wanted else None
    return out


def rule_labels(packs: PackArrays, loss_mask: np.ndarray | None, shifted: bool) -> np.ndarray:
    """``(num_packs, N)`` int32 labels by the rule (module docstring) from ``input_ids``, ``loss_mask``
    (None: all 1), the pieces' ``seq_lens`` and, when ``shifted``, ``next_label``.

    >>> p = PackArrays(np.array([[5, 6, 7, 8, 0]], np.int32), seq_lens=np.array([2, 2, 1]),
    ...                seq_lens_offsets=np.array([0, 3]), sample_index_offsets=np.array([0, 2]),
    ...                next_label=np.array([-100, 9], np.int32))
    >>> rule_labels(p, None, True).tolist()
    [[6, -100, 8, 9, -100]]
    """
    k, n = packs.input_ids.shape
    ids = packs.input_ids.reshape(-1)
    if shifted:
        labels = np.empty(k * n, dtype=np.int32)
        labels[:-1] = ids[1:]
        labels[-1:] = IGNORE_INDEX
    else:
        labels = ids.astype(np.int32, copy=True)
    if loss_mask is not None:
        np.copyto(labels, IGNORE_INDEX, where=loss_mask.reshape(-1) == 0)
    ends, used = _pieces(packs, n)
    if shifted:
        labels[ends] = packs.next_label
    labels[ranges(np.arange(k, dtype=np.int64) * n + used, n - used)] = IGNORE_INDEX  # the padding
    if packs.cp_padding is not None:  # and the context-parallel padding after each piece's tokens
        labels[ranges(ends + 1, packs.cp_padding)] = IGNORE_INDEX
    return labels.reshape(k, n)


def _pieces(packs: PackArrays, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat index (pack * N + position) of the last token of every piece (before its context-parallel
    padding, if any), in piece order, and the cells the pieces take in every pack (the rest is padding)."""
    spans, offsets = packs.piece_spans(), packs.sample_index_offsets
    last = pack_of_piece(offsets) * n + piece_starts(spans, offsets) + spans - 1
    return last if packs.cp_padding is None else last - packs.cp_padding, per_pack_sum(spans, offsets)


def mask_from_bits(bits: np.ndarray, n: int) -> np.ndarray:
    """``(num_packs, n)`` int8 ``loss_mask`` from its ``loss_mask_bits`` ``(num_packs, ceil(n / 8))``.

    >>> mask_from_bits(np.packbits(np.array([[1, 0, 1]], np.int8), axis=1), 3).tolist()
    [[1, 0, 1]]
    """
    return np.unpackbits(bits, axis=1, count=n).view(np.int8)


def labels_follow_rule(
    ids: np.ndarray, labels: np.ndarray, loss_mask: np.ndarray | None, offsets: np.ndarray, shifted: bool
) -> bool:
    """Whether the labels of samples (flat ``ids``, ``labels``, ``loss_mask`` or None, split by
    ``offsets``) are those the rule rebuilds (module docstring), wherever a pack holds them: with
    ``shifted`` labels every token but each sample's last (its piece's ``next_label`` stores that).

    >>> ids = np.array([5, 6, 7, 8], np.int32)
    >>> labels_follow_rule(ids, np.array([6, -100, 8, 3], np.int32), None, np.array([0, 2, 4]), True)
    True
    >>> labels_follow_rule(ids, np.array([5, 6, 7, 8], np.int32), None, np.array([0, 4]), True)
    False
    """
    if shifted:
        want = np.empty_like(ids)
        want[:-1] = ids[1:]
    else:
        want = ids.copy()
    if loss_mask is not None:
        np.copyto(want, IGNORE_INDEX, where=loss_mask == 0)
    differ = want != labels
    if shifted:
        lengths = np.diff(offsets)
        differ[offsets[1:][lengths > 0] - 1 - offsets[0]] = False
    return not differ.any()
