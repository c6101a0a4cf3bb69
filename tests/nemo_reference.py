"""Load the peers' reference code from their wheels for parity: NeMo AutoModel 0.1.2's ``packed_sequence.py``
(and 0.7.0's modules below), TRL 1.16.0's ``data_utils.py``.

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


# --- NeMo AutoModel 0.7.0: its packed layout (seq_lens_padded) and THD collater ---------------------------
MODULES_07 = {
    "packing": "nemo_automodel/components/datasets/packing.py",
    "utils": "nemo_automodel/components/datasets/utils.py",
    "packed_sequence": "nemo_automodel/components/datasets/llm/packed_sequence.py",
    "thd_utils": "nemo_automodel/components/distributed/thd_utils.py",
}


def find_wheel_07() -> Path | None:
    wheels = sorted((ROOT / ".cache" / "wheels").glob("nemo_automodel-0.7.0-*.whl"))
    return wheels[0] if wheels else None


def load_nemo07() -> dict:
    """NeMo AutoModel 0.7.0's ``packing``, ``utils`` (``packed_sequence_thd_collater``), ``packed_sequence``
    (``pack_dataset``) and ``thd_utils`` (``process_input_for_thd``) modules, from the wheel's files. They
    need torch, datasets and transformers only; ``utils``' one import of ``packing`` is pointed at the file
    loaded here (nothing else of NeMo is imported)."""
    wheel = find_wheel_07()
    if wheel is None:
        raise FileNotFoundError("NeMo AutoModel 0.7.0 wheel not in .cache/wheels: run `make install`")
    loaded = {}
    with zipfile.ZipFile(wheel) as z:
        for short, member in MODULES_07.items():
            name = f"nemo07_{short}"
            if name in sys.modules:
                loaded[short] = sys.modules[name]
                continue
            source = z.read(member).decode()
            source = source.replace(
                "from nemo_automodel.components.datasets.packing import", "from nemo07_packing import"
            )
            module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
            module.__file__ = f"{wheel.name}/{member}"
            sys.modules[name] = module
            exec(compile(source, module.__file__, "exec"), module.__dict__)
            loaded[short] = module
    return loaded


# --- TRL 1.16.0: pack_dataset (bfd, bfd_split) -------------------------------------------------------------
def load_trl_data_utils():
    """TRL 1.16.0's ``trl/data_utils.py`` (``pack_dataset``), from the wheel's file: it needs numpy, pyarrow,
    datasets and transformers only; nothing of TRL is installed or imported."""
    wheels = sorted((ROOT / ".cache" / "wheels").glob("trl-1.16.0-*.whl"))
    if not wheels:
        raise FileNotFoundError("TRL 1.16.0 wheel not in .cache/wheels: run `make install`")
    name = "trl116_data_utils"
    if name in sys.modules:
        return sys.modules[name]
    with zipfile.ZipFile(wheels[0]) as z:
        source = z.read("trl/data_utils.py").decode()
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    module.__file__ = f"{wheels[0].name}/trl/data_utils.py"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module
