"""What ``verify`` found: ``Problem`` (where and what) and ``VerifyReport`` (every problem counted, the first
``MAX_LISTED`` of each kind listed), with the human and JSON renderings."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

# problems of one kind listed in full up to this many; the rest are counted
MAX_LISTED = 10


@dataclass
class Problem:
    """One finding: where (``shard``, global ``pack`` index, ``field``) and what."""

    message: str
    shard: str | None = None
    pack: int | None = None
    field: str | None = None
    kind: str = "other"

    def __str__(self) -> str:
        where = [w for w in (self.shard, None if self.pack is None else f"pack {self.pack}") if w]
        if self.field:
            where.append(f"field '{self.field}'")
        return f"{', '.join(where)}: {self.message}" if where else self.message

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "shard": self.shard,
            "pack": self.pack,
            "field": self.field,
            "message": self.message,
        }


@dataclass
class VerifyReport:
    """What ``verify_output`` found. ``ok`` is True when no problem was found."""

    directory: str
    problems: list[Problem] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # problems per kind, listed or not
    checked: dict = field(default_factory=dict)  # figures of what was checked (packs, tokens, ...)
    notes: list[str] = field(default_factory=list)  # what was read by an older version's rules: no problem

    @property
    def ok(self) -> bool:
        return not self.counts

    def add(
        self,
        kind: str,
        message: str,
        *,
        shard: str | None = None,
        pack: int | None = None,
        field: str | None = None,
    ) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_LISTED:
            self.problems.append(Problem(message, shard, pack, field, kind))

    def add_many(
        self,
        kind: str,
        count: int,
        problems: Iterable[tuple[str, int | None]],
        *,
        shard: str | None = None,
        field: str | None = None,
    ) -> None:
        """``count`` problems of one kind, every one counted: ``problems`` yields ``(message, pack)`` of
        each, and only those listed (while the kind has room) are taken from it, so a lazy iterator
        builds no message for the others."""
        listed = min(count, max(0, MAX_LISTED - self.counts[kind]))
        for message, pack in itertools.islice(problems, listed):
            self.add(kind, message, shard=shard, pack=pack, field=field)
        if count > listed:
            self.counts[kind] += count - listed

    def lines(self) -> list[str]:
        """The human report: one line per listed problem, then what was left unlisted, then a verdict."""
        out = [f"note: {n}" for n in self.notes] + [f"problem: {p}" for p in self.problems]
        for kind, n in self.counts.items():
            if n > MAX_LISTED:
                out.append(f"... and {n - MAX_LISTED} more problem(s) of kind '{kind}'")
        c = self.checked
        what = ", ".join(f"{k}: {v:,}" for k, v in c.items() if isinstance(v, int))
        if self.ok:
            out.append(f"OK: {self.directory} ({what})")
        else:
            total = sum(self.counts.values())
            out.append(f"FAILED: {self.directory}: {total:,} problem(s) ({what} checked)")
        return out

    def to_dict(self) -> dict:
        return {
            "directory": self.directory,
            "ok": self.ok,
            "problem_counts": dict(self.counts),
            "problems": [p.to_dict() for p in self.problems],
            "checked": self.checked,
            "notes": self.notes,
        }
