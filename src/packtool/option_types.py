"""How a stage declares its options: ``OptionGroup``, ``option(...)`` and ``Applies``.

A stage's group is a msgspec ``Struct``; each field is one option, declared once with its type, its
``--help`` text and its constraints (msgspec ``Meta``: ``gt``, ``ge``, ``le``, ``lt``; a ``Literal`` for
choices). ``packtool.options`` gathers the groups into ``PackOptions`` and builds the CLI flags, the YAML
keys and the docs' table from these declarations.

Example (a stage's ``options.py``)::

    class ParquetOptions(OptionGroup):
        section = "output"
        applies = Applies("format", ("parquet",))

        row_group_size: option(int, "Packs per Parquet row group.", gt=0) = 128
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Optional

import msgspec

__all__ = ["Applies", "OptionGroup", "as_declared", "option"]


@dataclass(frozen=True)
class Applies:
    """A group applies only when the choice ``key`` (``sample_format``, ``format``, ``strategy`` with
    ``custom`` for a module:callable policy, or ``engine``) is one of ``values``."""

    key: str
    values: tuple[str, ...]

    def describe(self) -> str:
        shown = [v.replace("_", "-") for v in self.values]
        return f"--{self.key.replace('_', '-')} " + " or ".join(shown)


class OptionGroup(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A stage's options. Class attributes (not fields): ``section``, the ``--help`` section of its
    options; ``applies``, the choice it depends on (``None``: always)."""

    section = "running"
    applies = None  # an Applies, or None: not annotated, so that msgspec keeps it a class attribute


def option(
    kind: Any,
    help: str,
    *,
    short: str | None = None,
    runtime: bool = False,
    flag: bool = True,
    required: bool = False,
    **constraints: Any,
) -> Any:
    """The type of one option field: ``kind`` (``int | None`` for an option that may be unset) with its
    ``constraints`` (msgspec ``Meta``: ``gt=0`` ...) and what the CLI shows.

    ``help``: its ``--help`` text and docs row; ``short``: a one-letter flag too; ``runtime``: says where
    and how the job runs, never what it writes (left out of the manifest and the run_id, so the output is
    byte-identical for any number of processes); ``flag``: has a command-line flag (``False``: config
    file only); ``required``: marked required in ``--help`` (checked when the run starts, as a config file
    may set it)."""
    extra = {"short": short, "runtime": runtime, "flag": flag, "required": required}
    optional = type(None) in getattr(kind, "__args__", ())
    inner = next(a for a in kind.__args__ if a is not type(None)) if optional else kind
    if constraints:
        inner = Annotated[inner, msgspec.Meta(**constraints)]
    return Annotated[Optional[inner] if optional else inner, msgspec.Meta(description=help, extra=extra)]  # noqa: UP045


def as_declared(value: Any, choices: tuple[str, ...]) -> Any:
    """``value`` as ``choices`` spell it when it names one of them with ``-`` for ``_`` or the reverse
    (flags show ``prompt-completion``, the declarations and the manifest hold ``prompt_completion``: both
    are accepted, one is recorded); any other value as it is, for the caller to refuse.

    >>> as_declared("prompt-completion", ("text", "prompt_completion")), as_declared("x", ("text",))
    ('prompt_completion', 'x')
    """
    if not isinstance(value, str) or value in choices:
        return value
    return next((s for s in (value.replace("-", "_"), value.replace("_", "-")) if s in choices), value)
