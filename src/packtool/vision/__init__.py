"""Vision-language samples (issue 29): images with their tokens, counted exactly from their headers.

Needs the ``vision`` extra (``pip install 'packtool[vision]'``: Pillow, transformers); the text path never
imports this package.

* ``images``: an image's size from its header (``image_size``), one-line errors for bad images.
* ``processor``: the model's processor from a local directory (``load_processor``), or its refusal;
  ``expansion``: what it writes for each image, from the processor itself (``VisionProcessor.expansion``).
* ``samples``, ``hf_samples``: inputs -> ``VisionSample`` (LLaVA JSON / JSON Lines, chat ``messages`` with
  image parts, Hugging Face datasets with ``Image`` features, WebDataset captioning shards).
* ``sequences``: a sample as the model sees it (``encode_sample``): image tokens expanded, labels, each
  image's span; ``sample_lengths`` for ``packtool.packing.planner.make_plan``.
* ``packs``: whole samples planned into packs (``plan_packs``) and laid out with each image's span
  (``assemble_pack``); ``positions``: M-RoPE ids through the model's ``get_rope_index``.
* ``loader``, ``energon``: the loader's vision stages (``vision_dataset``, ``VisionPackTaskEncoder``).
* ``balance``: a pack order giving data-parallel ranks similar image tokens per step.
* ``records``: packs as Arrow rows with each image's original bytes and per-image columns.
* ``model_inputs``: a pack's stored images -> the processor's image inputs, in pack order.
* ``stats``: image statistics of stored packs (for the manifest and ``inspect``).
* ``inputs``: ``read_vision_samples(paths)``, the reader for each kind of input.

See docs/vision.md for what exists and what is left.
"""
