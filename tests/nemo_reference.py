"""Load NeMo AutoModel 0.1.2's ``packed_sequence.py`` from its wheel, as the reference for parity.

The wheel is fetched by ``make install`` into ``.cache/wheels`` (``pip download --no-deps``); only this
one module file is loaded (it needs torch, datasets and tqdm), nothing of NeMo is installed.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "nemo_automodel/components/datasets/llm/packed_sequence.py"


def find_wheel() -> Path | None:
    wheels = sorted((ROOT / ".cache" / "wheels").glob("nemo_automodel-0.1.2-*.whl"))
    return wheels[0] if wheels else None


def load_packed_sequence_module():
    wheel = find_wheel()
    if wheel is None:
        raise FileNotFoundError("NeMo AutoModel 0.1.2 wheel not in .cache/wheels: run `make install`")
    target = ROOT / ".cache" / "nemo_packed_sequence.py"
    if not target.exists():
        with zipfile.ZipFile(wheel) as z:
            target.write_bytes(z.read(MODULE))
    name = "nemo_packed_sequence_ref"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
