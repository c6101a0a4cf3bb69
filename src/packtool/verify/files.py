"""Checks of an output as a whole: the version's notes, the files the manifest names (present, size,
sha256, no stray shard) and the manifest's totals against its shard entries."""

from __future__ import annotations

from pathlib import Path

from packtool.binding import manifest_problem
from packtool.fileio import file_sha256
from packtool.formats.registry import FORMATS, ShardFormat
from packtool.manifest import MANIFEST, Manifest, SamplesPerPack, total_stats
from packtool.safepath import output_file_problem
from packtool.storage.outputs import file_names
from packtool.verify.report import VerifyReport


def check_files(directory: Path, manifest: Manifest, report: VerifyReport, fmt: ShardFormat) -> None:
    """Every shard the manifest names exists with its recorded size and sha256; no stray shard beside."""
    named = set()
    for entry in manifest.shards:
        name = entry.path
        named.add(name)
        named.update(fmt.reader.index_files(entry))
        for index in fmt.reader.index_files(entry):  # opened by verify and the readers: inside, regular
            if (problem := output_file_problem(directory, index)) not in (None, "missing"):
                report.add("path", f"index file {problem}: not opened", shard=name, field="index")
        path = directory / name
        problem = output_file_problem(directory, name)
        if problem == "missing":
            report.add("missing", "shard named in the manifest is missing", shard=name)
            continue
        if problem is not None:
            report.add("path", f"shard file {problem}: not opened", shard=name, field="path")
            continue
        size = path.stat().st_size
        if size != entry.bytes:
            how = "truncated" if size < entry.bytes else "grown"
            report.add(
                "size",
                f"{size:,} bytes, manifest says {entry.bytes:,} ({how})",
                shard=name,
                field="bytes",
            )
        if file_sha256(path) != entry.sha256:
            report.add(
                "sha256",
                "sha256 differs from the manifest's (the file was changed)",
                shard=name,
                field="sha256",
            )
    # a shard of any format: one of another format left beside the output's own is stray too
    names = file_names(directory)  # an output in a store: the store's objects, not the cache's
    strays = {name for other in FORMATS.values() for name in names if name.endswith(other.suffix)}
    for name in sorted(strays):
        if name not in named:
            report.add("unlisted", "shard file is not in the manifest (left from another run?)", shard=name)


def check_binding(manifest: Manifest, report: VerifyReport) -> None:
    """The manifest's reading fields must give its ``run_id`` (``packtool.binding``)."""
    if (problem := manifest_problem(manifest)) is not None:
        report.add("run_id", problem, shard=MANIFEST, field="run_id")


def check_version(manifest: Manifest, report: VerifyReport) -> None:
    """What this version read by its rules but could not take in (a newer minor version's additions) is a
    note, never a problem; a newer major version is refused as the manifest is read (``Manifest.load``)."""
    report.notes.extend(manifest.notes)


def check_stats(manifest: Manifest, report: VerifyReport, per_pack: SamplesPerPack | None) -> None:
    """The manifest's totals must be those of its shard entries (each checked against its shard's data),
    and ``samples_per_pack`` (``per_pack``, None when not every pack could be read) that of the packs."""
    stats = manifest.stats
    packs = sum(e.num_packs for e in manifest.shards)
    tokens = sum(e.num_tokens for e in manifest.shards)
    basis = f"the shards' {packs:,} packs of {tokens:,} tokens give"
    for key, want in total_stats(manifest.packed_sequence_size, packs, tokens).items():
        got = getattr(stats, key)
        if got == want:
            continue
        if key in ("num_packs", "num_tokens"):
            message = f"the shards list {want:,} {key.removeprefix('num_')}, stats say {_number(got)}"
        else:
            message = f"stats say {_number(got)}, {basis} {_number(want)}"
        report.add(key, message, shard=MANIFEST, field=key)
    for wrong in stats.check():  # the fates of the samples and tokens must add up to the input
        report.add("accounting", wrong, shard=MANIFEST, field="stats")
    vocab, pad = manifest.vocab_size, manifest.pad_token_id
    if pad < 0 or (vocab is not None and pad >= vocab):
        where = f"outside the vocabulary (size {vocab})" if vocab is not None else "negative"
        report.add("pad_token_id", f"pad_token_id {pad} is {where}", shard=MANIFEST, field="pad_token_id")
    recorded = stats.samples_per_pack
    for key, want in (vars(per_pack) if per_pack else {}).items():
        got = getattr(recorded, key)
        if got != want:
            field = f"samples_per_pack.{key}"
            message = f"stats say {_number(got)}, the packs give {_number(want)}"
            report.add("samples_per_pack", message, shard=MANIFEST, field=field)


def _number(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
