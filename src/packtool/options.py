"""``PackOptions``: the options of ``packtool pack``, each owned by the stage that reads it.

Every stage declares its own typed group in its own package (``readers/options.py``,
``encoders/options.py``, ``packing/options.py``, ``formats/options.py``, ``pipeline/options.py``) and
receives only that group. A group may hold sub-groups that apply only to one choice (the chat encoder's
options apply to ``--sample-format chat``, Parquet's to ``--format parquet``, ...): setting an option whose
group does not apply is a usage error naming it, so that no option is recorded as if it had an effect.

One name per option everywhere: the CLI flag (``--packed-sequence-size``), the YAML config key and the
manifest's ``config`` record key (``packed_sequence_size``) are the field's name. Types, ranges and
choices are msgspec constraints (``option(int, "help", gt=0)``); msgspec checks them when the options
are built (``PackOptions.from_dict``). Precedence: defaults < config file < flags.

Example::

    >>> opts = PackOptions.from_dict({"packed_sequence_size": 4096, "inputs": ["data.jsonl"]})
    >>> opts.packing.strategy, opts.packing.packed_sequence_size, sorted(opts.given)
    ('bfd', 4096, ['inputs', 'packed_sequence_size'])
"""

from __future__ import annotations

import difflib
import re
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Union

import msgspec

from packtool.encoders.options import EncodingOptions
from packtool.errors import ConfigError
from packtool.formats.options import OutputOptions
from packtool.option_types import Applies, OptionGroup, as_declared
from packtool.packing.options import PackingOptions, strategy_kind
from packtool.pipeline.options import RunningOptions
from packtool.readers.options import ReadingOptions

__all__ = ["SECTIONS", "SPECS", "OptionSpec", "PackOptions", "canonical_choice", "closest"]

# the help sections of ``packtool pack --help``, in order: one per stage
SECTIONS = ("input", "encoding", "packing", "output", "running")


class PackOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """All options of one ``packtool pack`` run: one group per stage, and the flat keys that were set.

    ``given``: the keys set by the user (flags, config file, or the mapping handed to ``from_dict``);
    only those are checked against the choices they depend on (a default never conflicts)."""

    reading: ReadingOptions = msgspec.field(default_factory=ReadingOptions)
    encoding: EncodingOptions = msgspec.field(default_factory=EncodingOptions)
    packing: PackingOptions = msgspec.field(default_factory=PackingOptions)
    output: OutputOptions = msgspec.field(default_factory=OutputOptions)
    running: RunningOptions = msgspec.field(default_factory=RunningOptions)
    given: frozenset[str] = frozenset()

    @classmethod
    def from_dict(
        cls,
        values: dict[str, Any],
        *,
        origin: str = "options",
        given: set[str] | None = None,
        check: bool = True,
    ) -> PackOptions:
        """Options from a flat mapping of keys (``{"packed_sequence_size": 4096, ...}``).

        Unknown keys, values of the wrong type or out of range, and options set where they do not apply
        raise ``ConfigError`` naming the key (and ``origin``: the config file, or ``options``).
        ``given``: the keys the user set (default: every key of ``values``); ``check``: also check the
        options against each other (``check``; off for a config file whose flags are still to come)."""
        unknown = sorted(set(values) - set(SPECS))
        if unknown:
            raise ConfigError(f"{origin}: unknown key {unknown[0]!r}{closest(unknown[0], SPECS)}")
        values = {name: canonical_choice(name, value) for name, value in values.items()}
        for name, value in values.items():  # one input, one pattern: a list of one
            if isinstance(value, str) and SPECS[name].kind is list:
                values[name] = [value]
        nested: dict[str, Any] = {}
        for name, value in values.items():
            node = nested
            for part in SPECS[name].path:
                node = node.setdefault(part, {})
            node[name] = value
        try:
            options = msgspec.convert(nested, cls, strict=True)
        except msgspec.ValidationError as e:
            where = "" if origin == "options" else f"{origin}: "
            raise ConfigError(f"{where}{_explain(e, values)}") from None
        options.given = frozenset(values if given is None else given)
        if check:
            options.check()
        return options

    @classmethod
    def of(cls, **values: Any) -> PackOptions:
        """``from_dict(values)`` with keyword arguments: ``PackOptions.of(packed_sequence_size=4096)``."""
        return cls.from_dict(values)

    @classmethod
    def from_provenance(cls, record: dict[str, Any], **changes: Any) -> PackOptions:
        """The options a manifest's ``config`` record names (a plain record a reader never parses
        strictly): keys this version does not know are left out; none counts as set by the user, so a
        recorded default never conflicts. ``changes``: keys to replace (``inputs=...``)."""
        values = {k: v for k, v in {**record, **changes}.items() if k in SPECS}
        return cls.from_dict(values, origin="the manifest's config", given=set())

    def check(self, sample_format: str | None = None) -> None:
        """``ConfigError`` for a set option whose group does not apply to the choices in effect
        (``sample_format``: the one resolved from the input, once ``auto`` has been decided), then each
        stage's own checks of what structure cannot say."""
        choices = {
            "sample_format": sample_format or self.encoding.sample_format,
            "format": self.output.format,
            "strategy": strategy_kind(self.packing.strategy),
            "engine": self.running.engine,
        }
        for name in sorted(self.given, key=list(SPECS).index):
            for applies in SPECS[name].applies:
                chosen = choices[applies.key]
                if chosen != "auto" and chosen not in applies.values:
                    raise ConfigError(
                        f"--{flag(name)} does not apply to --{flag(applies.key)} {flag(chosen)}: "
                        f"it is for {applies.describe()}; drop it"
                    )
        self.reading.check()
        self.encoding.check()
        self.packing.check(self.given)

    def check_required(self) -> None:
        """``ConfigError`` naming the first of the required options (inputs, output, N) not set."""
        if not self.reading.inputs:
            raise ConfigError("no input given: pass INPUT paths or set 'inputs' in the config")
        if not self.output.output:
            raise ConfigError("no output directory: pass --output DIR or set 'output' in the config")
        if self.packing.packed_sequence_size is None:
            raise ConfigError("packed_sequence_size is required (--packed-sequence-size)")

    def to_dict(self, *, include_runtime: bool = True) -> dict[str, Any]:
        """The flat record of every option (the manifest's ``config`` record without the runtime ones:
        those say where and how the job ran, never what it wrote)."""
        out = {}
        for name, spec in SPECS.items():
            if spec.runtime and not include_runtime:
                continue
            group: Any = self
            for part in spec.path:
                group = getattr(group, part)
            value = getattr(group, name)
            out[name] = list(value) if isinstance(value, list) else value
        return out

    def replace(self, **values: Any) -> PackOptions:
        """A copy with the flat keys ``values`` changed (checked as ``from_dict`` does)."""
        return PackOptions.from_dict({**self.to_dict(), **values}, given=set(self.given) | set(values))


@dataclass(frozen=True)
class OptionSpec:
    """One option as the CLI, the config file and the docs see it.

    ``path``: the group attributes from ``PackOptions`` to the field (``("encoding", "chat")``);
    ``annotation``: the field's type without its ``Meta``; ``applies``: the choices it depends on (its
    groups'); ``section``: its ``--help`` section (one of ``SECTIONS``)."""

    name: str
    path: tuple[str, ...]
    annotation: Any
    default: Any
    help: str
    section: str
    applies: tuple[Applies, ...]
    short: str | None = None
    runtime: bool = False
    flag: bool = True
    required: bool = False

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The values of a ``Literal`` type (``None`` for other types)."""
        inner = _without_none(self.annotation)
        return typing.get_args(inner) if typing.get_origin(inner) is typing.Literal else None

    @property
    def kind(self) -> type:
        """``bool``, ``int``, ``float``, ``str``, ``list`` or ``dict``: what a flag or a key takes."""
        inner = _without_none(self.annotation)
        if typing.get_origin(inner) is Annotated:
            inner = typing.get_args(inner)[0]
        if typing.get_origin(inner) is typing.Literal:
            return str
        return typing.get_origin(inner) or inner


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) is Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _specs(group: type[OptionGroup], path: tuple[str, ...], applies: tuple[Applies, ...]):
    """The options of ``group`` and of its sub-groups, in declaration order."""
    for f in msgspec.structs.fields(group):
        if isinstance(f.type, type) and issubclass(f.type, OptionGroup):
            sub = f.type.applies
            yield from _specs(f.type, (*path, f.name), applies + ((sub,) if sub else ()))
            continue
        # Annotated[Annotated[int, Meta(gt=0)], Meta(description=...)] is flattened to one Annotated:
        # its first Meta(s) are the constraints, its last one the help
        args = typing.get_args(f.type)
        annotation, meta = (Annotated[(args[0], *args[1:-1])] if len(args) > 2 else args[0]), args[-1]
        default = f.default_factory() if f.default is msgspec.NODEFAULT else f.default
        yield OptionSpec(
            f.name, path, annotation, default, meta.description, group.section, applies, **meta.extra
        )


SPECS: dict[str, OptionSpec] = {
    spec.name: spec
    for name, field_type in typing.get_type_hints(PackOptions).items()
    if name != "given"
    for spec in _specs(field_type, (name,), ())
}


def canonical_choice(name: str, value: Any) -> Any:
    """``value`` of option ``name`` in its declared spelling (``option_types.as_declared``).

    >>> canonical_choice("sample_format", "prompt-completion"), canonical_choice("format", "tar")
    ('prompt_completion', 'tar')
    """
    choices = SPECS[name].choices if name in SPECS else None
    return as_declared(value, choices) if choices else value


def flag(name: str) -> str:
    """A key or a value as a flag shows it: ``packed_sequence_size`` -> ``packed-sequence-size``."""
    return str(name).replace("_", "-")


def closest(name: str, known: Any) -> str:
    """``; did you mean 'x'?`` for the known key nearest to ``name``, or a pointer to the list."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {near[0]!r}?" if near else " (packtool pack --help lists the options)"


# what a value of each kind is called in an error, and msgspec's names of the others
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list"}
_WANTS = {"array": "a list", "str": "a string", "object": "a mapping"}


def _wanted(spec: OptionSpec, *, with_kind: bool) -> str:
    """What ``spec`` takes, from its declaration: ``a positive integer``, ``at least 0 and below 1``..."""
    inner = _without_none(spec.annotation)
    meta = typing.get_args(inner)[1] if typing.get_origin(inner) is Annotated else msgspec.Meta()
    kind = _KINDS.get(spec.kind, spec.kind.__name__)
    positive = spec.kind is int and meta.gt == 0
    bounds = [
        f"{word} {value}"
        for word, value in (
            ("at least", meta.ge),
            ("above", meta.gt),
            ("at most", meta.le),
            ("below", meta.lt),
        )
        if value is not None and not (positive and word == "above")
    ]
    head = "a positive integer" if positive else (kind if with_kind or not bounds else "")
    return " ".join(p for p in (head, " and ".join(bounds)) if p)


def _explain(error: msgspec.ValidationError, values: dict[str, Any]) -> str:
    """msgspec's ``Expected `int` >= 0 - at `$.packing.seed``` as ``seed must be at least 0, got -1``."""
    message, _, where = str(error).partition(" - at ")
    keys = re.findall(r"\.(\w+)", where)
    name = next((k for k in reversed(keys) if k in SPECS), None)
    if name is None or message.startswith("Object contains unknown field"):
        return message.replace("`", "")
    value = values.get(name)
    if message.startswith("Invalid enum value"):
        return f"{name} must be one of {', '.join(SPECS[name].choices or ())}, got {value!r}"
    if where.endswith("]`"):  # an item of a list
        want = message.replace("Expected ", "").replace("`", "").split(", got")[0]
        item = where.rsplit("[", 1)[-1].rstrip("`]")
        return f"{name} must be {_WANTS.get(want, want)} (item {item} of the list), got {value!r}"
    if ", got " in message:  # a value of another type
        want = message.replace("Expected ", "").replace("`", "").split(", got")[0].split(" |")[0]
        wanted = _WANTS.get(want) if want in ("array", "object") else _wanted(SPECS[name], with_kind=True)
        return f"{name} must be {wanted}, got {value!r}"
    return f"{name} must be {_wanted(SPECS[name], with_kind=False)}, got {value!r}"
