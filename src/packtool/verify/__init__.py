"""``packtool verify``: prove that an output directory is whole, and (``--source``) that nothing was lost.

Three layers of checks, each problem reported with its shard, pack and field:

* **files** (``verify.files``): the manifest parses and is packtool's; every shard it names exists with the
  recorded size and sha256; no shard file (of any format) lies in the directory that the manifest does not
  name; the manifest's totals are those of its shard entries.
* **format** (the shard's ``ShardChecker.check``, in ``packtool.formats``): the shard parses, carries this
  manifest's ``run_id``, holds the recorded number of packs, and its own index agrees with it (Parquet:
  the recorded ``row_groups``; tar: the ``.tar.idx`` offsets, each pack's members, ``.npy`` dtypes and
  shapes and metadata: the ``.json``, or a minimal pack's record); the dataset-level index files say what
  the manifest says.
* **packs** (``verify.packs``, format-independent, vectorized per batch): every per-token column has ``N``
  values, ``sum(seq_lens) == N``, ``seq_lens`` and ``sample_index`` agree, padding carries ``pad_token_id``
  and labels ``-100``, labels are aligned with ``input_ids`` (text input), position ids follow the
  layout, token ids lie inside the tokenizer's vocabulary, per-shard token counts match the manifest.
  The stored columns are checked (a ``minimal`` output's ``next_label`` and ``loss_mask_bits`` too); the
  columns a layout leaves out are rebuilt (``packtool.layout``), right by construction.

A vision-language output's images (``packtool.verify.images``): one per ``image_*`` value, each span
inside its sample and free of loss, each image's header intact and of the stored size, and with the
model's processor (``--processor``) each ``image_length`` its count.

With ``--source`` (``verify.source``) the inputs are read and encoded again by the pipeline's own reader
and encoder under the manifest's ``config``, and every piece in the packs is compared token by token with
the source sample named by its ``sample_index``; every sample with no tokens in the packs must be one the
manifest counts.

Example::

    >>> report = verify_output("out/demo")  # doctest: +SKIP
    >>> report.ok, report.problems[:1]  # doctest: +SKIP
    (True, [])
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from packtool.binding import fields_problem
from packtool.errors import ConfigError, InputError, PacktoolError
from packtool.formats.registry import get_format
from packtool.manifest import MANIFEST, Manifest, SamplesPerPack, ShardEntry
from packtool.packs import PackArrays
from packtool.safepath import output_file_problem
from packtool.verify.files import check_binding, check_files, check_stats, check_version
from packtool.verify.packs import check_packs
from packtool.verify.report import MAX_LISTED, Problem, VerifyReport
from packtool.verify.source import SourceCheck

__all__ = ["MAX_LISTED", "Problem", "VerifyReport", "iter_batches", "verify_output"]


def iter_batches(
    directory: str | Path, manifest: Manifest, report: VerifyReport
) -> Iterator[tuple[int, ShardEntry, int, PackArrays]]:
    """Every readable batch of packs, checked by its format on the way: ``(shard index, shard entry,
    global index of the first pack, packs)``. What cannot be read is reported on ``report``."""
    fmt = get_format(manifest.shard_format)
    base = 0
    for i, entry in enumerate(manifest.shards):
        path = Path(directory) / entry.path
        if output_file_problem(directory, entry.path) is None:  # else check_files says why
            for first, packs in fmt.checker.check(path, entry, manifest, report, i, base):
                yield i, entry, base + first, packs
        base += entry.num_packs


def verify_output(
    directory: str | Path,
    *,
    source: list[str] | None = None,
    progress: bool = False,
    tokenizer: str | None = None,
    processor: str | None = None,
) -> VerifyReport:
    """Check the output directory ``directory``; with ``source``, re-encode those inputs and prove that
    every kept sample's tokens are in the packs exactly once (see module docstring), with ``tokenizer``
    instead of the run's when given (required when the run's is code: ``SourceCheck.start``).

    A vision-language output's images are checked too (``packtool.verify.images``); ``processor``: the
    model's processor directory, to check each image's token count (``--source`` takes the run's
    recorded one when none is given; without either, a note says the counts were not checked)."""
    directory = Path(directory)
    report = VerifyReport(str(directory))
    report.checked.update(shards=0, packs=0, tokens=0)
    if not (directory / MANIFEST).exists():  # not an output at all: an error, as for inspect
        raise InputError(f"{directory}: no {MANIFEST} (not packtool output, or an unfinished run)")
    try:
        manifest = Manifest.load(directory)
        fmt = get_format(manifest.shard_format)
    except PacktoolError as e:
        report.add("manifest", str(e), shard=MANIFEST)
        return report
    check_binding(manifest, report)
    if fields_problem(manifest) is not None:
        return report  # (check_binding said what) no figure of it can be computed with, no pack rebuilt
    if "sample_index" not in manifest.columns:  # every pack check goes by it
        why = "the manifest lists no sample_index column, which verify checks every pack by"
        report.add("columns", why, shard=MANIFEST, field="columns")
        return report
    check_version(manifest, report)
    check_files(directory, manifest, report, fmt)
    fmt.checker.check_dataset_index(directory, manifest, report)
    text_labels = manifest.sample_format == "text" and manifest.tokenizer.kind == "huggingface"
    image_check = None
    if manifest.image_columns is not None:  # a vision-language output
        image_check, source_check = _vision_checks(manifest, report, source, processor)
    else:
        source_check = (
            SourceCheck.start(manifest, source, report, progress, tokenizer) if source is not None else None
        )
    num_packs = num_tokens = num_pieces = 0
    fewest, most = sys.maxsize, 0  # pieces in one pack
    shard_tokens: Counter = Counter()
    shard_packs: Counter = Counter()
    try:
        for i, entry, first, stored in iter_batches(directory, manifest, report):
            vocab = manifest.vocab_size
            used, packs = check_packs(stored, first, entry.path, manifest, report, vocab, text_labels)
            shard_tokens[i] += int(used.sum())
            shard_packs[i] += packs.num_packs
            num_packs += packs.num_packs
            num_tokens += int(used.sum())
            pieces = np.diff(packs.sample_index_offsets)
            num_pieces += int(pieces.sum())
            fewest, most = int(pieces.min(initial=fewest)), int(pieces.max(initial=most))
            if source_check is not None:
                source_check.add(packs, used, first, entry.path)
            if image_check is not None:
                image_check.add(packs, first, entry.path)
        all_read = True
        for i, entry in enumerate(manifest.shards):
            if shard_packs[i] != entry.num_packs:
                all_read = False
            elif shard_tokens[i] != entry.num_tokens:
                report.add(
                    "num_tokens",
                    f"holds {shard_tokens[i]:,} tokens, manifest says {entry.num_tokens:,}",
                    shard=entry.path,
                    field="num_tokens",
                )
        per_pack = SamplesPerPack.of(num_packs, num_pieces, fewest, most) if all_read else None
        check_stats(manifest, report, per_pack)
        if image_check is not None:
            image_check.finish(all_read)
        if source_check is not None:
            source_check.finish()
    finally:
        if source_check is not None:
            source_check.close()
    report.checked.update(shards=len(manifest.shards), packs=num_packs, tokens=num_tokens)
    return report


def _vision_checks(manifest: Manifest, report: VerifyReport, source: list[str] | None, processor: str | None):
    """The image checks of a vision-language output, and its ``--source`` check (``packtool.verify.images``;
    the run's recorded processor is opened only for ``--source``, which opens the recorded inputs too)."""
    from packtool.verify import images  # the vision extra (Pillow, transformers): for image outputs only

    if processor is None and source is not None:
        processor = images.recorded_processor(manifest).get("path")
    vision_processor = images.open_processor(manifest, report, processor)
    image_check = images.ImageCheck(manifest, report, vision_processor)
    if source is None:
        return image_check, None
    if vision_processor is None:
        raise ConfigError("--source: the run's processor is not recorded: pass --processor DIR")
    return image_check, images.VisionSourceCheck.begin(manifest, source, report, vision_processor)
