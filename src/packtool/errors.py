"""Errors that packtool reports to the user as one line, with a non-zero exit.

Every command (``pack``, ``inspect``, ``verify``) prints an error as one line on stderr,
``packtool: error: <file>, row <r>, field '<f>': <what>``, and exits with one code per kind:

====  ===================  ======================================================================
code  name                 when
====  ===================  ======================================================================
0                          done; nothing lost, or every loss allowed and said as a warning
1     ``EXIT_PROBLEMS``    problems found: ``verify`` found a defect; ``pack --strict`` would lose data
2     ``EXIT_USAGE``       a bad or conflicting option, config file or output location (``ConfigError``)
3     ``EXIT_INPUT``       bad input: an input record, a shard or a manifest (``InputError``)
4     ``EXIT_FAILURE``     the run failed: the system (disk full) or an internal error (a bug)
130   ``EXIT_INTERRUPTED`` interrupted (Ctrl-C); a ``pack`` run resumes when run again
====  ===================  ======================================================================

``ErrorSink`` is the ``on_error`` policy in one place: readers and the encoding step hand it every bad
record; under ``fail`` it raises the error, under ``skip`` it counts the record by reason and keeps the
first ``MAX_LOGGED`` locations for ``errors.jsonl``. It also counts what the readers did to the input
that is no bad record (``note``: records decoded by ``--decode``, files left out by ``--exclude``), so
that those counts reach the run's summary from every worker the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dc_field

ON_ERROR = ("fail", "skip")
EXIT_PROBLEMS, EXIT_USAGE, EXIT_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130
MAX_LOGGED = 100  # locations of skipped records kept for errors.jsonl


class PacktoolError(Exception):
    """Base class for errors that are shown to the user as a single line."""

    exit_code = EXIT_FAILURE


class DataLossError(PacktoolError):
    """``pack --strict``: samples would not be packed whole (raised before any shard is written)."""

    exit_code = EXIT_PROBLEMS


class WorkerDied(PacktoolError):
    """A worker process of the run died (killed by a signal, e.g. out of memory). The work finished so far
    is kept, so that the same command resumes the run."""

    exit_code = EXIT_FAILURE


class ConfigError(PacktoolError):
    """A bad option, config key or config value."""

    exit_code = EXIT_USAGE


class InputError(PacktoolError):
    """Bad input data. The message names the file, the row and the field."""

    exit_code = EXIT_INPUT

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        row: int | None = None,
        field: str | None = None,
        row_kind: str = "row",
        code: str = "invalid",
    ) -> None:
        self.source, self.row, self.field, self.row_kind = source, row, field, row_kind
        self.code = code  # short reason key, e.g. malformed_json (counted under on_error=skip)
        # the way past it that --on-error fail names, when skipping the record is not it (a wrong field)
        self.hint: str | None = None
        where = []
        if source is not None:
            where.append(str(source))
        if row is not None:
            where.append(f"{row_kind} {row}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.reason = message

    def location(self) -> dict:
        """Where and why, as one JSON-able record (a line of ``errors.jsonl``)."""
        return {
            "source": self.source,
            "row": self.row,
            "row_kind": self.row_kind,
            "field": self.field,
            "reason": self.code,
            "message": self.reason,
        }


@dataclass
class ErrorSink:
    """The ``on_error`` policy: ``bad(err)`` raises ``err`` (``fail``) or counts and logs it (``skip``).

    Example::

        >>> sink = ErrorSink("skip")
        >>> sink.bad(InputError("malformed JSON", source="a.jsonl", row=3, code="malformed_json"))
        >>> sink.counts, sink.total
        ({'malformed_json': 1}, 1)
    """

    on_error: str = "fail"
    counts: dict[str, int] = dc_field(default_factory=dict)
    entries: list[dict] = dc_field(default_factory=list)  # first MAX_LOGGED, in input order
    notes: dict[str, int] = dc_field(default_factory=dict)  # what was done to records kept, by kind
    # how an error is told to the user: e.g. a record of a directory named by its file, not its index
    rename: Callable[[InputError], InputError] | None = dc_field(default=None, repr=False, compare=False)

    def note(self, kind: str, n: int = 1) -> None:
        """Count ``n`` of ``kind`` (``decoded_records``, ``excluded_files``, ...): said, never a loss of
        a record, under every ``on_error``."""
        self.notes[kind] = self.notes.get(kind, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def named(self, err: InputError) -> InputError:
        """``err`` as this sink tells it (``rename``)."""
        return err if self.rename is None else self.rename(err)

    def bad(self, err: InputError) -> None:
        err = self.named(err)
        if self.on_error != "skip":  # say the way past it, which the error alone does not
            hint = err.hint or "--on-error skip leaves bad records out and counts them"
            raise InputError(
                f"{err.reason} ({hint})",
                source=err.source,
                row=err.row,
                field=err.field,
                row_kind=err.row_kind,
                code=err.code,
            ) from None
        self.counts[err.code] = self.counts.get(err.code, 0) + 1
        if len(self.entries) < MAX_LOGGED:
            self.entries.append(err.location())

    def merge(self, other: dict) -> None:
        """Add the counts and entries of another sink's ``to_dict()`` (e.g. from a worker)."""
        for code, n in other.get("counts", {}).items():
            self.counts[code] = self.counts.get(code, 0) + n
        self.entries.extend(other.get("entries", [])[: MAX_LOGGED - len(self.entries)])
        for kind, n in other.get("notes", {}).items():
            self.note(kind, n)

    def to_dict(self) -> dict:
        out = {"counts": dict(sorted(self.counts.items())), "entries": list(self.entries)}
        if self.notes:  # (left out when there are none: chunk metas as before)
            out["notes"] = dict(sorted(self.notes.items()))
        return out
