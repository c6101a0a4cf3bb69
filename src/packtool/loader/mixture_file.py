"""A mixture file: the outputs a loader mixes and the share of each, in YAML.

::

    # mixture.yaml: each pack drawn from a source with probability weight / sum(weights)
    sources:
      - path: out/web          # relative to this file's folder
        weight: 0.7
      - path: out/code
        weight: 0.3

or, per epoch, exactly ``repeat`` times each source's packs (0.5: half of them, another half each epoch)::

    sources:
      - {path: out/sft, repeat: 2}
      - {path: out/math, repeat: 0.5}

Read as plain data (``config_file.read_yaml``: at most 1 MiB, UTF-8, no aliases, no tags that build
objects): a file that is not this shape is a ``ConfigError`` naming the file and the entry. Wherever an
output directory is taken (``PackedDataset``, ``vision_dataset``, ``trl_dataset``, ``packtool inspect``),
a mixture file is taken too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packtool.config_file import read_yaml
from packtool.errors import ConfigError


def load_mixture_file(path: str | Path) -> list[dict[str, Any]]:
    """The file's ``sources`` entries, each a dict with its ``path`` made relative to the file's folder
    (a path with a scheme, ``s3://...``, kept as written); their keys and values are checked by
    ``sources.mixture_of``."""
    path = Path(path)
    data = read_yaml(path, "mixture")
    if not isinstance(data, dict) or "sources" not in data:
        raise ConfigError(f"{path}: a mixture file is a mapping with a 'sources' list")
    unknown = sorted(str(k) for k in data if k != "sources")
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; a mixture file holds only 'sources'")
    entries = data["sources"]
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'sources' must be a list of {{path, weight}} or {{path, repeat}}")
    out = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            target = entry["path"]
            if "://" not in target and not os.path.isabs(target):
                target = os.path.normpath(os.path.join(path.parent, target))
            entry = {**entry, "path": target}
        out.append(entry)
    return out
