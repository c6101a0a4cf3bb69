"""The dataset-level index files of a webdataset output: ``wids.json`` and Megatron-Energon's ``.nv-meta/``.

Written from the manifest once every shard is written, so the output loads with ``wids`` and Energon as
it is (no ``energon prepare``); ``verify`` compares the files on disk with what the manifest gives.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import yaml

from packtool.formats.base import ProblemSink
from packtool.formats.tar import INDEX_SUFFIX, tar_index_name
from packtool.manifest import MANIFEST, Manifest

WIDS_INDEX = "wids.json"
ENERGON_DIR = ".nv-meta"
ENERGON_SAMPLE_TYPE = {"__module__": "packtool.energon", "__class__": "PackSample"}
ENERGON_DATASET_COMMENT = (
    "# Megatron-Energon dataset config written by packtool (one sample per pack; see packtool.energon)\n"
)


def dataset_index_contents(manifest: Manifest) -> dict[str, dict]:
    """What the dataset-level index files hold, from the manifest: ``{relative file name: content}``."""
    shards = manifest.shards
    return {
        WIDS_INDEX: {
            "__kind__": "wids-shard-index-v1",
            "wids_version": 1,
            "name": f"packtool-{manifest.run_id}",
            "shardlist": [{"url": s.path, "nsamples": s.num_packs, "filesize": s.bytes} for s in shards],
        },
        f"{ENERGON_DIR}/.info.json": {"shard_counts": {s.path: s.num_packs for s in shards}},
        f"{ENERGON_DIR}/split.yaml": {"split_parts": {"train": [s.path for s in shards]}, "exclude": []},
        f"{ENERGON_DIR}/dataset.yaml": {
            "sample_type": ENERGON_SAMPLE_TYPE,
            "field_map": {c: f"{c}.npy" for c in manifest.columns},
        },
    }


def write_dataset_index(directory: str | Path, manifest: Manifest) -> list[str]:
    """Write the dataset-level index files into ``directory``; return their relative names."""
    directory = Path(directory)
    (directory / ENERGON_DIR).mkdir(exist_ok=True)
    contents = dataset_index_contents(manifest)
    for name, content in contents.items():
        if name.endswith(".json"):
            text = json.dumps(content, indent=1) + "\n"
        else:
            comment = ENERGON_DATASET_COMMENT if name.endswith("dataset.yaml") else ""
            text = comment + yaml.safe_dump(content, sort_keys=False)
        (directory / name).write_text(text)
    return list(contents)


def _diff(want, got, where: str = "") -> Iterator[tuple[str, object, object]]:
    """``(field path, wanted, found)`` for every leaf where ``got`` differs from ``want``."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in [*want, *(k for k in got if k not in want)]:
            yield from _diff(want.get(k), got.get(k), f"{where}.{k}" if where else str(k))
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            yield from _diff(a, b, f"{where}[{i}]")
    elif want != got:
        yield where, want, got


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_dataset_index(directory: Path, manifest: Manifest, report: ProblemSink) -> None:
    """``wids.json`` and ``.nv-meta/`` must say what the manifest says; no stray ``.tar.idx``. An output
    older than format_version 2 is said once here: its tar shards carry no run_id (the other checks run)."""
    if manifest.format_version < 2:
        report.add(
            "format_version",
            f"written by an older packtool (format_version {manifest.format_version}): its tar shards "
            "carry no run_id, so they cannot be matched to this manifest; pack it again to verify it "
            "(it still loads)",
            shard=MANIFEST,
            field="format_version",
        )
    for name, want in dataset_index_contents(manifest).items():
        path = directory / name
        if not path.exists():
            report.add("dataset index", "index file is missing", shard=name)
            continue
        try:
            got = json.loads(path.read_text()) if name.endswith(".json") else yaml.safe_load(path.read_text())
        except (ValueError, yaml.YAMLError) as e:
            report.add("dataset index", f"does not parse ({str(e).splitlines()[0]})", shard=name)
            continue
        diffs = list(_diff(want, got))
        if diffs:  # one problem per file: its first difference, and how many more
            where, a, b = diffs[0]
            more = f"; {len(diffs) - 1} more field(s) differ" if len(diffs) > 1 else ""
            report.add(
                "dataset index",
                f"{_short(b)} in the file, the manifest gives {_short(a)} (stale index{more})",
                shard=name,
                field=where or None,
            )
    named = {tar_index_name(e) for e in manifest.shards}
    for path in sorted(directory.glob("*.tar" + INDEX_SUFFIX)):
        if path.name not in named:
            report.add("unlisted", "index file of a shard the manifest does not name", shard=path.name)
