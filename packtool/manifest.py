"""The manifest of an output directory, its shard entries, and the pack columns, each defined once here.

``manifest.json`` is written last by ``packtool pack``: a directory without one is not a finished output.
It says what the packs hold (``packed_sequence_size``, the ``columns``, the ``labels`` and
``position_ids`` conventions, the tokenizer), how they were made (``config``, ``inputs``), what happened
to every input sample (``stats``) and where the packs are (``shards``). Everything else in packtool reads
it through ``Manifest`` (``Manifest.load(directory)``), never by string keys.

Example::

    >>> m = Manifest.load("out/demo")  # doctest: +SKIP
    >>> m.packed_sequence_size, m.stats.fill_rate, m.shards[0].path  # doctest: +SKIP
    (1024, 0.993768, 'packs-000000.parquet')
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packtool.config import PackConfig
from packtool.errors import ConfigError, InputError
from packtool.fileio import write_json_atomic
from packtool.version import __version__

MANIFEST = "manifest.json"
ERRORS_LOG = "errors.jsonl"  # the first skipped records (on_error=skip), one JSON object a line
FORMAT = "packtool"
# 2: every pack's .json member in a tar shard carries the run_id and shard number (verify matches them)
# 3: shard entries carry the file's crc32 and Parquet pages their CRC checksums (checked at read time)
# 4: a --columns minimal tar pack is input_ids.npy (+ labels.npy) and one small_columns.npy record that
#    holds the other columns and the .json's keys (3: one member per column and a .json)
FORMAT_VERSION = 4
MINIMAL_TAR_RECORD_VERSION = 4  # minimal tar outputs older than this are read, but verify cannot check them
# shard file names by split: the training packs, and those held out by val_fraction
SHARD_PREFIXES = {"train": "packs-", "val": "val-"}
SPLITS = tuple(SHARD_PREFIXES)
IGNORE_INDEX = -100  # the label of a token that takes no loss (padding, prompts, sample ends)


# --- the pack columns ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One column of a pack.

    Attributes:
        name: the column's name everywhere (Parquet column, tar member ``KEY.NAME.npy``, loader field).
        dtype: NumPy dtype of its values, as stored.
        per: ``token`` (``N`` values per pack), ``bit`` (``ceil(N / 8)`` bytes per pack, a bit per token),
            ``segment`` (one per ``seq_lens`` entry: the pieces, then the padding if any) or ``piece``
            (one per piece of a sample).
        optional: written only when the input carries it, or only in one layout (``column_names``).
        meaning: one line, for docs and dataset cards.
        stored_only: a column of the ``minimal`` layout that readers turn back into the columns it
            stands for (``packtool.layout``); never a column of what they give.
    """

    name: str
    dtype: np.dtype
    per: str
    optional: bool
    meaning: str
    stored_only: bool = False

    def width(self, n: int) -> int | None:
        """Values per pack of a fixed-width column (``token``, ``bit``) in packs of ``n``; None if ragged."""
        return {"token": n, "bit": -(-n // 8)}.get(self.per)


PACK_COLUMNS: tuple[Column, ...] = (
    Column("input_ids", np.dtype(np.int32), "token", False, "token ids, padded with pad_token_id"),
    Column("labels", np.dtype(np.int32), "token", False, "labels, -100 where no loss is taken"),
    Column("position_ids", np.dtype(np.int32), "token", False, "position ids (convention: position_ids)"),
    Column("seq_lens", np.dtype(np.int32), "segment", False, "lengths of the pieces, then of the padding"),
    Column("loss_mask", np.dtype(np.int8), "token", True, "1 where the loss is taken (fine-tuning input)"),
    Column("sample_index", np.dtype(np.int64), "piece", False, "input index of each piece's sample"),
    Column("sample_offset", np.dtype(np.int64), "piece", False, "where each piece starts in its sample"),
    Column("cp_padding", np.dtype(np.int32), "piece", True, "context-parallel padding ending each piece"),
    Column(
        "next_label",
        np.dtype(np.int32),
        "piece",
        True,
        "label of each piece's last token (minimal layout: labels are rebuilt from input_ids)",
        stored_only=True,
    ),
    Column(
        "loss_mask_bits",
        np.dtype(np.uint8),
        "bit",
        True,
        "loss_mask, 8 tokens a byte (numpy.packbits; minimal layout)",
        stored_only=True,
    ),
)
COLUMNS: dict[str, Column] = {c.name: c for c in PACK_COLUMNS}
TOKEN_COLUMNS = tuple(c.name for c in PACK_COLUMNS if c.per == "token")  # (N,) per pack
FIXED_COLUMNS = tuple(c.name for c in PACK_COLUMNS if c.per in ("token", "bit"))  # as many values per pack
TRAINING_COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens")  # every pack read has these


def column_names(
    has_loss_mask: bool,
    layout: str = "full",
    *,
    labels_rebuilt: bool = True,
    shifted: bool = True,
    has_cp_padding: bool = False,
) -> list[str]:
    """The columns an output stores, in their stored order.

    ``full`` stores every column a reader gives. ``minimal`` (``packtool.layout``) leaves out
    ``position_ids``, and ``labels`` when ``labels_rebuilt`` (the input's labels follow the rule the
    readers rebuild them by; with ``shifted`` labels one ``next_label`` per piece goes with them), and
    stores ``loss_mask`` as ``loss_mask_bits``. Any other column is stored as in ``full`` (``cp_padding``
    when ``has_cp_padding``: ``cp_size`` > 1).

    >>> column_names(True, "minimal")
    ['input_ids', 'seq_lens', 'sample_index', 'sample_offset', 'next_label', 'loss_mask_bits']
    """
    optional = {"loss_mask": has_loss_mask, "cp_padding": has_cp_padding}
    names = [c.name for c in PACK_COLUMNS if not c.stored_only and optional.get(c.name, True)]
    if layout == "full":
        return names
    drop = {"position_ids", "loss_mask"} | ({"labels"} if labels_rebuilt else set())
    names = [c for c in names if c not in drop]
    if labels_rebuilt and shifted:
        names.append("next_label")
    if has_loss_mask:
        names.append("loss_mask_bits")
    return [c.name for c in PACK_COLUMNS if c.name in names]


# --- statistics ----------------------------------------------------------------------------------------
def total_stats(n: int, num_packs: int, num_tokens: int) -> dict[str, int | float]:
    """The stats that follow from ``num_packs`` packs of ``n`` tokens holding ``num_tokens`` real tokens
    (``pack`` writes them, ``verify`` and ``inspect --full`` check them).

    >>> total_stats(4, 3, 10)["fill_rate"], total_stats(4, 3, 10)["packs_over_lower_bound"]
    (0.833333, 0)
    """
    lower_bound = -(-num_tokens // n)
    return {
        "num_packs": num_packs,
        "num_tokens": num_tokens,
        "padding_tokens": num_packs * n - num_tokens,
        "fill_rate": round(num_tokens / (num_packs * n), 6) if num_packs else 0.0,
        "lower_bound_packs": lower_bound,
        "packs_over_lower_bound": num_packs - lower_bound,
    }


@dataclass
class SamplesPerPack:
    """Pieces (``sample_index`` entries) per pack."""

    mean: float = 0.0
    min: int = 0
    max: int = 0

    @classmethod
    def of(cls, num_packs: int, num_pieces: int, fewest: int, most: int) -> SamplesPerPack:
        """``num_packs`` packs holding ``num_pieces`` pieces, ``fewest`` to ``most`` in one pack."""
        if not num_packs:
            return cls()
        return cls(round(num_pieces / num_packs, 4), fewest, most)


@dataclass
class Stats:
    """What happened to every input sample and token, and what the packs hold.

    Every input sample has one fate (``sample_fates``), and they add up to ``input_samples``; the tokens
    add up the same way (``token_fates``). Any fate but packed whole or split across packs is a loss, and
    ``losses()`` says each one in a line (the pack summary, ``inspect`` and its ``warnings`` show them).
    """

    num_samples: int = 0  # records encoded (bad records skipped under on_error=skip are not among them)
    packed_samples: int = 0  # samples with tokens in the packs (whole, split, truncated or partial)
    num_packs: int = 0
    num_tokens: int = 0  # real tokens in the packs
    input_tokens: int = 0  # tokens of every encoded sample
    padding_tokens: int = 0
    cp_padding_tokens: int = 0  # of the padding, what ends pieces for context parallelism (cp_size)
    fill_rate: float = 0.0
    lower_bound_packs: int = 0
    packs_over_lower_bound: int = 0
    samples_per_pack: SamplesPerPack = field(default_factory=SamplesPerPack)
    # the fates of the samples (one each)
    whole_samples: int = 0  # packed whole, in one pack
    split_samples: int = 0  # packed whole, spread over more than one pack
    truncated_samples: int = 0  # packed cut to N (long_samples=truncate)
    truncated_tokens: int = 0
    partial_samples: int = 0  # packed, partly cut off by max_packs
    samples_over_max_packs: int = 0  # left out wholly by max_packs
    tokens_over_max_packs: int = 0
    dropped_samples: int = 0  # longer than N, left out (long_samples=drop)
    dropped_tokens: int = 0
    empty_samples: int = 0  # encoded to no tokens: left out
    empty_loss_samples: int = 0  # tokens but nothing to learn (the empty_loss policy says what happened)
    empty_loss_dropped: int = 0  # ... of them left out (empty_loss=drop)
    empty_loss_tokens: int = 0  # tokens of those left out
    skipped_samples: int = 0  # bad records left out under on_error=skip, by reason below
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    policy_token_delta: int = 0  # tokens a custom pack_selected_samples added (+) or removed (-)
    policy_packs: int = 0  # packs a custom pack_selected_samples made: their tokens are the policy's

    @classmethod
    def from_dict(cls, d: dict) -> Stats:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        values["samples_per_pack"] = SamplesPerPack(**d.get("samples_per_pack", {}))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def input_samples(self) -> int:
        """Records read: encoded ones and bad ones skipped."""
        return self.num_samples + self.skipped_samples

    def sample_fates(self) -> dict[str, int]:
        """Input samples by fate, one fate each: the values add up to ``input_samples``.

        >>> Stats(num_samples=5, whole_samples=3, empty_samples=1, skipped_samples=1,
        ...       dropped_samples=1).sample_fates()["packed whole"]
        3
        """
        return {
            "packed whole": self.whole_samples,
            "split across packs": self.split_samples,
            "truncated": self.truncated_samples,
            "partly cut by max_packs": self.partial_samples,
            "left out by max_packs": self.samples_over_max_packs,
            "too long, dropped": self.dropped_samples,
            "empty, left out": self.empty_samples,
            "nothing to learn, left out": self.empty_loss_dropped,
            "bad record, skipped": self.skipped_samples,
        }

    def token_fates(self) -> dict[str, int]:
        """Input tokens by fate: the values add up to ``input_tokens`` (+ ``policy_token_delta``)."""
        return {
            "packed": self.num_tokens,
            "cut by truncation": self.truncated_tokens,
            "cut by max_packs": self.tokens_over_max_packs,
            "in dropped samples": self.dropped_tokens,
            "in samples with nothing to learn": self.empty_loss_tokens,
        }

    def check(self) -> list[str]:
        """What does not add up (a damaged manifest, or a packtool bug); empty when all is well."""
        wrong = []
        fates = sum(self.sample_fates().values())
        if fates != self.input_samples:
            wrong.append(f"sample fates add up to {fates:,}, not the {self.input_samples:,} input samples")
        tokens = sum(self.token_fates().values())
        if tokens != self.input_tokens + self.policy_token_delta:
            wrong.append(
                f"token fates add up to {tokens:,}, not the {self.input_tokens + self.policy_token_delta:,} "
                "input tokens"
            )
        packed = self.whole_samples + self.split_samples + self.truncated_samples + self.partial_samples
        if packed != self.packed_samples:
            wrong.append(f"packed_samples is {self.packed_samples:,}, its fates add up to {packed:,}")
        return wrong

    def losses(self, config: PackConfig) -> list[str]:
        """One line per kind of loss (every sample not packed whole, with its tokens), in input terms.

        >>> Stats(num_samples=10, dropped_samples=2, dropped_tokens=900).losses(PackConfig(
        ...     packed_sequence_size=256))
        ['2 of 10 samples longer than 256 tokens were dropped (900 tokens; long_samples=drop)']
        """
        n, total = config.packed_sequence_size, self.input_samples
        out = []
        if self.truncated_samples:
            out.append(
                f"{self.truncated_samples:,} of {total:,} samples were truncated to {n} tokens "
                f"({self.truncated_tokens:,} tokens cut; long_samples=truncate)"
            )
        if self.dropped_samples:
            out.append(
                f"{self.dropped_samples:,} of {total:,} samples longer than {n} tokens were dropped "
                f"({self.dropped_tokens:,} tokens; long_samples=drop)"
            )
        if self.samples_over_max_packs or self.partial_samples:
            part = f", {self.partial_samples:,} more cut short" if self.partial_samples else ""
            out.append(
                f"{self.samples_over_max_packs:,} of {total:,} samples were left out by max_packs "
                f"{config.max_packs}{part} ({self.tokens_over_max_packs:,} tokens)"
            )
        if self.empty_samples:
            out.append(f"{self.empty_samples:,} of {total:,} samples were empty (no tokens) and left out")
        if self.empty_loss_dropped:
            out.append(
                f"{self.empty_loss_dropped:,} of {total:,} samples had nothing to learn (every label -100) "
                f"and were left out ({self.empty_loss_tokens:,} tokens; empty_loss=drop)"
            )
        if self.skipped_samples:
            reasons = ", ".join(f"{k} {v:,}" for k, v in self.skipped_by_reason.items())
            out.append(
                f"{self.skipped_samples:,} of {total:,} records were bad and skipped ({reasons}; "
                "on_error=skip, first ones in errors.jsonl)"
            )
        return out

    def lost_totals(self) -> tuple[int, int]:
        """(samples not packed whole, input tokens not in the packs)."""
        kept = self.whole_samples + self.split_samples
        lost_tokens = sum(v for k, v in self.token_fates().items() if k != "packed")
        return self.input_samples - kept, lost_tokens


@dataclass
class Histogram:
    """Counts per bin: ``counts[i]`` values in ``[edges[i], edges[i + 1])`` (the last bin closed);
    ``quantiles`` (sample lengths only): ``{"p50", "p90", "p99", "max"}`` of the values."""

    edges: list[int]
    counts: list[int]
    quantiles: dict[str, int] | None = None

    @classmethod
    def of(cls, values: np.ndarray, edges: np.ndarray) -> Histogram:
        counts, edges = np.histogram(values, bins=edges)
        return cls([int(e) for e in edges], [int(c) for c in counts])

    # the manifest's histograms (``pack`` writes them, ``inspect --full`` recomputes them)
    @classmethod
    def lengths(cls, lengths: np.ndarray, at_least: int) -> Histogram:
        """Lengths in about 32 bins growing geometrically from 1 to the longest (``at_least`` at least),
        so that a long tail (a few samples 100 times the median) does not put nearly every sample into
        the first bin; with the quantiles p50/p90/p99/max.

        >>> Histogram.lengths(np.array([3, 5, 8, 1000]), 16).quantiles
        {'p50': 5, 'p90': 8, 'p99': 8, 'max': 1000}
        """
        top = max(int(lengths.max()) if len(lengths) else 1, at_least)
        edges = np.unique(np.concatenate([[0, 1], np.ceil(np.geomspace(1, top, 32))]).astype(np.int64))
        hist = cls.of(lengths, edges)
        if len(lengths):
            q = np.percentile(lengths, [50, 90, 99], method="lower")  # lengths a sample has
            hist.quantiles = {
                **{k: int(round(float(v))) for k, v in zip(("p50", "p90", "p99"), q, strict=True)},
                "max": int(lengths.max()),
            }
        return hist

    @classmethod
    def pack_fill(cls, pack_tokens: np.ndarray, n: int) -> Histogram:
        """Real tokens per pack in 20 bins from 0 to N."""
        return cls.of(pack_tokens, np.linspace(0, n, 21).astype(int))

    @classmethod
    def per_pack(cls, counts: np.ndarray) -> Histogram:
        """Pieces per pack, one bin per count."""
        return cls.of(counts, np.arange(0, (int(counts.max()) if len(counts) else 1) + 2))


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


# --- shards --------------------------------------------------------------------------------------------
@dataclass
class ShardEntry:
    """One shard file: ``num_packs`` packs from global pack ``first_pack`` on.

    ``crc32`` is the CRC-32 of the whole file (format 3 on; ``None`` before), which readers that read a
    whole shard check as they read it. ``split`` is ``val`` for a shard of held-out packs
    (``val_fraction``), ``None`` for training packs. The last fields belong to one format each (``None``
    for the others): Parquet's ``row_groups`` (packs per row group, the loader's read units) and
    ``row_group_offsets`` (byte offset of each, then the end); a tar shard's ``index`` (its ``.tar.idx``).
    """

    path: str
    first_pack: int
    num_packs: int
    num_tokens: int
    bytes: int
    sha256: str
    crc32: int | None = None
    split: str | None = None  # "val" for the packs held out by val_fraction; None: train
    row_groups: list[int] | None = None
    row_group_offsets: list[int] | None = None
    index: str | None = None

    @classmethod
    def from_dict(cls, d: dict) -> ShardEntry:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


# --- the manifest --------------------------------------------------------------------------------------
@dataclass
class Manifest:
    """``manifest.json``, typed. ``load`` / ``from_dict`` validate; ``save`` writes it atomically."""

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
    config: PackConfig
    stats: Stats
    histograms: dict[str, Histogram]
    shards: list[ShardEntry]
    index_files: list[str] | None = None  # dataset-level index files (webdataset: wids, Energon)
    warnings: list[str] = field(default_factory=list)  # input the packs do not hold, beyond samples
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    packtool_version: str = __version__

    # what other packtool tools need, named once -------------------------------------------------------
    @property
    def num_packs(self) -> int:
        """Packs listed in the shard entries."""
        return sum(s.num_packs for s in self.shards)

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
    def layout(self) -> str:
        """``full`` or ``minimal``: the ``columns`` key of the run (``columns`` lists what is stored)."""
        return self.config.columns

    @property
    def vocab_size(self) -> int | None:
        return self.tokenizer.vocab_size

    # reading and writing ----------------------------------------------------------------------------
    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        """The manifest of output ``directory``; ``InputError`` naming the file and field if there is
        none, it does not parse, or it is not a packtool manifest this version can read."""
        path = Path(directory) / MANIFEST
        if not path.exists():
            raise InputError(f"{directory}: no {MANIFEST} (not packtool output, or an unfinished run)")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: not valid JSON ({getattr(e, 'msg', e)})") from None
        return cls.from_dict(data, origin=str(path))

    @classmethod
    def from_dict(cls, d: Any, origin: str = MANIFEST) -> Manifest:
        if not isinstance(d, dict) or d.get("format", FORMAT) != FORMAT:
            raise InputError(f"{origin}: not a packtool manifest")
        for key in ("run_id", "packed_sequence_size", "shards", "stats", "config"):
            if key not in d:
                raise InputError(f"{origin}, field '{key}': missing (not a complete packtool manifest)")
        if not isinstance(d["packed_sequence_size"], int) or d["packed_sequence_size"] <= 0:
            raise InputError(f"{origin}, field 'packed_sequence_size': not a positive integer")
        try:
            shards = [ShardEntry.from_dict(s) for s in d["shards"]]
            config = PackConfig.from_dict(d["config"], origin=f"{origin}, field 'config'")
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
                inputs=[InputEntry(**i) for i in d.get("inputs", [])],
                config=config,
                stats=Stats.from_dict(d["stats"]),
                histograms={k: Histogram(**h) for k, h in d.get("histograms", {}).items()},
                shards=shards,
                index_files=d.get("index_files"),
                warnings=list(d.get("warnings", [])),
                format=d.get("format", FORMAT),
                format_version=d.get("format_version", 1),
                packtool_version=d.get("packtool_version", "unknown"),
            )
        except (TypeError, KeyError, AttributeError, ConfigError) as e:
            raise InputError(f"{origin}: not a valid packtool manifest ({e})") from None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": self.format,
            "format_version": self.format_version,
            "packtool_version": self.packtool_version,
            "run_id": self.run_id,
            "shard_format": self.shard_format,
            "packed_sequence_size": self.packed_sequence_size,
            "sample_format": self.sample_format,
            "labels": self.labels,
            "position_ids": self.position_ids,
            "pad_token_id": self.pad_token_id,
            "columns": list(self.columns),
            "tokenizer": self.tokenizer.to_dict(),
            "inputs": [dataclasses.asdict(i) for i in self.inputs],
            "config": self.config.to_dict(include_runtime=False),
            "stats": self.stats.to_dict(),
            "histograms": {k: dataclasses.asdict(h) for k, h in self.histograms.items()},
            "shards": [s.to_dict() for s in self.shards],
        }
        if self.index_files is not None:
            out["index_files"] = list(self.index_files)
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / MANIFEST
        write_json_atomic(path, self.to_dict())
        return path
