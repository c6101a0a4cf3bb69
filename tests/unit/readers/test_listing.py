"""Trees as they ship: ``--include``/``--exclude`` on directories, globs and prefixes in a store,
``--follow-symlinks`` with loops and second paths said, a glob and its directory reading the same files,
and text that is not UTF-8 read by ``--decode`` (``strict``, ``replace``, an encoding), each counted."""

from __future__ import annotations

import os
import pickle

import msgspec
import pytest

from packtool.errors import ConfigError, ErrorSink, InputError
from packtool.options import PackOptions
from packtool.readers.inputs import expand_inputs, read_inputs, unread_files
from packtool.readers.listing import Patterns, match, pattern_parts
from packtool.readers.options import FileOptions
from tests.fixtures.header_tree import LATIN1, headers  # noqa: F401 - fixtures
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures


def _read(inputs, sink=None, **options) -> tuple[list[str], ErrorSink]:
    """The texts every input gives, as the workers read them (lazy ranges, pickled and loaded)."""
    sink = sink or ErrorSink("fail")
    out = []
    for piece in read_inputs([str(p) for p in inputs], lazy=True, sink=sink, files=FileOptions(**options)):
        for b in pickle.loads(pickle.dumps(piece)).load(sink):
            out += b.batch.column("text").to_pylist()
    return out, sink


def test_patterns_match_names_at_any_depth_and_directories_whole():
    assert pattern_parts("*.h") == ("**", "*.h") and pattern_parts("X11/*.h") == ("X11", "*.h")
    p = Patterns.of(include=["*.h"], exclude=["tests", "X11/extensions/*.h"])
    assert p.keeps(("a", "b", "c.h")) and not p.keeps(("README.md",))
    assert not p.keeps(("tests", "t.h")) and p.excludes_dir(("tests",)) and p.excludes_dir(("a", "tests"))
    assert not p.keeps(("X11", "extensions", "Xge.h")) and p.keeps(("X11", "Xlib.h"))
    assert p.left_out(("tests", "deep", "t.h")) == ("tests",)  # the directory, said once
    assert match(("**",), ()) and match(("a", "**"), ("a",)) and not match(("a", "*"), ("a", "b", "c"))
    assert match(("*", "x.h"), ("sub",), partial=True) and not match(("a", "*"), ("b",), partial=True)


def test_a_latin1_file_stops_strict_is_replaced_and_counted_or_read_exactly(headers):
    """strict: the file is named with the ways past it; replace: packed, its characters counted;
    latin-1: its exact text, while the UTF-8 files stay UTF-8 (a © in both reads right)."""
    xge = headers / "X11" / "extensions" / "Xge.h"
    with pytest.raises(InputError, match=rf"{xge}: not valid UTF-8 \(byte 13\) .*--decode replace"):
        _read([headers], input_format="text")
    texts, sink = _read([headers], ErrorSink("skip"), input_format="text")
    assert sink.counts == {"not_utf8": 1} and len(texts) == 4 and not sink.notes  # dropped whole, counted

    texts, sink = _read([headers], input_format="text", decode="replace")
    assert texts[1] == LATIN1.replace("©", "\ufffd").replace("ü", "\ufffd")
    assert sink.notes == {"decoded_records": 1, "replaced_characters": 2} and sink.total == 0

    texts, sink = _read([headers], input_format="text", decode="latin-1")
    assert texts[1] == LATIN1 and texts[3] == "/* © UTF-8 */ typedef long ssize_t;\n"
    assert sink.notes == {"decoded_records": 1}


def test_decode_reads_lines_and_json_lines_one_by_one(tmp_path):
    """A line of a .txt or JSON Lines file that is not UTF-8 is read by the policy, the others as UTF-8;
    bytes the encoding has no character for are a bad record naming both."""
    (tmp_path / "a.txt").write_bytes("naïve\n".encode() + "café\n".encode("latin-1"))
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "ok"}\n' + '{"text": "señor"}\n'.encode("latin-1"))
    texts, sink = _read([tmp_path / "a.txt", tmp_path / "b.jsonl"], decode="cp1252")
    assert texts == ["naïve", "café", "ok", "señor"] and sink.notes == {"decoded_records": 2}
    (tmp_path / "c.txt").write_bytes(b"bad \x81 byte\n")  # undefined in cp1252
    with pytest.raises(InputError, match=r"c.txt, line 1: not valid UTF-8 \(byte 4\) nor cp1252 \(byte 4\)"):
        _read([tmp_path / "c.txt"], decode="cp1252")


def test_decode_takes_strict_replace_or_an_encoding_that_reads_ascii():
    for ok in ("strict", "replace", "latin-1", "cp1252", "shift_jis"):
        PackOptions.from_dict({"decode": ok})
    with pytest.raises(ConfigError, match=r"--decode utf-16: an encoding that does not read ASCII"):
        PackOptions.from_dict({"decode": "utf-16"})
    with pytest.raises(ConfigError, match=r"--decode latin-9x: not strict, replace, or an encoding"):
        PackOptions.from_dict({"decode": "latin-9x"})
    with pytest.raises(ConfigError, match=r"--exclude '/usr/include/X11': patterns match paths below"):
        PackOptions.from_dict({"exclude": "/usr/include/X11"})


def test_include_and_exclude_pick_a_directory_s_files_and_count_what_they_leave_out(headers):
    files = FileOptions(input_format="text", include=["*.h"], exclude=["tests", "Xge.h"])
    ((kind, _, read),) = expand_inputs([str(headers)], files)
    assert kind == "text_dir" and [os.path.relpath(f, headers) for f in read] == ["stdio.h", "sys/types.h"]
    (unread,) = unread_files([str(headers)], files)
    assert unread.excluded == ["X11/README.md", "X11/extensions/Xge.h", "tests/"]
    assert unread.counts() == {
        "excluded_files": 2,
        "excluded_dirs": 1,
        "followed_links": 0,
        "unfollowed_links": 0,
    }
    assert unread.notes() == [
        f"{headers}: 2 files and 1 directory left out by --include/--exclude (X11/README.md, "
        "X11/extensions/Xge.h, tests/)"
    ]
    _, sink = _read([headers], input_format="text", include=["*.h"], exclude=["tests", "Xge.h"])
    assert sink.notes == {"excluded_files": 2, "excluded_dirs": 1}  # what the run records
    with pytest.raises(
        InputError, match=r"no file of a known format .*: it holds no file; 5 entries left out"
    ):
        expand_inputs([str(headers)], FileOptions(include=["*.c"], input_format="text"))


def test_include_and_exclude_apply_to_a_glob_below_its_folder(headers):
    """Patterns match below the glob's folder, and only the files the glob matches are counted."""
    files = FileOptions(input_format="text", exclude=["extensions"])
    got = expand_inputs([str(headers / "**" / "*.h")], files)
    assert [os.path.relpath(s, headers) for _, s, _ in got] == ["stdio.h", "sys/types.h", "tests/t.h"]
    (unread,) = unread_files([str(headers / "**" / "*.h")], files)
    assert unread.excluded == [str(headers / "X11" / "extensions") + "/"]
    # files given by a pattern are read a sample per line: with --input-format text, said
    assert unread.warnings() == [
        f"{headers / '**' / '*.h'}: --input-format text reads each of the 3 files this pattern matches that "
        f"are not named .txt as a sample per line ({headers / 'stdio.h'}, {headers / 'sys' / 'types.h'}, "
        f"{headers / 'tests' / 't.h'}); for a sample per file give their directory as the input, with "
        "--include to pick them"
    ]
    with pytest.raises(InputError, match=r"no file matches this pattern: 1 entry left out by --include"):
        expand_inputs([str(headers / "X11" / "*" / "*.h")], FileOptions(exclude=["extensions"]))


@pytest.fixture
def linked(headers, tmp_path):
    """The header tree with links as distributions ship them: to a directory elsewhere, back to itself,
    and a second path to one of its own directories."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "gl.h").write_text("void gl(void);\n")
    (headers / "GL").symlink_to(elsewhere, target_is_directory=True)
    (headers / "self").symlink_to(".", target_is_directory=True)  # a loop: self/self/self/...
    (headers / "X11" / "sys-again").symlink_to(headers / "sys", target_is_directory=True)
    return headers


def test_links_to_directories_are_followed_on_request_each_directory_once(linked):
    files = FileOptions(input_format="text", follow_symlinks=True, exclude=["Xge.h"])
    ((_, _, read),) = expand_inputs([str(linked)], files)
    assert [os.path.relpath(f, linked) for f in read] == [
        "GL/gl.h", "X11/README.md", "stdio.h", "sys/types.h", "tests/t.h"
    ]  # fmt: skip
    (unread,) = unread_files([str(linked)], files)
    assert unread.followed == ["GL"]
    assert unread.repeated == [("X11/sys-again", "read as sys"), ("self", "a loop back to .")]
    assert unread.counts()["followed_links"] == 1 and unread.counts()["unfollowed_links"] == 2
    assert unread.notes()[1:] == [
        f"{linked}: 1 symbolic link to a directory followed (GL)",
        f"{linked}: 2 symbolic links to a directory read already not followed (X11/sys-again: read as sys, "
        "self: a loop back to .)",
    ]
    # not asked: none followed, each said
    (unread,) = unread_files([str(linked)], "text")
    assert unread.linked_dirs == ["GL", "X11/sys-again", "self"] and unread.counts()["unfollowed_links"] == 3


@pytest.mark.parametrize("follow", [False, True])
def test_a_glob_reads_the_files_its_directory_reads(linked, follow):
    """'DIR/**' and DIR: the same entries, links followed or not alike; a self-link neither fails the
    glob nor reads the tree again below it."""
    files = FileOptions(input_format="text", follow_symlinks=follow, decode="replace")
    assert expand_inputs([str(linked / "**")], files) == expand_inputs([str(linked)], files)
    options = msgspec.structs.asdict(files)
    assert _read([linked / "**"], **options)[0] == _read([linked], **options)[0]
    below = expand_inputs([str(linked / "**" / "*.h")], files)
    assert len(below) == (5 if follow else 4)  # gl.h through GL/ when followed; never self/... again
    assert [u.source for u in unread_files([str(linked / "**")], files)] == [str(linked)]


def test_a_prefix_and_a_pattern_in_a_store_honour_include_and_exclude(s3, headers):
    base = s3.put_tree("include", headers)
    files = FileOptions(input_format="text", include=["*.h"], exclude=["tests"])
    ((kind, source, read),) = expand_inputs([base], files)
    assert kind == "text_dir" and source == base
    assert read == [f"{base}/X11/extensions/Xge.h", f"{base}/stdio.h", f"{base}/sys/types.h"]
    (unread,) = unread_files([base], files)
    assert unread.excluded == ["X11/README.md", "tests/"] and unread.counts()["excluded_dirs"] == 1
    s3.put("include/.cache/old.h", b"stale")  # hidden: left out of a pattern's matches as of a prefix's
    files = FileOptions(exclude=["*.md", "sys"], input_format="text")
    got = expand_inputs([f"{base}/**"], files)
    assert [s for _, s, _ in got] == [f"{base}/X11/extensions/Xge.h", f"{base}/stdio.h", f"{base}/tests/t.h"]
    (said,) = unread_files([f"{base}/**"], files)
    assert said.hidden == [f"{base}/.cache/old.h"] and said.excluded == [
        f"{base}/X11/README.md",
        f"{base}/sys/",
    ]
    texts, sink = _read([base], input_format="text", include=["X11/**/*.h"], decode="latin-1")
    assert texts == [LATIN1] and sink.notes == {"decoded_records": 1, "excluded_files": 4}


def test_the_text_members_of_a_tar_are_read_by_decode_a_sample_counted_once(tmp_path):
    from tests.unit.readers.test_webdataset_input import tar

    shard = tar(
        tmp_path / "s.tar",
        [("000.txt", "un café".encode("latin-1")), ("000.json", "«x»".encode("latin-1")), ("001.txt", b"ok")],
    )
    sink = ErrorSink("fail")
    pieces = read_inputs([str(shard)], sink=sink, lazy=True, files=FileOptions(decode="latin-1"))
    rows = [r for p in pieces for b in pickle.loads(pickle.dumps(p)).load(sink) for r in b.batch.to_pylist()]
    assert [(r["txt"], r["json"]) for r in rows] == [("un café", "«x»"), ("ok", None)]
    assert sink.notes == {"decoded_records": 1}
    with pytest.raises(InputError, match=r"s.tar, sample 0, field 'txt': not valid UTF-8 .*--decode replace"):
        [b for p in read_inputs([str(shard)], lazy=True) for b in p.load()]
