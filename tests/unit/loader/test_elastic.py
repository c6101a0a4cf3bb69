"""Resume at another world size (and batch size): a state saved by ``W`` ranks of ``b`` packs resumes on
``W'`` ranks of ``b'``. Where ``W * b == W' * b'`` the global batches (every rank's batch of a step
together) are the uninterrupted run's, for the rest of the run; otherwise, within the epoch, no pack is read
twice and none is left out beyond the new remainder (fewer than ``W' * b'``)."""

from __future__ import annotations

import json

import pytest

from packtool.loader import PackedDataset, get_loader
from tests.fixtures.loader_outputs import packed  # noqa: F401 - fixtures
from tests.fixtures.mixture_outputs import smaller  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def loaders(source, world_size: int, batch_size: int, workers: int = 0, **kwargs) -> list:
    return [
        get_loader(
            PackedDataset(source, batch_size=batch_size, seed=4, rank=r, world_size=world_size, **kwargs),
            num_workers=workers,
        )  # fmt: skip
        for r in range(world_size)
    ]


def steps(ranks: list, count: int) -> list[list[tuple[int, int]]]:
    """``count`` global batches: each step's packs, rank after rank, as (source, pack_index)."""
    its = [iter(loader) for loader in ranks]
    out = []
    for _ in range(count):
        step = []
        for it in its:
            batch = next(it)
            source = batch.extra.get("source")
            names = source.tolist() if source is not None else [0] * len(batch)
            step += list(zip(names, batch.pack_index.tolist(), strict=True))
        out.append(step)
    return out


def resumed(source, before: tuple[int, int], after: tuple[int, int], cut: int, workers=(0, 0), **kwargs):
    """The first ``cut`` steps at ``before`` = (world size, batch size), and the loaders at ``after``
    restored from rank 0's state (a JSON checkpoint), as every rank of the new run loads it."""
    first = loaders(source, *before, workers[0], **kwargs)
    head = steps(first, cut)
    state = json.loads(json.dumps(first[0].state_dict()))
    second = loaders(source, *after, workers[1], **kwargs)
    for loader in second:
        loader.load_state_dict(state)
    return head, second


def mixture(packed, smaller) -> dict:
    return {str(packed): 0.5, str(smaller[0]): 0.3, str(smaller[1]): 0.2}


def each_once(packed, smaller) -> list[dict]:
    """A mixture whose epoch holds each pack of each source once (a weighted one draws a pack of a small
    source several times an epoch: there a pack read twice is no fault)."""
    return [{"path": str(p), "repeat": 1} for p in (packed, *smaller)]


SLOW = pytest.mark.slow
# (mixed, before, after): each change with one output and with a mixture, the repeats of a kind slow
SAME_GLOBAL = [
    (False, (2, 4), (4, 2)),
    (True, (2, 4), (4, 2)),
    (True, (4, 2), (2, 4)),
    pytest.param(False, (4, 2), (2, 4), marks=SLOW),
    pytest.param(True, (2, 4), (1, 8), marks=SLOW),
    pytest.param(False, (2, 4), (1, 8), marks=SLOW),
]
OTHER_GLOBAL = [
    (False, (2, 4), (3, 4)),
    (True, (2, 4), (3, 4)),
    (True, (3, 4), (2, 4)),
    (True, (2, 4), (2, 3)),
    pytest.param(False, (3, 4), (2, 4), marks=SLOW),
    pytest.param(False, (2, 4), (2, 3), marks=SLOW),
]


@pytest.mark.parametrize(("mixed", "before", "after"), SAME_GLOBAL)
def test_the_same_global_batches_when_world_size_times_batch_size_holds(
    packed, smaller, mixed, before, after
):
    """2 -> 4 ranks at half the batch, 4 -> 2 at twice, 2 -> 1: the global batches of the run that never
    stopped, through the rest of the epoch and two more (the new run keeps the first run's order)."""
    source = mixture(packed, smaller) if mixed else packed
    nb = loaders(source, *before)[0].dataset.batches_per_epoch
    total = 2 * nb + 5
    reference = steps(loaders(source, *before, infinite=True), total)
    head, second = resumed(source, before, after, 7, infinite=True)
    tail = steps(second, total - 7)
    assert [sorted(s) for s in head + tail] == [sorted(s) for s in reference]
    assert head + tail == reference  # rank after rank, in order


@pytest.mark.parametrize(("mixed", "before", "after"), OTHER_GLOBAL)
def test_another_global_batch_reads_no_pack_twice_and_leaves_out_only_the_remainder(
    packed, smaller, mixed, before, after
):
    """2 -> 3 ranks, 3 -> 2, and another batch size: the rest of the epoch is shared among the new ranks
    (equal batch counts), every pack the first run had still to read is read once, the packs left out are
    fewer than a new global batch beside the first run's own remainder; the next epoch is whole again."""
    source = each_once(packed, smaller) if mixed else packed
    whole = loaders(source, *before)
    planned = [
        [(int(s), int(p)) for s, p in zip(*_packs(whole[r].dataset, 0), strict=True)]
        for r in range(before[0])
    ]
    head, second = resumed(source, before, after, 5)
    counts = [loader.dataset.epoch_batches(0) for loader in second]
    assert len(set(counts)) == 1 and all(loader.epoch == 0 for loader in second)
    tail = steps(second, counts[0])
    read = [p for step in head + tail for p in step]
    assert len(read) == len(set(read))  # no pack twice in the epoch
    rest = {p for plan in planned for p in plan} - {p for step in head for p in step}
    new_global = after[0] * after[1]
    assert set(read) - {p for step in head for p in step} <= rest | _left_out(whole[0].dataset, planned)
    assert len(rest - set(read)) < new_global
    assert all(loader.epoch == 1 and loader.batch == 0 for loader in second)
    following = steps(second, 2)  # the next epoch: every rank's batches full
    assert all(len(step) == new_global for step in following)


def _packs(ds, epoch):
    """(source, pack_index) of every pack of ``ds``'s plan of ``epoch``, in order."""
    ids = ds.plan(epoch).reshape(-1)
    ids = ids[ids >= 0]
    units = ds.table.unit_of(ids)
    return ds.table.output[units], ds.table.pack_base[units] + ids - ds.table.first[units]


def _left_out(ds, planned) -> set:
    """The packs of the epoch the first run left out (its remainder): a resumed run may read them."""
    units = ds.table
    every = {
        (int(units.output[u]), int(units.pack_base[u] + k))
        for u in range(len(units.sizes))
        for k in range(units.sizes[u])
    }
    return every - {p for plan in planned for p in plan}


def test_resumed_twice_at_other_world_sizes_the_chain_holds(packed):
    """2 -> 4 -> 1 ranks at a global batch of 8: still the uninterrupted run's global batches."""
    reference = steps(loaders(packed, 2, 4, infinite=True), 30)
    head, middle = resumed(packed, (2, 4), (4, 2), 3, infinite=True)
    more = steps(middle, 4)
    state = json.loads(json.dumps(middle[0].state_dict()))
    assert state["order"] == {"world_size": 2, "batch_size": 4} and state["world_size"] == 4
    last = loaders(packed, 1, 8, infinite=True)
    last[0].load_state_dict(state)
    assert head + more + steps(last, 23) == reference


@pytest.mark.parametrize("workers", [(0, 2), (2, 1)])
def test_resume_at_another_world_size_with_workers(packed, workers):
    reference = steps(loaders(packed, 2, 4, workers[0], infinite=True), 20)  # its lanes: the workers
    head, second = resumed(packed, (2, 4), (4, 2), 6, workers=workers, infinite=True)
    assert head + steps(second, 14) == reference


def test_without_drop_last_every_pack_of_the_rest_is_read(packed):
    before, after = (2, 4), (3, 4)
    whole = loaders(packed, *before, drop_last=False)
    planned = {p for loader in whole for b in loader.dataset.plan(0) for p in b.tolist() if p >= 0}
    head, second = resumed(packed, before, after, 5, drop_last=False)
    counts = {loader.dataset.epoch_batches(0) for loader in second}
    assert len(counts) == 1
    tail = [p for loader in second for batch in loader for p in batch.pack_index.tolist()]
    seen = {p for step in head for _, p in step} | set(tail)
    assert seen == planned  # every pack of the epoch read
    assert len(tail) - len(set(tail)) < after[0] * 2  # repeats only to even out the ranks


def test_a_state_with_a_layout_no_run_of_these_packs_has_is_refused(packed):
    state = get_loader(PackedDataset(packed, batch_size=4), num_workers=0).state_dict()
    for key, value, message in (
        ("order", {"world_size": 10**6, "batch_size": 4}, "field 'order.world_size' must be a layout with"),
        ("order", {"world_size": 0, "batch_size": 4}, "field 'order.world_size' must be positive"),
        ("start", 10**6, "field 'start' must be at most"),
        ("world_size", 10**6, "field 'world_size' must be a layout with"),
    ):
        with pytest.raises(ValueError, match=message):
            get_loader(PackedDataset(packed, batch_size=4), num_workers=0).load_state_dict(
                {**state, key: value}
            )
