"""Sources: what the loader reads packs from, as a value: one output directory, or a mixture of outputs.

``OutputSource`` is one output directory: the one place that opens an output's files (its manifest, its
shards' readers). ``Mixture`` is several of them taken at weights or repeats (``order.Shares``). Both give
the epoch's sequence of packs (``sequence``) and the units a pack is read from (``UnitTable``), from which
``loader.order`` builds each rank's batches and ``loader.dataset`` reads them.

``open_source`` takes what a user passes wherever an output directory is taken: a directory, a mixture file
(``mixture.yaml``, ``loader.mixture_file``), ``{directory: weight, ...}``, or the list a mixture file holds
(``[{"path": ..., "weight": ...}]`` or ``[{"path": ..., "repeat": ...}]``). The outputs of a mixture must
agree on what a batch of their packs needs: ``packed_sequence_size``, the tokenizer, the labels convention,
the vision processor (an output without images mixes with one that has them), context-parallel padding.

Example::

    >>> mix = open_source({"out/web": 0.7, "out/code": 0.3})  # doctest: +SKIP
    >>> [o.name for o in mix.outputs], mix.shares.weights  # doctest: +SKIP
    (['out/web', 'out/code'], (0.7, 0.3))
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from packtool.errors import ConfigError
from packtool.formats.registry import get_format
from packtool.loader.mixture_file import load_mixture_file
from packtool.loader.order import Shares, Unit, mixture_counts, mixture_sequence, output_sequence, units_of
from packtool.manifest import TRAINING_COLUMNS, Manifest
from packtool.reading import require_shard_files

SHARE_KEYS = ("weight", "repeat")
MAX_SOURCES = 10_000  # a mixture of more outputs than this is not one anybody trains on


def shards_digest(manifest: Manifest, split: str | None) -> str:
    """sha256 over the paths and sha256s of the shards of ``split``, from the manifest: what a loader
    state (and ``trl_dataset``'s cache) binds to, besides ``run_id``."""
    h = hashlib.sha256()
    for _, entry in manifest.split_shards(split):
        h.update(f"{entry.path}\0{entry.sha256}\n".encode())
    return h.hexdigest()


@dataclass
class OutputSource:
    """One packtool output directory, its ``split`` (``train``, ``val`` or None: all), and its read units
    in order (``order.units_of``). The only code that opens the output's files."""

    directory: Path
    manifest: Manifest
    split: str | None
    units: list[Unit]

    @classmethod
    def open(cls, directory: str | Path, split: str | None = "train") -> OutputSource:
        """The output at ``directory`` (``InputError`` if it is none, from ``Manifest.load``)."""
        manifest = Manifest.load(Path(directory))
        return cls(Path(directory), manifest, split, units_of(manifest, split))

    @property
    def name(self) -> str:
        return str(self.directory)

    @property
    def outputs(self) -> tuple[OutputSource, ...]:
        return (self,)

    @property
    def unit_sizes(self) -> np.ndarray:
        return np.array([u.num_packs for u in self.units], dtype=np.int64)

    @property
    def num_packs(self) -> int:
        """Packs of the split."""
        return sum(u.num_packs for u in self.units)

    epoch_packs = num_packs  # one output's epoch holds each of its packs once

    def sequence(
        self, epoch: int, seed: int, shuffle: bool
    ) -> tuple[np.ndarray, np.ndarray | None, np.random.Generator | None]:
        """The epoch's packs (``order.output_sequence``), no laps (every pack is in lap ``epoch``), and the
        generator that draws the packs left over."""
        every, rng = output_sequence(self.unit_sizes, epoch=epoch, seed=seed, shuffle=shuffle)
        return every, None, rng

    def columns(self, columns: list[str]) -> list[str]:
        """``columns`` (what every output of the stream gives) and this output's image columns."""
        return columns + list(self.manifest.image_columns or ())

    def open_reader(self, verify_checksums: bool) -> Any:
        """A reader of this output's units (the shard format's ``UnitReader``)."""
        reader = get_format(self.manifest.shard_format).reader
        return reader.open_reader(self.directory, self.manifest, verify_checksums)

    @property
    def unit_kind(self) -> str | None:
        """What a unit is called in errors (``row group``), None for a whole shard."""
        return get_format(self.manifest.shard_format).reader.unit_kind

    def shard_path(self, unit: Unit) -> Path:
        return self.directory / self.manifest.shards[unit.shard].path

    def unit_name(self, unit: Unit) -> str:
        """``shard#part``, as ``loader.stats["bad_units"]`` lists it."""
        return f"{self.manifest.shards[unit.shard].path}#{unit.part}"

    def pack_bases(self) -> np.ndarray:
        """Each unit's first pack as an index in the output directory (all splits, shard order)."""
        first_in_shard: dict[int, int] = {}
        out = np.empty(len(self.units), dtype=np.int64)
        for j, unit in enumerate(self.units):
            base = first_in_shard.get(unit.shard, self.manifest.shards[unit.shard].first_pack)
            out[j] = base
            first_in_shard[unit.shard] = base + unit.num_packs
        return out

    def require_files(self) -> None:
        """``InputError`` naming the first shard missing or of another size (one ``stat`` each)."""
        require_shard_files(self.directory, self.manifest)

    def identity(self) -> dict[str, Any]:
        """What a loader state binds to: the run, the split, its shards' digest and pack count."""
        return {
            "run_id": self.manifest.run_id,
            "split": self.split,
            "shards": shards_digest(self.manifest, self.split),
            "num_packs": self.num_packs,
        }


@dataclass
class Mixture:
    """Several outputs taken at ``shares`` (weights or repeats; ``order.mixture_sequence``)."""

    outputs: tuple[OutputSource, ...]
    shares: Shares

    @property
    def name(self) -> str:
        return "mixture of " + ", ".join(o.name for o in self.outputs)

    @property
    def split(self) -> str | None:
        return self.outputs[0].split

    @property
    def sizes(self) -> np.ndarray:
        return np.array([o.num_packs for o in self.outputs], dtype=np.int64)

    @property
    def epoch_packs(self) -> int:
        """Packs of an epoch: the sources' packs together (weights), or the repeats' (``len()`` exact)."""
        if self.shares.repeats is None:
            return int(self.sizes.sum())
        return int(mixture_counts(self.sizes, self.shares, epoch=0, seed=0, shuffle=False).sum())

    def sequence(
        self, epoch: int, seed: int, shuffle: bool
    ) -> tuple[np.ndarray, np.ndarray | None, np.random.Generator | None]:
        """The epoch's packs, each one's lap in its source's cycle, and the generator for the packs left
        over (``order.mixture_sequence``)."""
        units = [o.unit_sizes for o in self.outputs]
        return mixture_sequence(units, self.shares, epoch=epoch, seed=seed, shuffle=shuffle)

    def share(self, i: int) -> tuple[str, float]:
        """``("weight", w)`` or ``("repeat", r)`` of source ``i``."""
        if self.shares.weights is not None:
            return "weight", self.shares.weights[i]
        return "repeat", self.shares.repeats[i]

    def entries(self) -> list[dict[str, Any]]:
        """The mixture as ``open_source`` takes it: ``[{"path", "weight" | "repeat"}, ...]``."""
        return [{"path": str(o.directory), **dict([self.share(i)])} for i, o in enumerate(self.outputs)]

    def identity(self) -> dict[str, Any]:
        """What a loader state binds to: each source's identity and share."""
        return {
            "sources": [
                {"name": o.name, **o.identity(), **dict([self.share(i)])} for i, o in enumerate(self.outputs)
            ]
        }


Source = Union[OutputSource, Mixture]  # noqa: UP007 - a runtime alias, read by isinstance


@dataclass
class UnitTable:
    """The read units of every output of a source, end to end: unit ``u`` is unit ``local[u]`` of output
    ``output[u]``; ``first`` (``(U + 1,)``) its first pack in the stream's numbering (outputs one after
    the other); ``pack_base`` its first pack as an index in its own output directory."""

    sizes: np.ndarray
    first: np.ndarray
    output: np.ndarray
    local: np.ndarray
    pack_base: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, source: Source) -> UnitTable:
        outputs = source.outputs
        sizes = np.concatenate([o.unit_sizes for o in outputs]).astype(np.int64)
        return cls(
            sizes=sizes,
            first=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            output=np.repeat(np.arange(len(outputs)), [len(o.units) for o in outputs]).astype(np.int64),
            local=np.concatenate([np.arange(len(o.units)) for o in outputs]).astype(np.int64),
            pack_base=np.concatenate([o.pack_bases() for o in outputs]).astype(np.int64),
        )

    def unit_of(self, packs: np.ndarray) -> np.ndarray:
        """The unit of each pack (stream numbering)."""
        return np.searchsorted(self.first, packs, side="right") - 1


# --- what a user passes ----------------------------------------------------------------------------------
def open_source(spec: Any, split: str | None = "train") -> Source:
    """The source ``spec`` names (see the module docstring), its outputs opened with ``split``.

    Raises ``ConfigError`` (one line, naming the entry or both outputs and the field) for a share that is
    not a finite positive number, a mixture file packtool does not read, or outputs that do not mix.
    """
    if isinstance(spec, (OutputSource, Mixture)):
        if spec.split != split:
            raise ConfigError(f"{spec.name}: opened with split {spec.split!r}, asked for {split!r}")
        return spec
    if isinstance(spec, (str, os.PathLike)):
        if Path(spec).is_file():  # a mixture file; a directory is an output
            return mixture_of(load_mixture_file(spec), split, origin=str(spec))
        return OutputSource.open(spec, split)
    if isinstance(spec, Mapping):
        entries = [{"path": path, "weight": weight} for path, weight in spec.items()]
        return mixture_of(entries, split, origin="mixture")
    if isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
        return mixture_of(list(spec), split, origin="mixture")
    raise ConfigError(
        f"a source is an output directory, a mixture file, {{directory: weight}} or a list of "
        f"{{path, weight | repeat}}, got {type(spec).__name__}"
    )


def mixture_of(entries: list, split: str | None, origin: str) -> Mixture:
    """The ``Mixture`` of ``entries`` (``{"path", "weight"}`` or ``{"path", "repeat"}`` each, one kind for
    all); ``origin`` names them in errors (a mixture file's path)."""
    if not entries:
        raise ConfigError(f"{origin}: a mixture needs at least one source")
    if len(entries) > MAX_SOURCES:
        raise ConfigError(f"{origin}: {len(entries):,} sources, over {MAX_SOURCES:,}")
    kinds, paths, values = set(), [], []
    for k, entry in enumerate(entries):
        where = f"{origin}, sources[{k}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), (str, os.PathLike)):
            raise ConfigError(f"{where}: each source is {{path, weight}} or {{path, repeat}}, got {entry!r}")
        unknown = sorted(set(map(str, entry)) - {"path", *SHARE_KEYS})
        given = [key for key in SHARE_KEYS if key in entry]
        if unknown or len(given) != 1:
            what = f"unknown key {unknown[0]!r}" if unknown else f"{' and '.join(given) or 'no weight'}"
            raise ConfigError(f"{where}: {what}; each source has a path and one of weight or repeat")
        kinds.add(given[0])
        paths.append(str(entry["path"]))
        values.append(share_value(entry[given[0]], f"{where}: {given[0]}"))
    if len(kinds) > 1:
        raise ConfigError(f"{origin}: weight and repeat in one mixture; give every source one kind")
    twice = next((p for k, p in enumerate(paths) if p in paths[:k]), None)
    if twice is not None:
        raise ConfigError(f"{origin}: {twice} is listed twice; give it one share")
    outputs = tuple(OutputSource.open(path, split) for path in paths)
    empty = next((o for o in outputs if o.num_packs == 0), None)
    if empty is not None:
        raise ConfigError(f"{origin}: {empty.name} has no packs of split {split!r}: nothing to draw from it")
    check_mixable(outputs)
    shares = Shares(weights=tuple(values)) if kinds == {"weight"} else Shares(repeats=tuple(values))
    if shares.repeats is not None:
        counts = mixture_counts(
            np.array([o.num_packs for o in outputs]), shares, epoch=0, seed=0, shuffle=False
        )
        for o, r, c in zip(outputs, values, counts.tolist(), strict=True):
            if c < 1:
                raise ConfigError(f"{origin}: {o.name}: repeat {r} of its {o.num_packs:,} packs takes none")
    return Mixture(outputs, shares)


def share_value(value: Any, where: str) -> float:
    """``value`` as a weight or repeat: a finite positive number (not a bool, not a string)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"{where} must be a finite positive number, got {value!r}")
    return float(value)


# --- what outputs must agree on to be mixed --------------------------------------------------------------
def _tokenizer(m: Manifest) -> dict[str, Any]:
    """The tokenizer's vocabulary digest (the sha256 of its file) and size, where the manifest has them."""
    return {"sha256": m.tokenizer.sha256, "vocab_size": m.tokenizer.vocab_size}


def _processor(m: Manifest) -> dict[str, Any] | None:
    """What decides a vision output's image inputs: its processor's family, image tokens, image processor
    and the digest of its configuration files; None for a text output."""
    vision = m.vision if isinstance(m.vision, dict) else None
    processor = vision.get("processor") if vision else None
    if not isinstance(processor, dict):
        return None
    keys = ("family", "image_token_ids", "image_processor", "config_sha256")
    return {k: processor.get(k) for k in keys}


def check_mixable(outputs: Sequence[OutputSource]) -> None:
    """``ConfigError`` naming two outputs and the field where they differ in what one batch of their packs
    needs (each against the first)."""
    first = outputs[0]
    for other in outputs[1:]:
        a, b = first.manifest, other.manifest
        pairs = [
            ("packed_sequence_size", a.packed_sequence_size, b.packed_sequence_size),
            ("labels", a.labels, b.labels),
            ("cp_padding (cp_size)", "cp_padding" in a.columns, "cp_padding" in b.columns),
        ]
        ta, tb = _tokenizer(a), _tokenizer(b)
        for key in ("sha256", "vocab_size"):  # a digest or size only one of them records cannot differ
            if ta[key] is not None and tb[key] is not None:
                pairs.append((f"tokenizer {key}", ta[key], tb[key]))
        pa_, pb_ = _processor(a), _processor(b)
        if pa_ is not None and pb_ is not None:
            pairs += [(f"vision processor {k}", pa_[k], pb_[k]) for k in pa_]
        for name, x, y in pairs:
            if x != y:
                raise ConfigError(
                    f"cannot mix {first.name} and {other.name}: they differ in {name} ({x!r} and {y!r})"
                )


def batch_columns(outputs: Sequence[OutputSource]) -> list[str]:
    """The columns a batch of the outputs' packs holds, as readers give them: the training columns, and
    ``loss_mask`` and ``cp_padding`` where every output has them."""
    columns = [*TRAINING_COLUMNS]
    if all(o.manifest.has_loss_mask for o in outputs):
        columns.append("loss_mask")
    if all("cp_padding" in o.manifest.columns for o in outputs):
        columns.append("cp_padding")
    return columns
