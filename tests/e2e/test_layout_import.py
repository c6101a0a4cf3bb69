"""packtool imports as the installed package from any working directory (issue 30 item 13).

A clone is usually a folder named ``packtool``; run from its parent, Python would take that folder for a
namespace package ahead of an editable install's import hook (``cannot import name 'read_packs' from
'packtool' (unknown location)``). The ``src/`` layout makes the editable install a plain path entry, so the
real package wins wherever Python runs.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_the_package_imports_from_a_folder_holding_a_packtool_folder(tmp_path):
    (tmp_path / "packtool" / "docs").mkdir(parents=True)  # a clone named packtool, seen from its parent
    got = subprocess.run(
        [sys.executable, "-c", "import packtool; from packtool import read_packs; print(packtool.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str(ROOT / "src" / "packtool" / "__init__.py")


def test_the_repository_root_holds_no_importable_packtool_folder():
    assert not (ROOT / "packtool").exists()
