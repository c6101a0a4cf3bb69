"""packtool.loader on real packtool output (built with the CLI): sharding, order, resume, faults, stages.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from packtool.errors import InputError
from packtool.loader import (
    IgnoreSample,
    PackedBatch,
    PackedDataset,
    SkipSample,
    batch_pad_stack,
    batch_stack,
    default_batch,
    epoch_plan,
    get_loader,
)
from packtool.masks import block_causal_mask, varlen_args
from packtool.reading import read_packs
from tests.fixtures.loader_outputs import packed, packs  # noqa: F401 - fixtures

N = 64
# more workers than this machine's cores is what the layout tests need, not a mistake
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def stream(loader, limit: int | None = None) -> list[np.ndarray]:
    """The pack_index rows of the batches the loader yields (up to ``limit`` batches)."""
    out = []
    for batch in loader:
        out.append(batch.pack_index.numpy().copy())
        if limit is not None and len(out) == limit:
            break
    return out


def flat(batches: list[np.ndarray]) -> list[int]:
    return [int(p) for b in batches for p in b]


# --- sharding --------------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (1, 2), (2, 1), (2, 3), (3, 2)])
def test_every_pack_once_per_epoch_across_ranks_and_workers(packed, packs, world_size, num_workers):
    seen, per_rank = [], []
    for rank in range(world_size):
        ds = PackedDataset(packed, batch_size=4, shuffle=True, seed=1, rank=rank, world_size=world_size)
        batches = stream(get_loader(ds, num_workers=num_workers))
        per_rank.append(len(batches))
        seen += flat(batches)
    total = len(packs)
    nb = total // (world_size * 4)
    assert per_rank == [nb] * world_size  # equal batch counts: no DDP hang at the epoch's end
    assert len(seen) == len(set(seen)) == world_size * nb * 4  # no pack twice
    assert total - len(seen) < world_size * 4  # only the remainder is left out
    assert set(seen) <= set(range(total))


def test_every_pack_returned_over_epochs_and_content_matches(packed, packs):
    ds = PackedDataset(packed, batch_size=4, shuffle=True, seed=0)
    loader = get_loader(ds, num_workers=2)
    seen = set()
    for _ in range(3):  # the left-out remainder differs from epoch to epoch when shuffled
        for batch in loader:
            for row, p in enumerate(batch.pack_index.tolist()):
                seen.add(p)
                ref = packs[p]
                assert torch.equal(batch.input_ids[row], torch.from_numpy(ref["input_ids"]))
                assert torch.equal(batch.labels[row], torch.from_numpy(ref["labels"]))
                assert torch.equal(batch.position_ids[row], torch.from_numpy(ref["position_ids"]))
                assert torch.equal(batch.loss_mask[row], torch.from_numpy(ref["loss_mask"]))
                k = len(ref["seq_lens"])
                assert batch.seq_lens[row, :k].tolist() == ref["seq_lens"].tolist()
                assert (batch.seq_lens[row, k:] == 0).all()
    assert loader.state_dict()["epoch"] == 3
    assert seen == set(range(len(packs)))


def test_batch_fields(packed):
    ds = PackedDataset(packed, batch_size=4, shuffle=False)
    batch = next(iter(get_loader(ds, num_workers=0)))
    assert isinstance(batch, PackedBatch) and len(batch) == 4 and batch.packed_sequence_size == N
    host = {"input_ids": torch.int32, "labels": torch.int32, "position_ids": torch.int32}
    host["loss_mask"] = torch.int8
    moved = batch.to("cpu")
    for name, dtype in host.items():
        t, m = getattr(batch, name), getattr(moved, name)
        assert t.shape == (4, N) and t.dtype == dtype  # the stored dtype on the host
        assert m.dtype == torch.int64 and torch.equal(m, t.long())  # widened by to()
    assert batch.seq_lens.dtype == moved.seq_lens.dtype == torch.int32 and (batch.seq_lens.sum(1) == N).all()
    assert moved.cu_seqlens.dtype == torch.int32 and moved.pack_index.dtype == torch.int64
    ref = varlen_args(batch.seq_lens, N)
    assert torch.equal(batch.cu_seqlens, ref["cu_seqlens"]) and batch.max_seqlen == ref["max_seqlen"]
    assert batch.attention_mask is None and batch.block_mask is None  # no mask unless asked
    assert batch.pack_index.tolist() == [0, 1, 2, 3]  # shuffle=False, one lane: file order


@pytest.mark.parametrize("keep", ["all", "none"])
def test_batches_kept_or_dropped_hold_their_own_data(packed, packs, keep):
    """Batches from workers live in shared-memory slots the workers reuse once a batch is freed: a loop
    that keeps every batch (more than the slots: the workers fall back to new blocks) and one that drops
    each at once (slots reused many times) both see exactly the stored packs, checked after the epoch."""
    loader = get_loader(PackedDataset(packed, batch_size=2, seed=4), num_workers=2)
    kept, seen = [], []
    for batch in loader:
        if keep == "all":
            kept.append(batch)
        else:
            seen.append((batch.pack_index.clone(), batch.input_ids.clone(), batch.seq_lens.clone()))
    if keep == "all":
        seen = [(b.pack_index, b.input_ids, b.seq_lens) for b in kept]
    assert len(seen) == len(packs) // 2
    for pack_index, ids, seq_lens in seen:
        for row, p in enumerate(pack_index.tolist()):
            assert torch.equal(ids[row], torch.from_numpy(packs[p]["input_ids"]))
            k = len(packs[p]["seq_lens"])
            assert seq_lens[row, :k].tolist() == packs[p]["seq_lens"].tolist()


@pytest.mark.parametrize("mask", ["dense", "flex"])
def test_to_builds_the_chosen_mask_on_the_device(packed, mask):
    ds = PackedDataset(packed, batch_size=2, mask=mask, attention="causal")
    batch = next(iter(get_loader(ds, num_workers=0)))
    assert batch.attention_mask is None and batch.block_mask is None  # not built in the loader
    moved = batch.to("cpu")
    dense = block_causal_mask(batch.seq_lens, N)
    if mask == "dense":
        assert torch.equal(moved.attention_mask, dense) and moved.block_mask is None
    else:
        assert moved.attention_mask is None
        assert moved.block_mask.seq_lengths == (N, N) and moved.block_mask.kv_num_blocks.shape[0] == 2


def test_to_builds_a_flex_mask_built_on_the_host_again_on_the_new_device(packed):
    """``BlockMask.to`` leaves the sequence ids its mask_mod captured on the host; a batch whose flex mask
    was built before ``to()`` (in a worker, say) gets one built on the new device. ``meta`` stands in for an
    accelerator here."""
    ds = PackedDataset(packed, batch_size=2, mask="flex", attention="causal")
    batch = next(iter(get_loader(ds, num_workers=0)))
    batch.build_mask()
    moved = batch.to("meta")

    def captured(block_mask) -> set:
        cells = block_mask.mask_mod.__closure__ or ()
        return {c.cell_contents.device.type for c in cells if isinstance(c.cell_contents, torch.Tensor)}

    assert captured(batch.block_mask) == {"cpu"}
    assert captured(moved.block_mask) == {"meta"} and moved.block_mask.kv_num_blocks.device.type == "meta"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
@pytest.mark.parametrize("mask", ["dense", "flex", "varlen"])
def test_attention_on_loader_batches_equals_each_sample_alone(packed, mask):
    """End to end: batches as the loader yields them, moved with ``to()`` (which builds the mask), through a
    causal self-attention layer, give each sample the output it gets alone, at positions 0..len-1."""
    from torch.nn.attention.flex_attention import flex_attention

    from tests.unit.test_masks import CausalSelfAttention, sdpa, varlen_reference

    samples = [len(p["sample_index"]) for p in read_packs(packed, with_sample_index=True)]
    torch.manual_seed(0)
    embed, layer = torch.nn.Embedding(1000, 16), CausalSelfAttention(16)
    # the layer below attends causally to its whole sequence: declared with attention="causal"
    ds = PackedDataset(packed, batch_size=4, seed=5, mask=mask, attention="causal")
    loader = get_loader(ds, num_workers=1)
    checked = 0
    for i, host_batch in enumerate(loader):
        if i == 3:
            break
        batch = host_batch.to("cpu")
        kernels = {
            "dense": lambda q, k, v, b=batch: sdpa(q, k, v, attn_mask=b.attention_mask),
            "flex": lambda q, k, v, b=batch: flex_attention(q, k, v, block_mask=b.block_mask),
            "varlen": lambda q, k, v, b=batch: varlen_reference(q, k, v, b.cu_seqlens, N),
        }
        with torch.no_grad():
            x = embed(batch.input_ids)
            packed_out = layer(x, batch.position_ids, kernels[mask])
            for row, p in enumerate(batch.pack_index.tolist()):
                start = 0
                for length in batch.seq_lens[row, : samples[p]].tolist():  # the samples, not the padding
                    span = slice(start, start + length)
                    assert batch.position_ids[row, span].tolist() == list(range(length))
                    alone = layer(
                        x[row : row + 1, span],
                        torch.arange(length).unsqueeze(0),
                        lambda q, k, v: sdpa(q, k, v, is_causal=True),
                    )
                    torch.testing.assert_close(packed_out[row, span], alone[0], atol=1e-5, rtol=1e-5)
                    start += length
                    checked += 1
    assert checked > 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs an accelerator")
def test_pin_memory(packed):
    batch = next(iter(get_loader(PackedDataset(packed, batch_size=2), num_workers=1, pin_memory=True)))
    assert batch.input_ids.is_pinned()


# --- order ----------------------------------------------------------------------------------------
def test_shuffle_is_deterministic_per_seed_and_epoch(packed):
    def epochs(seed, n=2, workers=0):
        loader = get_loader(PackedDataset(packed, batch_size=4, seed=seed, lanes=2), num_workers=workers)
        return [flat(stream(loader)) for _ in range(n)]

    a = epochs(0)
    assert a == epochs(0, workers=2)  # same seed, same stream, whatever the process layout
    assert a[0] != a[1]  # a new order each epoch
    assert a[0] != epochs(1, n=1)[0]
    assert sorted(a[0]) != a[0]


def test_stream_is_defined_by_lanes_not_workers(packed):
    streams = [
        flat(stream(get_loader(PackedDataset(packed, batch_size=3, seed=5, lanes=3), num_workers=w)))
        for w in (0, 1, 2, 3, 4)
    ]
    assert all(s == streams[0] for s in streams)


def test_unshuffled_single_lane_is_file_order(packed, packs):
    got = flat(stream(get_loader(PackedDataset(packed, batch_size=5, shuffle=False), num_workers=0)))
    assert got == list(range(len(packs) // 5 * 5))


def test_epoch_plan_shuffle_buffer_moves_packs_locally():
    sizes = np.full(50, 10)
    plan = epoch_plan(
        sizes, epoch=0, seed=0, shuffle=False, shuffle_buffer=0, rank=0, world_size=1, batch_size=10, lanes=1
    )
    assert plan.reshape(-1).tolist() == list(range(500))
    shuffled = epoch_plan(
        sizes, epoch=0, seed=0, shuffle=True, shuffle_buffer=16, rank=0, world_size=1, batch_size=10, lanes=1
    ).reshape(-1)
    assert sorted(shuffled.tolist()) == list(range(500))
    # inside a lane a pack moves less than the buffer away from its place in the unit order
    order = np.random.default_rng([0, 0]).permutation(50)
    unit_order_pos = np.empty(500, dtype=np.int64)
    unit_order_pos[(order[:, None] * 10 + np.arange(10)).reshape(-1)] = np.arange(500)
    assert np.abs(unit_order_pos[shuffled] - np.arange(500)).max() < 16


@pytest.mark.parametrize("sizes", [[130], [48, 48, 34], [16] * 8 + [2]])
@pytest.mark.parametrize("world_size", [1, 3])
def test_epoch_plan_packs_left_out_differ_from_epoch_to_epoch(sizes, world_size):
    """With shuffle, the packs that do not fill a batch on every rank are not always the same ones (they
    were the tail of the last unit in the order: with one unit, the same packs in every epoch)."""
    total, batch = sum(sizes), 8
    left_out = []
    for epoch in range(12):
        used = np.concatenate(
            [
                epoch_plan(
                    np.array(sizes), epoch=epoch, seed=0, shuffle=True, shuffle_buffer=0, rank=rank,
                    world_size=world_size, batch_size=batch, lanes=2,
                ).reshape(-1)
                for rank in range(world_size)
            ]
        )  # fmt: skip
        assert len(np.unique(used)) == len(used) == total // (world_size * batch) * world_size * batch
        left_out.append(frozenset(range(total)) - frozenset(used.tolist()))
    assert len(set(left_out)) > 1
    # with one unit, packs from its head are left out too, not only its tail
    assert len(frozenset().union(*left_out)) > total % (world_size * batch)


# --- resume ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("save_workers", [0, 1, 2])
def test_resume_equals_uninterrupted_stream(packed, save_workers):
    def make(workers):
        return get_loader(PackedDataset(packed, batch_size=4, seed=3, infinite=True), num_workers=workers)

    nb = PackedDataset(packed, batch_size=4).batches_per_epoch
    total = nb + 7  # crosses an epoch boundary
    reference = stream(make(save_workers), total)
    for load_workers in (0, 1, 2, 3):
        cut = 5 + load_workers * 3
        first = make(save_workers)
        head = stream(first, cut)
        state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
        second = make(load_workers)
        second.load_state_dict(state)
        tail = stream(second, total - cut)
        assert [b.tolist() for b in head + tail] == [b.tolist() for b in reference], (
            save_workers,
            load_workers,
        )


def test_resume_in_epoch_mode_finishes_the_epoch_then_continues(packed):
    def make(workers):
        return get_loader(PackedDataset(packed, batch_size=4, seed=9), num_workers=workers)

    ref = make(2)
    epoch0, epoch1 = flat(stream(ref)), flat(stream(ref))
    first = make(2)
    head = flat(stream(first, 3))
    second = make(1)
    second.load_state_dict(first.state_dict())
    rest = flat(stream(second))
    assert head + rest == epoch0
    assert flat(stream(second)) == epoch1


def test_breaking_out_keeps_the_cursor(packed):
    loader = get_loader(PackedDataset(packed, batch_size=4, seed=2), num_workers=2)
    full = flat(stream(get_loader(PackedDataset(packed, batch_size=4, seed=2, lanes=2), num_workers=0)))
    a = flat(stream(loader, 2))  # prefetched batches beyond these two are not counted
    b = flat(stream(loader))
    assert a + b == full


def test_state_of_another_stream_is_refused(packed):
    """Another order is refused; another world size or batch size resumes (test_elastic.py)."""
    state = get_loader(PackedDataset(packed, batch_size=4, seed=0), num_workers=0).state_dict()
    for kwargs in ({"seed": 1}, {"shuffle": False}, {"shuffle_buffer": 3}):
        loader = get_loader(PackedDataset(packed, **{"batch_size": 4, "seed": 0, **kwargs}), num_workers=0)
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            loader.load_state_dict(state)


# --- faults ---------------------------------------------------------------------------------------
def damaged_copy(packed: Path, tmp_path: Path, how: str) -> tuple[Path, str, int]:
    out = tmp_path / "out"
    shutil.copytree(packed, out)
    shard = json.loads((out / "manifest.json").read_text())["shards"][1]
    path = out / shard["path"]
    if how == "missing":
        path.unlink()
    else:  # keep the footer (schema, row groups), zero every data page
        data = bytearray(path.read_bytes())
        pages_end = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
        data[4:pages_end] = bytes(pages_end - 4)
        path.write_bytes(bytes(data))
    first = json.loads((out / "manifest.json").read_text())["shards"][0]["num_packs"]
    return out, shard["path"], first


@pytest.mark.parametrize("how", ["missing", "corrupt"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_shard_fails_by_default(packed, tmp_path, how, num_workers):
    out, name, _ = damaged_copy(packed, tmp_path, how)
    if how == "missing":  # found before the first batch
        with pytest.raises(InputError, match=rf"{name}: missing; run packtool verify"):
            PackedDataset(out, batch_size=4, shuffle=False)
        return
    loader = get_loader(PackedDataset(out, batch_size=4, shuffle=False), num_workers=num_workers)
    with pytest.raises(InputError, match=rf"{name}, row group \d+: cannot read packs"):
        stream(loader)
    # its workers are stopped with the error, not when the garbage collector frees its traceback (torch's
    # DataLoader then waited 5 s a worker before it terminated them)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("how", ["missing", "corrupt"])
def test_bad_shard_skipped_and_counted(packed, packs, tmp_path, how):
    out, name, first = damaged_copy(packed, tmp_path, how)
    shard1 = set(range(first, first + 40))
    ds = PackedDataset(out, batch_size=4, seed=4, on_error="skip")
    loader = get_loader(ds, num_workers=2)
    got = flat(stream(loader))
    planned = set(ds.plan(0).reshape(-1).tolist())
    assert len(got) == len(set(got))
    assert set(got) == planned - shard1  # all the readable packs, none of the bad shard
    assert loader.stats["bad_packs"] == len(planned & shard1) > 0
    assert sorted(loader.stats["bad_units"]) == sorted(f"{name}#{i}" for i in range(6))
    assert loader.state_dict()["stats"]["bad_packs"] == loader.stats["bad_packs"]


# --- task encoder stages --------------------------------------------------------------------------
class DropOdd:
    """Drops packs with an odd pack_index, and every batch whose first pack index is a multiple of 6."""

    def encode_sample(self, pack):
        assert isinstance(pack["input_ids"], torch.Tensor) and pack["input_ids"].shape == (N,)
        if pack["pack_index"] % 2:
            raise SkipSample()
        return pack

    def encode_batch(self, raw):
        if raw["pack_index"][0] % 6 == 0:
            raise IgnoreSample()
        return raw


def test_skip_sample_drops_and_counts(packed):
    ds = PackedDataset(packed, batch_size=4, seed=0, task_encoder=DropOdd())
    loader = get_loader(ds, num_workers=2)
    got = list(loader)
    plan = ds.plan(0)
    odd = int((plan % 2).sum())
    evens = [row[row % 2 == 0] for row in plan]
    dropped_batches = sum(1 for e in evens if len(e) == 0 or e[0] % 6 == 0)
    assert loader.stats["skipped_packs"] == odd
    assert loader.stats["skipped_batches"] == dropped_batches > 0
    assert len(got) == len(plan) - dropped_batches
    assert all(isinstance(b, dict) and all(p % 2 == 0 for p in b["pack_index"]) for b in got)
    assert loader.state_dict()["batch"] == 0 and loader.state_dict()["epoch"] == 1


def test_custom_batch_stage(packed):
    class Encoder:
        def batch(self, packs):
            return {"ids": batch_stack([p["input_ids"] for p in packs]), "n": len(packs)}

        def encode_batch(self, raw):
            return raw["ids"], raw["n"]

    ids, n = next(
        iter(get_loader(PackedDataset(packed, batch_size=3, task_encoder=Encoder()), num_workers=1))
    )
    assert ids.shape == (3, N) and ids.dtype == torch.int32 and n == 3  # the pack's dtype kept


def test_batch_helpers():
    ragged = [np.array([3, 2, 1], dtype=np.int32), np.array([6], dtype=np.int32)]
    assert batch_pad_stack(ragged).tolist() == [[3, 2, 1], [6, 0, 0]]
    assert batch_pad_stack([torch.tensor([1]), torch.tensor([1, 2])], pad_value=-1).tolist() == [
        [1, -1],
        [1, 2],
    ]
    raw = default_batch(
        [{"input_ids": np.arange(3, dtype=np.int32), "seq_lens": r, "tag": "x"} for r in ragged]
    )
    assert raw["input_ids"].dtype == torch.int32 and raw["seq_lens"].dtype == torch.int32  # dtypes kept
    assert raw["tag"] == ["x", "x"]


def test_too_few_packs_is_a_clear_error(packed):
    with pytest.raises(ValueError, match="cannot fill one batch"):
        PackedDataset(packed, batch_size=1000)


def test_too_few_packs_for_one_batch_read_with_drop_last_false(packed, packs):
    ds = PackedDataset(packed, batch_size=1000, shuffle=False, drop_last=False)
    assert len(ds) == 1
    (only,) = stream(get_loader(ds, num_workers=0))
    assert sorted(only.tolist()) == list(range(len(packs)))


@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (1, 2), (2, 1), (3, 2)])
def test_drop_last_false_uses_every_pack_with_equal_batch_counts(packed, packs, world_size, num_workers):
    """As torch's DistributedSampler(drop_last=False) + DataLoader(drop_last=False): every pack at least
    once, repeats only to even out the ranks, every rank the same number of batches (the last one short)."""
    seen, per_rank = [], []
    for rank in range(world_size):
        ds = PackedDataset(packed, batch_size=4, seed=3, rank=rank, world_size=world_size, drop_last=False)
        loader = get_loader(ds, num_workers=num_workers)
        batches = stream(loader)
        assert len(batches) == len(loader) == len(ds) == ds.batches_per_epoch
        assert all(len(b) == 4 for b in batches[:-1]) and 1 <= len(batches[-1]) <= 4
        per_rank.append(len(batches))
        seen += flat(batches)
    per = -(-len(packs) // world_size)
    assert per_rank == [-(-per // 4)] * world_size
    assert set(seen) == set(range(len(packs)))  # every pack
    assert len(seen) == per * world_size  # and only as many repeats as evening out the ranks takes


def test_len_is_batches_per_epoch_and_infinite_has_none(packed, packs):
    ds = PackedDataset(packed, batch_size=4)
    assert len(ds) == len(get_loader(ds, num_workers=0)) == len(packs) // 4 == len(stream(get_loader(ds, 0)))
    infinite = PackedDataset(packed, batch_size=4, infinite=True)
    with pytest.raises(TypeError, match="infinite"):
        len(infinite)
    assert len(get_loader(infinite, num_workers=0)) == len(packs) // 4  # one epoch, for LR schedules


def test_drop_last_is_part_of_the_resume_state(packed):
    a = get_loader(PackedDataset(packed, batch_size=4, drop_last=False), num_workers=0)
    state = a.state_dict()
    assert state["drop_last"] is False
    b = get_loader(PackedDataset(packed, batch_size=4), num_workers=0)
    with pytest.raises(ValueError, match="drop_last"):
        b.load_state_dict(state)
    older = {k: v for k, v in b.state_dict().items() if k != "drop_last"}  # saved before drop_last existed
    b.load_state_dict(older)


class _Identity:
    """A task encoder whose ``encode_sample`` keeps the pack: the loader's per-pack path."""

    def encode_sample(self, pack):
        return pack


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
@pytest.mark.parametrize("columns", ["full", "minimal"])
@pytest.mark.parametrize("per_pack", [False, True])
def test_context_parallel_padding_reaches_the_batch(tmp_path, fmt, columns, per_pack):
    """``--cp-size``: each batch says how much of each sequence is padding (``cp_padding``, aligned with
    ``seq_lens``) and gives ``cu_seqlens_unpadded``, what Transformer Engine's THD attention takes beside
    ``cu_seqlens`` (its ``_padded`` offsets); the real lengths are ``nemo_thd_sample``'s."""
    from packtool import run_pack
    from packtool.nemo import nemo_thd_sample
    from packtool.options import PackOptions
    from tests.conftest import DEMO, DEMO_TOKENIZER

    out = tmp_path / "out"
    run_pack(
        PackOptions.of(
            inputs=[str(DEMO / "train.jsonl")], output=str(out), tokenizer=str(DEMO_TOKENIZER),
            packed_sequence_size=128, cp_size=4, long_samples="truncate", format=fmt, columns=columns,
            quiet=True,
        )
    )  # fmt: skip
    want = {i: p for i, p in enumerate(read_packs(out, with_sample_index=True))}
    te = _Identity() if per_pack else None
    ds = PackedDataset(out, batch_size=8, shuffle=False, drop_last=False, task_encoder=te)
    seen = 0
    for batch in get_loader(ds, num_workers=0):
        assert batch.cp_padding.shape == batch.seq_lens.shape and batch.cp_padding.dtype == torch.int32
        real = []
        for row, index in enumerate(batch.pack_index.tolist()):
            pack = want[index]
            pieces = len(pack["sample_index"])
            assert batch.cp_padding[row, :pieces].tolist() == pack["cp_padding"].tolist()
            assert not batch.cp_padding[row, pieces:].any()
            lengths = pack["seq_lens"].tolist()
            real += nemo_thd_sample(pack)["seq_lens"] + lengths[pieces:]  # the pack's padding: its own
            seen += 1
        assert batch.cu_seqlens_unpadded.tolist() == np.concatenate([[0], np.cumsum(real)]).tolist()
        moved = batch.to("cpu")
        assert torch.equal(moved.cu_seqlens_unpadded, batch.cu_seqlens_unpadded)
    assert seen == len(want) and any(p["cp_padding"].any() for p in want.values())


def test_no_context_parallel_padding_no_fields(packed):
    batch = next(iter(get_loader(PackedDataset(packed, batch_size=4, shuffle=False), num_workers=0)))
    assert batch.cp_padding is None and batch.cu_seqlens_unpadded is None
