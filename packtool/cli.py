"""The ``packtool`` command line: parse, load the config, call the pipeline, print.

Every flag of ``pack`` has the same name as its config key (``--packed-sequence-size`` <->
``packed_sequence_size``). Every command prints an error as one line on stderr and exits with the code
of its kind (``packtool.errors``: 1 problems found, 2 usage, 3 bad input, 4 failure, 130 interrupted).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from packtool.config import PackConfig, load_config_file
from packtool.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    ConfigError,
    PacktoolError,
)
from packtool.pipeline.engines import may_need_workers, resolve_num_proc
from packtool.pipeline.engines.local import keep_freed_memory, start_forkserver


def _one_line(e: BaseException) -> str:
    """An error's text on one line (libraries' messages, e.g. transformers', can span several)."""
    return " ".join(str(e).split())


class PacktoolGroup(click.Group):
    """The ``packtool`` group: every error of every command, its option parsing included, is one line on
    stderr (``packtool: error: ...``) with the documented exit code."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except PacktoolError as e:
            click.echo(f"packtool: error: {_one_line(e)}", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:  # a usage error: an unknown option, a bad value, ...
            click.echo(f"packtool: error: {_one_line(e.format_message())}", err=True)
            sys.exit(EXIT_USAGE)
        except (KeyboardInterrupt, click.Abort):
            click.echo(
                "packtool: interrupted; no complete-looking output was left behind "
                "(run the same command again to resume)",
                err=True,
            )
            sys.exit(EXIT_INTERRUPTED)
        except OSError as e:
            click.echo(f"packtool: error: {e.filename or ''}: {e.strerror or e}", err=True)
            sys.exit(EXIT_FAILURE)
        except Exception as e:  # an internal error: say so, with the traceback only when asked
            if os.environ.get("PACKTOOL_DEBUG"):
                traceback.print_exc()
            click.echo(
                f"packtool: internal error: {type(e).__name__}: {_one_line(e)} "
                "(set PACKTOOL_DEBUG=1 for a traceback)",
                err=True,
            )
            sys.exit(EXIT_FAILURE)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=PacktoolGroup)
@click.version_option(package_name="packtool")
def main() -> None:
    """Pack LLM training samples offline into fixed-length sequences, and inspect the result."""


def config_options(fn: Callable) -> Callable:
    """Add one click option per ``PackConfig`` key that has a flag, from the key's own declaration (its
    name, type, default, choices and help), so that the flag, the config key and the manifest field are
    one name with one meaning."""
    for f in reversed(dataclasses.fields(PackConfig)):
        meta = f.metadata
        if not meta["flag"]:
            continue
        name = "--" + f.name.replace("_", "-")
        names = [name] + ([f"-{meta['short']}"] if meta["short"] else [])
        kind = str(f.type).split(" |")[0]
        kwargs: dict[str, Any] = {"help": meta["help"], "show_default": f.default is not None}
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        if kind == "bool":
            if f.name == "quiet":
                kwargs["is_flag"] = True
            else:
                names = [f"{name}/--no-{name[2:]}"]
        elif meta["choices"]:
            kwargs["type"] = click.Choice(meta["choices"])
        elif kind in ("int", "float"):
            kwargs["type"] = {"int": int, "float": float}[kind]
        fn = click.option(*names, f.name, **kwargs)(fn)
    return fn


def _read_config_file(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """``--config FILE``: the file's keys become the options' defaults (click's ``default_map``), so a
    flag given on the command line overrides the file and the file overrides the built-in default."""
    if path:
        ctx.default_map = {**(ctx.default_map or {}), **load_config_file(path)}
    return path


@main.command()
@click.argument("inputs", nargs=-1)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    is_eager=True,
    callback=_read_config_file,
    help="YAML file of config keys (the flags' names with underscores); flags override it.",
)
@config_options
@click.pass_context
def pack(ctx: click.Context, inputs: tuple[str, ...], config_file: str | None, **values: Any) -> None:
    """Tokenize INPUTS (JSONL/JSON, Parquet, text, save_to_disk dirs, hf:NAME) and pack them into shards."""
    # keys without a flag (encoder_kwargs) come from the config file alone
    file_only = {k: v for k, v in (ctx.default_map or {}).items() if k not in ctx.params}
    values = {**file_only, **values, "inputs": list(inputs)}
    config = PackConfig.from_dict(values, origin=config_file or "options")
    config.num_proc = resolve_num_proc(config)
    if config.engine == "local" and may_need_workers(config):  # its imports then run beside ours
        start_forkserver(config.num_proc)
    # imported after the forkserver started: the two processes then import numpy and pyarrow side by side
    from packtool.pipeline.run import run_pack, summary_line

    keep_freed_memory()  # the writers reuse their arrays (the CLI only: run_pack leaves its caller be)
    manifest = run_pack(config)
    s = manifest.stats
    if not config.quiet:
        click.echo(summary_line(manifest, config.output), err=True)
    # lost data is said even with --quiet: quiet is about progress, not about what the packs miss
    losses = s.losses(config)
    for line in manifest.warnings:
        click.echo(f"packtool: warning: {line}", err=True)
    for line in losses:
        click.echo(f"packtool: warning: {line}", err=True)
    if losses:
        samples, tokens = s.lost_totals()
        click.echo(
            f"packtool: warning: in all {samples:,} of {s.input_samples:,} samples were not packed whole "
            f"and {tokens:,} of {s.input_tokens:,} tokens are not in the packs "
            "(--strict makes this an error)",
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
    # the command's own modules, imported once its options are parsed (--help stays quick)
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
def verify(directory: str, inputs: tuple[str, ...], source: bool, as_json: bool, quiet: bool) -> None:
    """Check that a packtool output DIRECTORY is whole: shards, sizes, sha256, run_id, index, packs.

    Prints OK, or every problem with its shard, pack and field. Exit code: 0 OK, 1 problems found,
    2 bad options, 3 not a packtool output or an unreadable source input.
    """
    from packtool.verify import verify_output  # imported once its options are parsed (--help stays quick)

    if inputs and not source:
        raise ConfigError("input paths after DIRECTORY are the source: pass --source")
    report = verify_output(directory, source=list(inputs) if source else None, progress=not quiet)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)
    sys.exit(0 if report.ok else EXIT_PROBLEMS)


if __name__ == "__main__":
    main()
