"""The vision extra stays out of the text path: packtool.vision (Pillow, transformers' processors) is
imported only by who asks for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_text_path_does_not_import_packtool_vision():
    code = (
        "import sys, packtool.cli, packtool.pipeline.run, packtool.loader, packtool.reading\n"
        "print(sorted(m for m in sys.modules if m.startswith('packtool.vision')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
