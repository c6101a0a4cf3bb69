"""verify's format-independent checks on what the minimal layout stores: the columns it rebuilds from
(``next_label``'s values, ``loss_mask_bits``' padding and spare bits) are checked; the rebuilt ones are
right by construction."""

from __future__ import annotations

from types import SimpleNamespace

from packtool.manifest import column_names
from packtool.verify.packs import check_packs
from packtool.verify.report import VerifyReport
from tests.unit.test_packs import N, minimal_packs


def check(packs):
    manifest = SimpleNamespace(
        columns=column_names(True, "minimal"),
        packed_sequence_size=N,
        position_ids="restart",
        labels="shifted",
        pad_token_id=0,
    )
    report = VerifyReport("out")
    used, rebuilt = check_packs(packs, 10, "packs-000000.parquet", manifest, report, 100, True)
    return report, used, rebuilt


def sound_packs():
    packs = minimal_packs()
    packs.input_ids[1, 3:] = 0  # pack 1's padding
    packs.loss_mask_bits[1] = 0b11100000  # no loss on it
    return packs


def test_sound_minimal_packs_pass_and_come_back_rebuilt():
    report, used, rebuilt = check(sound_packs())
    assert report.ok, report.problems
    assert used.tolist() == [6, 3]
    assert rebuilt.labels[1].tolist() == [7, 8, -100, -100, -100, -100]  # the piece's next_label is -100
    assert rebuilt.labels[0, 3] == -100 and rebuilt.labels[0, 5] == 5  # loss_mask 0 at 3; next_label 5
    assert rebuilt.loss_mask[1].tolist() == [1, 1, 1, 0, 0, 0] and rebuilt.loss_mask_bits is None


def test_bad_stored_columns_are_named():
    packs = sound_packs()
    packs.next_label[1] = -7  # neither -100 nor a token id
    packs.loss_mask_bits[0] |= 0b01  # a bit past N = 6
    packs.loss_mask_bits[1] = 0b11110000  # loss on the padding
    report, _, _ = check(packs)
    got = {(p.kind, p.pack, p.field) for p in report.problems}
    assert got == {
        ("next_label", 10, "next_label"),
        ("loss_mask_bits", 10, "loss_mask_bits"),
        ("padding loss_mask_bits", 11, "loss_mask_bits"),
    }, report.problems
    assert any("next_label -7 of piece 1" in p.message for p in report.problems)
