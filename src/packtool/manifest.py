"""The manifest of an output directory and its shard entries, each defined once here (the pack columns:
``packtool.schema``, importable from here too).

``manifest.json`` is written last by ``packtool pack``: a directory without one is not a finished output.
It says what the packs hold (``packed_sequence_size``, the ``columns`` and their ``layout``, the
``labels`` and ``position_ids`` conventions, the pad id, the tokenizer), what happened to every input
sample (``stats``) and where the packs are (``shards``): what a reader needs. How they were made
(``provenance``: the options of the run, ``inputs``) is a record for people and for ``verify --source``,
which readers never parse strictly. Everything else in packtool reads it through ``Manifest``
(``Manifest.load(directory)``), never by string keys.

The reading contract (docs/formats.md#compatibility): a reader reads every manifest of its major
``format_version`` and of every earlier one, ignores the fields it does not know, wherever they are, and
refuses only a greater major version, in one line naming both.

Example::

    >>> m = Manifest.load("out/demo")  # doctest: +SKIP
    >>> m.packed_sequence_size, m.stats.fill_rate, m.shards[0].path  # doctest: +SKIP
    (1024, 0.993768, 'packs-000000.parquet')
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.conventions import IGNORE_INDEX as IGNORE_INDEX  # the conventions, importable from here too
from packtool.conventions import LABELS as LABELS
from packtool.conventions import POSITION_IDS as POSITION_IDS
from packtool.errors import InputError
from packtool.fileio import write_json_atomic
from packtool.safepath import output_file_problem
from packtool.schema import COLUMNS as COLUMNS  # the pack columns (packtool.schema), importable from here too
from packtool.schema import FIXED_COLUMNS as FIXED_COLUMNS
from packtool.schema import IMAGE_COLUMNS as IMAGE_COLUMNS
from packtool.schema import PACK_COLUMNS as PACK_COLUMNS
from packtool.schema import TOKEN_COLUMNS as TOKEN_COLUMNS
from packtool.schema import TRAINING_COLUMNS as TRAINING_COLUMNS
from packtool.schema import Column as Column
from packtool.schema import column_names as column_names
from packtool.stats import Histogram as Histogram  # the manifest's sections, importable from here too
from packtool.stats import SamplesPerPack as SamplesPerPack
from packtool.stats import Stats as Stats
from packtool.stats import total_stats as total_stats
from packtool.version import __version__

MANIFEST = "manifest.json"
# a manifest lists its shards (a few hundred bytes each): 64 MiB is far beyond any real one, and bounds what
# reading an untrusted one may allocate
MAX_MANIFEST_BYTES = 64 << 20
ERRORS_LOG = "errors.jsonl"  # the first skipped records (on_error=skip), one JSON object a line
FORMAT = "packtool"
# 2: every pack's .json member in a tar shard carries the run_id and shard number (verify matches them)
# 3: shard entries carry the file's crc32 and Parquet pages their CRC checksums (checked at read time)
# 4: a --columns minimal tar pack is input_ids.npy (+ labels.npy) and one small_columns.npy record that
#    holds the other columns and the .json's keys (3: one member per column and a .json)
# 5.0: the reading contract (docs/formats.md#compatibility): format_version is the major version and
#    format_minor the minor one; the options that made the output are a plain ``provenance`` record
#    (before: ``config``, parsed as this version's options), the layout is the field ``layout``
# 5.1: optional fields a 5.0 reader rightly ignores: a tar shard entry's ``compression`` (``none``)
# 6.0: what a 5.x reader would read wrong or not at all: a tar shard's .npy members compressed
#    (``--tar-compression gzip``: NAME.npy.gz, the shard entry's ``compression``), and vision-language
#    outputs (``image_columns`` beside ``columns``, ``vision``: the processor's identity and image
#    statistics; a 5.x reader would give the tokens without their images)
# An output says the lowest version that reads it whole (``pipeline.summary.lowest_version``): 6.0 where it
# has one of those, else 5.1, so that a cluster pinned to a 5.x packtool keeps reading what needs no more.
# 5.2 and 6.1: a Parquet shard entry's ``content_digest``, naming the record of its row groups' digests in
#    its footer (``formats.parquet_content``), checked at read time; optional to a 5.1 or 6.0 reader
# 6.2: a vision-language output's ``run_key`` carries the digest of its processor record (``vision.processor``
#    less its path: ``binding.processor_run_key``), checked at read time; a 6.1 reader reads the key as the
#    string it always was (the run_id is made from it as before)
NEWEST_MINOR = {5: 2, 6: 2}  # the newest minor of each major this packtool reads whole
CONTENT_DIGEST_MINOR = {5: 2, 6: 1}  # from which minor of each major Parquet entries record content_digest
BASE_FORMAT_VERSION = 5  # what an output using nothing newer says
IMAGES_FORMAT_VERSION = 6  # what a vision-language output says
FORMAT_VERSION = max(NEWEST_MINOR)  # major: a reader refuses a manifest of a greater one
FORMAT_MINOR = NEWEST_MINOR[FORMAT_VERSION]  # minor: what a newer minor adds is ignored by older readers
# what the shard files' own metadata records as format_version (Parquet key-value metadata; the run_id's
# basis): their layout has not changed since format 4
SHARD_FORMAT_VERSION = 4
MINIMAL_TAR_RECORD_VERSION = 4  # minimal tar outputs older than this hold one member per column
# shard file names by split: the training packs, and those held out by val_fraction
SHARD_PREFIXES = {"train": "packs-", "val": "val-"}
SPLITS = tuple(SHARD_PREFIXES)


# --- provenance ----------------------------------------------------------------------------------------
@dataclass
class TokenizerIdentity:
    """What encoded the samples, as the encoder reports it (``Encoder.identity()``).

    ``kind``: ``huggingface``, ``pretokenized`` or ``custom``; ``name``: the tokenizer path or plugin spec;
    ``sha256``: of the tokenizer file. ``details`` holds the rest in the encoder's order (``vocab_size``,
    ``bos_token_id``, ``eos_token_id``, the chat template's source and hash, what was ``switched_off``).
    """

    kind: str | None = None
    name: str | None = None
    sha256: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> TokenizerIdentity:
        rest = {k: v for k, v in d.items() if k not in ("kind", "name", "sha256")}
        return cls(d.get("kind"), d.get("name"), d.get("sha256"), rest)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "sha256": self.sha256, **self.details}

    @property
    def vocab_size(self) -> int | None:
        return self.details.get("vocab_size")

    @property
    def bos_token_id(self) -> int | None:
        return self.details.get("bos_token_id")

    @property
    def eos_token_id(self) -> int | None:
        return self.details.get("eos_token_id")


@dataclass
class InputEntry:
    """One input as the run saw it: its name, reader kind, size in bytes, the samples it gave (its
    records less the bad ones skipped; ``sample_index`` numbers them in input order across inputs) and
    its absolute ``path`` (a local input), so that ``inspect`` finds it from any directory."""

    source: str
    kind: str
    bytes: int
    num_samples: int | None = None
    path: str | None = None

    @classmethod
    def from_dict(cls, d: dict) -> InputEntry:
        """Fields this version does not know are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# --- shards ---------------------------------------------------------------------------------------------
SHARD_ENTRY_FIELDS = ("path", "first_pack", "num_packs", "num_tokens", "bytes", "sha256", "crc32", "split")


@dataclass
class ShardEntry:
    """One shard file: ``num_packs`` packs from global pack ``first_pack`` on.

    The fields every format has: ``crc32`` is the CRC-32 of the whole file (format 3 on; ``None``
    before), which readers that read a whole shard check as they read it; ``split`` is ``val`` for a shard
    of held-out packs (``val_fraction``), ``None`` for training packs. ``fields`` holds the rest, as read
    or as the format's writer gave them: the fields the shard's format owns (its module parses them:
    ``formats.parquet.ParquetFields``, ``formats.webdataset.TarFields``) and any a newer packtool wrote,
    kept and written back as they were.

    >>> e = ShardEntry.from_dict({"path": "p.parquet", "first_pack": 0, "num_packs": 2, "num_tokens": 9,
    ...                           "bytes": 10, "sha256": "ab", "row_groups": [2], "new": 1})
    >>> e.fields
    {'row_groups': [2], 'new': 1}
    """

    path: str
    first_pack: int
    num_packs: int
    num_tokens: int
    bytes: int
    sha256: str
    crc32: int | None = None
    split: str | None = None  # "val" for the packs held out by val_fraction; None: train
    fields: dict[str, Any] = field(default_factory=dict)  # the format's own fields, and unknown ones

    @classmethod
    def from_dict(cls, d: dict) -> ShardEntry:
        return cls(
            **{k: d[k] for k in SHARD_ENTRY_FIELDS if k in d},
            fields={k: v for k, v in d.items() if k not in SHARD_ENTRY_FIELDS},
        )

    def to_dict(self) -> dict[str, Any]:
        common = {k: getattr(self, k) for k in SHARD_ENTRY_FIELDS}
        return {k: v for k, v in {**common, **self.fields}.items() if v is not None}


# --- the manifest --------------------------------------------------------------------------------------
@dataclass
class Manifest:
    """``manifest.json``, typed. ``load`` / ``from_dict`` read it by the contract of the version that
    wrote it (``format_version``); ``save`` writes it atomically, in the current version.

    ``provenance`` is the run's options as the writer recorded them (a plain dict: nothing here parses
    it; a manifest before format 5 calls it ``config``). ``notes`` says what this version read by its
    rules but could not take in (never written).

    A vision-language output (6.0) has ``image_columns``, the image columns its shards store beside
    ``columns`` (``schema.IMAGE_COLUMNS``: ``images`` and the per-image ``image_*`` columns; ``None``
    for text), and ``vision``: ``{"processor": VisionProcessor.identity(), "images": image statistics,
    "input_images", "packed_images", "skipped_images"}`` (a record for people, ``inspect`` and ``verify``).
    """

    run_id: str
    shard_format: str
    packed_sequence_size: int
    sample_format: str
    labels: str
    position_ids: str
    pad_token_id: int
    columns: list[str]
    tokenizer: TokenizerIdentity
    inputs: list[InputEntry]
    provenance: dict[str, Any]
    stats: Stats
    histograms: dict[str, Histogram]
    shards: list[ShardEntry]
    layout: str = "full"  # full or minimal: how the packs' columns are stored (packtool.layout)
    index_files: list[str] | None = None  # dataset-level index files (webdataset: wids, Energon)
    warnings: list[str] = field(default_factory=list)  # input the packs do not hold, beyond samples
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    format_minor: int = FORMAT_MINOR
    packtool_version: str = __version__
    run_key: str | None = None  # what the run_id is made from with the reading fields (packtool.binding)
    image_columns: list[str] | None = None  # a vision-language output's image columns (6.0)
    vision: dict[str, Any] | None = None  # its processor's identity and image statistics (6.0)
    notes: list[str] = field(default_factory=list, compare=False)

    # what other packtool tools need, named once -------------------------------------------------------
    @property
    def num_packs(self) -> int:
        """Packs listed in the shard entries."""
        return sum(s.num_packs for s in self.shards)

    @property
    def shard_starts(self) -> list[int]:
        """Each shard's first pack as its place in the shard list gives it (the packs of the shards before
        it): what its ``first_pack`` and its own metadata must say (``binding.first_pack_problem``)."""
        starts, first = [], 0
        for s in self.shards:
            starts.append(first)
            first += s.num_packs
        return starts

    def split_shards(self, split: str | None) -> list[tuple[int, ShardEntry]]:
        """``(position in shards, entry)`` of the shards of ``split`` (``train``, ``val``; ``None``: all).

        Raises ``ValueError`` for another split name."""
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)} or None, got {split!r}")
        return [(i, e) for i, e in enumerate(self.shards) if split is None or (e.split or "train") == split]

    @property
    def has_loss_mask(self) -> bool:
        """The packs have a ``loss_mask`` (stored as it is, or as ``loss_mask_bits``)."""
        return "loss_mask" in self.columns or "loss_mask_bits" in self.columns

    @property
    def vocab_size(self) -> int | None:
        return self.tokenizer.vocab_size

    @property
    def version(self) -> str:
        """``format_version.format_minor``, e.g. ``5.0`` (``4.0`` for a manifest of format 4)."""
        return f"{self.format_version}.{self.format_minor}"

    def option(self, name: str, default: Any = None) -> Any:
        """The run's option ``name`` as the provenance records it (``default`` when it records none):
        for display and for ``verify --source``, never for reading packs."""
        return self.provenance.get(name, default)

    # reading and writing ----------------------------------------------------------------------------
    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        """The manifest of output ``directory``; ``InputError`` naming the file and field if there is
        none, it does not parse, or it is not a packtool manifest this version can read."""
        path = Path(directory) / MANIFEST
        problem = output_file_problem(directory, MANIFEST)  # a FIFO would block, a link may lead out
        if problem == "missing":
            raise InputError(f"{directory}: no {MANIFEST} (not packtool output, or an unfinished run)")
        if problem is not None:
            raise InputError(f"{path}: {problem}")
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise InputError(f"{path}: over {MAX_MANIFEST_BYTES:,} bytes, not a packtool manifest")
        try:
            data = strict_json(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # (strict_json's "nested too deep" too)
            raise InputError(f"{path}: not valid JSON ({getattr(e, 'msg', e)})") from None
        except ValueError as e:  # strict_json's: a key twice, a number no writer gives
            raise InputError(f"{path}, {e}") from None
        return cls.from_dict(data, origin=str(path))

    @classmethod
    def from_dict(cls, d: Any, origin: str = MANIFEST) -> Manifest:
        if not isinstance(d, dict) or d.get("format", FORMAT) != FORMAT:
            raise InputError(f"{origin}: not a packtool manifest")
        major, minor = read_version(d, origin)
        for key in ("run_id", "packed_sequence_size", "shards", "stats"):
            if key not in d:
                raise InputError(f"{origin}, field '{key}': missing (not a complete packtool manifest)")
        if not isinstance(d["packed_sequence_size"], int) or d["packed_sequence_size"] <= 0:
            raise InputError(f"{origin}, field 'packed_sequence_size': not a positive integer")
        # before format 5 the options were ``config``, and the layout one of them (``columns``)
        provenance = d.get("provenance" if major >= 5 else "config") or {}
        if not isinstance(provenance, dict):
            provenance = {}
        layout = d.get("layout", "full") if major >= 5 else provenance.get("columns", "full")
        notes = []
        if minor > NEWEST_MINOR.get(major, minor):
            notes.append(
                f"written by a newer packtool (format_version {major}.{minor}; this one reads {major}."
                f"{NEWEST_MINOR[major]}): what that version added is not read"
            )
        try:
            return cls(
                run_id=d["run_id"],
                shard_format=d.get("shard_format", "parquet"),
                packed_sequence_size=d["packed_sequence_size"],
                sample_format=d.get("sample_format", "text"),
                labels=d.get("labels", "shifted"),
                position_ids=d.get("position_ids", "nemo"),
                pad_token_id=d.get("pad_token_id", 0),
                columns=list(d.get("columns") or column_names(False)[:4]),
                tokenizer=TokenizerIdentity.from_dict(d.get("tokenizer") or {}),
                inputs=[InputEntry.from_dict(i) for i in d.get("inputs", [])],
                provenance=provenance,
                stats=Stats.from_dict(d["stats"]),
                histograms={k: Histogram.from_dict(h) for k, h in d.get("histograms", {}).items()},
                shards=[ShardEntry.from_dict(s) for s in d["shards"]],
                layout=layout,
                index_files=d.get("index_files"),
                warnings=list(d.get("warnings", [])),
                format=d.get("format", FORMAT),
                format_version=major,
                format_minor=minor,
                packtool_version=d.get("packtool_version", "unknown"),
                run_key=d.get("run_key"),
                image_columns=d.get("image_columns"),
                vision=d.get("vision"),
                notes=notes,
            )
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise InputError(f"{origin}: not a valid packtool manifest ({e})") from None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": self.format,
            "format_version": self.format_version,
            "format_minor": self.format_minor,
            "packtool_version": self.packtool_version,
            "run_id": self.run_id,
            "shard_format": self.shard_format,
            "packed_sequence_size": self.packed_sequence_size,
            "sample_format": self.sample_format,
            "labels": self.labels,
            "position_ids": self.position_ids,
            "pad_token_id": self.pad_token_id,
            "columns": list(self.columns),
            "layout": self.layout,
            "tokenizer": self.tokenizer.to_dict(),
            "stats": self.stats.to_dict(),
            "histograms": {k: h.to_dict() for k, h in self.histograms.items()},
            "shards": [s.to_dict() for s in self.shards],
            "inputs": [dataclasses.asdict(i) for i in self.inputs],
            "provenance": dict(self.provenance),
        }
        if self.index_files is not None:
            out["index_files"] = list(self.index_files)
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.run_key is not None:
            out["run_key"] = self.run_key
        if self.image_columns is not None:
            out["image_columns"] = list(self.image_columns)
        if self.vision is not None:
            out["vision"] = dict(self.vision)
        return out

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / MANIFEST
        write_json_atomic(path, self.to_dict())
        return path


class _Refused:
    """A JSON value ``strict_json`` refuses, held until the object holding it names its key."""

    def __init__(self, what: str) -> None:
        self.what = what


def _number(text: str) -> int | _Refused:
    # Python converts at most sys.get_int_max_str_digits() digits (4,300 by default; 0: no limit), so
    # no writer in Python can write a longer one: its own error would name no field
    digits, limit = len(text.lstrip("-")), sys.get_int_max_str_digits()
    return int(text) if not limit or digits <= limit else _Refused(f"an integer of {digits:,} digits")


def _refused_in(value: Any) -> _Refused | None:
    """The first refused value in ``value`` or the lists nested in it (an object's were named already)."""
    if isinstance(value, _Refused):
        return value
    if isinstance(value, list):
        return next((r for v in value if (r := _refused_in(v)) is not None), None)
    return None


def _float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(f"{text} (beyond a float)")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"field {key!r}: given twice (which value is meant cannot be told)")
        if (refused := _refused_in(value)) is not None:
            raise ValueError(f"field {key!r}: {refused.what}, not a value packtool writes")
        out[key] = value
    return out


def strict_json(text: str | bytes) -> Any:
    """``text`` parsed as JSON, refusing what ``json.loads`` takes silently from an untrusted manifest or
    shard (a footer's records, a pack's ``.json``): a key given twice in an object (the last would win
    without a word), ``NaN`` / ``Infinity`` and numbers beyond a float, and integers longer than Python
    converts (``sys.get_int_max_str_digits``: its own error names no field); and what it raises no
    ``ValueError`` for, arrays or objects nested past Python's recursion limit. Raises ``ValueError``
    naming the field (``json.JSONDecodeError``, one, for text that is not JSON or is nested too deep).

    >>> strict_json('{"a": 1, "b": [2.5]}')
    {'a': 1, 'b': [2.5]}
    >>> strict_json('{"a": 1, "a": 2}')
    Traceback (most recent call last):
    ValueError: field 'a': given twice (which value is meant cannot be told)
    >>> strict_json('{"num_packs": Infinity}')
    Traceback (most recent call last):
    ValueError: field 'num_packs': Infinity (beyond a float), not a value packtool writes
    >>> strict_json("[" * 100_000 + "]" * 100_000)
    Traceback (most recent call last):
    json.decoder.JSONDecodeError: nested too deep: line 1 column 1 (char 0)
    """
    try:
        data = json.loads(
            text, object_pairs_hook=_object, parse_int=_number, parse_float=_float, parse_constant=_float
        )
    except RecursionError:  # arrays or objects nested thousands deep: bounded, refused in one line
        raise json.JSONDecodeError("nested too deep", "", 0) from None
    if (refused := _refused_in(data)) is not None:
        raise ValueError(f"the document holds {refused.what}")
    return data


def read_version(d: dict, origin: str = MANIFEST) -> tuple[int, int]:
    """``(major, minor)`` of a manifest: ``format_version`` (an int; ``"M.m"`` is taken too) and
    ``format_minor`` (0 when absent: every manifest before format 5). ``InputError`` in one line naming
    both versions when the major one is newer than this packtool reads.

    >>> read_version({"format_version": 3}), read_version({"format_version": 5, "format_minor": 2})
    ((3, 0), (5, 2))
    """
    raw = d.get("format_version", 1)
    try:
        if isinstance(raw, str):
            major_text, _, minor_text = raw.partition(".")
            major, minor = int(major_text), int(minor_text or 0)
        else:
            major, minor = int(raw), int(d.get("format_minor", 0))
    except (TypeError, ValueError):
        raise InputError(f"{origin}, field 'format_version': {raw!r} is not a version number") from None
    if major > FORMAT_VERSION:
        raise InputError(
            f"{origin}: format_version {major}.{minor} is newer than this packtool reads "
            f"({FORMAT_VERSION}.{FORMAT_MINOR} and older; packtool {__version__}): upgrade packtool"
        )
    return major, minor
