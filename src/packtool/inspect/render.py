"""How ``packtool inspect`` shows a report: rich tables and histograms in a terminal, or a matplotlib PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from packtool.errors import ConfigError

HISTOGRAM_TITLES = {
    "sample_lengths": "sample lengths (tokens, as read)",
    "pack_fill": "pack fill (real tokens per pack)",
    "samples_per_pack": "samples per pack",
    "packed_sample_lengths": "packed sample lengths (tokens in the packs)",
    "images_per_pack": "images per pack",
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


def _quantiles(hist: dict, names: bool = True) -> str:
    """``p50 180, p90 1,204, p99 9,871, max 170,501`` (or ``180 / 1,204 / 9,871 / 170,501``)."""
    q = hist["quantiles"]
    if names:
        return ", ".join(f"{k} {v:,}" for k, v in q.items())
    return " / ".join(f"{v:,}" for v in q.values())


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
        ("packs", f"{report['num_packs']:,}"),
        *([("  held out as validation", f"{report['val_packs']:,}")] if report.get("val_packs") else []),
        ("tokens in the packs", f"{report['num_tokens']:,}"),
        ("padding tokens", f"{report['padding_tokens']:,}"),
        *(
            [("  of which context-parallel (cp_size)", f"{report['cp_padding_tokens']:,}")]
            if report.get("cp_padding_tokens")
            else []
        ),
        ("fill rate", f"{report['fill_rate']:.2%}"),
        ("lower bound ceil(tokens / N)", f"{report['lower_bound_packs']:,} packs"),
        ("packs over lower bound", f"{report['packs_over_lower_bound']:,}"),
        ("samples per pack mean / min / max", f"{spp['mean']:.2f} / {spp['min']} / {spp['max']}"),
    ]
    for k, v in rows:
        overview.add_row(k, v)
    lengths = report.get("histograms", {}).get("sample_lengths", {})
    if lengths.get("quantiles"):  # how long the samples are, however long the tail
        overview.add_row("sample length p50 / p90 / p99 / max", _quantiles(lengths, names=False))
    images = report.get("images")
    if images:  # a vision-language output
        overview.add_section()
        for k, v in image_rows(images):
            overview.add_row(k, v)
    overview.add_section()
    total = report.get("input_samples", report["num_samples"])
    overview.add_row("input samples", f"{total:,}")
    for fate, count in report.get("sample_fates", {}).items():
        if count or fate == "packed whole":
            overview.add_row(f"  {fate}", f"{count:,}")
    if report.get("empty_loss_samples") and report.get("settings", {}).get("empty_loss") == "keep":
        overview.add_row("  (of them, nothing to learn, kept)", f"{report['empty_loss_samples']:,}")
    for k, v in report.get("skipped_by_reason", {}).items():
        overview.add_row(f"    skipped: {k}", f"{v:,}")
    overview.add_row("input tokens", f"{report.get('input_tokens', 0):,}")
    for fate, count in report.get("token_fates", {}).items():
        if count or fate == "packed":
            overview.add_row(f"  {fate}", f"{count:,}")
    overview.add_section()
    for key, value in report.get("settings", {}).items():
        if key == "packed_sequence_size":
            continue
        if key in ("bos_token_id", "eos_token_id") and not report["settings"].get(f"add_{key[:3]}"):
            value = f"{value} (not added)" if value is not None else "-"
        elif key in ("bos_token_id", "eos_token_id", "pad_token_id") and tok.get(f"{key[:3]}_token"):
            value = f"{value} ({tok[f'{key[:3]}_token']})"  # the token's text, as the run recorded it
        overview.add_row(key, "-" if value is None else str(value))
    overview.add_section()
    overview.add_row("tokenizer", str(tok.get("name")))
    overview.add_row("tokenizer kind / vocab_size", f"{tok.get('kind')} / {tok.get('vocab_size')}")
    if tok.get("sha256"):
        overview.add_row("tokenizer sha256", str(tok["sha256"])[:16] + "…")
    if tok.get("switched_off"):
        overview.add_row("switched off in the tokenizer", ", ".join(map(str, tok["switched_off"])))
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
        if hist.get("quantiles"):
            console.print(f"  {_quantiles(hist)}")
        console.print()
    rec = report.get("recomputed")
    if rec:
        table = Table(title="recomputed from the data (--full)")
        for col in ("figure", "manifest", "data", ""):
            table.add_column(col, justify="left" if col == "figure" else "right")
        # a vision-language output's image figures, one a row
        figures = {**rec, **{f"images: {k}": v for k, v in (rec.get("images") or {}).items()}}
        recorded = {**report, **{f"images: {k}": v for k, v in (report.get("images") or {}).items()}}
        for key, value in figures.items():
            if key in ("histograms", "images") or isinstance(value, dict) and key.startswith("images: "):
                continue
            want = recorded.get(key)
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
        if w.startswith("lost: "):  # what the run left out, by its settings
            console.print(f"[bold yellow]warning:[/bold yellow] {w}")
        else:  # the files disagree with the manifest
            console.print(f"[bold red]warning:[/bold red] {w} (run packtool verify)")
    for note in report.get("notes", []):  # what this version read by its rules, not a problem
        console.print(f"note: {note}")


def render_mixture(report: dict) -> None:
    """Print a mixture's table (``inspect.mixture.mixture_report``): each source's figures and its share."""
    kind = report["kind"]
    title = f"mixture: {report['mixture'] or 'sources'} (N = {report['packed_sequence_size']:,})"
    table = Table(title=title)
    columns = ("source", kind, "packs", "tokens", "fill", "packs/ep", "tokens/ep", "share", "laps/ep")
    for col in columns:
        table.add_column(col, justify="left" if col == "source" else "right", no_wrap=True)
    for s in report["sources"]:
        table.add_row(
            s["path"], f"{s[kind]:g}", f"{s['packs']:,}", f"{s['tokens']:,}", f"{s['fill_rate']:.2%}",
            f"{s['epoch_packs']:,.1f}", f"{s['epoch_tokens']:,.0f}", f"{s['token_share']:.2%}",
            f"{s['source_epochs']:.2f}",
        )  # fmt: skip
    table.add_section()
    table.add_row("epoch", "", "", "", "", f"{report['epoch_packs']:,.1f}", f"{report['epoch_tokens']:,.0f}",
                  "100%", "")  # fmt: skip
    console = Console()
    wide = console.options.update(max_width=1 << 14)  # the paths whole, however wide
    console.width = max(console.width, Measurement.get(console, wide, table).maximum)
    console.print(table)
    how = (
        "exactly each source's repeat times its packs"
        if kind == "repeat"
        else "each pack drawn from a source with probability weight / sum(weights): expected figures"
    )
    console.print(
        f"per epoch (ep): {how}; share: of the epoch's tokens, and of every 1,000 steps' alike; laps: times "
        "over the source's own packs"
    )


def image_rows(images: dict) -> list[tuple[str, str]]:
    """The overview's rows of a vision-language output's image figures (``inspect.image_report``)."""
    rows = [
        ("images packed / read", f"{images.get('packed_images', 0):,} / {images.get('input_images', 0):,}"),
        ("image tokens (share of the packs' tokens)",
         f"{images['image_tokens']:,} ({images['image_token_share']:.2%})"),
        ("images per pack mean / max",
         f"{images['images_per_pack_mean']:.2f} / {images['images_per_pack_max']}"),
        ("tokens per image min / mean / max",
         f"{images['tokens_per_image_min']} / {images['tokens_per_image_mean']:.1f} / "
         f"{images['tokens_per_image_max']}"),
        (f"image-token spread per {images['ranks']} consecutive packs mean / max",
         f"{images['step_spread_mean']:,.1f} / {images['step_spread_max']:,}"),
    ]  # fmt: skip
    if images.get("processor"):
        rows.append(("processor", str(images["processor"])))
    return rows


def render_pack(report: dict) -> None:
    """Print one pack's layout, where each piece comes from, and its text when decoded (trained tokens
    bold green, untrained dim)."""
    console = Console()
    console.print(
        f"pack {report['pack']} ({report['shard']}, row {report['row']}): fill {report['fill_rate']:.2%}, "
        f"{report['padding_tokens']:,} padding tokens"
    )
    console.print(f"seq_lens: {report['seq_lens']}")
    table = Table(show_header=True)
    for col in ("piece", "sample", "source", "at (pack)", "length", "from token (sample)"):
        table.add_column(col, justify="left" if col == "source" else "right", overflow="fold")
    for i, p in enumerate(report["pieces"]):
        start = f"{p.get('sample_offset', 0):,}" + (" (continued)" if p.get("continuation") else "")
        table.add_row(
            str(i),
            str(p["sample_index"]),
            _source(p.get("source")),
            str(p["offset"]),
            f"{p['length']} + {p['cp_padding']} cp" if p.get("cp_padding") else str(p["length"]),
            start,
        )
    console.print(table)
    if report.get("images"):  # each image's span in the pack
        images = Table(show_header=True, title="images")
        for col in ("image", "piece", "at (pack)", "length", "height x width", "name", "bytes"):
            images.add_column(col, justify="left" if col == "name" else "right", overflow="fold")
        for k, im in enumerate(report["images"]):
            span = f"{im['offset']}..{im['offset'] + im['length'] - 1}"
            size = f"{im['height']} x {im['width']}"
            images.add_row(
                str(k), str(im["piece"]), span, str(im["length"]), size, str(im["name"]), f"{im['bytes']:,}"
            )
        console.print(images)
    decoded = any("text" in p for p in report["pieces"])
    if decoded:
        console.print(
            "[dim]text: [bold green]trained[/bold green] (a target of the loss), untrained dim[/dim]"
        )
    for i, p in enumerate(report["pieces"]):
        if "text" not in p:
            continue
        text = Text()
        for seg in p.get("segments", [{"trained": True, "text": p["text"]}]):
            text.append(seg["text"], style="bold green" if seg["trained"] else "dim")
        cont = f", continued from token {p['sample_offset']:,}" if p.get("continuation") else ""
        title = f"piece {i}: sample {p['sample_index']}{cont}, {p['length']} tokens at {p['offset']}"
        console.print(Panel(text, title=title, title_align="left"))
    if report["padding_tokens"] and decoded:
        console.print(f"[dim][padding: {report['padding_tokens']} tokens][/dim]")


def _source(where: dict | None) -> str:
    """``file:line`` (or ``file, row r``) of a piece's sample; ``-`` when not known."""
    if not where:
        return "-"
    if where.get("row") is None:
        return f"{where['source']} (sample {where['sample_in_source']:,} of it)"
    sep = ":" if where.get("row_kind") == "line" else f", {where['row_kind']} "
    return f"{where['source']}{sep}{where['row']}"


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
        if hist.get("quantiles"):  # bins grow geometrically: a log axis, the quantiles marked
            ax.set_xscale("symlog", linthresh=1)
            for (name, value), style in zip(hist["quantiles"].items(), ("-", "--", ":", "-."), strict=True):
                ax.axvline(value, color="#d83b3b", linestyle=style, linewidth=1, label=f"{name} {value:,}")
            ax.legend(fontsize=8)
    fig.suptitle(
        f"{report['directory']}: {report['num_packs']:,} packs of {report['packed_sequence_size']:,}, "
        f"fill {report['fill_rate']:.2%}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
