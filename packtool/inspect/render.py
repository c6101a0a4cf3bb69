"""How ``packtool inspect`` shows a report: rich tables and histograms in a terminal, or a matplotlib PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from packtool.errors import ConfigError

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
    try:  # matplotlib is an optional extra (packtool[plot])
        import matplotlib

        matplotlib.use("Agg")  # no display: draw to the file
        import matplotlib.pyplot as plt  # after use("Agg")
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
