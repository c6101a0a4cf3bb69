"""Megatron-Energon reads a vision-language tar output (issue 29): through Energon's own ``get_train_dataset``
and ``get_loader`` (``crude.yaml``, ``VisionPackTaskEncoder``), every pack comes once with its images, and
each batch equals the batch packtool's own loader (``vision_dataset``) gives for that pack: tokens,
``pixel_values`` and ``image_grid_thw`` in pack order."""

from __future__ import annotations

import pytest
import torch

from packtool.options import PackOptions
from packtool.pipeline.run import run_pack
from packtool.vision.loader import VisionBatch, vision_dataset
from packtool.vision.processor import load_processor
from tests.fixtures.vision_inputs import write_llava_input
from tests.fixtures.vision_processors import build_qwen2vl


@pytest.fixture(scope="module")
def tar_output(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("energon_vision")
    vp = load_processor(build_qwen2vl(tmp / "qwen2vl"))
    options = PackOptions.of(inputs=[str(write_llava_input(tmp / "input"))], output=str(tmp / "out"),
                             processor=vp.path, packed_sequence_size=120, format="webdataset", num_proc=1,
                             quiet=True)  # fmt: skip
    run_pack(options)
    return vp, tmp / "out"


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_energon_gives_each_pack_with_its_images_as_packtools_loader(tar_output):
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from packtool.vision.energon import VisionPackTaskEncoder

    vp, out = tar_output
    ours = vision_dataset(out, vp, batch_size=1, shuffle=False, mask="dense", attention="causal")
    ours = {int(b.pack_index): b for b in ours}
    ds = get_train_dataset(
        out,
        dataset_config="crude.yaml",
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1),
        task_encoder=VisionPackTaskEncoder(vp, mask="dense", attention="causal"),  # as ours
        repeat=False,
    )
    got = {}
    for batch in get_loader(ds):
        assert isinstance(batch, VisionBatch)
        got[int(batch.pack_index)] = batch
    assert sorted(got) == sorted(ours) and len(got) >= 2
    assert sum(int(b.images_per_pack.sum()) for b in got.values()) == 5
    for k, want in ours.items():
        batch = got[k]
        assert torch.equal(batch.input_ids, want.input_ids) and torch.equal(batch.labels, want.labels)
        assert torch.equal(batch.seq_lens, want.seq_lens)
        for name in ("pixel_values", "image_grid_thw"):
            a, b = getattr(batch, name), getattr(want, name)
            assert (a is None and b is None) or torch.equal(a, b), (k, name)
        assert torch.equal(batch.model_inputs()["attention_mask"], want.model_inputs()["attention_mask"])


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_energon_gives_a_cross_attention_model_s_packs_as_packtools_loader(tmp_path):
    """Llama 3.2 Vision: each pack's images as one row, its aspect-ratio inputs and cross_attention_mask,
    as packtool's loader gives them (the model hooked by both: cross_attention=model)."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from packtool.vision.energon import VisionPackTaskEncoder
    from tests.fixtures.vision_families import build_mllama
    from tests.unit.vision.test_families import _meta_mllama

    (tmp_path / "mllama").mkdir()
    vp = load_processor(build_mllama(tmp_path / "mllama"))
    out = tmp_path / "out"
    options = PackOptions.of(inputs=[str(write_llava_input(tmp_path / "input"))], output=str(out),
                             processor=vp.path, packed_sequence_size=60, format="webdataset", num_proc=1,
                             quiet=True)  # fmt: skip
    run_pack(options)
    model = _meta_mllama(vp)
    kwargs = {"mask": "dense", "attention": "causal", "cross_attention": model}
    ours = {int(b.pack_index): b for b in vision_dataset(out, vp, batch_size=1, **kwargs)}
    ds = get_train_dataset(out, dataset_config="crude.yaml", batch_size=1, shuffle_buffer_size=None,
                           max_samples_per_sequence=None, repeat=False,
                           worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1),
                           task_encoder=VisionPackTaskEncoder(vp, **kwargs))  # fmt: skip
    got = {int(batch.pack_index): batch for batch in get_loader(ds)}
    assert sorted(got) == sorted(ours) and len(got) >= 2
    for k, want in ours.items():
        a, b = got[k].model_inputs(), want.model_inputs()
        assert a.keys() == b.keys() and "cross_attention_mask" in a and "aspect_ratio_ids" in a
        for name, value in b.items():
            assert value is a[name] or torch.equal(value, a[name]), (k, name)


def test_a_vision_output_dataset_yaml_takes_no_text_task_encoder(tar_output):
    """The default dataset.yaml of a vision-language output names crude samples of subflavor
    ``vision-pack``: Energon's text path (``PackTaskEncoder``, whose cooker takes ``pack``) has no cooker
    for them and stops, instead of giving the packs' tokens without their images (on 050f8fb dataset.yaml
    named PackSample, which has no images)."""
    from megatron.energon import WorkerConfig, get_train_dataset

    from packtool.energon import PackTaskEncoder

    _, out = tar_output
    assert "CrudeWebdataset" in (out / ".nv-meta" / "dataset.yaml").read_text()
    with pytest.raises(ValueError, match="No cooker found for subflavors"):  # at once, before a batch
        get_train_dataset(
            out,
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            task_encoder=PackTaskEncoder(),
            repeat=False,
        )
