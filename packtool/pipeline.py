"""``packtool pack`` as four steps: read -> encode -> plan -> write.

* **read** (this process): inputs are streamed as ``SourceBatch`` objects and grouped into chunks of
  ``chunk_size`` records, in input order.
* **encode** (engine, parallel by chunk): each chunk goes through the encoder and is written to the
  scratch directory as flat token arrays (``packtool.writers.chunks``).
* **plan** (this process): sample lengths are read from the chunks' offsets and packed by the strategy
  into a ``PackPlan``; no token is touched.
* **write** (engine, parallel by pack range): each shard gathers its packs' tokens from the chunks with
  vectorized copies and writes them; the manifest is written last and the directory renamed into place.

Chunk and shard boundaries depend only on the config, never on the number of processes, so the output
is byte-identical for every ``num_proc``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packtool import __version__
from packtool.config import PackConfig
from packtool.encoders import build_encoder, resolve_sample_format
from packtool.engines import make_engine
from packtool.errors import InputError
from packtool.packing import PackPlan, make_plan
from packtool.readers import expand_inputs, read_inputs
from packtool.readers.base import SourceBatch
from packtool.utils import file_sha256
from packtool.writers import OutputDir, build_pack_arrays, write_chunk, write_parquet_shard
from packtool.writers.chunks import ChunkStore

FORMAT_VERSION = 1

# --- worker state: built once per process by ``_init_worker`` --------------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(config: dict, sample_format: str) -> None:
    cfg = PackConfig.from_dict(config)
    _WORKER.clear()
    _WORKER.update(config=cfg, encoder=build_encoder(cfg, sample_format), stores={})


def _encode_chunk(task: tuple[int, list[SourceBatch], str]) -> dict:
    index, batches, work_dir = task
    encoder = _WORKER["encoder"]
    return write_chunk(work_dir, index, batches, [encoder(b) for b in batches])


def _store(work_dir: str) -> ChunkStore:
    stores = _WORKER.setdefault("stores", {})
    if work_dir not in stores:
        metas = json.loads((Path(work_dir) / "chunks.json").read_text())
        stores[work_dir] = ChunkStore(Path(work_dir), metas)
    return stores[work_dir]


def _write_shard(task: tuple[int, PackPlan, str, str, dict]) -> dict:
    index, plan, work_dir, out_dir, meta = task
    cfg: PackConfig = _WORKER["config"]
    packs = build_pack_arrays(plan, _store(work_dir), cfg.pad_token_id)
    name = f"packs-{index:06d}.parquet"
    path = Path(out_dir) / name
    info = write_parquet_shard(
        path, packs, row_group_size=cfg.row_group_size, metadata={**meta, "shard": index}
    )
    used = int(plan.length.sum())
    return {
        "path": name,
        "num_packs": plan.num_packs,
        "num_tokens": used,
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
        **info,
    }


# --- the driver ----------------------------------------------------------------------------------------
def chunked(batches: Iterator[SourceBatch], chunk_size: int) -> Iterator[list[SourceBatch]]:
    """Group batches into chunks of exactly ``chunk_size`` records (the last may be smaller)."""
    chunk: list[SourceBatch] = []
    size = 0
    for b in batches:
        start = 0
        while start < b.num_rows:
            take = min(chunk_size - size, b.num_rows - start)
            piece = (
                b
                if (start == 0 and take == b.num_rows)
                else SourceBatch(
                    b.source, b.batch.slice(start, take), b.rows[start : start + take], b.row_kind
                )
            )
            chunk.append(piece)
            size += take
            start += take
            if size == chunk_size:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


def input_fingerprint(inputs: list[str]) -> list[dict]:
    """Names and sizes of the input files (what the run_id is made from)."""
    out = []
    for kind, source, files in expand_inputs(inputs):
        paths = files or ([source] if Path(source).is_file() else [])
        if Path(source).is_dir() and not files:
            paths = sorted(str(p) for p in Path(source).rglob("*") if p.is_file())
        out.append({"source": source, "kind": kind, "bytes": sum(os.path.getsize(p) for p in paths)})
    return out


def run_pack(config: PackConfig, *, progress: bool | None = None) -> dict:
    """Run ``packtool pack`` for ``config``; return the manifest. Raises ``PacktoolError`` subclasses."""
    config.validate()
    show = (not config.quiet) if progress is None else progress
    out = OutputDir(config.output, overwrite=config.overwrite).open()
    try:
        manifest = _run(config, out, show)
        out.commit(manifest)
        return manifest
    except BaseException:
        out.abort()
        raise


def _progress(show: bool, **kw):
    from tqdm import tqdm

    return tqdm(disable=not show, file=sys.stderr, dynamic_ncols=True, **kw)


def _run(config: PackConfig, out: OutputDir, show: bool) -> dict:
    batches = read_inputs(config.inputs, split=config.split, text_field=config.text_field)
    first = next(batches, None)
    if first is None:
        raise InputError("input holds no records", source=", ".join(config.inputs))
    sample_format = resolve_sample_format(config, first.batch.schema.names)
    encoder = build_encoder(config, sample_format)  # fail fast here on a bad tokenizer spec
    work = str(out.work)
    fingerprint = input_fingerprint(config.inputs)
    identity = encoder.identity()
    config_dict = config.to_dict(include_runtime=False)
    run_id = hashlib.sha256(
        json.dumps([config_dict, identity, fingerprint, FORMAT_VERSION], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]

    engine = make_engine(config, _init_worker, (config.to_dict(), sample_format))
    with engine:
        store = encode_to_chunks(config, itertools.chain([first], batches), work, engine, show)
        lengths = store.lengths()
        plan = make_plan(lengths, config, store.locate)
        shard_ranges = [
            (i, a, min(a + config.shard_size, plan.num_packs))
            for i, a in enumerate(range(0, plan.num_packs, config.shard_size))
        ]
        meta = {
            "run_id": run_id,
            "packed_sequence_size": config.packed_sequence_size,
            "format_version": FORMAT_VERSION,
        }
        shards = []
        with _progress(show, desc="write", unit=" packs", total=plan.num_packs) as bar:
            tasks = ((i, plan.slice(a, b), work, str(out.partial), meta) for i, a, b in shard_ranges)
            for info in engine.map(_write_shard, tasks):
                shards.append(info)
                bar.update(info["num_packs"])
    return build_manifest(
        config,
        plan,
        lengths,
        shards,
        identity,
        sample_format,
        run_id,
        fingerprint,
        has_loss_mask=store.has_loss_mask,
    )


def encode_to_chunks(
    config: PackConfig, batches: Iterator[SourceBatch], work: str, engine: Any, show: bool
) -> ChunkStore:
    """The encode step: ``batches`` -> encoded chunks in ``work`` (by ``engine``, whose workers were
    started with ``_init_worker``). Shared by ``packtool pack`` and ``packtool verify --source``."""
    metas = []
    with _progress(show, desc="encode", unit=" samples") as bar:
        tasks = ((i, chunk, work) for i, chunk in enumerate(chunked(batches, config.chunk_size)))
        for meta in engine.map(_encode_chunk, tasks):
            metas.append(meta)
            bar.update(meta["num_samples"])
    (Path(work) / "chunks.json").write_text(json.dumps(metas))
    return ChunkStore(Path(work), metas)


def _histogram(values: np.ndarray, edges: np.ndarray) -> dict:
    counts, edges = np.histogram(values, bins=edges)
    return {"edges": [int(e) for e in edges], "counts": [int(c) for c in counts]}


def build_manifest(
    config: PackConfig,
    plan: PackPlan,
    lengths: np.ndarray,
    shards: list[dict],
    tokenizer: dict,
    sample_format: str,
    run_id: str,
    inputs: list[dict],
    has_loss_mask: bool,
) -> dict:
    n = config.packed_sequence_size
    pack_tokens = plan.pack_tokens()
    per_pack = np.diff(plan.pack_offsets)
    num_packs, num_tokens = plan.num_packs, int(pack_tokens.sum())
    lower_bound = -(-num_tokens // n)
    packed_samples = len(np.unique(plan.sample))
    stats = {
        "num_samples": int(len(lengths)),
        "packed_samples": int(packed_samples),
        "num_packs": int(num_packs),
        "num_tokens": num_tokens,
        "input_tokens": int(lengths.sum()),
        "padding_tokens": int(num_packs * n - num_tokens),
        "fill_rate": round(num_tokens / (num_packs * n), 6) if num_packs else 0.0,
        "lower_bound_packs": int(lower_bound),
        "packs_over_lower_bound": int(num_packs - lower_bound),
        "samples_per_pack": {
            "mean": round(float(per_pack.mean()), 4) if num_packs else 0.0,
            "min": int(per_pack.min()) if num_packs else 0,
            "max": int(per_pack.max()) if num_packs else 0,
        },
        **plan.stats.to_dict(),
    }
    stats["num_samples"] = int(len(lengths))
    length_edges = np.unique(
        np.linspace(0, max(int(lengths.max()) if len(lengths) else 1, n), 33).astype(int)
    )
    histograms = {
        "sample_lengths": _histogram(lengths, length_edges),
        "pack_fill": _histogram(pack_tokens, np.linspace(0, n, 21).astype(int)),
        "samples_per_pack": _histogram(per_pack, np.arange(0, (int(per_pack.max()) if num_packs else 1) + 2)),
    }
    return {
        "format": "packtool",
        "format_version": FORMAT_VERSION,
        "packtool_version": __version__,
        "run_id": run_id,
        "shard_format": config.format,
        "packed_sequence_size": n,
        "sample_format": sample_format,
        "labels": config.labels,
        "position_ids": config.position_ids,
        "pad_token_id": config.pad_token_id,
        "columns": ["input_ids", "labels", "position_ids", "seq_lens"]
        + (["loss_mask"] if has_loss_mask else [])
        + ["sample_index"],
        "tokenizer": tokenizer,
        "inputs": inputs,
        "config": config.to_dict(include_runtime=False),
        "stats": stats,
        "histograms": histograms,
        "shards": shards,
    }
