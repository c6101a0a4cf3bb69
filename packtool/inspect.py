"""``packtool inspect``: how good is this packing? Figures, per-shard table and histograms of an output.

By default everything comes from the manifest and the shards' own metadata (the Parquet footer; for a
tar shard its ``.tar.idx`` and the ``.json`` of its first and last packs), so ``inspect`` takes the same
time for 10 packs or 10 million. ``full=True`` (``--full``) reads every pack and recomputes the figures
from the data, flagging any that differ from the manifest.

Example::

    >>> report = inspect_report("out/demo")  # doctest: +SKIP
    >>> report["fill_rate"], report["num_packs"], report["lower_bound_packs"]  # doctest: +SKIP
    (0.9746, 133, 131)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from packtool.errors import ConfigError, PacktoolError
from packtool.reading import iter_row_group_packs, load_manifest, samples_per_pack_stats, total_stats

if TYPE_CHECKING:
    from packtool.verify import Problem

# config keys shown as "strategy and config" (the rest is in --json)
CONFIG_KEYS = (
    "strategy",
    "split_across_pack",
    "long_samples",
    "max_packs",
    "position_ids",
    "labels",
    "add_bos",
    "add_eos",
    "pad_token_id",
    "shard_size",
    "row_group_size",
)
HISTOGRAM_TITLES = {
    "sample_lengths": "sample lengths (tokens, as read)",
    "pack_fill": "pack fill (real tokens per pack)",
    "samples_per_pack": "samples per pack",
    "packed_sample_lengths": "packed sample lengths (tokens in the packs)",
}


def inspect_report(directory: str | Path, *, full: bool = False) -> dict:
    """The figures of an output directory as one dict (what ``inspect --json`` prints).

    Top-level keys are the manifest's ``stats`` (``num_samples``, ``num_packs``, ``num_tokens``,
    ``fill_rate``, ``padding_tokens``, ``lower_bound_packs``, ``dropped_samples``, ...) plus
    ``packed_sequence_size``, ``strategy``, ``config``, ``tokenizer``, ``shards`` (each with
    ``fill_rate`` and what its own metadata says) and ``histograms``. ``warnings`` lists every
    disagreement between the manifest and the files; ``full`` adds ``recomputed`` (from the data).
    """
    from packtool.verify import shard_format

    m = load_manifest(directory)
    n = m["packed_sequence_size"]
    fmt = shard_format(m)
    warnings: list[str] = []
    shards = []
    for i, entry in enumerate(m["shards"]):
        sh = {k: entry.get(k) for k in ("path", "num_packs", "num_tokens", "bytes", "row_groups")}
        sh["fill_rate"] = total_stats(n, entry["num_packs"], entry["num_tokens"])["fill_rate"]
        path = Path(directory) / entry["path"]
        if not path.exists():
            warnings.append(f"{entry['path']}: missing")
        else:
            size = path.stat().st_size
            if size != entry.get("bytes"):
                warnings.append(
                    f"{entry['path']}: {size:,} bytes on disk, manifest says {entry.get('bytes'):,}"
                )
            if fmt.summary is not None:
                try:
                    own = fmt.summary(path)
                except Exception as e:
                    warnings.append(f"{entry['path']}: metadata unreadable ({str(e).splitlines()[0]})")
                else:
                    for key, value in own.items():
                        recorded = {"run_id": m["run_id"], "shard": i}.get(key, entry.get(key, value))
                        if value != recorded:
                            warnings.append(
                                f"{entry['path']}: {key} {value} in the file, {recorded} in the manifest"
                            )
        shards.append(sh)
    report = {
        "directory": str(directory),
        "run_id": m["run_id"],
        "packed_sequence_size": n,
        "strategy": m["config"].get("strategy"),
        "shard_format": m.get("shard_format"),
        "sample_format": m.get("sample_format"),
        "labels": m.get("labels"),
        "empty_loss": m["config"].get("empty_loss"),
        "position_ids": m.get("position_ids"),
        "tokenizer": m.get("tokenizer"),
        "inputs": m.get("inputs"),
        "config": m.get("config"),
        **m["stats"],
        "shards": shards,
        "histograms": m.get("histograms", {}),
        "warnings": warnings,
    }
    if full:
        report["recomputed"] = recompute_stats(directory, m, warnings)
        for key, value in report["recomputed"].items():
            if key in m["stats"] and value != m["stats"][key]:
                warnings.append(f"{key}: {value} in the data, {m['stats'][key]} in the manifest")
    return report


def recompute_stats(directory: str | Path, manifest: dict, warnings: list[str] | None = None) -> dict:
    """Read every pack and compute the figures again from ``seq_lens`` and ``sample_index``.

    What cannot be read is left out of the figures and described in ``warnings``."""
    from packtool.pipeline import _histogram
    from packtool.verify import VerifyReport, iter_batches
    from packtool.writers.chunks import ranges

    n = manifest["packed_sequence_size"]
    check = VerifyReport(str(directory))
    used, per_pack, pieces_sample, pieces_len = [], [], [], []
    for _, _, _, packs in iter_batches(directory, manifest, check):
        npieces = np.diff(packs.sample_index_offsets)
        sl = packs.seq_lens.astype(np.int64)
        length = sl[ranges(packs.seq_lens_offsets[:-1], npieces)]
        cs = np.concatenate([[0], np.cumsum(length)])
        used.append(np.diff(cs[packs.sample_index_offsets]))
        per_pack.append(npieces)
        pieces_sample.append(packs.sample_index.astype(np.int64))
        pieces_len.append(length)
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
    split = {} if manifest["config"].get("max_packs") else {"split_samples": int((packs_of_sample > 1).sum())}
    return {
        **total_stats(n, num_packs, num_tokens),
        "packed_samples": len(kept),
        "samples_per_pack": samples_per_pack_stats(
            num_packs,
            len(sample),
            int(per_pack.min()) if num_packs else 0,
            int(per_pack.max()) if num_packs else 0,
        ),
        **split,
        "histograms": {
            "packed_sample_lengths": _histogram(
                kept, np.unique(np.linspace(0, max(int(kept.max()) if len(kept) else 1, 1), 33).astype(int))
            ),
            "pack_fill": _histogram(used, np.linspace(0, n, 21).astype(int)),
            "samples_per_pack": _histogram(
                per_pack, np.arange(0, (int(per_pack.max()) if num_packs else 1) + 2)
            ),
        },
    }


# --- one pack ----------------------------------------------------------------------------------------
def read_one_pack(directory: str | Path, manifest: dict, index: int) -> tuple[dict, str, int]:
    """Pack ``index`` (global, 0-based) as a dict of arrays (with ``sample_index``); its shard and row.

    The pack is read alone where the format allows (its Parquet row group, its bytes through a tar
    shard's ``.tar.idx``); failing that the shard is read in order, as ``verify`` reads it. Raises
    ``PacktoolError`` naming the shard, the pack and why when the pack cannot be read either way.
    """
    total = sum(int(s["num_packs"]) for s in manifest["shards"])
    if not 0 <= index < total:
        raise ConfigError(f"--pack {index}: the output has {total:,} packs (0..{total - 1})")
    base = 0
    for entry in manifest["shards"]:
        if index < base + entry["num_packs"]:
            break
        base += entry["num_packs"]
    row = index - base
    path = Path(directory) / entry["path"]
    from packtool.verify import VerifyReport, shard_format

    check = VerifyReport(str(directory))
    if not path.exists():
        check.add("missing", "the shard is missing", shard=entry["path"])
    elif (pack := _read_pack_alone(path, entry, manifest, row)) is not None:
        return pack, entry["path"], row
    else:  # read in order: the packs that can be read, and what is wrong with the others
        shard = manifest["shards"].index(entry)
        for first, packs in shard_format(manifest).open(path, entry, manifest, check, shard, base):
            if first <= row < first + packs.num_packs:
                k = row - first
                pack = packs.pack(k)
                pack["sample_index"] = packs.sample_index[
                    packs.sample_index_offsets[k] : packs.sample_index_offsets[k + 1]
                ]
                return pack, entry["path"], row
    raise PacktoolError(
        f"{path}: pack {index} cannot be read{_why(check.problems, index)}; run packtool verify"
    )


def _read_pack_alone(path: Path, entry: dict, manifest: dict, row: int) -> dict | None:
    """Pack ``row`` of shard ``path`` read without the rest of the shard: its Parquet row group, or its
    bytes through a tar shard's ``.tar.idx``. None where the shard cannot be read that way (damaged,
    no index): the caller then reads it in order, which says what is wrong."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.writers.webdataset import read_tar_pack

    n = manifest["packed_sequence_size"]
    fmt = manifest.get("shard_format", "parquet")
    if fmt == "webdataset":
        try:
            return read_tar_pack(path, row, n)
        except PacktoolError:  # a damaged member: reading in order says so, as for any format
            return None
    if fmt != "parquet" or not entry.get("row_groups"):
        return None
    bounds = np.cumsum([0, *entry["row_groups"]])
    rg = int(np.searchsorted(bounds, row, side="right") - 1)
    try:
        table = pq.ParquetFile(path).read_row_group(rg).slice(row - int(bounds[rg]), 1)
        packs = list(iter_row_group_packs(table, n, with_sample_index=True))
    except (pa.ArrowException, OSError, ValueError, KeyError):  # damaged, or not the manifest's row groups
        return None
    return packs[0] if packs else None


def _why(problems: list[Problem], index: int) -> str:
    """What is wrong with pack ``index``, as `` (reason)``, from the problems found reading its shard: the
    one at that pack, else the last one before it or about the whole shard; ``""`` if none."""
    before = [p for p in problems if p.pack is None or p.pack <= index]
    if not before:
        return ""
    found = ([p for p in before if p.pack == index] or before)[-1]
    return f" ({replace(found, shard=None, pack=None if found.pack == index else found.pack)})"


def pack_report(
    directory: str | Path, index: int, *, decode: bool = False, tokenizer: str | None = None
) -> dict:
    """One pack: its ``seq_lens``, ``sample_index``, and (``decode``) each sample's text.

    The text is decoded with the tokenizer named in the manifest (or ``tokenizer``), loaded with
    ``HFTokenizer``. Returns ``{"pack", "shard", "row", "seq_lens", "sample_index", "pieces": [...],
    "padding_tokens", "fill_rate"}``; each piece has ``sample_index``, ``offset`` (in the pack), ``length``
    and with ``decode`` ``text``.
    """
    m = load_manifest(directory)
    n = m["packed_sequence_size"]
    pack, shard, row = read_one_pack(directory, m, index)
    seq_lens = [int(x) for x in pack["seq_lens"]]
    samples = [int(x) for x in pack["sample_index"]]
    lengths = seq_lens[: len(samples)]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    used = int(offsets[-1])
    pieces = [
        {"sample_index": s, "offset": int(o), "length": int(length)}
        for s, o, length in zip(samples, offsets[:-1], lengths, strict=True)
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
    if decode:
        tok = load_tokenizer(m, tokenizer)
        ids = pack["input_ids"]
        for p in pieces:
            p["text"] = tok.decode([int(t) for t in ids[p["offset"] : p["offset"] + p["length"]]])
    return out


def load_tokenizer(manifest: dict, override: str | None = None):
    """``HFTokenizer`` for the manifest's ``tokenizer`` entry (or ``override``); checks its sha256."""
    from packtool.encoders.text import HFTokenizer
    from packtool.utils import file_sha256

    ident = manifest.get("tokenizer") or {}
    spec = override or ident.get("name")
    if not spec or (override is None and ident.get("kind") != "huggingface"):
        raise ConfigError(
            f"the manifest names no Hugging Face tokenizer (tokenizer kind {ident.get('kind')!r}); "
            "pass --tokenizer PATH to decode"
        )
    if not Path(spec).exists():
        if override:
            raise ConfigError(f"--tokenizer {spec}: not found")
        raise ConfigError(f"tokenizer {spec} from the manifest is not found here; pass --tokenizer PATH")
    tok = HFTokenizer(spec)
    if (
        override is None
        and ident.get("sha256")
        and tok.hash_file
        and file_sha256(tok.hash_file) != ident["sha256"]
    ):
        raise ConfigError(
            f"tokenizer {spec} has changed since the run (sha256 differs from the manifest's); "
            "pass --tokenizer PATH to decode with it anyway"
        )
    return tok


# --- rendering ---------------------------------------------------------------------------------------
def _bins(hist: dict, max_rows: int = 16) -> list[tuple[str, int]]:
    """Histogram rows ``(label, count)``: leading/trailing empty bins cut, merged to at most ``max_rows``."""
    edges, counts = list(hist.get("edges", [])), list(hist.get("counts", []))
    nz = [i for i, c in enumerate(counts) if c]
    if not nz:
        return []
    lo, hi = nz[0], nz[-1] + 1
    edges, counts = edges[lo : hi + 1], counts[lo:hi]
    step = -(-len(counts) // max_rows)
    rows = []
    integer_bins = all(b - a == 1 for a, b in zip(edges[:-1], edges[1:], strict=True))
    for i in range(0, len(counts), step):
        a, b = edges[i], edges[min(i + step, len(counts))]
        label = str(a) if integer_bins and step == 1 else f"{a:,}–{b:,}"
        rows.append((label, int(sum(counts[i : i + step]))))
    return rows


def render_histogram(title: str, hist: dict, width: int = 40):
    """A rich Table drawing ``hist`` (``{"edges", "counts"}``) as horizontal bars."""
    from rich.table import Table

    table = Table(title=title, show_header=False, box=None, padding=(0, 1), title_justify="left")
    table.add_column("bin", justify="right", style="cyan")
    table.add_column("bar")
    table.add_column("count", justify="right")
    rows = _bins(hist)
    top = max((c for _, c in rows), default=0)
    for label, count in rows:
        size = count / top * width if top else 0
        bar = "█" * int(size) + ("▌" if size - int(size) >= 0.5 else "")
        table.add_row(label, f"[green]{bar}[/green]", f"{count:,}")
    return table


def render_report(report: dict) -> None:
    """Print the overview, the per-shard table and the histograms to the terminal."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    n = report["packed_sequence_size"]
    overview = Table(title=f"packtool output: {report['directory']}", show_header=False)
    overview.add_column("figure", style="bold")
    overview.add_column("value", justify="right")
    tok = report.get("tokenizer") or {}
    spp = report["samples_per_pack"]
    rows = [
        ("run_id", report["run_id"]),
        ("packed_sequence_size (N)", f"{n:,}"),
        ("samples in", f"{report['num_samples']:,}"),
        ("samples packed", f"{report['packed_samples']:,}"),
        ("packs", f"{report['num_packs']:,}"),
        ("tokens", f"{report['num_tokens']:,}"),
        ("padding tokens", f"{report['padding_tokens']:,}"),
        ("fill rate", f"{report['fill_rate']:.2%}"),
        ("lower bound ceil(tokens / N)", f"{report['lower_bound_packs']:,} packs"),
        ("packs over lower bound", f"{report['packs_over_lower_bound']:,}"),
        ("samples per pack mean / min / max", f"{spp['mean']:.2f} / {spp['min']} / {spp['max']}"),
        ("empty samples", f"{report['empty_samples']:,}"),
        (
            f"nothing to learn ({report.get('empty_loss', 'drop')})",
            f"{report.get('empty_loss_samples', 0):,}",
        ),
        (
            "dropped samples (too long)",
            f"{report['dropped_samples']:,} ({report.get('dropped_tokens', 0):,} tokens)",
        ),
        (
            "truncated samples",
            f"{report['truncated_samples']:,} ({report.get('truncated_tokens', 0):,} tokens cut)",
        ),
        ("split samples", f"{report['split_samples']:,}"),
        (
            "samples over max_packs",
            f"{report['samples_over_max_packs']:,} ({report.get('tokens_over_max_packs', 0):,} tokens)",
        ),
        ("skipped samples (bad input)", f"{report.get('skipped_samples', 0):,}"),
    ]
    rows += [(f"  skipped: {k}", f"{v:,}") for k, v in report.get("skipped_by_reason", {}).items()]
    for k, v in rows:
        overview.add_row(k, v)
    overview.add_section()
    cfg = report.get("config") or {}
    overview.add_row("format", f"{report.get('shard_format')} ({report.get('sample_format')} input)")
    for key in CONFIG_KEYS:
        if key in cfg:
            overview.add_row(key, str(cfg[key]))
    overview.add_section()
    overview.add_row("tokenizer", str(tok.get("name")))
    overview.add_row("tokenizer kind / vocab_size", f"{tok.get('kind')} / {tok.get('vocab_size')}")
    if tok.get("sha256"):
        overview.add_row("tokenizer sha256", str(tok["sha256"])[:16] + "…")
    if tok.get("bos_token_id") is not None or tok.get("eos_token_id") is not None:
        overview.add_row("bos / eos token id", f"{tok.get('bos_token_id')} / {tok.get('eos_token_id')}")
    console.print(overview)

    shards = Table(title="shards")
    for col in ("path", "packs", "tokens", "fill", "bytes", "row groups"):
        shards.add_column(col, justify="left" if col == "path" else "right")
    for sh in report["shards"]:
        shards.add_row(
            sh["path"],
            f"{sh['num_packs']:,}",
            f"{sh['num_tokens']:,}",
            f"{sh['fill_rate']:.2%}",
            f"{sh['bytes']:,}",
            str(len(sh["row_groups"])) if sh.get("row_groups") else "-",
        )
    console.print(shards)
    for key, hist in report.get("histograms", {}).items():
        console.print(render_histogram(HISTOGRAM_TITLES.get(key, key), hist))
        console.print()
    rec = report.get("recomputed")
    if rec:
        table = Table(title="recomputed from the data (--full)")
        for col in ("figure", "manifest", "data", ""):
            table.add_column(col, justify="left" if col == "figure" else "right")
        for key, value in rec.items():
            if key == "histograms":
                continue
            want = report.get(key)
            if key == "samples_per_pack":
                want, value = (
                    None if v is None else "{mean:.2f} / {min} / {max}".format(**v) for v in (want, value)
                )
            table.add_row(
                key, str(want), str(value), "[green]ok[/green]" if want == value else "[red]differs[/red]"
            )
        console.print(table)
        hist = rec["histograms"]["packed_sample_lengths"]
        console.print(render_histogram(HISTOGRAM_TITLES["packed_sample_lengths"], hist))
    for w in report.get("warnings", []):
        console.print(f"[bold red]warning:[/bold red] {w} (run packtool verify)")


def render_pack(report: dict) -> None:
    """Print one pack's layout, and its samples' text when decoded."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    console = Console()
    console.print(
        f"pack {report['pack']} ({report['shard']}, row {report['row']}): fill {report['fill_rate']:.2%}, "
        f"{report['padding_tokens']:,} padding tokens"
    )
    console.print(f"seq_lens: {report['seq_lens']}")
    console.print(f"sample_index: {report['sample_index']}")
    table = Table(show_header=True)
    for col in ("piece", "sample_index", "offset", "length"):
        table.add_column(col, justify="right")
    for i, p in enumerate(report["pieces"]):
        table.add_row(str(i), str(p["sample_index"]), str(p["offset"]), str(p["length"]))
    console.print(table)
    for i, p in enumerate(report["pieces"]):
        if "text" in p:
            title = f"piece {i}: sample {p['sample_index']}, {p['length']} tokens at offset {p['offset']}"
            console.print(Panel(Text(p["text"]), title=title, title_align="left"))
    if report["padding_tokens"] and any("text" in p for p in report["pieces"]):
        console.print(f"[dim][padding: {report['padding_tokens']} tokens][/dim]")


def plot_report(report: dict, path: str | Path) -> None:
    """Write the histograms as one PNG (needs matplotlib: ``pip install 'packtool[plot]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'packtool[plot]'") from None
    hists = dict(report.get("histograms", {}))
    if report.get("recomputed"):
        hists["packed_sample_lengths"] = report["recomputed"]["histograms"]["packed_sample_lengths"]
    fig, axes = plt.subplots(1, len(hists), figsize=(5 * len(hists), 3.6), squeeze=False)
    for ax, (key, hist) in zip(axes[0], hists.items(), strict=True):
        edges, counts = np.asarray(hist["edges"]), np.asarray(hist["counts"])
        ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", edgecolor="white", color="#3b7dd8")
        ax.set_title(HISTOGRAM_TITLES.get(key, key), fontsize=10)
        ax.set_ylabel("count")
    fig.suptitle(
        f"{report['directory']}: {report['num_packs']:,} packs of {report['packed_sequence_size']:,}, "
        f"fill {report['fill_rate']:.2%}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
