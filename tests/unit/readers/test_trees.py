"""Corpora as they ship: directory trees (subdirectories, hidden entries, symbolic links), ``**`` globs,
files known only by their content (``--input-format``, compression told by magic bytes), and what a
directory holds that a run leaves out, said."""

from __future__ import annotations

import gzip
import os

import pyarrow as pa
import pytest

from packtool.errors import ErrorSink, InputError
from packtool.readers.compressed import codec_of
from packtool.readers.inputs import expand_inputs, read_inputs, unread_files


def _texts(inputs, **kw) -> list[str]:
    out = []
    for piece in read_inputs([str(p) for p in inputs], lazy=True, **kw):
        for b in piece.load(ErrorSink()):
            out += b.batch.column("text").to_pylist()
    return out


@pytest.fixture
def tree(tmp_path):
    """A documentation tree: text two levels down, files known by name only, hidden entries."""
    docs = tmp_path / "docs"
    for d in ("pkg-a", "pkg-b/examples", ".git", "pkg-a/.hidden-dir"):
        (docs / d).mkdir(parents=True)
    (docs / "top.txt").write_text("top")
    (docs / "pkg-a" / "guide.txt").write_text("guide a")
    (docs / "pkg-b" / "examples" / "deep.txt").write_text("deep b")
    (docs / "pkg-b" / "notes.txt").write_text("notes b")
    (docs / "pkg-a" / "copyright").write_text("copyright a")
    (docs / "pkg-a" / "README").write_text("readme a")
    (docs / "pkg-b" / "changelog.Debian.gz").write_bytes(gzip.compress(b"changelog b\nsecond line"))
    (docs / ".git" / "config.txt").write_text("never read")
    (docs / "pkg-a" / ".hidden-dir" / "secret.txt").write_text("never read")
    (docs / "pkg-a" / ".notes.txt").write_text("never read")
    return docs


def test_a_directory_is_read_with_its_subdirectories_in_tree_order(tree):
    """Every .txt file of the tree, at any depth, one sample each, sorted by path parts; hidden entries
    and files of no known format left out."""
    assert _texts([tree]) == ["guide a", "deep b", "notes b", "top"]
    ((kind, source, files),) = expand_inputs([str(tree)])
    assert kind == "text_dir" and source == str(tree)
    assert [os.path.relpath(f, tree) for f in files] == [
        "pkg-a/guide.txt", "pkg-b/examples/deep.txt", "pkg-b/notes.txt", "top.txt"
    ]  # fmt: skip


def test_what_a_directory_holds_unread_is_said(tree):
    (unread,) = unread_files([str(tree)])
    assert unread.files == ["pkg-a/README", "pkg-a/copyright", "pkg-b/changelog.Debian.gz"]
    assert unread.warnings() == [
        f"{tree}: 3 files of no known format not read (pkg-a/README, pkg-a/copyright, "
        "pkg-b/changelog.Debian.gz; known: .jsonl .json .ndjson .parquet .txt .tar, compressed or not; "
        "--input-format text reads every file as text)"
    ]
    assert unread.notes() == [
        f"{tree}: 3 hidden entries left out (.git, pkg-a/.hidden-dir, pkg-a/.notes.txt)"
    ]
    assert unread_files([str(tree)], "text")[0].warnings() == []  # every file read: nothing to say of them


def test_input_format_text_reads_every_file_as_text_compressed_ones_by_content(tree):
    """copyright, README and changelog.Debian.gz are text; the gzip one is decompressed, told by its
    bytes, not its name."""
    assert _texts([tree], files="text") == [
        "readme a", "copyright a", "guide a", "changelog b\nsecond line", "deep b", "notes b", "top"
    ]  # fmt: skip
    # a file given alone: one sample per line, as a .txt file
    assert _texts([tree / "pkg-b" / "changelog.Debian.gz"], files="text") == [
        "changelog b",
        "second line",
    ]
    with pytest.raises(InputError, match=r"unknown input format '.Debian.gz' .*--input-format text"):
        expand_inputs([str(tree / "pkg-b" / "changelog.Debian.gz")])


def test_a_directory_of_no_known_file_names_what_it_holds(tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    for name in ("README", "copyright", "INSTALL", "sub/NEWS"):
        (docs / name).write_text(name)
    with pytest.raises(InputError) as e:
        expand_inputs([str(docs)])
    assert str(e.value) == (
        f"{docs}: directory holds no file of a known format (.jsonl .json .ndjson .parquet .txt .tar, "
        "compressed or not): it holds 4 files (INSTALL, README, copyright and 1 more); --input-format "
        "text reads every file as text"
    )
    assert _texts([docs], files="text") == ["INSTALL", "README", "copyright", "sub/NEWS"]


def test_double_star_globs_go_into_subdirectories_and_read_a_file_once(tree):
    """``DIR/**/*.txt``: every .txt file below (a file given by a glob is one sample per line);
    ``DIR/**``, which matches the directory and each subdirectory, still reads each file once."""
    kinds = expand_inputs([str(tree / "**" / "*.txt")])
    assert [os.path.relpath(s, tree) for _, s, _ in kinds] == [
        "pkg-a/guide.txt", "pkg-b/examples/deep.txt", "pkg-b/notes.txt", "top.txt"
    ]  # fmt: skip
    assert {k for k, _, _ in kinds} == {"text"}
    assert _texts([tree / "**"]) == _texts([tree]) == ["guide a", "deep b", "notes b", "top"]
    # the files of no known format it matches are left out as a directory's are, and said once
    assert [(u.source, u.files) for u in unread_files([str(tree / "**")])] == [
        (str(tree), ["pkg-a/README", "pkg-a/copyright", "pkg-b/changelog.Debian.gz"])
    ]
    assert [(u.source, u.files) for u in unread_files([str(tree / "*" / "*")])] == [
        (str(tree / "*" / "*"), [str(tree / "pkg-a" / "README"), str(tree / "pkg-a" / "copyright"),
                                 str(tree / "pkg-b" / "changelog.Debian.gz")]),
    ]  # fmt: skip
    with pytest.raises(InputError, match=r"no file of a known format .* matches this pattern: it matches 1 "):
        expand_inputs([str(tree / "pkg-a" / "READ*")])


def test_symbolic_links_to_files_are_read_to_directories_not_followed(tree, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "linked.txt").write_text("linked dir's file")
    (tree / "pkg-c").symlink_to(elsewhere, target_is_directory=True)
    (tree / "loop").symlink_to(tree, target_is_directory=True)  # a tree linking into itself
    (tree / "pkg-b" / "alias.txt").symlink_to(tree / "top.txt")
    assert _texts([tree]) == ["guide a", "top", "deep b", "notes b", "top"]  # pkg-b/alias.txt second
    (unread,) = unread_files([str(tree)])
    assert unread.linked_dirs == ["loop", "pkg-c"]
    assert unread.warnings()[1] == (
        f"{tree}: 2 symbolic links to a directory not followed (loop, pkg-c; --follow-symlinks follows them)"
    )
    (tree / "pkg-a" / "gone.txt").symlink_to(tmp_path / "nowhere.txt")  # would be read: named
    with pytest.raises(InputError, match=r"gone.txt: a broken symbolic link"):
        expand_inputs([str(tree)])


def test_compression_is_told_by_content_not_by_name(tmp_path):
    rows = b'{"text": "one"}\n{"text": "two"}\n'
    (tmp_path / "inside.jsonl").write_bytes(gzip.compress(rows))  # gzip, named as plain JSON Lines
    (tmp_path / "plain.jsonl.gz").write_bytes(rows)  # plain, named as gzip
    with pa.output_stream(str(tmp_path / "z.jsonl"), compression="zstd") as out:
        out.write(rows)
    for name in ("inside.jsonl", "plain.jsonl.gz", "z.jsonl"):
        assert _texts([tmp_path / name]) == ["one", "two"], name
    assert [codec_of(tmp_path / n) for n in ("inside.jsonl", "plain.jsonl.gz", "z.jsonl")] == [
        "gzip", None, "zstd"
    ]  # fmt: skip


def test_input_format_jsonl_reads_files_of_any_name(tmp_path):
    (tmp_path / "records.log").write_text('{"text": "a"}\n{"text": "b"}\n')
    assert _texts([tmp_path / "records.log"], files="jsonl") == ["a", "b"]
    with pytest.raises(InputError, match="unknown input format '.log'"):
        expand_inputs([str(tmp_path / "records.log")])
