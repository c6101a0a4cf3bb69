"""``--columns minimal`` against ``--columns full`` through the CLI: the same packs, bit for bit, from
``read_packs``, the loader, ``inspect`` and ``verify`` (``--source`` too), for every kind of input, with
and without ``--split-across-pack``, in both shard formats; the manifest and the card say what is stored;
a bad value is a one-line usage error."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.inspect import inspect_report, pack_report
from packtool.loader import PackedDataset, get_loader
from packtool.reading import load_manifest, read_packs
from packtool.verify import VerifyReport, iter_batches, verify_output
from tests.conftest import (
    DEMO,
    DEMO_TOKENIZER,
    manifest_json,
    masked_rows,
    rewrite_tar_members,
    run_cli,
    write_jsonl,
)

N = 128


def _pretokenized(root: Path, labels: str | None, mask: bool) -> Path:
    """Pretokenized records: ids (and a random loss_mask); ``labels`` ``shifted`` (the next id, -100 at
    the end: what the rule rebuilds) or ``own`` (ids of no rule: stored)."""
    rows = masked_rows(150, 1, 2 * N, 1000, seed=1)
    rng = np.random.default_rng(2)
    for r in rows:
        if labels == "shifted":
            r["labels"] = r["input_ids"][1:] + [-100]
        elif labels == "own":
            r["labels"] = rng.integers(0, 1000, len(r["input_ids"])).tolist()
        if not mask:
            del r["loss_mask"]
    return write_jsonl(root / f"pretokenized-{labels}-{mask}.jsonl", rows)


def _head(root: Path, name: str, lines: int) -> Path:
    path = root / name
    path.write_text("".join((DEMO / name).read_text().splitlines(keepends=True)[:lines]))
    return path


# kind: (input, flags); every kind of labels the encoders make, and pretokenized labels of the input's own
KINDS = {
    "text": (lambda r: _head(r, "train.jsonl", 150), ["--tokenizer", DEMO_TOKENIZER, "--add-eos"]),
    "ids": (lambda r: _pretokenized(r, None, False), []),
    "ids-mask": (lambda r: _pretokenized(r, None, True), []),
    "ids-mask-unshifted": (lambda r: _pretokenized(r, None, True), ["--labels", "unshifted"]),
    "ids-labels": (lambda r: _pretokenized(r, "shifted", False), []),
    "ids-own-labels": (lambda r: _pretokenized(r, "own", False), []),
    "ids-own-labels-mask": (lambda r: _pretokenized(r, "own", True), []),
    "prompt-completion": (
        lambda r: _head(r, "alpaca.jsonl", 120),
        [
            "--sample-format",
            "prompt_completion",
            "--prompt-template",
            "alpaca",
            "--completion-field",
            "output",
            "--tokenizer",
            DEMO_TOKENIZER,
            "--add-eos",
        ],
    ),  # fmt: skip
    "chat": (
        lambda r: _head(r, "chat.jsonl", 60),
        ["--sample-format", "chat", "--tokenizer", DEMO / "chat-tokenizer"],
    ),
}
# context-parallel padding inside the pieces, and a validation split beside the training packs
CP = ["--cp-size", "2", "--val-fraction", "0.2"]
KINDS["text-cp"] = (KINDS["text"][0], [*KINDS["text"][1], *CP])
KINDS["ids-mask-cp"] = (KINDS["ids-mask"][0], CP)
# webdataset: the kinds that store each of the minimal columns (next_label, loss_mask_bits, labels)
CASES = (
    [(k, s, "parquet") for k in KINDS if not k.endswith("-cp") for s in (False, True)]
    + [
        (k, s, "webdataset")
        for k in ("text", "ids-mask", "ids-own-labels-mask", "ids-mask-unshifted")
        for s in (False, True)
    ]
    + [(k, False, fmt) for k in ("text-cp", "ids-mask-cp") for fmt in ("parquet", "webdataset")]
)


def _pack(tmp_path: Path, kind: str, split: bool, fmt: str) -> tuple[Path, Path]:
    make, flags = KINDS[kind]
    src = make(tmp_path)
    base = ["pack", src, "--packed-sequence-size", N, "--format", fmt, "--shard-size", 20, *flags]
    base += ["--split-across-pack"] if split else ["--long-samples", "truncate"]
    if fmt == "parquet":
        base += ["--row-group-size", 8]
    outs = (tmp_path / "full", tmp_path / "minimal")
    run_cli(*base, "-o", outs[0], "-q")
    proc = run_cli(*base, "-o", outs[1], "--columns", "minimal")  # not quiet: its notes are asserted
    assert ("stores labels" in proc.stderr) == kind.startswith("ids-own"), proc.stderr
    return outs


def _loader_batches(out: Path) -> list:
    ds = PackedDataset(out, batch_size=3, shuffle=True, seed=1, drop_last=False)
    return list(get_loader(ds, num_workers=0))


@pytest.mark.parametrize("kind, split, fmt", CASES)
def test_minimal_gives_the_packs_of_full(tmp_path, kind, split, fmt):
    full, minimal = _pack(tmp_path, kind, split, fmt)
    m = load_manifest(minimal)
    stored = set(m.columns)
    assert m.layout == "minimal" and load_manifest(full).layout == "full"
    assert {"position_ids", "loss_mask"}.isdisjoint(stored)
    assert ("labels" in stored) == kind.startswith("ids-own")
    assert ("next_label" in stored) == ("labels" not in stored and "unshifted" not in kind)
    assert ("loss_mask_bits" in stored) == load_manifest(full).has_loss_mask
    if split and "next_label" in stored:  # a split sample's piece ends on a label in the next pack
        batches = iter_batches(minimal, m, VerifyReport(str(minimal)))
        assert any((packs.next_label >= 0).any() for *_, packs in batches)

    # read_packs: every pack, every column, dtype and value
    a, b = list(read_packs(full, with_sample_index=True)), list(read_packs(minimal, with_sample_index=True))
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)
        for name in x:
            assert x[name].dtype == y[name].dtype and np.array_equal(x[name], y[name]), name

    # the loader: the same batches, field by field
    for x, y in zip(_loader_batches(full), _loader_batches(minimal), strict=True):
        for name in (
            "input_ids",
            "labels",
            "position_ids",
            "loss_mask",
            "seq_lens",
            "cu_seqlens",
            "pack_index",
        ):
            u, v = getattr(x, name), getattr(y, name)
            assert (u is None and v is None) or (u.dtype == v.dtype and bool((u == v).all())), name

    # verify: both pass, over the same packs and tokens; minimal's rebuilt labels match the re-encoded source
    reports = [verify_output(full), verify_output(minimal, source=[])]
    for report in reports:
        assert report.ok, report.problems
    assert reports[0].checked.items() <= reports[1].checked.items()  # the same shards, packs and tokens

    # inspect: one pack, and the figures recomputed from every pack
    for index in (0, len(a) // 2, len(a) - 1):
        assert pack_report(minimal, index) == pack_report(full, index)
    assert inspect_report(minimal, full=True)["recomputed"] == inspect_report(full, full=True)["recomputed"]


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_inspect_decodes_the_same_trained_text(tmp_path, fmt):
    """``inspect --pack --decode``'s trained / untrained segments come from the labels: the same."""
    full, minimal = _pack(tmp_path, "prompt-completion", False, fmt)
    for index in (0, 5):
        got = [
            json.loads(run_cli("inspect", out, "--pack", index, "--decode", "--json").stdout)
            for out in (full, minimal)
        ]
        assert got[0] == got[1]
        assert any(not s["trained"] for p in got[0]["pieces"] for s in p["segments"])
    settings = json.loads(run_cli("inspect", minimal, "--json").stdout)["settings"]
    assert settings["columns"] == "minimal"


def test_manifest_and_card_say_what_is_stored(tmp_path):
    full, minimal = _pack(tmp_path, "ids-mask", False, "parquet")
    doc = manifest_json(minimal)
    assert doc["layout"] == "minimal" and manifest_json(full)["layout"] == "full"
    assert doc["columns"] == [
        "input_ids",
        "seq_lens",
        "sample_index",
        "sample_offset",
        "next_label",
        "loss_mask_bits",
    ]
    assert pq.ParquetFile(minimal / doc["shards"][0]["path"]).schema_arrow.names == doc["columns"]
    card = (minimal / "README.md").read_text()
    assert "`loss_mask_bits`" in card and "`position_ids`" in card and "--columns minimal" in card
    assert "--columns minimal" not in (full / "README.md").read_text()
    run_cli("verify", minimal)  # exit 0


@pytest.mark.parametrize(
    "damage, message",
    [
        ("value", "field 'next_label': next_label -5 of piece 0 is neither -100 nor a token id"),
        ("count", "field 'next_label': has 0 values, expected one per sample_index entry: "),
    ],
)
def test_verify_names_a_damaged_next_label(tmp_path, damage, message):
    """verify still checks what it checks, here in the column minimal stores for the labels: pack 0's
    first next_label made negative, or pack 0 left without its next_label values."""
    _, minimal = _pack(tmp_path, "text", True, "parquet")
    shard = minimal / load_manifest(minimal).shards[0].path
    table = pq.read_table(shard)
    col = table.column("next_label").combine_chunks()
    values, offsets = col.values.to_numpy().copy(), col.offsets.to_numpy().copy()
    if damage == "value":
        values[0] = -5
    else:
        values, offsets = values[offsets[1] :], np.r_[0, offsets[1:] - offsets[1]]
    column = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values))
    damaged = table.set_column(table.column_names.index("next_label"), "next_label", column)
    metadata = pq.ParquetFile(shard).schema_arrow.metadata
    pq.write_table(damaged.replace_schema_metadata(metadata), shard, row_group_size=8, compression="zstd")
    proc = run_cli("verify", minimal, check=False)
    assert proc.returncode == 1
    assert message in proc.stdout + proc.stderr, proc.stdout


def _record_bytes(fields: dict[str, np.ndarray]) -> bytes:
    """A small_columns.npy member holding ``fields``, as numpy writes it."""
    rec = np.empty((), [(name, a.dtype, a.shape) for name, a in fields.items()])
    for name, a in fields.items():
        rec[name] = a
    buf = io.BytesIO()
    np.save(buf, rec, allow_pickle=False)
    return buf.getvalue()


def test_verify_names_a_damaged_small_columns_member(tmp_path):
    """A minimal tar pack's small columns and metadata are fields of one member, small_columns.npy (there
    is no .json): verify names that member when it is missing or does not parse, its missing fields, and a
    damaged field by its column or metadata key."""
    _, minimal = _pack(tmp_path, "ids-mask", False, "webdataset")
    shard = minimal / load_manifest(minimal).shards[0].path

    def change(packs):
        def fields(key: str) -> dict[str, np.ndarray]:
            rec = np.load(io.BytesIO(packs[key]["small_columns.npy"]), allow_pickle=False)
            return {name: rec[name] for name in rec.dtype.names}

        del packs["000000001"]["small_columns.npy"]
        data = packs["000000002"]["small_columns.npy"]
        packs["000000002"]["small_columns.npy"] = b"\x00" + data[1:]  # not the .npy magic
        packs["000000003"]["small_columns.npy"] = _record_bytes(
            {k: v for k, v in fields("000000003").items() if k != "next_label"}
        )
        f = fields("000000004")
        packs["000000004"]["small_columns.npy"] = _record_bytes(
            {**f, "seq_lens": f["seq_lens"].astype(np.int64)}
        )
        f = fields("000000005")
        packs["000000005"]["small_columns.npy"] = _record_bytes(
            {**f, "next_label": np.r_[-5, f["next_label"][1:]]}
        )
        # the metadata fields: a wrong value, another dtype, one missing
        f = fields("000000006")
        packs["000000006"]["small_columns.npy"] = _record_bytes({**f, "pack_index": np.int64(60)})
        f = fields("000000007")
        packs["000000007"]["small_columns.npy"] = _record_bytes({**f, "run_id": f["run_id"].astype("U16")})
        f = fields("000000008")
        packs["000000008"]["small_columns.npy"] = _record_bytes(
            {k: v for k, v in f.items() if k != "num_tokens"}
        )

    rewrite_tar_members(shard, change)
    proc = run_cli("verify", minimal, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1
    name = shard.name
    assert f"{name}, pack 1: missing member(s) 000000001.small_columns.npy" in text
    assert f"{name}, pack 2: member 000000002.small_columns.npy has a bad .npy header" in text
    assert (
        f"{name}, pack 3, field 'next_label': 000000003.small_columns.npy has no field(s) next_label" in text
    )
    assert f"{name}, pack 4, field 'seq_lens': int64 array of shape (" in text
    assert "expected a 1-D int32 array (a field of 000000004.small_columns.npy)" in text
    assert (
        f"{name}, pack 5, field 'next_label': next_label -5 of piece 0 is neither -100 nor a token id" in text
    )
    assert (
        f"{name}, pack 6, field 'pack_index': 000000006.small_columns.npy says pack_index 60, expected 6"
        in text
    )
    assert f"{name}, pack 7, field 'run_id': a <U16 value, expected |S16 (a field of 000000007." in text
    assert (
        f"{name}, pack 8, field 'num_tokens': 000000008.small_columns.npy has no field(s) num_tokens" in text
    )
    assert "pack 0," not in text and "pack 9," not in text, text
    # every pack's member is the record: no .json
    with tarfile.open(minimal / load_manifest(minimal).shards[1].path) as tar:
        assert {m.name.partition(".")[2] for m in tar.getmembers()} == {"input_ids.npy", "small_columns.npy"}


@pytest.mark.parametrize(
    "how",
    [["--columns", "compact"], ["--config", "bad.yaml"]],
    ids=["flag", "config-file"],
)
def test_a_bad_columns_value_is_a_usage_error(tmp_path, how):
    src = write_jsonl(tmp_path / "in.jsonl", [{"input_ids": [1, 2, 3]}])
    (tmp_path / "bad.yaml").write_text("columns: compact\n")
    proc = run_cli(
        "pack", src, "--packed-sequence-size", 8, "-o", tmp_path / "out", *how, check=False, cwd=tmp_path
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "columns" in lines[0] and "compact" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()
