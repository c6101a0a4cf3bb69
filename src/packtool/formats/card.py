"""The dataset card (``README.md``) of an output directory, so that ``datasets.load_dataset(DIR)`` loads it.

Hugging Face ``datasets`` reads a directory's ``README.md`` YAML header: its ``configs:`` / ``data_files:``
say which files are the data. Without it, ``load_dataset(DIR)`` takes every file as data and fails on
``manifest.json`` or the ``.tar.idx`` indexes. The card names the shards by a glob of their suffix, and its
body says what each column holds (from ``manifest.PACK_COLUMNS``), the conventions and the run's figures,
so that the directory can also be uploaded to the Hub as it is.

Written last by ``packtool pack``, beside the format's dataset index (``pipeline.run``); the text depends
only on the manifest, so the output stays byte-identical for any ``num_proc`` and engine.

The tar shards of a vision-language output are not offered to ``load_dataset``: its WebDataset builder
fixes each row's members from the first packs of the first shard, so a pack with more images than those
(``KEY.img4.png``) would come back without them. Their card's data files name the readers instead
(``NOT_FOR_DATASETS``: ``load_dataset`` stops on them, naming ``vision_dataset``), and its body says so.
A Parquet vision output loads whole (its ``images`` column is a list per pack).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from packtool.formats.tar import (
    COMPRESSIONS,
    META,
    PACK_META,
    RUN_ID_BYTES,
    SMALL_COLUMNS,
    member_compression,
    pack_members,
)
from packtool.manifest import COLUMNS, MANIFEST, SHARD_PREFIXES, Manifest

CARD = "README.md"
# the data files of a vision tar output's card: none match, so load_dataset stops with this path in its error
NOT_FOR_DATASETS = (
    "datasets-cannot-load-these-tar-packs-whole-read-them-with-packtool.vision.loader.vision_dataset"
)


def member_name(column: str, manifest: Manifest) -> str:
    """The column's name as the shards hold it: a tar member keeps its ``.npy`` suffix (``.npy.gz`` when
    compressed), and a minimal tar pack's small columns are fields of one member
    (``small_columns.npy["seq_lens"]``)."""
    if manifest.shard_format != "webdataset":
        return column
    z = COMPRESSIONS[member_compression(manifest)]
    if column in pack_members(manifest.columns, manifest.layout).get(SMALL_COLUMNS, ()):
        return f'{SMALL_COLUMNS}{z}["{column}"]'
    return f"{column}.npy{z}"


def card_yaml(manifest: Manifest, suffix: str) -> dict:
    """The card's YAML header: the data files of the one config (a ``validation`` split for the packs held
    out by ``val_fraction``), and tags."""
    files = [{"split": "train", "path": f"{SHARD_PREFIXES['train']}*{suffix}"}]
    if manifest.split_shards("val"):
        files.append({"split": "validation", "path": f"{SHARD_PREFIXES['val']}*{suffix}"})
    if manifest.image_columns is not None and manifest.shard_format == "webdataset":
        files = [{"split": "train", "path": NOT_FOR_DATASETS}]
    return {
        "configs": [{"config_name": "default", "data_files": files}],
        "tags": ["packtool", "packed-sequences"],
    }


def dataset_card(manifest: Manifest, suffix: str) -> str:
    """The text of ``README.md`` for an output with this manifest and shard suffix (``.parquet``)."""
    m, s = manifest, manifest.stats
    held = sum(e.num_packs for _, e in m.split_shards("val"))
    val = f", and `{SHARD_PREFIXES['val']}NNNNNN{suffix}`: {held:,} packs held out as validation" * bool(held)
    fmt = m.shard_format
    rows = [
        f"| `{member_name(c, m)}` | `{col.dtype.name}` | {PER[col.per]} | {col.meaning} |"
        for c in [*m.columns, *(m.image_columns or ())]
        if (col := COLUMNS.get(c)) is not None
    ]
    if m.image_columns is not None:  # a vision-language output: each image's bytes
        tar = fmt == "webdataset"
        where, what = ("`KEY.img{k}.{ext}`", "its original extension") if tar else ("`images`", "its name")
        rows.append(f"| {where} | image | {PER['image']} | each image's original encoded bytes and {what} |")
    if fmt == "webdataset":
        meta = ", ".join(f"`{k}`" for k in PACK_META)
        if META in pack_members(m.columns, m.layout):
            rows.append(f"| `{META}` | object | one | {meta} |")
        else:  # a minimal pack's metadata: the first fields of its record
            rows.append(
                f'| `{SMALL_COLUMNS}["KEY"]` | `int64` (`run_id`: `S{RUN_ID_BYTES}`, ASCII) | one |'
                f" the pack's metadata, KEY one of {meta} |"
            )
        rows.append("| `__key__` | string | one | the pack's global index, zero-padded (`000000123`) |")
    labels = (
        "`labels[i]` is the target of `input_ids[i]` (already shifted, per sample)"
        if m.labels == "shifted"
        else "`labels` equal `input_ids` where a loss is taken (the model shifts)"
    )
    lines = [
        "---",
        yaml.safe_dump(card_yaml(m, suffix), sort_keys=False).rstrip("\n"),
        "---",
        "",
        "# Packed sequences (packtool)",
        "",
        f"Written by `packtool pack` (packtool {m.packtool_version}, run `{m.run_id}`).",
        "",
        f"- {s.num_packs:,} packs of {m.packed_sequence_size:,} tokens, {s.num_tokens:,} real tokens "
        f"from {s.packed_samples:,} samples (fill rate {s.fill_rate:.2%})",
        f"- {fmt} shards `{SHARD_PREFIXES['train']}NNNNNN{suffix}`{val}; `{MANIFEST}` says how they were "
        "made and what happened to every input sample",
        "",
        *(VISION_TAR_READING if m.image_columns is not None and fmt == "webdataset" else LOADING),
        "",
        "Each row is one pack. Several samples sit in a pack one after the other; `seq_lens` gives their",
        "lengths (then the padding's, when the pack is not full), so attention must stay inside each sample:",
        "packtool's `docs/loader.md` shows the masks, and `packtool.loader` streams the packs into PyTorch.",
        "",
        "| column | type | values per pack | meaning |",
        "|---|---|---|---|",
        *rows,
        "",
        f"- labels: {labels}; `-100` where no loss is taken",
        f"- position ids: `{m.position_ids}`; padding token id: {m.pad_token_id}",
        *LAYOUT_NOTE.get(m.layout, []),
        *(TAR_LAYOUT_NOTE.get(m.layout, []) if fmt == "webdataset" else []),
        f"- tokenizer: `{m.tokenizer.name or m.tokenizer.kind or 'unknown'}`",
    ]
    return "\n".join(lines) + "\n"


LOADING = [
    "```python",
    "import datasets",
    'ds = datasets.load_dataset("path/to/this/directory", split="train")  # or streaming=True',
    "```",
]
# a vision tar output: datasets would drop a pack's images beyond those of the first packs it sees
VISION_TAR_READING = [
    "`datasets.load_dataset` cannot read these tar packs whole (it fixes each row's image members from the",
    "first packs it reads, so a pack with more images would lose some); read them with packtool:",
    "",
    "```python",
    "from packtool.vision.loader import vision_dataset  # or packtool.vision.energon.VisionPackTaskEncoder",
    "from packtool.vision.processor import load_processor",
    "",
    'ds = vision_dataset("path/to/this/directory", load_processor("path/to/the/model"), batch_size=4)',
    "```",
]
# the card of a minimal output says where the columns it leaves out went (a full one says nothing more)
LAYOUT_NOTE = {
    "minimal": [
        "- layout: `--columns minimal`: the columns above are all that is stored; `labels`, `position_ids`"
        " (and `loss_mask`) are rebuilt from them by packtool's readers (`packtool.read_packs`,"
        " `packtool.loader`): see packtool's docs/formats.md"
    ]
}
# datasets cannot turn a NumPy record (small_columns.npy) into Arrow: say so where the card says how to load
TAR_LAYOUT_NOTE = {
    "minimal": [
        "- tar shards of `--columns minimal` hold `input_ids.npy` (and `labels.npy` when stored) and"
        f" `{SMALL_COLUMNS}`, a NumPy record of the pack's metadata and the other columns (`numpy.load`"
        ' gives it, `rec["seq_lens"]`, `rec["run_id"]`), and no `json`; `datasets` cannot decode that'
        " record: read the packs with `packtool.read_packs`, or pack with `--columns full`"
    ]
}
PER = {
    "token": "one per token",
    "bit": "a bit per token (8 a byte)",
    "segment": "one per piece, +1 for padding",
    "piece": "one per piece",
    "image": "one per image",
}


def write_dataset_card(directory: str | Path, manifest: Manifest, suffix: str) -> str:
    """Write ``README.md`` into the output ``directory``; return its name."""
    (Path(directory) / CARD).write_text(dataset_card(manifest, suffix))
    return CARD
