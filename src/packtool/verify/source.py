"""``verify --source``: the inputs re-read and re-encoded with the run's config, and every piece in the
packs compared token by token with its source sample; every sample accounted for."""

from __future__ import annotations

import itertools
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from packtool.arrays import ranges
from packtool.encoders.registry import fields_read
from packtool.errors import ConfigError, ErrorSink, InputError
from packtool.manifest import MANIFEST, Manifest
from packtool.options import PackOptions
from packtool.packs import PackArrays
from packtool.pipeline.chunks import ChunkStore
from packtool.pipeline.encode import encode_to_chunks
from packtool.pipeline.engines import make_engine, resolve_num_proc
from packtool.pipeline.run import start_run
from packtool.plugins import is_plugin_spec
from packtool.readers.inputs import read_inputs
from packtool.schema import pack_of_piece, piece_starts
from packtool.verify.report import VerifyReport


@dataclass
class SourceCheck:
    """Re-encoded source samples, and how many tokens of each the packs have delivered so far."""

    manifest: Manifest
    report: VerifyReport
    store: ChunkStore
    lengths: np.ndarray  # (num_samples,) tokens per source sample
    seen: np.ndarray  # (num_samples,) tokens found in the packs so far
    tmp: tempfile.TemporaryDirectory
    empty_loss_samples: int = 0  # samples with tokens but nothing to learn, as the source gives them

    @classmethod
    def start(
        cls,
        manifest: Manifest,
        inputs: list[str],
        report: VerifyReport,
        progress: bool,
        tokenizer: str | None = None,
        processor: str | None = None,
    ) -> SourceCheck:
        """Re-encode the source with the run's config, the tokenizer replaced by ``tokenizer`` when the
        user gives one (``verify --tokenizer``), a vision-language run's processor by ``processor``. A
        manifest is untrusted input: a tokenizer it names that is code (a ``module:callable`` or
        ``file.py:callable`` plugin) is never imported on its word, only when the user names it
        (``ConfigError`` otherwise); a tokenizer file or model folder is data."""
        if manifest.stats.policy_packs:
            raise ConfigError(
                f"--source cannot check this output: its {manifest.stats.policy_packs:,} packs hold what the "
                f"custom strategy's pack_selected_samples returned "
                f"({manifest.option('strategy')}), not the "
                "source samples' tokens; run verify without --source"
            )
        # the run's inputs where it found them (absolute paths: verify may run from another directory)
        recorded_inputs = [i.path if i.path and Path(i.path).exists() else i.source for i in manifest.inputs]
        recorded_tokenizer = _recorded_tokenizer(manifest)
        if tokenizer is None and isinstance(recorded_tokenizer, str) and is_plugin_spec(recorded_tokenizer):
            raise ConfigError(
                f"--source: the run's tokenizer is code ({recorded_tokenizer}), and verify runs only "
                "code named on its command line: pass --tokenizer SPEC (that plugin, if you trust it)"
            )
        replaced = {"processor": processor} if processor else {"tokenizer": tokenizer or recorded_tokenizer}
        options = PackOptions.from_provenance(
            {**manifest.provenance, **replaced},
            inputs=list(inputs) or recorded_inputs or manifest.option("inputs") or [],
        )
        # bad records are left out as the run left them (its on_error), fields it did not read ignored
        sink = ErrorSink(options.running.on_error)
        used = fields_read(options.encoding, manifest.sample_format)
        batches = read_inputs(
            options.reading.inputs,
            split=options.reading.split,
            text_field=options.encoding.text_field,
            sink=sink,
            used_fields=used,
            files=options.reading.files,
        )
        first = next(batches, None)
        if first is None:
            raise InputError("input holds no records", source=", ".join(options.reading.inputs))
        spec, facts = start_run(options, manifest.sample_format)
        ident, recorded = facts.identity, manifest.tokenizer
        if ident.get("sha256") != recorded.sha256:
            report.add(
                "source",
                f"tokenizer {ident.get('name')} (sha256 {str(ident.get('sha256'))[:12]}) is "
                f"not the one of the run (sha256 {str(recorded.sha256)[:12]})",
                shard=MANIFEST,
                field="tokenizer",
            )
        tmp = tempfile.TemporaryDirectory(prefix="packtool-verify-")
        with (
            make_engine(options.running, resolve_num_proc(options.to_dict())) as engine,
            tqdm(disable=not progress, file=sys.stderr, desc="encode source", unit=" samples") as bar,
        ):
            metas = encode_to_chunks(
                spec, options, itertools.chain([first], batches), tmp.name, engine,
                lambda meta, new: bar.update(meta["num_samples"]),
            )  # fmt: skip
        skipped = sink.total + sum(sum(m.get("skipped", {}).get("counts", {}).values()) for m in metas)
        if skipped != manifest.stats.skipped_samples:
            report.add(
                "source",
                f"the source has {skipped:,} bad records to skip, the manifest says "
                f"{manifest.stats.skipped_samples:,}",
                shard=MANIFEST,
                field="skipped_samples",
            )
        store = ChunkStore(Path(tmp.name), metas)
        lengths = store.lengths().astype(np.int64)
        # under empty_loss=drop a sample with nothing to learn reaches the packs as an empty one, and the
        # run counts it as dropped for its loss, not as empty (pipeline.summary)
        empty_loss = sum(m.get("empty_loss_samples", 0) for m in metas)
        zeros = np.zeros(len(lengths), dtype=np.int64)
        return cls(manifest, report, store, lengths, zeros, tmp, empty_loss)

    def where(self, sample: int) -> str:
        """``file, line L`` of source sample ``sample``."""
        e = self.store.locate(sample, "input_ids", "")
        return f"{e.source}, {e.row_kind} {e.row}"

    def close(self) -> None:
        self.store._open.clear()
        self.tmp.cleanup()

    def add(self, packs: PackArrays, used: np.ndarray, first: int, name: str) -> None:
        """Compare every piece of a batch of packs with its source sample."""
        k, n = packs.input_ids.shape
        npieces = np.diff(packs.sample_index_offsets)
        sl, slo = packs.seq_lens.astype(np.int64), packs.seq_lens_offsets
        # piece lengths: the first npieces entries of each pack's seq_lens
        piece_slot = ranges(slo[:-1], npieces)
        span = sl[piece_slot] if len(piece_slot) == len(packs.sample_index) else None
        length = span  # a piece's tokens: its seq_lens entry less its context-parallel padding, if any
        if span is not None and packs.cp_padding is not None and len(packs.cp_padding) == len(span):
            length = span - packs.cp_padding
        if length is None or np.any(length <= 0):
            return  # broken layout, already reported by the structure checks
        sample = packs.sample_index.astype(np.int64)
        pack = pack_of_piece(packs.sample_index_offsets)
        dest = pack * n + piece_starts(span, packs.sample_index_offsets)
        bad = (sample < 0) | (sample >= len(self.lengths))
        where = np.flatnonzero(bad)
        problems = (
            (
                f"sample_index {sample[j]} is not a sample of the source ({len(self.lengths):,} samples)",
                first + int(pack[j]),
            )
            for j in where
        )
        self.report.add_many("source", len(where), problems, shard=name, field="sample_index")
        ok = ~bad
        offsets = None if packs.sample_offset is None else packs.sample_offset.astype(np.int64)[ok]
        sample, length, dest, pack = sample[ok], length[ok], dest[ok], pack[ok]
        # offset of each piece inside its sample: tokens of earlier pieces, this batch included
        order = np.argsort(sample, kind="stable")
        s_sorted, l_sorted = sample[order], length[order]
        csum = np.cumsum(l_sorted) - l_sorted
        group_start = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
        before = np.empty_like(csum)
        before[order] = csum - np.repeat(csum[group_start], np.diff(np.r_[group_start, len(s_sorted)]))
        start = self.seen[sample] + before if offsets is None else offsets
        np.add.at(self.seen, sample, length)
        over = (start + length > self.lengths[sample]) | (self.seen[sample] > self.lengths[sample])
        where = np.flatnonzero(over)
        problems = (
            (
                f"sample {sample[j]} has more tokens in the packs than in the source "
                f"({self.lengths[sample[j]]}): duplicated?",
                first + int(pack[j]),
            )
            for j in where
        )
        self.report.add_many("source", len(where), problems, shard=name, field="input_ids")
        keep = ~over
        sample, length, dest, start, pack = sample[keep], length[keep], dest[keep], start[keep], pack[keep]
        want = {"input_ids": np.zeros(k * n, dtype=np.int32), "labels": np.zeros(k * n, dtype=np.int32)}
        if packs.loss_mask is not None:
            want["loss_mask"] = np.zeros(k * n, dtype=np.int8)
        self.store.pieces_into(sample, start, length, dest, want)
        pos = ranges(dest, length)
        piece_of_token = np.repeat(np.arange(len(sample)), length)
        got = {"input_ids": packs.input_ids, "labels": packs.labels, "loss_mask": packs.loss_mask}
        for col, expected in want.items():
            values = got[col].reshape(-1)
            diff = np.flatnonzero(values[pos] != expected[pos])
            pieces = np.unique(piece_of_token[diff])
            at = pos[diff[np.searchsorted(piece_of_token[diff], pieces)]]  # each piece's first difference
            problems = (
                (
                    f"sample {sample[j]} ({self.where(int(sample[j]))}): token {start[j] + t - dest[j]} is "
                    f"{values[t]} in the pack, {expected[t]} in the source",
                    first + int(pack[j]),
                )
                for j, t in zip(pieces, at, strict=True)
            )
            self.report.add_many("source", len(pieces), problems, shard=name, field=col)

    def finish(self) -> None:
        """Account for every sample: whole, truncated, cut at max_packs, or left out for a counted reason."""
        cfg, stats = self.manifest.provenance, self.manifest.stats
        n = self.manifest.packed_sequence_size
        lengths, seen = self.lengths, self.seen
        long = lengths > n
        policy = None if cfg.get("split_across_pack") else cfg.get("long_samples")
        counted = {
            "num_samples": len(lengths),
            "packed_samples": int((seen > 0).sum()),
            "empty_samples": int((lengths == 0).sum())
            - (self.empty_loss_samples if cfg.get("empty_loss", "drop") == "drop" else 0),
            "empty_loss_samples": self.empty_loss_samples,
            # the long_samples policy applies to every long sample, before max_packs cuts any of them; a
            # truncated sample that max_packs cut too counts as cut by max_packs (one fate each)
            "dropped_samples": int(long.sum()) if policy == "drop" else 0,
            "truncated_samples": int((long & (seen == n)).sum()) if policy == "truncate" else 0,
        }
        short = (seen < lengths) & (lengths > 0)
        explained = (long & (seen == 0)) if policy == "drop" else np.zeros(len(lengths), dtype=bool)
        if policy == "truncate":
            explained |= long & (seen == n)
        over_max = short & ~explained
        if cfg.get("max_packs"):  # left out whole, or partly kept (also counted as packed)
            counted["samples_over_max_packs"] = int((over_max & (seen == 0)).sum())
            counted["partial_samples"] = int((over_max & (seen > 0)).sum())
        else:
            counted.update(samples_over_max_packs=0, partial_samples=0)

            def lost(s: int) -> tuple[str, None]:
                what = (
                    "is missing from the packs" if seen[s] == 0 else f"has {seen[s]} of {lengths[s]} tokens"
                )
                return f"sample {s} ({self.where(s)}) {what}", None

            where = np.flatnonzero(over_max)
            self.report.add_many("source", len(where), map(lost, where.tolist()), field="sample_index")
        for key, value in counted.items():
            if getattr(stats, key) != value:
                self.report.add(
                    "source",
                    f"the source gives {key} = {value:,}, the manifest says {getattr(stats, key)}",
                    shard=MANIFEST,
                    field=key,
                )
        self.report.checked["source samples"] = len(lengths)


def _recorded_tokenizer(manifest: Manifest) -> str | None:
    """The run's tokenizer path as verify can open it: as given to ``pack`` (relative to where it ran),
    else the absolute path the manifest recorded (``verify`` may run from another directory; the sha256
    is compared after loading). A ``module:callable`` encoder is left as given."""
    given = manifest.option("tokenizer")
    recorded = manifest.tokenizer.details.get("path")
    if not isinstance(given, str) or not given or Path(given).exists():
        return given  # a wrong type is named when the options are built from the provenance
    if not isinstance(recorded, str) or not Path(recorded).exists():
        return given
    return recorded
