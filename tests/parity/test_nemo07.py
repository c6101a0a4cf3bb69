"""NeMo AutoModel 0.7.0's packed layout: ``packtool.nemo.nemo_thd_sample`` turns packtool's ``sequential``
packs into what 0.7's ``pack_dataset`` writes (``seq_lens`` real documents, ``seq_lens_padded`` with the
pack's padding), and 0.7's own ``packed_sequence_thd_collater`` + ``process_input_for_thd`` then give
exactly the ``cu_seqlens``, ``max_seqlen`` and ``padding_mask`` of NeMo's own packs.

The reference is the real module files from the nemo-automodel 0.7.0 wheel (see ``nemo_reference.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packtool import read_packs, run_pack
from packtool.nemo import nemo_thd_sample
from packtool.options import PackOptions
from packtool.verify import verify_output
from tests.conftest import write_jsonl
from tests.nemo_reference import find_wheel_07, load_nemo07

pytestmark = pytest.mark.skipif(
    find_wheel_07() is None, reason="NeMo AutoModel 0.7.0 wheel not fetched (make install)"
)
FIELDS = ("input_ids", "labels", "position_ids", "seq_lens", "seq_lens_padded")


def _rows(seed: int, count: int, max_len: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for length in rng.integers(1, max_len + 1, size=count):
        labels = np.where(rng.random(length) < 0.2, -100, rng.integers(0, 5000, size=length))
        rows.append({"input_ids": rng.integers(1, 5000, size=length).tolist(), "labels": labels.tolist()})
    return rows


@pytest.mark.parametrize(("n", "max_len"), [(16, 16), (32, 4), (50, 60), (33, 33)])
def test_sequential_packs_in_nemo_07_layout_equal_pack_dataset(tmp_path, n, max_len):
    nemo = load_nemo07()
    rows = _rows(n, 60, max_len)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    config = PackOptions.of(
        inputs=[str(src)], output=str(tmp_path / "out"), packed_sequence_size=n, strategy="sequential",
        long_samples="drop", quiet=True,
    )  # fmt: skip
    run_pack(config)
    ours = [nemo_thd_sample(p) for p in read_packs(tmp_path / "out", with_sample_index=True)]
    fits = [dict(r) for r in rows if len(r["input_ids"]) <= n]
    ref = nemo["packed_sequence"].pack_dataset(fits, None, n, padding_idx=0)
    assert len(ours) == len(ref)
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        for f in FIELDS:
            assert o[f] == list(r[f]), f"pack {i}, field {f}"

    assert_same_thd_batches(nemo, ours, ref)


def assert_same_thd_batches(nemo: dict, ours: list[dict], ref) -> None:
    """0.7's own ``packed_sequence_thd_collater`` + ``process_input_for_thd`` give the same tensors
    (``cu_seqlens``, ``max_seqlen``, ``padding_mask``, ...) for our packs as for ``ref`` (its
    ``pack_dataset``'s), four packs a batch."""
    collate, thd = nemo["utils"].packed_sequence_thd_collater, nemo["thd_utils"].process_input_for_thd
    for a in range(0, len(ours), 4):
        got = thd(collate([dict(x) for x in ours[a : a + 4]]))
        want = thd(collate([dict(x) for x in ref.select(range(a, min(a + 4, len(ref))))]))
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[key], value), key


def test_nemo_thd_sample_needs_the_pieces():
    with pytest.raises(ValueError, match="sample_index"):
        nemo_thd_sample({"input_ids": [1], "labels": [1], "position_ids": [0], "seq_lens": [1]})


@pytest.mark.parametrize(("n", "max_len", "cp_size"), [(16, 16, 2), (32, 9, 4), (48, 48, 3), (8, 3, 2)])
@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_cp_size_equals_pack_dataset_cp_size(tmp_path, n, max_len, cp_size, fmt):
    """``--cp-size``: every sample padded to a multiple of 2 x cp_size inside its pack, as NeMo 0.7's
    ``pack_dataset(cp_size=...)`` pads it; ``nemo_thd_sample`` gives its ``seq_lens`` (real) and
    ``seq_lens_padded``, and 0.7's THD collater the same ``cu_seqlens``, ``cu_seqlens_padded`` and
    ``padding_mask``; ``verify --source`` finds every token."""
    nemo = load_nemo07()
    rows = _rows(n + cp_size, 80, max_len)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    config = PackOptions.of(
        inputs=[str(src)], output=str(out), packed_sequence_size=n, strategy="sequential",
        long_samples="drop", cp_size=cp_size, format=fmt, quiet=True,
    )  # fmt: skip
    run_pack(config)
    ours = [nemo_thd_sample(p) for p in read_packs(out, with_sample_index=True)]
    fits = [dict(r) for r in rows if len(r["input_ids"]) <= n]
    ref = nemo["packed_sequence"].pack_dataset(fits, None, n, padding_idx=0, cp_size=cp_size)
    assert len(ours) == len(ref)
    assert any(a != b for o in ours for a, b in zip(o["seq_lens"], o["seq_lens_padded"], strict=True))
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        for f in FIELDS:
            assert o[f] == list(r[f]), f"pack {i}, field {f}"

    assert_same_thd_batches(nemo, ours, ref)

    report = verify_output(out, source=[str(src)])
    assert report.ok, report.problems[:3]
    assert report.checked["tokens"] == sum(len(r["input_ids"]) for r in fits)
