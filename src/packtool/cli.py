"""The ``packtool`` command line: parse, load the config, call the pipeline, print.

Every flag of ``pack`` has the same name as its config key (``--packed-sequence-size`` <->
``packed_sequence_size``). Every command prints an error as one line on stderr and exits with the code
of its kind (``packtool.errors``: 1 problems found, 2 usage, 3 bad input, 4 failure, 130 interrupted).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from packtool.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    ConfigError,
    PacktoolError,
)
from packtool.storage.urls import configure as configure_storage
from packtool.storage.urls import is_url

# where a value set by the user comes from: the command line or the config file (click's default_map)
_SET = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.DEFAULT_MAP)


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
        except (KeyboardInterrupt, click.Abort) as e:
            if isinstance(e.__cause__, EOFError):  # click makes an EOFError (a file read short) an Abort
                _internal_error(e.__cause__)
            _stop_helpers()
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
            _internal_error(e)
        sys.exit(code if isinstance(code, int) else 0)


def _internal_error(e: BaseException) -> None:
    """Exit 4 with one line naming ``e`` (its traceback with ``PACKTOOL_DEBUG=1``)."""
    if os.environ.get("PACKTOOL_DEBUG"):
        traceback.print_exception(e)
    click.echo(
        f"packtool: internal error: {type(e).__name__}: {_one_line(e)} "
        "(set PACKTOOL_DEBUG=1 for a traceback)",
        err=True,
    )
    sys.exit(EXIT_FAILURE)


def _stop_helpers() -> None:
    """An interrupted job ends the helper processes it started and waits for them (the workers' server,
    which a Ctrl-C may catch in the middle of its imports), so that it exits leaving none behind."""
    local = sys.modules.get("packtool.pipeline.engines.local")  # imported only by a job that starts any
    if local is not None:
        local.stop_helpers()


@click.group(cls=PacktoolGroup)
@click.version_option(package_name="packtool")
def main() -> None:
    """Pack LLM training samples offline into fixed-length sequences, and inspect the result."""


PACK_EXAMPLES = """\
  packtool pack data/*.jsonl --tokenizer tokenizer.json --packed-sequence-size 4096 -o packed/
  packtool pack --config configs/demo.yaml --format webdataset --overwrite
"""


def option_params() -> list[click.Parameter]:
    """One click option per option that has a flag, from its stage's declaration (name, type, default,
    choices, help), so that the flag, the config key and the manifest key are one name."""
    # imported when pack runs or shows its help: the stages' groups
    from packtool.options import SPECS, as_declared

    params: list[click.Parameter] = []
    for spec in SPECS.values():
        if not spec.flag:
            continue
        name = "--" + spec.name.replace("_", "-")
        names = [name] + ([f"-{spec.short}"] if spec.short else [])
        help = spec.help + (" [required]" if spec.required else "")
        if spec.applies:
            help += " For " + ", ".join(a.describe() for a in spec.applies) + "."
        kwargs: dict[str, Any] = {"help": help, "show_default": spec.default is not None}
        kwargs["default"] = spec.default
        if spec.kind is bool:
            if spec.short:
                kwargs["is_flag"] = True
            else:
                names = [f"{name}/--no-{name[2:]}"]
        elif spec.choices:
            kwargs["type"] = _Choice(spec.choices, as_declared)
        elif spec.kind in (int, float):
            kwargs["type"] = spec.kind
        elif spec.kind is list:  # repeatable: --exclude A --exclude B
            kwargs.update(multiple=True, default=tuple(spec.default), show_default=False)
        option = click.Option([*names, spec.name], **kwargs)
        option.section = spec.section  # type: ignore[attr-defined]
        params.append(option)
    return params


class _Choice(click.Choice):
    """A choice in either spelling (``prompt-completion`` or ``prompt_completion``), converted by
    ``spell`` (``option_types.as_declared``) to the declared one, which the manifest records."""

    def __init__(self, choices: tuple[str, ...], spell: Callable[[Any, tuple[str, ...]], Any]) -> None:
        super().__init__(choices)
        self.spell = spell

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(self.spell(value, tuple(self.choices)), param, ctx)


class PackCommand(click.Command):
    """``pack``: its options are built from the stages' declarations when first needed (``packtool
    --help`` and the other commands do not import the stages), and its ``--help`` lists them by stage."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not getattr(self, "_options_added", False):
            self._options_added = True
            self.params.extend(option_params())
        return super().get_params(ctx)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from packtool.options import SECTIONS, SPECS  # the stages' groups: see get_params

        sections: dict[str, list[tuple[str, str]]] = {s: [] for s in (*SECTIONS, "other")}
        sections["input"].append(("INPUTS...", f"{SPECS['inputs'].help} [required]"))
        for param in self.get_params(ctx):
            if isinstance(param, click.Argument):  # INPUTS: listed first, under Input
                continue
            record = param.get_help_record(ctx)
            if record:
                sections[getattr(param, "section", "other")].append(record)
        for name, rows in sections.items():
            if rows:
                with formatter.section(f"{name.capitalize()} options"):
                    formatter.write_dl(rows)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Examples"):
            for line in PACK_EXAMPLES.splitlines():
                formatter.write(f"{'':>{formatter.current_indent}}{line}\n")


def _read_config_file(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """``--config FILE``: the file's keys become the options' defaults (click's ``default_map``), so a
    flag given on the command line overrides the file and the file overrides the built-in default."""
    if path:
        from packtool.config_file import load_config_file  # see PackCommand: the stages' groups

        ctx.default_map = {**(ctx.default_map or {}), **load_config_file(path)}
    return path


class _PathOrURL(click.Path):
    """A local path that must exist (as ``click.Path`` checks it), or a URL of an object store, taken as
    it is (never as a path: ``s3://b/out`` is no local folder named ``s3:``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value if is_url(value) else super().convert(value, param, ctx)


_STORAGE_OPTIONS = click.option(
    "--storage-options",
    help="For an output in an object store: its settings as a JSON object (fsspec's storage_options) "
    "[default: the store's own variables, e.g. AWS_*].",
)


@contextmanager
def _read_output(given: str, storage_options: str | None) -> Iterator[str]:
    """The local folder to read output ``given`` from (a URL's view in the cache: ``storage.outputs``);
    messages raised meanwhile name ``given``, not the cache."""
    from packtool.storage.outputs import output_dir  # fsspec and the cache: a command that reads an output

    configure_storage(storage_options)
    local = str(output_dir(given))
    try:
        yield local
    except PacktoolError as e:
        if local != given and e.args and isinstance(e.args[0], str):
            e.args = (e.args[0].replace(local, given.rstrip("/")),)
        raise


def _positive(value: Any) -> bool:
    """``value`` is unset or a positive integer (a bad ``--num-proc`` is named once the options are built)."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)


@main.command(cls=PackCommand)
@click.argument("inputs", nargs=-1)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    is_eager=True,
    callback=_read_config_file,
    help="YAML file of option keys (the flags' names with underscores); flags override it.",
)
@click.pass_context
def pack(ctx: click.Context, inputs: tuple[str, ...], config_file: str | None, **values: Any) -> None:
    """Tokenize INPUTS (JSONL/JSON, Parquet, text, save_to_disk dirs, hf:NAME) and pack them into shards.

    INPUTS, --output and --packed-sequence-size are required (on the command line or in --config)."""
    # imported once the options are parsed (--help stays quick); os alone decides the workers' forkserver
    from packtool.pipeline.engines import may_need_workers, resolve_num_proc, worker_preload
    from packtool.pipeline.engines.local import keep_freed_memory, start_forkserver

    # keys without a flag (encoder_kwargs) come from the config file alone
    defaults = ctx.default_map or {}
    file_only = {k: v for k, v in defaults.items() if k not in ctx.params}
    values = {**file_only, **values, "inputs": list(inputs) or defaults.get("inputs", [])}
    given = {k for k in ctx.params if ctx.get_parameter_source(k) in _SET} | set(file_only)
    if inputs or "inputs" in defaults:
        given.add("inputs")
    num_proc = resolve_num_proc(values) if _positive(values.get("num_proc")) else 1  # (checked below)
    if values.get("engine") == "local" and may_need_workers(values):  # its imports then run beside ours
        start_forkserver(num_proc, worker_preload(values))
    # imported after the forkserver started: the two processes then import numpy and pyarrow side by side
    from packtool.options import PackOptions
    from packtool.pipeline.run import losses_line, run_pack, summary_line

    options = PackOptions.from_dict(values, origin=config_file or "options", given=given & set(values))
    options = options.replace(num_proc=num_proc)

    keep_freed_memory()  # the writers reuse their arrays (the CLI only: run_pack leaves its caller be)
    # what the run says before a step (notes, guessed special tokens) is printed as it comes
    manifest = run_pack(options, say=lambda line: click.echo(f"packtool: {line}", err=True))
    s = manifest.stats
    # the result line and lost data are said even with --quiet: quiet is about progress (the bars and the
    # notes as the run goes), not about what was written or what the packs miss
    click.echo(summary_line(manifest, options.output.output), err=True)
    losses = s.losses(manifest.packed_sequence_size, manifest.option("max_packs"))
    for line in manifest.warnings:
        click.echo(f"packtool: warning: {line}", err=True)
    for line in losses:
        click.echo(f"packtool: warning: {line}", err=True)
    if losses:
        click.echo(f"packtool: warning: {losses_line(s)}", err=True)


@main.command()
@click.argument("sources", nargs=-1, required=True, type=_PathOrURL(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Also write the histograms to this PNG file.")
@click.option("--full", is_flag=True, help="Read every pack and recompute the figures from the data.")
@click.option("--pack", "pack_index", type=int, help="Show pack I (0-based): its seq_lens and samples.")
@click.option(
    "--locate", is_flag=True, help="With --pack: read the run's input files for each sample's line or row."
)
@click.option("--decode", is_flag=True, help="With --pack: the text of each sample, via the run's tokenizer.")
@click.option("--tokenizer", help="With --decode: use this tokenizer instead of the manifest's.")
@click.option(
    "--weight", "weights", type=float, multiple=True,
    help="A mixture of the DIRECTORIES: each one's weight, in order (one --weight per directory).",
)  # fmt: skip
@click.option(
    "--repeat", "repeats", type=float, multiple=True,
    help="A mixture of the DIRECTORIES: each one's repeat per epoch, in order (one --repeat per directory).",
)  # fmt: skip
@_STORAGE_OPTIONS
def inspect(
    sources: tuple[str, ...],
    as_json: bool,
    plot: str | None,
    full: bool,
    pack_index: int | None,
    locate: bool,
    decode: bool,
    tokenizer: str | None,
    weights: tuple[float, ...],
    repeats: tuple[float, ...],
    storage_options: str | None,
) -> None:
    """Show fill rate, padding, counts, per-shard figures and histograms of a packtool output DIRECTORY.

    Or of a mixture: a mixture file (mixture.yaml), or several DIRECTORIES with a --weight or a --repeat
    each: each source's packs, tokens, fill and its share of an epoch.

    Fast: from the manifest and the shards' metadata, unless --full.
    """
    configure_storage(storage_options)
    mixture = _mixture(sources, weights, repeats)
    if mixture is not None:
        if pack_index is not None or full or plot:
            raise ConfigError("--pack, --full and --plot go with one output directory, not a mixture")
        from packtool.inspect.mixture import mixture_report  # torch (the loader's sources): a mixture only
        from packtool.inspect.render import render_mixture

        report = mixture_report(mixture)
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            render_mixture(report)
        return
    # the command's own modules, imported once its options are parsed (--help stays quick)
    from packtool.inspect import inspect_report, pack_report
    from packtool.inspect.render import plot_report, render_pack, render_report

    if pack_index is None and (decode or tokenizer or locate):
        raise ConfigError("--locate, --decode and --tokenizer go with --pack I")
    with _read_output(sources[0], storage_options) as directory:
        if pack_index is not None:
            report = pack_report(directory, pack_index, decode=decode, tokenizer=tokenizer, locate=locate)
        else:
            report = inspect_report(directory, full=full)
    if "directory" in report:
        report["directory"] = sources[0]
    if pack_index is not None:
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            render_pack(report)
        return
    if plot:
        plot_report(report, plot)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        render_report(report)
        if plot:
            click.echo(f"histograms written to {plot}", err=True)


def _mixture(sources: tuple[str, ...], weights: tuple[float, ...], repeats: tuple[float, ...]) -> Any:
    """What ``inspect SOURCES`` names when it is a mixture (a mixture file, or the directories with their
    weights or repeats, as ``packtool.loader.sources.open_source`` takes them), else None."""
    if weights and repeats:
        raise ConfigError("--weight and --repeat: a mixture takes one kind of share")
    shares = weights or repeats
    if len(sources) == 1 and not shares:
        return sources[0] if os.path.isfile(sources[0]) else None
    if len(shares) != len(sources) or any(os.path.isfile(s) for s in sources):
        raise ConfigError(
            f"a mixture of {len(sources)} output directories takes one --weight (or --repeat) each, in "
            f"order; got {len(shares)} (a mixture file goes alone)"
        )
    key = "weight" if weights else "repeat"
    return [{"path": s, key: v} for s, v in zip(sources, shares, strict=True)]


@main.command()
@click.argument("directory", type=_PathOrURL(exists=True, file_okay=False))
@click.argument("inputs", nargs=-1)
@click.option(
    "--source",
    is_flag=True,
    help="Also re-read and re-encode the source (INPUTS, or the manifest's inputs if none are given) with "
    "the run's config and prove every kept sample's tokens are in the packs exactly once.",
)
@click.option(
    "--tokenizer",
    default=None,
    help="With --source: encode with this tokenizer instead of the run's; needed when the run's is a "
    "plugin (code is run only when named here, never on the manifest's word).",
)
@click.option(
    "--processor",
    default=None,
    help="A vision-language output: the model's processor directory, to check each image's token count "
    "(with --source the run's recorded one is used when this is not given).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar while re-encoding the source.")
@_STORAGE_OPTIONS
def verify(
    directory: str,
    inputs: tuple[str, ...],
    source: bool,
    tokenizer: str | None,
    processor: str | None,
    as_json: bool,
    quiet: bool,
    storage_options: str | None,
) -> None:
    """Check that a packtool output DIRECTORY is whole: shards, sizes, sha256, run_id, index, packs.

    Prints OK, or every problem with its shard, pack and field. Exit code: 0 OK, 1 problems found,
    2 bad options, 3 not a packtool output or an unreadable source input.
    """
    from packtool.verify import verify_output  # imported once its options are parsed (--help stays quick)

    if inputs and not source:
        raise ConfigError("input paths after DIRECTORY are the source: pass --source")
    if tokenizer and not source:
        raise ConfigError("--tokenizer is the tokenizer of --source: pass --source")
    with _read_output(directory, storage_options) as local:
        report = verify_output(
            local,
            source=list(inputs) if source else None,
            progress=not quiet,
            tokenizer=tokenizer,
            processor=processor,
        )
    report.directory = directory
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)
    sys.exit(0 if report.ok else EXIT_PROBLEMS)


def run() -> None:
    """The program (``packtool``, ``python -m packtool.cli``): ``main``, and for a command that only reads
    (``inspect``, ``verify`` without ``--source``: no helper process to reap, no file to finish) an exit
    that skips the interpreter's teardown once its output is flushed. Arrow's C++ thread pool can abort
    that teardown (``terminate called without an active exception``, exit -6, apache/arrow#34314): seen
    twice in some thousands of test runs on a loaded machine, after the command had printed its answer."""
    try:
        main()
    except SystemExit as e:
        args = sys.argv[1:]
        command = next((a for a in args if not a.startswith("-")), None)
        read_only = command == "inspect" or (command == "verify" and "--source" not in args)
        if not read_only or multiprocessing.active_children():
            raise
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # a closed pipe (| head): what the teardown would have met too
                pass
        os._exit(code)


if __name__ == "__main__":
    run()
