"""packtool.threads: the background prefetch (the Parquet writer and the in-memory pipeline use it)."""

from __future__ import annotations

import threading

import pytest

from packtool.threads import prefetch


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name == "packtool-prefetch"}


@pytest.mark.parametrize("depth", [1, 3])
def test_prefetch_yields_every_item_in_order(depth):
    assert list(prefetch(iter(range(100)), depth=depth)) == list(range(100))
    assert list(prefetch(iter([]), depth=depth)) == []
    assert not _threads()


def test_prefetch_raises_the_error_where_the_item_would_have_been():
    def items():
        yield 1
        yield 2
        raise ValueError("bad item 3")

    got = []
    with pytest.raises(ValueError, match="bad item 3"):
        for x in prefetch(items()):
            got.append(x)
    assert got == [1, 2]
    assert not _threads()


def test_prefetch_stops_its_thread_when_the_consumer_stops_early():
    produced = []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    gen = prefetch(items(), depth=2)
    assert [next(gen), next(gen)] == [0, 1]
    gen.close()  # what a for loop broken by an exception does
    assert not _threads()
    assert len(produced) < 10  # it stopped near where the consumer was, not at the end


def test_prefetch_consumer_error_does_not_leave_the_producer_blocked():
    def consume():
        for x in prefetch(iter(range(10**6)), depth=1):
            if x == 3:
                raise KeyError("consumer failed")

    with pytest.raises(KeyError):
        consume()
    assert not _threads()


def test_a_row_group_of_minimal_packs_reads_back_as_stored(tmp_path):
    """packs_table and table_packs handle every column by its PACK_COLUMNS entry: the minimal layout's
    next_label (per piece) and loss_mask_bits (uint8, ceil(N / 8) a pack) included."""
    import numpy as np
    import pyarrow.parquet as pq

    from packtool.formats.parquet import packs_table, table_packs
    from tests.unit.test_packs import N, minimal_packs

    packs = minimal_packs()
    pq.write_table(packs_table(packs), tmp_path / "a.parquet")
    table = pq.read_table(tmp_path / "a.parquet")
    assert table.column_names == packs.present()
    assert str(table.schema.field("loss_mask_bits").type) == "list<element: uint8>"
    again = table_packs(table, N)
    for name in packs.present():
        assert np.array_equal(getattr(again, name), getattr(packs, name)), name
