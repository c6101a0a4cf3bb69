"""Errors that packtool reports to the user as one line, with a non-zero exit.

``InputError`` is bad input (exit code 2): it names the file, the row and the field.
``ConfigError`` is a bad option or config file (exit code 2).
Anything else escaping the pipeline is an internal error (exit code 1).
"""

from __future__ import annotations


class PacktoolError(Exception):
    """Base class for errors that are shown to the user as a single line."""

    exit_code = 1


class ConfigError(PacktoolError):
    """A bad option, config key or config value."""

    exit_code = 2


class InputError(PacktoolError):
    """Bad input data. The message names the file, the row and the field."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        row: int | None = None,
        field: str | None = None,
        row_kind: str = "row",
    ) -> None:
        self.source, self.row, self.field, self.row_kind = source, row, field, row_kind
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
