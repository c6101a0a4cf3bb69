"""The vision extra stays out of the text path: no packtool module outside packtool.vision imports it, but
for the deferred imports of ``VISION_ENTRIES`` (inside a function, run for vision outputs only), so Pillow
and transformers' processors load only for who asks for images."""

from __future__ import annotations

from tests.unit.test_architecture import DEFERRED, graph

# module -> the packtool.vision modules it imports inside a function, for vision outputs only
VISION_ENTRIES = {
    "packtool.pipeline.run": {"packtool.vision.run"},
    "packtool.verify": {"packtool.vision.checks"},
}


def test_no_module_outside_packtool_vision_imports_it():
    edges = graph()
    outside = sorted(
        f"{name} imports {target}"
        for name, targets in edges.items()
        if not name.startswith("packtool.vision")
        for target in targets
        if target.startswith("packtool.vision") and target not in VISION_ENTRIES.get(name, ())
    )
    assert not outside, "\n".join(outside)
    assert "packtool.vision.processor" in edges  # the graph sees the package
    for name, targets in VISION_ENTRIES.items():  # each one deferred, where the architecture allows it
        assert targets <= DEFERRED.get(name, set()), name
