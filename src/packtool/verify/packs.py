"""Format-independent checks of a batch of packs (``PackArrays``), vectorized per batch.

The checks look at what the shards store: a column the layout leaves out (``packtool.layout``: the
``minimal`` layout's ``labels`` and ``position_ids``) is rebuilt from the stored ones, right by
construction, so its checks are those of the columns it is rebuilt from (``next_label``'s values,
``loss_mask_bits``' padding).
"""

from __future__ import annotations

import numpy as np

from packtool.arrays import ranges
from packtool.layout import rebuild
from packtool.manifest import IGNORE_INDEX, Manifest
from packtool.packs import PackArrays, pack_position_ids
from packtool.schema import pack_of_piece
from packtool.verify.report import VerifyReport


def check_packs(
    packs: PackArrays,
    first: int,
    name: str,
    manifest: Manifest,
    report: VerifyReport,
    vocab_size: int | None,
    text_labels: bool,
) -> tuple[np.ndarray, PackArrays]:
    """Format-independent checks of a batch of packs as stored; returns ``(k,)`` real tokens per pack and
    the packs as readers give them (``layout.rebuild``; packs whose layout is broken get ``-100`` labels
    and 0 positions)."""
    stored = packs
    k, n = packs.input_ids.shape
    pad_id = manifest.pad_token_id
    sl, slo = packs.seq_lens.astype(np.int64), packs.seq_lens_offsets
    npieces = packs.pieces_per_pack()
    nsl = np.diff(slo)
    csl = np.concatenate([[0], np.cumsum(sl)])
    sums = csl[slo[1:]] - csl[slo[:-1]]
    seg_end = csl[1:] - np.repeat(csl[slo[:-1]], nsl)  # where every seq_lens entry ends in its pack, 1..n
    nonpos = np.concatenate([[0], np.cumsum(sl <= 0)])
    has_pad = nsl - npieces
    layout = {
        "seq_lens": [
            (sums != n, lambda i: f"sum(seq_lens) = {sums[i]}, expected {n}"),
            (nonpos[slo[1:]] > nonpos[slo[:-1]], lambda i: "holds a zero or negative length"),
        ],
        "sample_index": [
            (
                (has_pad < 0) | (has_pad > 1) | (npieces == 0),
                lambda i: f"{npieces[i]} sample_index entries for {nsl[i]} seq_lens entries",
            )
        ],
    }
    cp = None  # each piece's context-parallel padding (cp_size), inside its seq_lens entry
    if packs.cp_padding is not None:
        cp = packs.cp_padding.astype(np.int64)
        bad_cp = np.ones(k, dtype=bool)
        if len(cp) == len(packs.sample_index) and np.all(nsl >= npieces):
            wrong = (cp < 0) | (cp >= sl[ranges(slo[:-1], npieces)])
            bad_cp = np.bincount(np.repeat(np.arange(k), npieces), weights=wrong, minlength=k) > 0
        layout["cp_padding"] = [(bad_cp, lambda i: "cp_padding is negative or not shorter than its piece")]
    broken = np.zeros(k, dtype=bool)
    for col, tests in layout.items():
        for bad, message in tests:
            broken |= bad
            where = np.flatnonzero(bad)
            problems = ((message(i), first + int(i)) for i in where)
            report.add_many(col, len(where), problems, shard=name, field=col)
    # a pack whose layout is broken is reported once, above; the checks below look at the others
    packs = rebuild(stored, manifest, ok=~broken)
    if stored.position_ids is not None:
        check_position_ids(packs, broken, first, name, manifest, report)
    pad_len = np.where(~broken, stored.padding_lengths(), 0)  # (a sound pack has one entry or none)
    used = n - pad_len
    cols = np.arange(n)[None, :]
    pad = cols >= used[:, None]
    if cp is not None and cp.any():  # the padding that ends pieces is padding too
        whole = np.repeat(~broken, npieces)
        ends = seg_end[ranges(slo[:-1], npieces)][whole]
        piece_cp, pack = cp[whole], np.repeat(np.arange(k), npieces)[whole]
        pad.reshape(-1)[ranges(pack * n + ends - piece_cp, piece_cp)] = True
        used = used - np.bincount(pack, weights=piece_cp, minlength=k).astype(np.int64)
    checks = [("input_ids", packs.input_ids, pad_id, "padding is not pad_token_id")]
    if stored.labels is not None:
        checks.append(("labels", packs.labels, IGNORE_INDEX, "label on padding is not -100"))
    if packs.loss_mask is not None:  # stored, or rebuilt from loss_mask_bits
        field = "loss_mask" if stored.loss_mask is not None else "loss_mask_bits"
        checks.append((field, packs.loss_mask, 0, "loss_mask on padding is not 0"))
    for col, arr, want, message in checks:
        where = np.flatnonzero((pad & (arr != want)).any(axis=1) & ~broken)
        problems = ((message, first + int(i)) for i in where)
        report.add_many(f"padding {col}", len(where), problems, shard=name, field=col)
    real = ~pad
    ids = packs.input_ids
    bad_vocab = real & ((ids < 0) | (ids >= vocab_size) if vocab_size else (ids < 0))
    size = f" (size {vocab_size})" if vocab_size else ""

    def vocab_problem(i: int) -> tuple[str, int]:
        j = int(np.flatnonzero(bad_vocab[i])[0])
        return f"token id {ids[i, j]} at position {j} is outside the vocabulary{size}", first + i

    where = np.flatnonzero(bad_vocab.any(axis=1))  # any pack: the ids are there
    report.add_many("vocab", len(where), map(vocab_problem, where.tolist()), shard=name, field="input_ids")
    check_minimal_columns(stored, broken, first, name, report, vocab_size)
    if text_labels and stored.labels is not None:
        # inside a piece, label j is -100 or the id the labels convention names; a piece's last label
        # may point past the pack (split or truncated samples), so it is not checked
        piece_end = np.zeros((k, n + 1), dtype=bool)
        whole = np.repeat(~broken, nsl)
        piece_end[np.repeat(np.arange(k), nsl)[whole], seg_end[whole]] = True
        last = piece_end[:, 1:]  # last[i, j]: token j is the last of its piece
        shifted = manifest.labels == "shifted"
        target = np.concatenate([ids[:, 1:], ids[:, -1:]], axis=1) if shifted else ids
        bad = real & ~(last & shifted) & (packs.labels != IGNORE_INDEX) & (packs.labels != target)

        def labels_problem(i: int) -> tuple[str, int]:
            j = int(np.flatnonzero(bad[i])[0])
            return (
                f"label {packs.labels[i, j]} at position {j} is not aligned with input_ids "
                f"({manifest.labels} labels expect {target[i, j]} or -100)",
                first + i,
            )

        where = np.flatnonzero(bad.any(axis=1) & ~broken)
        report.add_many("labels", len(where), map(labels_problem, where.tolist()), shard=name, field="labels")
    return used, packs


def check_minimal_columns(
    packs: PackArrays, broken: np.ndarray, first: int, name: str, report: VerifyReport, vocab_size: int | None
) -> None:
    """The columns that stand for others in the ``minimal`` layout: every ``next_label`` is ``-100`` or a
    token id; no bit of ``loss_mask_bits`` past ``N`` is set."""
    if packs.next_label is not None:
        values = packs.next_label
        bad = (values != IGNORE_INDEX) & (
            (values < 0) | (values >= vocab_size) if vocab_size else (values < 0)
        )
        pack = pack_of_piece(packs.sample_index_offsets)
        where = np.flatnonzero(bad & ~broken[pack])
        size = f" (vocabulary of {vocab_size})" if vocab_size else ""
        problems = (
            (f"next_label {values[j]} of piece {j - packs.sample_index_offsets[pack[j]]} is neither -100 nor "
             f"a token id{size}", first + int(pack[j]))
            for j in where
        )  # fmt: skip
        report.add_many("next_label", len(where), problems, shard=name, field="next_label")
    n = packs.input_ids.shape[1]
    if packs.loss_mask_bits is not None and n % 8:
        spare = (1 << (8 - n % 8)) - 1  # the low bits of the last byte: tokens past N
        where = np.flatnonzero(packs.loss_mask_bits[:, -1] & spare)
        problems = ((f"bits past packed_sequence_size {n} are set", first + int(i)) for i in where)
        report.add_many("loss_mask_bits", len(where), problems, shard=name, field="loss_mask_bits")


def check_position_ids(
    packs: PackArrays, broken: np.ndarray, first: int, name: str, manifest: Manifest, report: VerifyReport
) -> None:
    """``position_ids`` must be what the writer makes of each pack's layout (``seq_lens``, each piece's
    ``sample_offset``) under the manifest's ``position_ids`` convention; packs whose layout is broken are
    left out (already reported)."""
    k, n = packs.position_ids.shape
    convention = manifest.position_ids
    ok = np.flatnonzero(~broken)
    if not len(ok) or (packs.sample_offset is None and convention == "nemo"):  # an older output
        return
    nsl, npieces = np.diff(packs.seq_lens_offsets), np.diff(packs.sample_index_offsets)
    csr = lambda counts: np.concatenate([[0], np.cumsum(counts[ok])])  # noqa: E731
    starts = np.zeros(int(npieces[ok].sum()), dtype=np.int64)
    if packs.sample_offset is not None:
        starts = packs.sample_offset[np.repeat(~broken, npieces)]
    want = pack_position_ids(
        packs.seq_lens[np.repeat(~broken, nsl)], csr(nsl), csr(npieces), starts, n, convention
    )
    got = packs.position_ids[ok]
    bad = np.flatnonzero((got != want).any(axis=1))

    def problem(i: int) -> tuple[str, int]:
        j = int(np.flatnonzero(got[i] != want[i])[0])
        return f"position id {got[i, j]} at position {j}, the layout gives {want[i, j]}", first + int(ok[i])

    report.add_many("position_ids", len(bad), map(problem, bad.tolist()), shard=name, field="position_ids")
