"""The vision extra stays out of the text path: no packtool module outside packtool.vision imports it, so
Pillow and transformers' processors load only for who asks for images."""

from __future__ import annotations

from tests.unit.test_architecture import graph


def test_no_module_outside_packtool_vision_imports_it():
    edges = graph()
    outside = sorted(
        f"{name} imports {target}"
        for name, targets in edges.items()
        if not name.startswith("packtool.vision")
        for target in targets
        if target.startswith("packtool.vision")
    )
    assert not outside, "\n".join(outside)
    assert "packtool.vision.processor" in edges  # the graph sees the package
