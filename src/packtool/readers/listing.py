"""What a tree of inputs holds: a directory's files at any depth, walked once, and the patterns that pick
among them (``--include``, ``--exclude``, and a glob's part after its fixed folder).

**Patterns** match a path relative to the input (a directory, a prefix in a store, or a glob's folder before
its first wildcard), by its ``/``-separated parts: ``*``, ``?`` and ``[...]`` within a part, ``**`` for any
number of parts (none included). A pattern without a ``/`` matches a name at any depth (``*.md`` is
``**/*.md``, as in ``.gitignore``); a pattern that matches a directory matches everything below it
(``--exclude tests``). Matching is case-sensitive on every system.

>>> p = Patterns.of(include=["*.h"], exclude=["X11"])
>>> p.keeps(("sys", "types.h")), p.keeps(("X11", "Xlib.h")), p.keeps(("README",))
(True, False, False)
>>> match(("**", "*.h"), ("a", "b.h")), match(("a", "*"), ("a", "b", "c")), match(("a", "*"), ("a",), True)
(True, False, True)

**The walk** (``scan_directory``) lists a directory's real subdirectories first, then, with
``follow_symlinks``, the directories its symbolic links lead to, in tree order, each real directory once
(by device and inode): a link back into the tree (``self -> .``) or a second path to a directory read
already is not followed, and said. Files come out in tree order (sorted by their path's parts).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from packtool.errors import InputError
from packtool.readers.compressed import input_format as name_format
from packtool.storage.files import has_glob

Parts = tuple[str, ...]  # a path relative to the input, by its parts

_FILE_READERS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".txt": "text",
    ".tar": "webdataset",
}
KNOWN = ".jsonl .json .ndjson .parquet .txt .tar"


def split_glob(spec: str) -> tuple[str, Parts]:
    """``(folder, pattern)``: the leading parts of ``spec`` without glob characters (``""`` for none), and
    the parts of the rest.

    >>> split_glob("docs/**/*.txt"), split_glob("*.jsonl"), split_glob("/usr/include/*/x.h")
    (('docs', ('**', '*.txt')), ('', ('*.jsonl',)), ('/usr/include', ('*', 'x.h')))
    """
    parts = spec.split("/")
    fixed = next(i for i, part in enumerate(parts) if has_glob(part))
    folder = "/".join(parts[:fixed])
    if fixed and not folder:  # the root: /*.jsonl
        folder = "/"
    return folder, tuple(p for p in parts[fixed:] if p)


def pattern_parts(pattern: str) -> Parts:
    """A user's pattern as parts: one without a ``/`` matches a name at any depth.

    >>> pattern_parts("*.md"), pattern_parts("docs/*.md"), pattern_parts("build/")
    (('**', '*.md'), ('docs', '*.md'), ('**', 'build'))
    """
    stripped = pattern.strip("/")
    parts = tuple(p for p in stripped.split("/") if p not in ("", "."))
    return parts if "/" in stripped else ("**", *parts)


def match(pattern: Parts, parts: Parts, partial: bool = False) -> bool:
    """Whether ``pattern`` matches the path ``parts``; with ``partial``, also whether it may match a path
    below it (a directory worth going into)."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(match(rest, parts[k:], partial) for k in range(len(parts) + 1))
    if not parts:
        return partial
    return fnmatchcase(parts[0], head) and match(rest, parts[1:], partial)


def _hits(pattern: Parts, parts: Parts) -> bool:
    """``pattern`` matches the path or a directory above it."""
    return any(match(pattern, parts[:k]) for k in range(1, len(parts) + 1))


@dataclass(frozen=True)
class Patterns:
    """``--include`` and ``--exclude``, as parts: a file is kept when no exclude pattern matches it (or a
    directory above it) and, if there are include patterns, one of them does."""

    include: tuple[Parts, ...] = ()
    exclude: tuple[Parts, ...] = ()

    @classmethod
    def of(cls, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> Patterns:
        return cls(tuple(map(pattern_parts, include)), tuple(map(pattern_parts, exclude)))

    def excludes_dir(self, parts: Parts) -> bool:
        """An exclude pattern matches the directory ``parts``: nothing below it is read (nor listed)."""
        return any(match(p, parts) for p in self.exclude)

    def keeps(self, parts: Parts) -> bool:
        if any(_hits(p, parts) for p in self.exclude):
            return False
        return not self.include or any(_hits(p, parts) for p in self.include)

    def left_out(self, parts: Parts) -> Parts | None:
        """What of the file ``parts`` the patterns leave out: the highest directory above it an exclude
        pattern matches, the file itself, or None when it is kept."""
        for k in range(1, len(parts)):
            if self.excludes_dir(parts[:k]):
                return parts[:k]
        return None if self.keeps(parts) else parts


@dataclass
class DirectoryTree:
    """What a directory holds, its subdirectories included, each entry by its parts below the directory:
    ``files``, the regular files (symbolic links to files too) in tree order, not yet picked by
    ``--include``/``--exclude``; and what is not read: ``hidden`` entries (names starting with ``.``,
    not looked into), ``linked_dirs`` (symbolic links to directories, not followed without
    ``follow_symlinks``), ``excluded`` directories (an exclude pattern matches them: not gone into),
    ``other`` entries (FIFOs, sockets, devices) and ``broken`` links. With ``follow_symlinks``:
    ``followed``, the links followed, and ``repeated``, ``(link, why)`` for each link to a directory read
    already (a loop back into the tree, or a second path to it)."""

    files: list[Parts] = field(default_factory=list)
    hidden: list[Parts] = field(default_factory=list)
    linked_dirs: list[Parts] = field(default_factory=list)
    excluded: list[Parts] = field(default_factory=list)
    other: list[Parts] = field(default_factory=list)
    broken: list[Parts] = field(default_factory=list)
    followed: list[Parts] = field(default_factory=list)
    repeated: list[tuple[Parts, str]] = field(default_factory=list)


def _dir_key(path: Path | os.DirEntry) -> tuple[int, int]:
    st = path.stat()  # a link followed: the directory it leads to
    return st.st_dev, st.st_ino


def scan_directory(
    path: Path | str,
    *,
    follow_symlinks: bool = False,
    patterns: Patterns = Patterns(),
    within: Callable[[Parts], bool] | None = None,
) -> DirectoryTree:
    """Walk ``path`` and its subdirectories (``DirectoryTree``); ``InputError`` naming a subdirectory
    that cannot be listed, rather than leaving its files out unsaid.

    ``patterns``: directories an exclude pattern matches are not gone into (the files are the caller's to
    pick, ``Patterns.left_out``); ``within``: the directories worth going into at all (a glob's), by their
    parts. Entries are in tree order: sorted by their parts (``a/z.txt`` before ``a.txt``)."""
    root = Path(path)
    tree = DirectoryTree()
    read_as: dict[tuple[int, int], Parts] = {_dir_key(root): ()}  # each real directory, where it is read
    todo: list[Parts] = [()]  # directories to list
    links: list[Parts] = []  # links to directories met, to follow once the real directories are listed
    while todo or links:
        if not todo:  # the next link in tree order, unless its directory is read already
            links.sort()
            link = links.pop(0)
            try:
                key = _dir_key(root.joinpath(*link))
            except OSError:  # gone since it was listed
                tree.broken.append(link)
                continue
            if key in read_as:
                tree.repeated.append((link, _why_not(link, read_as[key])))
                continue
            read_as[key] = link
            tree.followed.append(link)
            todo.append(link)
            continue
        parts = todo.pop()
        for entry in _entries(root.joinpath(*parts)):
            sub = (*parts, entry.name)
            if entry.name.startswith("."):
                tree.hidden.append(sub)
            elif entry.is_dir():  # a link to a directory too
                if within is not None and not within(sub):
                    continue
                if patterns.excludes_dir(sub):
                    tree.excluded.append(sub)
                elif entry.is_symlink():
                    (links if follow_symlinks else tree.linked_dirs).append(sub)
                elif (key := _dir_key(entry)) in read_as:  # the same directory mounted twice
                    tree.repeated.append((sub, _why_not(sub, read_as[key])))
                else:
                    read_as[key] = sub
                    todo.append(sub)
            elif entry.is_file():
                plain_name(Path(entry.path))
                tree.files.append(sub)
            elif entry.is_symlink() and not os.path.exists(entry.path):
                tree.broken.append(sub)
            else:
                tree.other.append(sub)
    for name in ("files", "hidden", "linked_dirs", "excluded", "other", "broken", "followed", "repeated"):
        getattr(tree, name).sort()
    return tree


def _entries(directory: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise InputError(f"cannot list a directory: {e.strerror or e}", source=str(directory)) from None


def _why_not(link: Parts, read_at: Parts) -> str:
    """Why the directory ``link`` leads to is not read again: it holds the link, or it is read elsewhere.

    >>> _why_not(("a", "self"), ("a",)), _why_not(("b",), ("a",))
    ('a loop back to a', 'read as a')
    """
    if link[: len(read_at)] == read_at:
        return f"a loop back to {'/'.join(read_at) or '.'}"
    return f"read as {'/'.join(read_at)}"


def plain_name(path: Path) -> None:
    """``InputError`` when ``path``'s name is not UTF-8: the manifest, Arrow and JSON need one."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise InputError("file name is not valid UTF-8: rename it", source=shown) from None


def reader_of(path: Path | str, input_format: str = "auto") -> str | None:
    """The reader of a file: ``input_format`` unless ``auto``, else by its name's suffixes, None if
    none (a compressed file's inner suffix decides; Parquet compresses its own pages: a file named as
    compressed Parquet is not read; nor a compressed tar, which has no member offsets to hand out)."""
    if input_format != "auto":
        return input_format
    suffix, codec = name_format(path)
    kind = _FILE_READERS.get(suffix.lower())
    return None if codec is not None and kind in ("parquet", "webdataset") else kind


@dataclass
class Unread:
    """What the input ``source`` (a directory, a prefix, a pattern) holds that a run leaves out or reads
    otherwise than the rest, relative to it for a directory: ``files`` of no known format (with
    ``input_format`` ``auto``), ``linked_dirs`` not followed, ``other`` entries, ``hidden`` ones,
    what ``--include``/``--exclude`` leave out (``excluded``; a directory ``name/``), the links
    ``followed``, those ``repeated`` (``(link, why)``: to a directory read already), and the files a
    pattern reads a sample per line under ``--input-format text`` though not named ``.txt``
    (``per_line``)."""

    source: str
    files: list[str]
    linked_dirs: list[str]
    other: list[str]
    hidden: list[str]
    excluded: list[str] = field(default_factory=list)
    followed: list[str] = field(default_factory=list)
    repeated: list[tuple[str, str]] = field(default_factory=list)
    per_line: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """A line per kind of entry a user may have meant to pack, or to pack otherwise."""
        out = []
        if self.files:
            out.append(
                f"{self.source}: {count_of(self.files, 'file')} of no known format not read "
                f"({names_of(self.files)}; known: {KNOWN}, compressed or not; --input-format text reads "
                "every file as text)"
            )
        if self.linked_dirs:
            out.append(
                f"{self.source}: {count_of(self.linked_dirs, 'symbolic link')} to a directory not followed "
                f"({names_of(self.linked_dirs)}; --follow-symlinks follows them)"
            )
        if self.other:
            out.append(
                f"{self.source}: {count_of(self.other, 'entry', 'entries')} that are not regular files not "
                f"read ({names_of(self.other)})"
            )
        if self.per_line:
            files = count_of(self.per_line, "file")
            out.append(
                f"{self.source}: --input-format text reads each of the {files} this pattern matches that "
                f"are not named .txt as a sample per line ({names_of(self.per_line)}); for a sample per "
                "file give their directory as the input, with --include to pick them"
            )
        return out

    def notes(self) -> list[str]:
        """What was left out or followed as asked (hidden entries, never meant as data, too): said all the
        same, as notes."""
        out = []
        if self.hidden:
            hidden = count_of(self.hidden, "hidden entry", "hidden entries")
            out.append(f"{self.source}: {hidden} left out ({names_of(self.hidden)})")
        if self.excluded:
            n = self.counts()
            what = [count_of(n["excluded_files"], "file")] if n["excluded_files"] else []
            what += [count_of(n["excluded_dirs"], "directory", "directories")] if n["excluded_dirs"] else []
            out.append(
                f"{self.source}: {' and '.join(what)} left out by --include/--exclude "
                f"({names_of(self.excluded)})"
            )
        if self.followed:
            out.append(
                f"{self.source}: {count_of(self.followed, 'symbolic link')} to a directory followed "
                f"({names_of(self.followed)})"
            )
        if self.repeated:
            shown = [f"{link}: {why}" for link, why in self.repeated]
            out.append(
                f"{self.source}: {count_of(shown, 'symbolic link')} to a directory read already not followed "
                f"({names_of(shown)})"
            )
        return out

    def counts(self) -> dict[str, int]:
        """The manifest's counts of what this input's listing did (``Stats``' fields of the same names)."""
        dirs = sum(n.endswith("/") for n in self.excluded)
        return {
            "excluded_files": len(self.excluded) - dirs,
            "excluded_dirs": dirs,
            "followed_links": len(self.followed),
            "unfollowed_links": len(self.linked_dirs) + len(self.repeated),
        }


def count_of(names: list | int, one: str, many: str | None = None) -> str:
    """``3 files``: how many ``names`` (or that number) there are, in words."""
    n = names if isinstance(names, int) else len(names)
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def names_of(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown:,} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
