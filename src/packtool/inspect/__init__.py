"""``packtool inspect``: how good is this packing? Figures, per-shard table and histograms of an output.

By default everything comes from the manifest and the shards' own metadata (the Parquet footer; for a
tar shard its ``.tar.idx`` and the metadata of its first and last packs: their ``.json``, or a minimal
pack's record), so ``inspect`` takes the same time for 10 packs or 10 million. ``full=True`` (``--full``)
reads every pack and recomputes the figures from the data, flagging any that differ from the manifest.

Example::

    >>> report = inspect_report("out/demo")  # doctest: +SKIP
    >>> report["fill_rate"], report["num_packs"], report["lower_bound_packs"]  # doctest: +SKIP
    (0.9746, 133, 131)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from packtool.binding import manifest_problem
from packtool.errors import ConfigError, InputError
from packtool.fileio import file_sha256
from packtool.formats.base import UNIT_ERRORS
from packtool.formats.registry import get_format
from packtool.inspect.sources import locate_samples
from packtool.layout import rebuild
from packtool.manifest import IGNORE_INDEX, Histogram, Manifest, SamplesPerPack, total_stats
from packtool.reading import load_manifest, shard_file_problem
from packtool.safepath import output_file_problem
from packtool.schema import one_pack_offsets, per_pack_sum, piece_lengths, piece_spans, piece_starts
from packtool.stats import image_stats
from packtool.tokenizing.tokenizer import HFTokenizer
from packtool.verify import Problem, VerifyReport, iter_batches


def inspect_report(directory: str | Path, *, full: bool = False) -> dict:
    """The figures of an output directory as one dict (what ``inspect --json`` prints).

    Top-level keys are the manifest's ``stats`` (``num_samples``, ``num_packs``, ``num_tokens``,
    ``fill_rate``, ``padding_tokens``, ``lower_bound_packs``, ``dropped_samples``, ...) plus
    ``packed_sequence_size``, ``strategy``, ``provenance``, ``tokenizer``, ``shards`` (each with
    ``fill_rate`` and what its own metadata says) and ``histograms``. ``warnings`` lists every
    disagreement between the manifest and the files; ``full`` adds ``recomputed`` (from the data).
    """
    m = load_manifest(directory)  # its fields of their types: the report computes with them
    n = m.packed_sequence_size
    fmt = get_format(m.shard_format)
    warnings: list[str] = []
    shards = []
    for i, entry in enumerate(m.shards):
        sh = {k: getattr(entry, k) for k in ("path", "num_packs", "num_tokens", "bytes")}
        sh["row_groups"] = fmt.reader.units(entry) if fmt.reader.unit_kind else None  # the read units
        sh["split"] = entry.split or "train"
        sh["fill_rate"] = total_stats(n, entry.num_packs, entry.num_tokens)["fill_rate"]
        path = Path(directory) / entry.path
        problem = shard_file_problem(directory, entry)
        if problem is not None:
            warnings.append(f"{entry.path}: {problem}")
        if output_file_problem(directory, entry.path) is not None:  # not opened: missing, outside, a FIFO
            shards.append(sh)
            continue
        try:
            own = fmt.reader.summary(path)
        except Exception as e:  # any damage: a warning here, verify says exactly what
            warnings.append(f"{entry.path}: metadata unreadable ({str(e).splitlines()[0]})")
        else:
            recorded_fields = entry.to_dict()  # the common fields and the format's own
            for key, value in own.items():
                recorded = {"run_id": m.run_id, "shard": i}.get(key, recorded_fields.get(key, value))
                if value != recorded:
                    warnings.append(f"{entry.path}: {key} {value} in the file, {recorded} in the manifest")
        shards.append(sh)
    stats = m.stats.to_dict()
    losses = m.stats.losses(m.packed_sequence_size, m.option("max_packs"))
    lost = [f"lost: {line}" for line in [*m.warnings, *losses]]
    warnings[:0] = lost + [f"manifest: {w}" for w in m.stats.check()]
    if (problem := manifest_problem(m)) is not None:  # what it shows (provenance, processor) is not the run's
        warnings.insert(len(lost), f"manifest: {problem}")
    report = {
        "directory": str(directory),
        "run_id": m.run_id,
        "packed_sequence_size": n,
        "strategy": m.option("strategy"),
        "shard_format": m.shard_format,
        "sample_format": m.sample_format,
        "labels": m.labels,
        "empty_loss": m.option("empty_loss"),
        "position_ids": m.position_ids,
        "tokenizer": m.tokenizer.to_dict(),
        "inputs": [dataclasses.asdict(i) for i in m.inputs],
        "provenance": m.provenance,
        "settings": settings(m),
        **stats,
        "val_packs": sum(e.num_packs for _, e in m.split_shards("val")),  # held out (val_fraction)
        "input_samples": m.stats.input_samples,
        "sample_fates": m.stats.sample_fates(),
        "token_fates": m.stats.token_fates(),
        "losses": losses,
        "notes": m.notes,
        "shards": shards,
        "histograms": {k: dataclasses.asdict(h) for k, h in m.histograms.items()},
        "warnings": warnings,
    }
    images = image_report(m)
    if images is not None:  # a vision-language output
        report["images"] = images
        report["histograms"]["images_per_pack"] = images.pop("images_per_pack_histogram")
    if full and "sample_index" not in m.columns:  # every figure is recomputed by it
        warnings.append("manifest: it lists no sample_index column; the figures cannot be recomputed")
    elif full:
        report["recomputed"] = recompute_stats(directory, m, warnings)
        for key, value in report["recomputed"].items():
            if key in stats and value != stats[key]:
                warnings.append(f"{key}: {value} in the data, {stats[key]} in the manifest")
        for key, value in report["recomputed"].get("images", {}).items():
            recorded = (images or {}).get(key)
            if key in IMAGE_FIGURES and value != recorded:
                warnings.append(f"images: {key} {value} in the data, {recorded} in the manifest")
    return report


# the image figures inspect --full compares with the manifest's (the others follow from them)
IMAGE_FIGURES = ("images", "image_tokens", "images_per_pack_max", "tokens_per_image_max", "step_spread_max")


def image_report(m: Manifest) -> dict | None:
    """A vision-language output's image figures, from its manifest (``vision``: ``stats.image_stats`` of
    the packs in their order, the images read, packed and dropped, the processor), with the images-per-pack
    histogram as the report's histograms hold them; None for text."""
    vision = m.vision if isinstance(m.vision, dict) else None
    if vision is None or not isinstance(vision.get("images"), dict):
        return None
    figures = dict(vision["images"])
    counts = {int(k): int(v) for k, v in (figures.get("images_per_pack_histogram") or {}).items()}
    top = max(counts, default=0)
    histogram = {"edges": list(range(top + 2)), "counts": [counts.get(i, 0) for i in range(top + 1)]}
    processor = vision.get("processor") if isinstance(vision.get("processor"), dict) else {}
    return {
        **figures,
        "images_per_pack_histogram": histogram,
        **{k: vision.get(k) for k in ("input_images", "packed_images", "dropped_images")},
        "processor": processor.get("path"),
    }


def settings(m: Manifest) -> dict:
    """The settings of the run as its provenance records them (what ``inspect`` shows as settings; None
    where it records none: an option the writing version did not have, or one that does not apply)."""
    c, tok = m.option, m.tokenizer
    bfd = c("strategy") == "bfd"
    return {
        "packed_sequence_size": m.packed_sequence_size,
        "sample_format": m.sample_format,
        "strategy": c("strategy"),
        "seed": c("seed") if bfd and c("shuffle_packs") else None,
        "shuffle_packs": c("shuffle_packs") if bfd else None,
        "split_across_pack": c("split_across_pack"),
        "long_samples": None if c("split_across_pack") else c("long_samples"),
        "max_packs": c("max_packs"),
        "cp_size": c("cp_size"),
        "val_fraction": c("val_fraction"),
        "position_ids": m.position_ids,
        "labels": m.labels,
        "add_bos": c("add_bos"),
        "add_eos": c("add_eos"),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": m.pad_token_id,
        "empty_loss": c("empty_loss") if m.sample_format in ("prompt_completion", "chat") else None,
        # which tokens are trained, for the formats that choose (chat: loss_on; prompt_completion: the prompt)
        "loss_on": c("loss_on") if m.sample_format == "chat" else None,
        "train_on_prompt": c("train_on_prompt") if m.sample_format == "prompt_completion" else None,
        "on_error": c("on_error"),
        "shard_format": m.shard_format,
        "columns": m.layout,
        "shard_size": c("shard_size"),
        "row_group_size": c("row_group_size") if get_format(m.shard_format).reader.unit_kind else None,
    }


def recompute_stats(directory: str | Path, manifest: Manifest, warnings: list[str] | None = None) -> dict:
    """Read every pack and compute the figures again from ``seq_lens`` and ``sample_index``.

    What cannot be read is left out of the figures and described in ``warnings``."""
    n = manifest.packed_sequence_size
    check = VerifyReport(str(directory))
    used, per_pack, pieces_sample, pieces_len = [], [], [], []
    image_lengths, images_per_pack = [], []  # a vision-language output's
    for _, _, _, packs in iter_batches(directory, manifest, check):
        if packs.image_sample_offsets is not None:
            image_lengths.append(packs.image_length.astype(np.int64))
            images_per_pack.append(np.diff(packs.image_sample_offsets))
        lengths = packs.piece_lengths()  # the pieces' own tokens: their cp_size padding is padding
        used.append(per_pack_sum(lengths, packs.sample_index_offsets))
        per_pack.append(packs.pieces_per_pack())
        pieces_sample.append(packs.sample_index.astype(np.int64))
        pieces_len.append(lengths)
    if warnings is not None:
        warnings.extend(str(problem) for problem in check.problems)
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)  # noqa: E731
    used, per_pack, sample, length = cat(used), cat(per_pack), cat(pieces_sample), cat(pieces_len)
    num_packs, num_tokens = len(used), int(used.sum())
    pack_of_piece = np.repeat(np.arange(num_packs), per_pack)
    uniq_pairs = np.unique(sample * max(num_packs, 1) + pack_of_piece)
    packs_of_sample = np.bincount(uniq_pairs // max(num_packs, 1)) if len(uniq_pairs) else np.zeros(0)
    kept = np.bincount(sample, weights=length) if len(sample) else np.zeros(0)
    kept = kept[kept > 0].astype(np.int64)
    # samples spread over several packs; not with max_packs, whose manifest counts the samples split before
    # the cut (one cut at the boundary may have kept a single piece of them): the packs cannot tell
    split = {} if manifest.option("max_packs") else {"split_samples": int((packs_of_sample > 1).sum())}
    spp = SamplesPerPack.of(
        num_packs,
        len(sample),
        int(per_pack.min()) if num_packs else 0,
        int(per_pack.max()) if num_packs else 0,
    )
    images = {}
    if manifest.image_columns is not None and num_packs:
        ranks = int((manifest.vision or {}).get("images", {}).get("ranks", 8))
        offsets = np.concatenate([[0], np.cumsum(cat(images_per_pack))])
        images = {"images": image_stats(cat(image_lengths), offsets, np.full(num_packs, n), ranks)}
    return {
        **total_stats(n, num_packs, num_tokens),
        **images,
        "packed_samples": len(kept),
        "samples_per_pack": dataclasses.asdict(spp),
        **split,
        "histograms": {
            "packed_sample_lengths": dataclasses.asdict(Histogram.lengths(kept, 1)),
            "pack_fill": dataclasses.asdict(Histogram.pack_fill(used, n)),
            "samples_per_pack": dataclasses.asdict(Histogram.per_pack(per_pack)),
        },
    }


# --- one pack ----------------------------------------------------------------------------------------
def read_one_pack(directory: str | Path, manifest: Manifest, index: int) -> tuple[dict, str, int]:
    """Pack ``index`` (global, 0-based) as a dict of arrays (with ``sample_index``); its shard and row.

    The pack is read alone where the format allows (its Parquet row group, its bytes through a tar
    shard's ``.tar.idx``); failing that the shard is read in order, as ``verify`` reads it. Raises
    ``InputError`` naming the shard, the pack and why when the pack cannot be read either way.
    """
    total = manifest.num_packs
    if not 0 <= index < total:
        raise ConfigError(f"--pack {index}: the output has {total:,} packs (0..{total - 1})")
    base, shard = 0, 0
    for shard, entry in enumerate(manifest.shards):  # noqa: B007 - the loop finds the pack's shard
        if index < base + entry.num_packs:
            break
        base += entry.num_packs
    row = index - base
    path = Path(directory) / entry.path
    fmt = get_format(manifest.shard_format)
    check = VerifyReport(str(directory))
    if (problem := output_file_problem(directory, entry.path)) is not None:
        check.add("path", f"the shard file {problem}", shard=entry.path)
    elif (pack := fmt.reader.read_pack(path, entry, row, manifest)) is not None:  # the pack alone
        return pack, entry.path, row
    else:  # read in order: the packs that can be read, and what is wrong with the others
        for first, packs in fmt.checker.check(path, entry, manifest, check, shard, base):
            if first <= row < first + packs.num_packs:
                try:  # the pack as stored, as readers give it
                    one = rebuild(packs.take([row - first]), manifest)
                except UNIT_ERRORS as e:  # a layout the rebuild cannot follow
                    check.add("layout", f"cannot be rebuilt ({e})", shard=entry.path, pack=index)
                    break
                return one.pack(0, with_sample_index=True), entry.path, row
    raise InputError(f"{path}: pack {index} cannot be read{_why(check.problems, index)}; run packtool verify")


def _why(problems: list[Problem], index: int) -> str:
    """What is wrong with pack ``index``, as `` (reason)``, from the problems found reading its shard: the
    one at that pack, else the last one before it or about the whole shard; ``""`` if none."""
    before = [p for p in problems if p.pack is None or p.pack <= index]
    if not before:
        return ""
    found = ([p for p in before if p.pack == index] or before)[-1]
    return f" ({replace(found, shard=None, pack=None if found.pack == index else found.pack)})"


def pack_report(
    directory: str | Path,
    index: int,
    *,
    decode: bool = False,
    tokenizer: str | None = None,
    locate: bool = False,
) -> dict:
    """One pack: its ``seq_lens``, ``sample_index``, and where each piece comes from.

    Returns ``{"pack", "shard", "row", "seq_lens", "sample_index", "pieces": [...], "padding_tokens",
    "fill_rate"}``, and for a vision-language pack ``images``: each image's ``piece``, ``offset`` and
    ``length`` (its run of image tokens), ``height``, ``width``, ``name`` and ``bytes``. Each piece has
    ``sample_index``, ``offset`` (its place in the pack), ``length``, ``sample_offset`` (where it starts
    in its sample), ``continuation`` (it continues a sample begun in an earlier pack) and ``source``
    (``{"source", "row_kind", "row", "sample_in_source"}``; ``row`` is found with ``locate``, which reads
    the run's input files). With ``decode``, ``text`` and ``segments``: the text cut where the tokens go
    from trained (a target of the loss) to untrained and back, decoded with the run's tokenizer (or
    ``tokenizer``). Without ``locate`` and ``decode`` nothing outside ``directory`` is opened.
    """
    m = load_manifest(directory)
    if "sample_index" not in m.columns:
        raise InputError(f"{directory}: the manifest lists no sample_index column; pieces cannot be traced")
    n = m.packed_sequence_size
    pack, shard, row = read_one_pack(directory, m, index)
    seq_lens = [int(x) for x in pack["seq_lens"]]
    samples = [int(x) for x in pack["sample_index"]]
    starts = [int(x) for x in pack.get("sample_offset", np.zeros(len(samples), dtype=np.int64))]
    layout = (pack["seq_lens"], *one_pack_offsets(pack["seq_lens"], len(samples)))
    cp_padding = [int(x) for x in pack.get("cp_padding", np.zeros(len(samples), dtype=np.int64))]
    lengths = piece_lengths(*layout, np.array(cp_padding, dtype=np.int64))  # less cp_size padding
    offsets = piece_starts(piece_spans(*layout), layout[2])
    used = int(lengths.sum())
    where = locate_samples(directory, m, samples, read_inputs=locate)
    pieces = [
        {
            "sample_index": s,
            "offset": int(o),
            "length": int(length),
            "sample_offset": start,
            "continuation": start > 0,
            "source": where.get(s),
            **({"cp_padding": cp} if "cp_padding" in pack else {}),
        }
        for s, o, length, start, cp in zip(samples, offsets, lengths, starts, cp_padding, strict=True)
    ]
    out = {
        "pack": index,
        "shard": shard,
        "row": row,
        "seq_lens": seq_lens,
        "sample_index": samples,
        "padding_tokens": n - used,
        "fill_rate": round(used / n, 6),
        "pieces": pieces,
    }
    if "image_offset" in pack:  # a vision-language pack: each image's span and what it is
        out["images"] = [
            {
                "piece": int(pack["image_sample"][k]),
                "offset": int(pack["image_offset"][k]),
                "length": int(pack["image_length"][k]),
                "height": int(pack["image_height"][k]),
                "width": int(pack["image_width"][k]),
                "name": image.get("path") if isinstance(image, dict) else None,
                "bytes": len(image.get("bytes") or b"") if isinstance(image, dict) else 0,
            }
            for k, image in enumerate(pack.get("images") or [{}] * len(pack["image_offset"]))
        ]
    if decode:
        tok = load_tokenizer(m, tokenizer, directory)
        ids = pack["input_ids"]
        trained = trained_tokens(pack["labels"], pack["seq_lens"], m.labels)
        for p in pieces:
            a, b = p["offset"], p["offset"] + p["length"]
            cuts = [a, *(a + 1 + np.flatnonzero(np.diff(trained[a:b].astype(np.int8)))).tolist(), b]
            p["text"], texts = decode_segments(tok, ids, cuts)
            p["segments"] = [
                {"trained": bool(trained[x]), "text": text} for x, text in zip(cuts[:-1], texts, strict=True)
            ]
    return out


def decode_segments(tok: HFTokenizer, ids: np.ndarray, cuts: list[int]) -> tuple[str, list[str]]:
    """The text of ``ids[cuts[0]:cuts[-1]]`` decoded whole, and its parts between the ``cuts``.

    Each part is cut from the whole text at the length of the text its tokens so far decode to, not
    decoded alone: a WordPiece continuation (``##cloud``) or a byte-level piece of a character decodes
    to something else on its own (``g ##cloud`` read ``g##cloud``). Where a prefix does not decode to
    the start of the whole text (a character split between parts), the cut falls where they agree.
    """
    a, b = cuts[0], cuts[-1]
    whole = tok.decode([int(t) for t in ids[a:b]])
    at = [0]
    for c in cuts[1:-1]:
        prefix = tok.decode([int(t) for t in ids[a:c]])
        same = len(os.path.commonprefix([prefix, whole]))
        at.append(max(same, at[-1]))
    at.append(len(whole))
    return whole, [whole[x:y] for x, y in zip(at[:-1], at[1:], strict=True)]


def trained_tokens(labels: np.ndarray, seq_lens: np.ndarray, convention: str) -> np.ndarray:
    """``(N,)`` bool: the tokens of a pack the loss trains the model to produce.

    ``unshifted`` labels name the token itself; ``shifted`` labels at ``i`` name token ``i + 1``, so a
    token is trained when the label before it is not -100 (the first token of every ``seq_lens`` entry
    is not: no earlier token of its piece predicts it).

    >>> trained_tokens(np.array([-100, 7, 8, -100, 5, -100]), np.array([4, 2]), "shifted").tolist()
    [False, False, True, True, False, True]
    """
    taken = np.asarray(labels) != IGNORE_INDEX
    if convention != "shifted":
        return taken
    out = np.zeros(len(taken), dtype=bool)
    out[1:] = taken[:-1]
    out[np.cumsum(np.asarray(seq_lens, dtype=np.int64))[:-1]] = False
    return out


def load_tokenizer(
    manifest: Manifest, override: str | None = None, directory: str | Path | None = None
) -> HFTokenizer:
    """``HFTokenizer`` for the manifest's ``tokenizer`` entry (or ``override``); checks its sha256.

    The run's tokenizer is looked for where the run found it: its name as given (relative to the working
    directory), its absolute ``path``, then its name relative to the output ``directory``; the error
    names every place tried.
    """
    ident = manifest.tokenizer
    if override:
        if not Path(override).exists():
            raise ConfigError(f"--tokenizer {override}: not found")
        return HFTokenizer(override)
    if not ident.name or ident.kind != "huggingface":
        raise ConfigError(
            f"the manifest names no Hugging Face tokenizer (tokenizer kind {ident.kind!r}); "
            "pass --tokenizer PATH to decode"
        )
    tried = [ident.name, ident.details.get("path")]
    if directory is not None and not Path(ident.name).is_absolute():
        tried.append(str(Path(directory) / ident.name))
    tried = list(dict.fromkeys(t for t in tried if t))
    spec = next((t for t in tried if Path(t).exists()), None)
    if spec is None:
        raise ConfigError(
            f"tokenizer of the run not found: tried {', '.join(tried)}; pass --tokenizer PATH to decode"
        )
    tok = HFTokenizer(spec)
    if ident.sha256 and tok.hash_file and file_sha256(tok.hash_file) != ident.sha256:
        raise ConfigError(
            f"tokenizer {spec} has changed since the run (sha256 differs from the manifest's); "
            "pass --tokenizer PATH to decode with it anyway"
        )
    return tok
