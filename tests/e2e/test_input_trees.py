"""``packtool pack`` on trees as they ship (a C header tree like /usr/include), through the CLI: a Latin-1
header under each ``--decode`` policy, ``--include``/``--exclude`` and ``--follow-symlinks`` recorded in
the manifest with what they did, a glob and its directory packing alike, the same options on a prefix in
a store, and ``--input-format text`` with a pattern that reads files a sample per line, said."""

from __future__ import annotations

import json
from pathlib import Path

from packtool import read_packs
from tests.conftest import DEMO_TOKENIZER, manifest_json, run_cli
from tests.fixtures.header_tree import LATIN1, headers  # noqa: F401 - fixtures
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures

BASE = ["--tokenizer", DEMO_TOKENIZER, "--packed-sequence-size", "256", "--input-format", "text", "-q"]


def _tokens(out: Path) -> list[bytes]:
    return [p["input_ids"].tobytes() for p in read_packs(out)]


def test_a_latin1_header_stops_strict_packs_replaced_or_exact_and_is_counted(headers, tmp_path):
    strict = run_cli("pack", headers, "-o", tmp_path / "strict", *BASE, check=False)
    assert strict.returncode == 3 and not (tmp_path / "strict").exists()
    assert strict.stderr.strip().endswith(
        f"packtool: error: {headers / 'X11' / 'extensions' / 'Xge.h'}: not valid UTF-8 (byte 13) (--on-error "
        "skip leaves bad records out and counts them; --decode replace or --decode ENCODING (e.g. latin-1) "
        "reads them)"
    )
    replaced = run_cli("pack", headers, "-o", tmp_path / "replace", *BASE[:-1], "--decode", "replace")
    warning = (
        "packtool: warning: 1 record was not UTF-8 and was packed with 2 characters replaced by U+FFFD "
        "(--decode replace)"
    )
    assert warning in replaced.stderr.splitlines() and "packed 5 of 5 samples whole" in replaced.stderr
    m = manifest_json(tmp_path / "replace")
    assert (m["stats"]["decoded_records"], m["stats"]["replaced_characters"]) == (1, 2)
    assert m["provenance"]["decode"] == "replace" and warning[len("packtool: warning: ") :] in m["warnings"]
    run_cli("verify", tmp_path / "replace", "--source")  # the source read again as the run read it

    run_cli("pack", headers, "-o", tmp_path / "latin", *BASE, "--decode", "latin-1")
    (headers / "X11" / "extensions" / "Xge.h").write_text(LATIN1)  # the same header, as UTF-8
    run_cli("pack", headers, "-o", tmp_path / "utf8", *BASE)
    assert _tokens(tmp_path / "latin") == _tokens(tmp_path / "utf8")  # the exact text
    latin, utf8 = manifest_json(tmp_path / "latin"), manifest_json(tmp_path / "utf8")
    assert latin["stats"]["decoded_records"] == 1 and utf8["stats"]["decoded_records"] == 0
    assert latin["run_id"] != utf8["run_id"]


def test_include_exclude_and_followed_links_are_recorded_counted_and_a_glob_packs_as_its_directory(
    headers, tmp_path
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "gl.h").write_text("void glFlush(void);\n")
    (headers / "GL").symlink_to(elsewhere, target_is_directory=True)
    (headers / "self").symlink_to(".", target_is_directory=True)
    picks = ["--include", "*.h", "--exclude", "tests", "--exclude", "X11", "--follow-symlinks"]
    proc = run_cli("pack", headers, "-o", tmp_path / "dir", *BASE[:-1], *picks)
    lines = proc.stderr.splitlines()
    assert f"packtool: note: {headers}: 2 directories left out by --include/--exclude (X11/, tests/)" in lines
    assert f"packtool: note: {headers}: 1 symbolic link to a directory followed (GL)" in lines
    assert (
        f"packtool: note: {headers}: 1 symbolic link to a directory read already not followed (self: a loop "
        "back to .)"
    ) in lines
    assert "packed 3 of 3 samples whole" in proc.stderr  # GL/gl.h, stdio.h, sys/types.h
    m = manifest_json(tmp_path / "dir")
    counts = ("excluded_files", "excluded_dirs", "followed_links", "unfollowed_links")
    assert [m["stats"][k] for k in counts] == [0, 2, 1, 1]
    p = m["provenance"]
    assert (p["include"], p["exclude"], p["follow_symlinks"]) == (["*.h"], ["tests", "X11"], True)

    run_cli("verify", tmp_path / "dir", "--source")  # listed again with the recorded patterns and links
    run_cli("pack", f"{headers}/**", "-o", tmp_path / "glob", *BASE, *picks)  # the same files, once each
    assert _tokens(tmp_path / "glob") == _tokens(tmp_path / "dir")
    assert manifest_json(tmp_path / "glob")["stats"]["unfollowed_links"] == 1

    unfollowed = run_cli("pack", f"{headers}/**", "-o", tmp_path / "plain", *BASE[:-1], *picks[:-1])
    assert (
        f"packtool: warning: {headers}: 2 symbolic links to a directory not followed (GL, self; "
        "--follow-symlinks follows them)"
    ) in unfollowed.stderr.splitlines()
    assert "packed 2 of 2 samples whole" in unfollowed.stderr
    assert manifest_json(tmp_path / "plain")["run_id"] != m["run_id"]


def test_a_prefix_in_a_store_takes_the_same_options_and_packs_as_the_local_tree(s3, headers, tmp_path):
    url = s3.put_tree("include", headers)
    opts = ["--exclude", "tests", "--exclude", "README.md", "--decode", "latin-1"]
    run_cli("pack", url, "-o", tmp_path / "remote", *BASE, *opts)
    run_cli("pack", headers, "-o", tmp_path / "local", *BASE, *opts)
    assert _tokens(tmp_path / "remote") == _tokens(tmp_path / "local")
    stats = manifest_json(tmp_path / "remote")["stats"]
    assert (stats["excluded_files"], stats["excluded_dirs"], stats["decoded_records"]) == (1, 1, 1)
    # a pattern in the store: each object by itself, a sample per line, --exclude below its folder
    run_cli("pack", f"{url}/**/*.h", "-o", tmp_path / "lines", *BASE, "--exclude", "X11")
    m = manifest_json(tmp_path / "lines")
    assert [Path(i["source"]).name for i in m["inputs"]] == ["stdio.h", "types.h", "t.h"]
    assert m["stats"]["num_samples"] == 3 and m["stats"]["excluded_dirs"] == 1


def test_input_format_text_with_a_pattern_of_files_not_named_txt_says_they_give_a_sample_per_line(
    headers, tmp_path
):
    """A pattern's files are read as files given by name: under --input-format text, a sample per line.
    That is rarely meant for source files, so it is said (and recorded), with the way to a sample per
    file; the directory with --include packs each header whole."""
    pattern = f"{headers}/**/*.h"
    proc = run_cli("pack", pattern, "-o", tmp_path / "lines", *BASE[:-1], "--decode", "replace")
    said = (
        f"{pattern}: --input-format text reads each of the 4 files this pattern matches that are not named "
        f".txt as a sample per line ({headers}/X11/extensions/Xge.h, {headers}/stdio.h, "
        f"{headers}/sys/types.h and 1 more); for a sample per file give their directory as the input, with "
        "--include to pick them"
    )
    assert f"packtool: warning: {said}" in proc.stderr.splitlines()
    assert said in manifest_json(tmp_path / "lines")["warnings"]
    assert manifest_json(tmp_path / "lines")["stats"]["num_samples"] == 5  # Xge.h's two lines apart
    whole = run_cli(
        "pack", headers, "-o", tmp_path / "files", *BASE[:-1], "--include", "*.h", "--decode", "replace"
    )
    assert "sample per line" not in whole.stderr and "packed 4 of 4 samples whole" in whole.stderr
    assert manifest_json(tmp_path / "files")["stats"]["num_samples"] == 4
    report = json.loads(run_cli("inspect", tmp_path / "lines", "--json").stdout)
    assert any(said in line for line in report["warnings"])
