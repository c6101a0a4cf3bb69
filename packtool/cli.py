"""The ``packtool`` command line: parse, load the config, call the pipeline, print.

Every flag of ``pack`` has the same name as its config key (``--packed-sequence-size`` <->
``packed_sequence_size``). Errors are one line on stderr; exit code 2 for bad input or options, 1 for
internal errors.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from typing import Any

import click

from packtool.config import (
    EMPTY_LOSS_POLICIES,
    ENGINES,
    FORMATS,
    LABELS,
    LONG_SAMPLE_POLICIES,
    LOSS_ON,
    POSITION_IDS,
    SAMPLE_FORMATS,
    PackConfig,
    load_config_file,
)
from packtool.errors import ON_ERROR, ConfigError, PacktoolError


def _one_line(e: BaseException) -> str:
    """An error's text on one line (libraries' messages, e.g. transformers', can span several)."""
    return " ".join(str(e).split())


def _one_line_errors(fn):
    """Turn packtool errors into one line on stderr and the documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PacktoolError as e:
            click.echo(f"packtool: error: {_one_line(e)}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo(
                "packtool: interrupted; no complete-looking output was left behind "
                "(run the same command again to resume)",
                err=True,
            )
            sys.exit(130)
        except OSError as e:
            click.echo(f"packtool: error: {e.filename or ''}: {e.strerror or e}", err=True)
            sys.exit(1)
        except Exception as e:  # an internal error: say so, with the traceback only when asked
            if os.environ.get("PACKTOOL_DEBUG"):
                traceback.print_exc()
            click.echo(
                f"packtool: internal error: {type(e).__name__}: {_one_line(e)} "
                "(set PACKTOOL_DEBUG=1 for a traceback)",
                err=True,
            )
            sys.exit(1)

    return wrapper


@click.group()
@click.version_option(package_name="packtool")
def main() -> None:
    """Pack LLM training samples offline into fixed-length sequences, and inspect the result."""


@main.command()
@click.argument("inputs", nargs=-1)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML file of config keys.")
@click.option("--output", "-o", help="Output directory (written atomically).")
@click.option("--tokenizer", help="tokenizer.json, a local model directory, or module:callable encoder.")
@click.option("--packed-sequence-size", type=int, help="Tokens per pack (N).")
@click.option(
    "--split-across-pack/--no-split-across-pack",
    default=None,
    help="Let a sample run over into the next pack instead of moving it whole.",
)
@click.option("--max-packs", type=int, help="Keep at most this many packs (the rest is counted, not kept).")
@click.option(
    "--strategy",
    help="Packing strategy: bfd (default: best-fit decreasing, packs shuffled by --seed), sequential "
    "(NeMo PackedSequence order), or module:callable naming a select_samples_to_pack policy.",
)
@click.option(
    "--packing-buffer-size",
    type=int,
    help="Samples planned together by bfd or a custom policy (default: the whole input).",
)
@click.option(
    "--long-samples",
    type=click.Choice(LONG_SAMPLE_POLICIES),
    help="Samples longer than N without --split-across-pack: error (default), drop or truncate.",
)
@click.option(
    "--position-ids",
    type=click.Choice(POSITION_IDS),
    help="nemo (PackedSequence parity; default for sequential) or restart (0 at every sample piece and "
    "padding; default for the other strategies).",
)
@click.option("--num-proc", type=int, help="Processes for encoding and writing (output identical for any).")
@click.option("--engine", type=click.Choice(ENGINES), help="Where encoding and writing run: local or ray.")
@click.option("--ray-address", help="Ray cluster to join with --engine ray (default: start a local Ray).")
@click.option("--split", help="Split of a Hugging Face dataset (default train).")
@click.option("--text-field", help="Field holding the text (default text).")
@click.option("--sample-format", type=click.Choice(SAMPLE_FORMATS), help="How records are encoded.")
@click.option("--add-bos/--no-add-bos", default=None, help="Prepend the BOS token to every sample.")
@click.option("--add-eos/--no-add-eos", default=None, help="Append the EOS token to every sample.")
@click.option("--bos-token", help="BOS token text (default: the tokenizer's).")
@click.option("--eos-token", help="EOS token text (default: the tokenizer's).")
@click.option(
    "--labels",
    type=click.Choice(LABELS),
    help="shifted (default: labels[i] is the target of input_ids[i]) or unshifted (labels = ids).",
)
@click.option("--prompt-field", help="prompt_completion: field holding the prompt (default prompt).")
@click.option("--completion-field", help="prompt_completion: field holding the completion.")
@click.option(
    "--prompt-template",
    help="prompt_completion: 'alpaca' (instruction/input) or a format string over fields ('Q: {question}').",
)
@click.option(
    "--train-on-prompt/--no-train-on-prompt", default=None, help="prompt_completion: train on the prompt too."
)
@click.option("--chat-template", help="chat: Jinja template file (default: the tokenizer directory's own).")
@click.option(
    "--loss-on",
    type=click.Choice(LOSS_ON),
    help="chat: train on every assistant turn (default), the last one only, or all tokens.",
)
@click.option(
    "--empty-loss",
    type=click.Choice(EMPTY_LOSS_POLICIES),
    help="prompt_completion/chat: samples with nothing to learn: drop (default, counted), keep or error.",
)
@click.option("--pad-token-id", type=int, help="Id used to pad input_ids (default 0, as PackedSequence).")
@click.option("--format", "format_", type=click.Choice(FORMATS), help="Shard format: parquet, webdataset.")
@click.option("--shard-size", type=int, help="Packs per shard (default 2048).")
@click.option("--shard-max-bytes", type=int, help="webdataset: at most this many bytes per .tar shard.")
@click.option("--row-group-size", type=int, help="Packs per Parquet row group (default 128).")
@click.option("--chunk-size", type=int, help="Samples per encoding chunk (default 4096).")
@click.option("--seed", type=int, help="Seed of the pack shuffle of bfd (same seed, same bytes).")
@click.option(
    "--on-error",
    type=click.Choice(ON_ERROR),
    help="Bad records: fail (default: stop, exit code 2) or skip (count by reason, log errors.jsonl).",
)
@click.option("--overwrite/--no-overwrite", default=None, help="Replace an existing output directory.")
@click.option("--quiet", "-q", is_flag=True, default=None, help="No progress bars.")
@_one_line_errors
def pack(inputs: tuple[str, ...], config_file: str | None, format_: str | None, **flags: Any) -> None:
    """Tokenize INPUTS (JSONL/JSON, Parquet, text, save_to_disk dirs, hf:NAME) and pack them into shards."""
    values: dict[str, Any] = load_config_file(config_file) if config_file else {}
    flags["format"] = format_
    if inputs:
        flags["inputs"] = list(inputs)
    values.update({k: v for k, v in flags.items() if v is not None})
    config = PackConfig.from_dict(values, origin=config_file or "options")
    if config.engine == "local":  # its imports then run beside ours (see start_forkserver)
        from packtool.pipeline.engines.local import start_forkserver

        start_forkserver(config.num_proc)
    from packtool.pipeline import run_pack

    manifest = run_pack(config)
    if not config.quiet:
        s = manifest.stats
        click.echo(
            f"packed {s.packed_samples:,} of {s.num_samples:,} samples into {s.num_packs:,} packs "
            f"of {manifest.packed_sequence_size} tokens (fill rate {s.fill_rate:.2%}, lower bound "
            f"{s.lower_bound_packs:,} packs) -> {config.output}",
            err=True,
        )
        if s.empty_samples:
            click.echo(f"left out {s.empty_samples:,} empty samples (no tokens)", err=True)
        if s.skipped_samples:
            reasons = ", ".join(f"{k} {v:,}" for k, v in s.skipped_by_reason.items())
            click.echo(
                f"skipped {s.skipped_samples:,} bad records ({reasons}); first ones in "
                f"{os.path.join(config.output, 'errors.jsonl')}",
                err=True,
            )


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Also write the histograms to this PNG file.")
@click.option("--full", is_flag=True, help="Read every pack and recompute the figures from the data.")
@click.option("--pack", "pack_index", type=int, help="Show pack I (0-based): its seq_lens and samples.")
@click.option("--decode", is_flag=True, help="With --pack: the text of each sample, via the run's tokenizer.")
@click.option("--tokenizer", help="With --decode: use this tokenizer instead of the manifest's.")
@_one_line_errors
def inspect(
    directory: str,
    as_json: bool,
    plot: str | None,
    full: bool,
    pack_index: int | None,
    decode: bool,
    tokenizer: str | None,
) -> None:
    """Show fill rate, padding, counts, per-shard figures and histograms of a packtool output DIRECTORY.

    Fast: from the manifest and the shards' metadata, unless --full.
    """
    from packtool.inspect import inspect_report, pack_report
    from packtool.inspect.render import plot_report, render_pack, render_report

    if pack_index is None and (decode or tokenizer):
        raise ConfigError("--decode and --tokenizer go with --pack I")
    if pack_index is not None:
        report = pack_report(directory, pack_index, decode=decode, tokenizer=tokenizer)
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            render_pack(report)
        return
    report = inspect_report(directory, full=full)
    if plot:
        plot_report(report, plot)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        render_report(report)
        if plot:
            click.echo(f"histograms written to {plot}", err=True)


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.argument("inputs", nargs=-1)
@click.option(
    "--source",
    is_flag=True,
    help="Also re-read and re-encode the source (INPUTS, or the manifest's inputs if none are given) with "
    "the run's config and prove every kept sample's tokens are in the packs exactly once.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar while re-encoding the source.")
@_one_line_errors
def verify(directory: str, inputs: tuple[str, ...], source: bool, as_json: bool, quiet: bool) -> None:
    """Check that a packtool output DIRECTORY is whole: shards, sizes, sha256, run_id, index, packs.

    Prints OK, or every problem with its shard, pack and field. Exit code: 0 OK, 1 problems found,
    2 bad options or unreadable source input.
    """
    from packtool.verify import verify_output

    if inputs and not source:
        raise ConfigError("input paths after DIRECTORY are the source: pass --source")
    report = verify_output(directory, source=list(inputs) if source else None, progress=not quiet)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
