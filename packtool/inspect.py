"""``packtool inspect``: a report of a packtool output directory, from its manifest."""

from __future__ import annotations

from pathlib import Path

from packtool.reading import load_manifest


def inspect_report(directory: str | Path) -> dict:
    """Manifest figures as one flat-ish dict (what ``inspect --json`` prints)."""
    m = load_manifest(directory)
    s = m["stats"]
    return {
        "directory": str(directory),
        "run_id": m["run_id"],
        "packed_sequence_size": m["packed_sequence_size"],
        "strategy": m["config"].get("strategy"),
        "shard_format": m.get("shard_format"),
        "sample_format": m.get("sample_format"),
        "labels": m.get("labels"),
        "empty_loss": m["config"].get("empty_loss"),
        "tokenizer": m.get("tokenizer"),
        **s,
        "shards": [
            {k: sh[k] for k in ("path", "num_packs", "num_tokens", "bytes")}
            | {"fill_rate": round(sh["num_tokens"] / (sh["num_packs"] * m["packed_sequence_size"]), 6)}
            for sh in m["shards"]
        ],
        "histograms": m.get("histograms", {}),
    }


def render_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    overview = Table(title=f"packtool output: {report['directory']}", show_header=False)
    overview.add_column("figure", style="bold")
    overview.add_column("value", justify="right")
    tok = report.get("tokenizer") or {}
    rows = [
        ("packed_sequence_size", f"{report['packed_sequence_size']:,}"),
        ("strategy", str(report["strategy"])),
        ("tokenizer", str(tok.get("name"))),
        ("samples in", f"{report['num_samples']:,}"),
        ("samples packed", f"{report['packed_samples']:,}"),
        ("packs", f"{report['num_packs']:,}"),
        ("tokens", f"{report['num_tokens']:,}"),
        ("padding tokens", f"{report['padding_tokens']:,}"),
        ("fill rate", f"{report['fill_rate']:.2%}"),
        ("lower bound (packs)", f"{report['lower_bound_packs']:,}"),
        ("packs over lower bound", f"{report['packs_over_lower_bound']:,}"),
        (
            "samples per pack (mean/min/max)",
            "{mean:.2f} / {min} / {max}".format(**report["samples_per_pack"]),
        ),
        ("empty samples", f"{report['empty_samples']:,}"),
        (
            f"nothing to learn ({report.get('empty_loss', 'drop')})",
            f"{report.get('empty_loss_samples', 0):,}",
        ),
        ("dropped samples (too long)", f"{report['dropped_samples']:,}"),
        ("truncated samples", f"{report['truncated_samples']:,}"),
        ("split samples", f"{report['split_samples']:,}"),
        ("samples over max_packs", f"{report['samples_over_max_packs']:,}"),
        ("skipped samples (bad input)", f"{report.get('skipped_samples', 0):,}"),
    ]
    rows += [(f"  skipped: {k}", f"{v:,}") for k, v in report.get("skipped_by_reason", {}).items()]
    for k, v in rows:
        overview.add_row(k, v)
    console.print(overview)
    shards = Table(title="shards")
    for col in ("path", "packs", "tokens", "fill", "bytes"):
        shards.add_column(col, justify="left" if col == "path" else "right")
    for sh in report["shards"]:
        shards.add_row(
            sh["path"],
            f"{sh['num_packs']:,}",
            f"{sh['num_tokens']:,}",
            f"{sh['fill_rate']:.2%}",
            f"{sh['bytes']:,}",
        )
    console.print(shards)
