"""Through Megatron-Energon, outputs mix with Energon's own metadataset (docs/loader.md, mixtures): a
``blend_epochized`` of two webdataset outputs read with ``packtool.energon.PackTaskEncoder`` gives each
source's packs its repetitions times an epoch."""

from __future__ import annotations

from collections import Counter

from packtool.formats.tar import pack_key
from tests.conftest import DEMO, DEMO_TOKENIZER
from tests.fixtures.interop_outputs import interop_wds, pack, reference  # noqa: F401 - fixtures


def test_an_energon_metadataset_blends_packtool_outputs(interop_wds, tmp_path):
    """Both outputs without a loss mask (``PackTaskEncoder.batch`` stacks the packs' columns: packs with and
    without ``loss_mask`` do not batch together)."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from packtool.energon import PackTaskEncoder

    lines = (DEMO / "train.jsonl").read_text().splitlines()[:300]
    (tmp_path / "part.jsonl").write_text("\n".join(lines) + "\n")
    part = pack(tmp_path / "part", tmp_path / "part.jsonl", "--tokenizer", DEMO_TOKENIZER, "--long-samples",
                "truncate", "--format", "webdataset")  # fmt: skip
    metadataset = tmp_path / "mixture.yaml"
    metadataset.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        f"      - repetitions: 1\n        path: {interop_wds}\n"
        f"      - repetitions: 2\n        path: {part}\n"
    )
    ds = get_train_dataset(
        metadataset, batch_size=4, shuffle_buffer_size=8, max_samples_per_sequence=16, repeat=False,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), task_encoder=PackTaskEncoder(),
    )  # fmt: skip
    drawn: Counter = Counter()
    for batch in get_loader(ds):
        samples = [r for r in batch.__restore_key__ if isinstance(r, tuple)]  # one per sample, in order
        for key, restore in zip(batch.__key__, samples, strict=True):
            drawn[restore[restore.index("BlendDataset") + 1], key] += 1  # the blend's source of the sample
    sizes = [len(reference(d)) for d in (interop_wds, part)]
    for source, size in enumerate(sizes):
        assert {k for s, k in drawn if s == source} == {pack_key(i) for i in range(size)}
    assert [n for (s, _), n in drawn.items() if s == 0] == [1] * sizes[0]
    assert [n for (s, _), n in drawn.items() if s == 1] == [2] * sizes[1]  # repetitions: 2
