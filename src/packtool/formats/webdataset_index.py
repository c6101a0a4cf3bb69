"""The dataset-level index files of a webdataset output: ``wids.json`` and Megatron-Energon's ``.nv-meta/``.

Written from the manifest once every shard is written, so the output loads with ``wids`` and Energon as
it is (no ``energon prepare``); ``verify`` compares the files on disk with what the manifest gives.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import yaml

from packtool.errors import PacktoolError
from packtool.formats.base import FetchShard, ProblemSink
from packtool.formats.energon_index import INDEX_UUID, SQLITE_INDEX, write_sqlite_index
from packtool.formats.tar import INDEX_SUFFIX, member_compression, pack_members, stored_name, tar_index_name
from packtool.manifest import MANIFEST, MAX_MANIFEST_BYTES, MINIMAL_TAR_RECORD_VERSION, Manifest
from packtool.safepath import open_output_file, output_file_problem

WIDS_INDEX = "wids.json"  # the training shards only: a wids reader of it never sees held-out packs
WIDS_VAL_INDEX = "wids-val.json"  # the --val-fraction shards, written when there are any
ENERGON_DIR = ".nv-meta"
ENERGON_SAMPLE_TYPE = {"__module__": "packtool.energon", "__class__": "PackSample"}
ENERGON_DATASET_COMMENT = (
    "# Megatron-Energon dataset config written by packtool (one sample per pack; see packtool.energon)\n"
)
# the same packs through Energon's own classes, for a trainer without packtool: get_train_dataset(DIR,
# dataset_config="crude.yaml", task_encoder=...) hands its cookers CrudeSample dicts of NumPy arrays
ENERGON_CRUDE_CONFIG = "crude.yaml"
ENERGON_SUBFLAVOR = "pack"  # the crude samples' subflavor packtool.energon's cooker takes
ENERGON_VISION_SUBFLAVOR = "vision-pack"  # a vision-language output's: packtool.vision.energon's cooker
ENERGON_CRUDE_COMMENT = (
    "# Megatron-Energon dataset config written by packtool: the packs as CrudeSample dicts, no packtool\n"
    "# needed (a cooker for subflavor packtool: pack builds the sample; see packtool's docs/formats.md)\n"
)


def _wids_index(manifest: Manifest, split: str) -> dict:
    """A wids shard index of the shards of ``split`` (one descriptor per split, as wids reads one
    dataset per file)."""
    shards = [s for _, s in manifest.split_shards(split)]
    return {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": f"packtool-{manifest.run_id}" + ("" if split == "train" else f"-{split}"),
        "shardlist": [{"url": s.path, "nsamples": s.num_packs, "filesize": s.bytes} for s in shards],
    }


def dataset_index_contents(manifest: Manifest) -> dict[str, dict]:
    """What the dataset-level index files hold, from the manifest: ``{relative file name: content}``.

    ``wids.json`` lists the training shards, ``wids-val.json`` (only when the run held packs out with
    ``--val-fraction``) the validation shards; Energon's ``split.yaml`` names both splits."""
    shards = manifest.shards
    # a vision-language output's packs are crude samples only a cooker of its own subflavor takes
    # (packtool.vision.energon): PackSample has no images, so dataset.yaml must not name it for them
    vision = manifest.image_columns is not None
    crude = {
        "__module__": "megatron.energon",
        "__class__": "CrudeWebdataset",
        "subflavors": {"packtool": ENERGON_VISION_SUBFLAVOR if vision else ENERGON_SUBFLAVOR},
    }
    wids = {WIDS_INDEX: _wids_index(manifest, "train")}
    if manifest.split_shards("val"):
        wids[WIDS_VAL_INDEX] = _wids_index(manifest, "val")
    return {
        **wids,
        f"{ENERGON_DIR}/.info.json": {"shard_counts": {s.path: s.num_packs for s in shards}},
        # as energon prepare writes it: every split named (get_val_dataset, energon lint), test empty
        f"{ENERGON_DIR}/split.yaml": {
            "split_parts": {
                "train": [s.path for _, s in manifest.split_shards("train")],
                "val": [s.path for _, s in manifest.split_shards("val")],  # --val-fraction's packs
                "test": [],
            },
            "exclude": [],
        },
        f"{ENERGON_DIR}/dataset.yaml": crude
        if vision
        else {
            "sample_type": ENERGON_SAMPLE_TYPE,
            # the members of one column, named after it (a minimal output's small columns, fields of one
            # member, are not PackSample's: Energon reads a full output); NAME.npy.gz when compressed,
            # which Energon's decoder (webdataset's) decompresses by its suffix
            "field_map": {
                names[0]: ext
                for ext, names in pack_members(
                    manifest.columns, manifest.layout, member_compression(manifest)
                ).items()
                if names == (stored_name(ext).removesuffix(".npy"),)
            },
        },
        f"{ENERGON_DIR}/{ENERGON_CRUDE_CONFIG}": crude,
    }


def write_dataset_index(
    directory: str | Path, manifest: Manifest, *, energon: bool = True, fetch_shard: FetchShard = None
) -> list[str]:
    """Write the dataset-level index files into ``directory``; return their relative names (Energon's
    ``index.sqlite`` and ``index.uuid`` among them when ``energon`` and megatron-energon is installed)."""
    directory = Path(directory)
    (directory / ENERGON_DIR).mkdir(exist_ok=True)
    contents = dataset_index_contents(manifest)
    for name, content in contents.items():
        if name.endswith(".json"):
            text = json.dumps(content, indent=1) + "\n"
        else:
            comments = {"dataset.yaml": ENERGON_DATASET_COMMENT, ENERGON_CRUDE_CONFIG: ENERGON_CRUDE_COMMENT}
            text = comments.get(Path(name).name, "") + yaml.safe_dump(content, sort_keys=False)
        (directory / name).write_text(text)
    names = list(contents)
    if energon:
        names += write_sqlite_index(
            directory, [s.path for s in manifest.shards], manifest.run_id, fetch_shard
        )
    return names


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


def old_minimal_layout(manifest: Manifest) -> bool:
    """A ``--columns minimal`` output from before its tar packs became one record (format_version 3)."""
    return manifest.layout == "minimal" and manifest.format_version < MINIMAL_TAR_RECORD_VERSION


def check_dataset_index(directory: Path, manifest: Manifest, report: ProblemSink) -> None:
    """``wids.json`` and ``.nv-meta/`` must say what the manifest says; no stray ``.tar.idx``. An output
    older than format_version 2 is said once here: its tar shards carry no run_id (the other checks run).
    A minimal output of format 3's one-member-per-column layout (``old_minimal_layout``) is checked as
    readers read it (``TarChecker.check``)."""
    if manifest.format_version < 2:
        report.add(
            "format_version",
            f"written by an older packtool (format_version {manifest.format_version}): its tar shards "
            "carry no run_id, so they cannot be matched to this manifest; pack it again to verify it "
            "(it still loads)",
            shard=MANIFEST,
            field="format_version",
        )
    written = manifest.index_files
    for name, want in dataset_index_contents(manifest).items():
        if written is not None and name not in written:  # an older packtool did not write this one
            continue
        problem = output_file_problem(directory, name)  # a FIFO would block, a link may lead out
        if problem is not None:
            report.add(
                "dataset index", "index file is missing" if problem == "missing" else problem, shard=name
            )
            continue
        try:
            with open_output_file(directory, name) as f:
                text = f.read(MAX_MANIFEST_BYTES + 1).decode()  # (a few KiB: the shards' names)
            if len(text) > MAX_MANIFEST_BYTES:
                raise ValueError(f"over {MAX_MANIFEST_BYTES:,} bytes")
            got = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError, PacktoolError) as e:
            report.add("dataset index", f"does not parse ({str(e).splitlines()[0]})", shard=name)
            continue
        if name.endswith("split.yaml") and isinstance(got, dict) and "val" not in got.get("split_parts", {}):
            want = {**want, "split_parts": {"train": want["split_parts"]["train"]}}  # an older packtool's
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
    if SQLITE_INDEX in (manifest.index_files or ()):  # written when megatron-energon was installed
        _check_key_index(directory, manifest, report)
    named = {tar_index_name(e) for e in manifest.shards}
    for path in sorted(directory.glob("*.tar" + INDEX_SUFFIX)):
        if path.name not in named:
            report.add("unlisted", "index file of a shard the manifest does not name", shard=path.name)


def _check_key_index(directory: Path, manifest: Manifest, report: ProblemSink) -> None:
    """Energon's key index must be there and index as many packs as the manifest lists."""
    rebuild = "`energon prepare DIR --tar-index-only` rebuilds it"
    problems = {name: output_file_problem(directory, name) for name in (SQLITE_INDEX, INDEX_UUID)}
    for name, problem in problems.items():
        if problem is not None:  # missing, or not to be opened (a FIFO would block SQLite)
            why = f"index file is missing ({rebuild})" if problem == "missing" else problem
            report.add("dataset index", why, shard=name)
    path = directory / SQLITE_INDEX
    if problems[SQLITE_INDEX] is not None:
        return
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            (count,) = db.execute("SELECT COUNT(*) FROM samples").fetchone()
    except sqlite3.Error as e:
        report.add("dataset index", f"does not read as Energon's index ({e}; {rebuild})", shard=SQLITE_INDEX)
        return
    if count != manifest.num_packs:
        report.add(
            "dataset index",
            f"indexes {count:,} packs, the manifest lists {manifest.num_packs:,} (stale index; {rebuild})",
            shard=SQLITE_INDEX,
        )
