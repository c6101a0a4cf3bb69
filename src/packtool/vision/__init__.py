"""Vision-language samples: images with their tokens, exactly as the model's own processor writes them.

Needs the ``vision`` extra (``pip install 'packtool[vision]'``: Pillow, transformers); the text path never
imports this package. ``packtool pack --processor DIR`` runs these through the one pipeline
(``packtool.encoders.vision``), as any other sample format.

* ``files``: an image file read as inputs are (regular files only, bounded), and its bytes' digest.
* ``images``: an image's size from its header (``image_size``), one-line errors for bad images.
* ``processor``: the model's processor from a local directory (``load_processor``), or its refusal;
  ``expansion``: what it writes for each image, from the processor itself.
* ``samples``: records -> ``VisionSample`` (LLaVA, chat ``messages`` with image parts, captioning).
* ``sequences``: a sample as the model sees it (``encode_sample``): the processor's tokens, labels, each
  image's span; ``sample_lengths`` for the planner.
* ``loader``, ``energon``: the loader's vision stages (``vision_dataset``, ``VisionPackTaskEncoder``);
  ``model_inputs``: a pack's stored images -> the processor's image inputs, in pack order;
  ``positions``: M-RoPE ids through the model's ``get_rope_index``.
* ``checks``: ``verify``'s checks of a vision output's images.

docs/vision.md is the user's page.
"""
