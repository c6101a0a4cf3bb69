"""The vision extra stays out of the text path: no packtool module outside it imports it, but for the
deferred imports of ``VISION_ENTRIES`` (inside a function, run for vision samples or outputs only), so
Pillow and transformers' processors load only for who asks for images.

The vision extra is ``packtool.vision``, the vision encoder (``packtool.encoders.vision``) and verify's
image checks (``packtool.verify.images``), less
``packtool.vision.files`` (reading an image file and its digest: the pipeline's image store uses it, and
it needs neither Pillow nor transformers)."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_architecture import DEFERRED, ROOT, graph

# module -> the vision extra's modules it imports inside a function, for vision samples or outputs only
VISION_ENTRIES = {
    "packtool.encoders.registry": {"packtool.encoders.vision"},
    "packtool.verify": {"packtool.verify.images"},
}
LIGHT = {"packtool.vision.files"}


def in_extra(name: str) -> bool:
    extra = name.startswith("packtool.vision") or name in (
        "packtool.encoders.vision",
        "packtool.verify.images",
    )
    return extra and name not in LIGHT


def test_no_module_outside_the_vision_extra_imports_it():
    edges = graph()
    outside = sorted(
        f"{name} imports {target}"
        for name, targets in edges.items()
        if not in_extra(name)
        for target in targets
        if in_extra(target) and target not in VISION_ENTRIES.get(name, ())
    )
    assert not outside, "\n".join(outside)
    assert "packtool.vision.processor" in edges  # the graph sees the package
    for name, targets in VISION_ENTRIES.items():  # each one deferred, where the architecture allows it
        assert targets <= DEFERRED.get(name, set()), name


def test_the_text_pipeline_imports_neither_pillow_nor_transformers():
    code = (
        "import sys; import packtool.pipeline.run, packtool.verify, packtool.loader, packtool.reading; "
        "print(sorted(m for m in ('PIL', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
