"""Every reader on real files, through ``read_inputs`` and through the CLI.

(In-process tests; the CLI's are in tests/e2e.)"""

from __future__ import annotations

import json
import os
import socket

import datasets
import huggingface_hub.constants
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.errors import InputError
from packtool.readers.inputs import expand_inputs, read_inputs
from tests.conftest import write_jsonl

ROWS = [{"text": f"sample number {i}", "input_ids": list(range(1, i + 2))} for i in range(7)]


def _texts(inputs, **kw) -> list[str]:
    out = []
    for b in read_inputs([str(p) for p in inputs], **kw):
        out += b.batch.column("text").to_pylist()
    return out


def test_jsonl_streams_records_with_line_numbers(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + "\n".join(json.dumps(r) for r in ROWS[1:]) + "\n")
    batches = list(read_inputs([str(path)]))
    assert sum(b.num_rows for b in batches) == 7
    assert batches[0].rows.tolist()[:3] == [1, 3, 4]  # the blank line 2 is skipped
    assert batches[0].where(1) == "line 3"


def test_json_array(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(ROWS))
    assert _texts([path]) == [r["text"] for r in ROWS]


def test_parquet(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=3)
    assert _texts([path]) == [r["text"] for r in ROWS]


def test_text_lines_and_text_directory(tmp_path):
    (tmp_path / "lines.txt").write_text("first line\n\nsecond line\n")
    assert _texts([tmp_path / "lines.txt"]) == ["first line", "second line"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "b.txt").write_text("doc b\nwith two lines")
    (docs / "a.txt").write_text("doc a")
    assert _texts([docs]) == ["doc a", "doc b\nwith two lines"]


def test_hf_save_to_disk_dataset_and_dataset_dict(tmp_path):
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "ds"))
    assert _texts([tmp_path / "ds"]) == [r["text"] for r in ROWS]
    datasets.DatasetDict({"train": ds, "validation": ds.select([0, 1])}).save_to_disk(str(tmp_path / "dd"))
    assert _texts([tmp_path / "dd"], split="validation") == [ROWS[0]["text"], ROWS[1]["text"]]
    with pytest.raises(InputError, match="no split 'test'"):
        _texts([tmp_path / "dd"], split="test")


def test_hf_load_dataset_from_a_local_directory(tmp_path):
    write_jsonl(tmp_path / "hub" / "data.jsonl", ROWS)
    assert _texts([f"hf:{tmp_path / 'hub'}"]) == [r["text"] for r in ROWS]


def test_globs_and_several_inputs_keep_a_deterministic_order(tmp_path):
    for name in ("b", "a", "c"):
        write_jsonl(tmp_path / f"{name}.jsonl", [{"text": name}])
    (tmp_path / "z.txt").write_text("z\n")
    assert _texts([tmp_path / "*.jsonl", tmp_path / "z.txt"]) == ["a", "b", "c", "z"]
    assert [kind for kind, _, _ in expand_inputs([str(tmp_path)])] == ["jsonl"] * 3 + ["text"]


def test_missing_and_unknown_inputs_are_named(tmp_path):
    with pytest.raises(InputError, match="nope.jsonl: no such file"):
        list(read_inputs([str(tmp_path / "nope.jsonl")]))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(InputError, match="unknown input format '.csv'"):
        list(read_inputs([str(tmp_path / "x.csv")]))
    with pytest.raises(InputError, match="no file matches"):
        list(read_inputs([str(tmp_path / "*.parquet")]))


def test_mixed_types_name_the_row_and_field(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "ok"}, {"text": "fine"}, {"text": 5}])
    with pytest.raises(InputError) as e:
        list(read_inputs([str(path)]))
    assert str(e.value).startswith(f"{path}, line 3, field 'text': expected str")


def test_lazy_parquet_rows_read_the_same_records_in_any_order(tmp_path):
    # row groups of 7 rows; pieces cut anywhere, read forwards, backwards and skipping ahead (the cursor
    # continues its stream, decodes and skips inside a row group, or reopens at another row group)
    path = tmp_path / "a.parquet"
    ids = [list(range(i % 5 + 1)) for i in range(40)]
    pq.write_table(pa.table({"input_ids": ids, "n": list(range(40))}), path, row_group_size=7)
    (piece,) = [p for p in read_inputs([str(path)], lazy=True)][:1]
    assert piece.num_rows == 7 and piece.schema.names == ["input_ids", "n"]
    whole = [p for p in read_inputs([str(path)], lazy=True)]
    assert sum(p.num_rows for p in whole) == 40 and all(p.row_kind == "row" for p in whole)
    cuts = [(0, 3), (3, 10), (13, 1), (30, 10), (2, 5), (20, 4), (24, 1), (39, 1), (0, 40)]
    for start, n in cuts:
        g = next(i for i, p in enumerate(whole) if p.start <= start < p.start + p.num_rows)
        lazy = whole[g].slice(start - whole[g].start, n)
        got = lazy.load() if lazy.num_rows == n else None
        if got is None:  # a piece longer than its row group: read as the reader's consumer would
            from packtool.readers.parquet import ParquetRows

            got = ParquetRows(str(path), start, n, whole[0].schema).load()
        assert sum(b.num_rows for b in got) == n
        assert [r for b in got for r in b.batch.column("n").to_pylist()] == list(range(start, start + n))
        assert [r for b in got for r in b.rows.tolist()] == list(range(start, start + n))
        assert [r for b in got for r in b.batch.column("input_ids").to_pylist()] == ids[start : start + n]


def test_lazy_parquet_corrupt_data_is_reported_where_it_is_read(tmp_path):
    path = tmp_path / "a.parquet"
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 1000, 50).tolist() for _ in range(400)]
    pq.write_table(pa.table({"input_ids": ids}), path, row_group_size=200, compression="none")
    data = bytearray(path.read_bytes())
    assert len(data) > 20_000
    data[8:4000] = b"\xff" * 3992  # the first row group's first page (header included), footer intact
    path.write_bytes(bytes(data))
    pieces = list(read_inputs([str(path)], lazy=True))  # the footer is fine
    with pytest.raises(InputError, match="corrupt Parquet data after row 0"):
        pieces[0].load()


def _batches(path, **kw):
    from packtool.errors import ErrorSink
    from packtool.readers.jsonl import _read_lines

    def flat(batches):  # records and line numbers, or the error
        try:
            bs = [(b.batch.to_pylist(), b.rows.tolist()) for b in batches]
        except InputError as e:
            return str(e)
        # a key is absent or None depending on which batch it was read in (a batch has the union of its
        # records' keys): the same record either way
        records = [{k: v for k, v in r.items() if v is not None} for b, _ in bs for r in b]
        return records, [n for _, ns in bs for n in ns]

    fast = flat(read_inputs([str(path)], **kw))
    return fast, flat(_read_lines(str(path), 2048, ErrorSink(), "text"))


@pytest.mark.parametrize(
    "lines",
    [
        # plain text and token lists: parsed by pyarrow.json
        [{"text": f"t{i}", "input_ids": [i, i + 1]} for i in range(3000)],
        # a type pyarrow.json would infer differently (timestamp, double, int beyond int64): line by line
        [{"text": "2020-01-01"}, {"text": "b"}],
        [{"text": "a", "score": 1.5}],
        [{"input_ids": [1, 2**70]}],
        # blank lines, a surrogate escape: line by line
        [{"text": "a"}, None, {"text": "b"}],
        [{"text": "\\ud83d\\ude00"}],
        # chat messages with keys missing in some turns
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "x": 1}]}],
        # lists whose first values are null (an interleaved document that starts with text): pyarrow.json
        # drops the nulls and keeps counting them (apache/arrow#51305), so the batch is read line by line
        [{"texts": ["a", "b", None], "images": [None, None, "x.png"]}, {"texts": [None], "images": ["y"]}],
        [{"images": []}, {"images": [None, "x.png"]}, {"images": ["y.png", None]}],
    ],
)
def test_jsonl_fast_path_reads_what_the_line_by_line_path_reads(tmp_path, lines):
    path = tmp_path / "a.jsonl"
    text = "\n".join("" if r is None else json.dumps(r) for r in lines).replace("\\\\u", "\\u")
    path.write_text(text + "\n")
    fast, slow = _batches(path)
    assert fast == slow
    if not isinstance(fast, str):  # [1, 2**70] is an error, the same on both paths
        assert len(fast[0]) == sum(r is not None for r in lines)


def test_jsonl_fast_path_hands_over_mid_file(tmp_path, monkeypatch):
    # a field that first appears after many blocks: the first blocks come from pyarrow.json,
    # the rest line by line from the first line not read, with the same records and line numbers
    import packtool.readers.jsonl as jsonl

    monkeypatch.setattr(jsonl, "ARROW_BLOCK", 1 << 12)
    rows = [{"text": f"t{i}", "n": i} for i in range(3000)] + [{"text": "x", "n": 1, "late": "field"}]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    fast, slow = _batches(path)
    assert fast == slow and len(fast[0]) == 3001 and fast[1][-1] == 3001
    state: dict = {}
    got = sum(b.num_rows for b in jsonl._read_arrow(str(path), 2048, state))
    assert 0 < got < 3000 and not state  # pyarrow.json read the first blocks, then handed over


@pytest.mark.parametrize(
    "late",
    ["", '{"text": "\\ud83d\\ude00"}', b'{"text": "\xff"}', "long"],
    ids=["blank line", "surrogate escape", "not utf-8", "line longer than a scan block"],
)
def test_jsonl_fast_path_scans_as_it_reads_and_hands_over_at_a_late_odd_line(tmp_path, monkeypatch, late):
    """The plain-lines scan runs in step with pyarrow.json: the first blocks are read fast, and a line
    that pyarrow would read differently (or number differently), found late in the file, hands over to
    the line-by-line path with the same records and line numbers."""
    import packtool.readers.jsonl as jsonl

    monkeypatch.setattr(jsonl, "ARROW_BLOCK", 1 << 12)
    monkeypatch.setattr(jsonl, "_SCAN_BLOCK", 1 << 12)
    path = tmp_path / "a.jsonl"
    good = [json.dumps({"text": f"t{i}", "n": i}).encode() for i in range(3000)]
    if late == "long":
        odd = json.dumps({"text": "x" * 20000, "n": 1}).encode()
    else:
        odd = late.encode() if isinstance(late, str) else late
    path.write_bytes(b"\n".join([*good, odd, *good[:50]]) + b"\n")
    fast, slow = _batches(path)  # records and line numbers, or the same error (not UTF-8)
    assert fast == slow
    if late == "long":  # plain, only longer than a scan block: the scan reads on to its end
        assert jsonl._PlainLines(str(path)).cover(3051)
        return
    assert not jsonl._PlainLines(str(path)).cover(3001)
    state: dict = {}
    got = sum(b.num_rows for b in jsonl._read_arrow(str(path), 2048, state))
    assert 2000 < got <= 3000 and not state  # fast through the early blocks, then handed over


def test_read_rows_reopens_a_file_rewritten_under_the_same_name(tmp_path):
    """A worker process outlives a job (Ray workers do): its cursor must not serve the old file's rows."""
    import os

    from packtool.readers.parquet import read_rows

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"a{i}" for i in range(50)]}), path, row_group_size=20)
    first = read_rows(str(path), 10, 5)
    assert [b.batch.column("text").to_pylist() for b in first] == [[f"a{i}" for i in range(10, 15)]]
    pq.write_table(pa.table({"text": [f"b{i}" for i in range(60)]}), path, row_group_size=20)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a new stamp even on a coarse clock
    again = read_rows(str(path), 15, 10)  # would continue the old stream without the stamp check
    assert [v for b in again for v in b.batch.column("text").to_pylist()] == [f"b{i}" for i in range(15, 25)]
    assert np.concatenate([b.rows for b in again]).tolist() == list(range(15, 25))


def test_a_slice_pickles_only_its_own_rows(tmp_path):
    """Chunks go to worker processes pickled; a slice of a reader's block must not carry the whole block."""
    import pickle

    texts = [f"text number {i} " * 20 for i in range(2000)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (batch,) = list(read_inputs([str(path)]))
    part = batch.slice(100, 50)
    back = pickle.loads(pickle.dumps(part))
    assert back.batch.equals(part.batch) and back.rows.tolist() == part.rows.tolist()
    assert (back.source, back.row_kind) == (part.source, part.row_kind)
    assert len(pickle.dumps(part)) < 2 * len(pickle.dumps(batch)) / (2000 / 50)


def _clean(value):
    """A record as the encoders see it: a key that is None is a key that is absent, at any depth (a batch's
    struct type holds the union of its records' keys, so which keys are None depends on the batching)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _lazy(path, batch_rows, on_error="fail"):
    """What the pipeline gets for ``path`` with lazy reading: the driver's batches, then each piece loaded
    as a worker loads it (its own sink); records and line numbers, or the first error, and skip counts."""
    from packtool.errors import ErrorSink
    from packtool.readers.jsonl import read_jsonl

    sink = ErrorSink(on_error)
    records, lines = [], []
    try:
        for piece in read_jsonl(str(path), batch_rows=batch_rows, sink=sink, lazy=True):
            for b in piece.load(sink):
                records += [_clean(r) for r in b.batch.to_pylist()]
                lines += b.rows.tolist()
    except InputError as e:
        return str(e), None
    return (records, lines), dict(sink.counts)


def _eager(path, on_error="fail"):
    from packtool.errors import ErrorSink

    sink = ErrorSink(on_error)
    records, lines = [], []
    try:
        for b in read_inputs([str(path)], sink=sink):
            records += [_clean(r) for r in b.batch.to_pylist()]
            lines += b.rows.tolist()
    except InputError as e:
        return str(e), None
    return (records, lines), dict(sink.counts)


@pytest.mark.parametrize(
    "text",
    [
        "".join(json.dumps({"text": f"t{i}", "n": i}) + "\n" for i in range(50)),
        "".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(50)).rstrip("\n"),  # no final newline
        '{"text": "a"}\n\n  \n{"text": "b"}\n' * 9,  # blank lines
        '{"text": "a"}\n{bad\n"str"\n{"text": "\\ud83d\\ude00"}\n' * 7,  # bad lines, a surrogate pair
        '{"text": "a", "score": 1.5}\n' * 12 + '{"text": "2020-01-01"}\n',  # types pyarrow reads otherwise
        "\n\n\n" + '{"text": "late first record"}\n' * 5,  # the first records after empty pieces
        "\n\n",
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
            )
            + "\n"
            + json.dumps({"messages": [{"role": "user", "content": "a", "x": i}]})
            + "\n"
            for i in range(6)
        ),
        '{"input_ids": [1, 2]}\n' * 4 + '{"input_ids": [1, 1180591620717411303424]}\n',  # past int64
        '{"text": "a"}\r\n' * 9,  # Windows line ends
        '\ufeff{"text": "a"}\n' + '{"text": "b"}\n' * 5,  # a byte order mark
        '{"texts": ["a", null], "images": [null, "x.png"]}\n' * 6,  # lists that start with nulls
    ],
    ids=[
        "plain",
        "no-final-newline",
        "blank-lines",
        "bad-lines",
        "other-types",
        "late-first",
        "only-blank",
        "chat-keys-missing-in-some-turns",
        "int-past-int64",
        "crlf",
        "bom",
        "lists-leading-nulls",
    ],  # fmt: skip
)
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_lazy_jsonl_pieces_read_what_the_whole_file_reader_reads(tmp_path, text, on_error):
    """Workers parse their own line ranges: the same records, line numbers, errors and skip counts as the
    driver reading the whole file, whatever the piece size."""
    path = tmp_path / "a.jsonl"
    path.write_text(text)
    want = _eager(path, on_error)
    for batch_rows in (1, 3, 7, 2048):
        assert _lazy(path, batch_rows, on_error) == want, batch_rows


def test_lazy_jsonl_pieces_cover_every_line_once_and_pickle_small(tmp_path):
    import pickle

    from packtool.readers import jsonl

    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"text": "x" * (i % 50), "i": i}) for i in range(1000)]
    path.write_text("\n".join(lines))  # no final newline
    data = path.read_bytes()
    pieces = list(jsonl._line_ranges(str(path), 64, "text"))
    assert [p.num_rows for p in pieces] == [64] * 15 + [40]
    assert [p.first_line for p in pieces] == list(range(1, 1001, 64))
    got = [
        data[int(a) : int(b)].rstrip(b"\n").decode()
        for p in pieces
        for a, b in zip(p.line_starts[:-1], p.line_starts[1:], strict=True)
    ]
    assert got == lines
    part = pieces[3].slice(10, 20)
    assert (part.first_line, part.num_rows) == (3 * 64 + 11, 20)
    assert [b.batch.column("i").to_pylist() for b in part.load()] == [list(range(202, 222))]
    assert len(pickle.dumps(pieces[3])) < 1000  # a worker reads the lines itself
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert list(jsonl._line_ranges(str(empty), 64, "text")) == []


def test_hf_name_is_read_offline_without_touching_the_environment(monkeypatch):
    lookups = []

    def no_network(*args, **kw):
        lookups.append(args[0])
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    env = dict(os.environ)
    before = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
    with pytest.raises(InputError, match="could not load Hugging Face dataset"):
        list(read_inputs(["hf:packtool-test/does-not-exist"]))
    assert lookups == []  # not one host name looked up
    assert dict(os.environ) == env
    assert (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE) == before


def test_a_directory_of_txt_files_is_one_sample_per_file_whatever_else_it_holds(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("doc one l1\ndoc one l2\n")
    (docs / "b.txt").write_text("doc two\n")
    expected = ["doc one l1\ndoc one l2\n", "doc two\n"]
    assert _texts([docs]) == expected
    (docs / "README").write_text("about these docs\n")
    (docs / "notes.md").write_text("# notes\n")
    assert _texts([docs]) == expected
    assert [kind for kind, _, _ in expand_inputs([str(docs)])] == ["text_dir"]


def test_a_utf8_bom_is_stripped_from_text_as_from_json_lines(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"\xef\xbb\xbffirst\nsecond\n")
    assert _texts([tmp_path / "b.txt"]) == ["first", "second"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_bytes(b"\xef\xbb\xbfdoc a")
    assert _texts([docs]) == ["doc a"]
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "first"}\n')
    assert _texts([tmp_path / "b.jsonl"]) == ["first"]


@pytest.mark.parametrize("lazy", [False, True])
def test_corrupt_parquet_row_group_is_reported_at_its_first_row(tmp_path, lazy):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"input_ids": [[i, i + 1] for i in range(500)]}), path, row_group_size=50)
    offset = pq.ParquetFile(path).metadata.row_group(6).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 40] = bytes(b ^ 0xFF for b in data[offset : offset + 40])
    path.write_bytes(bytes(data))
    rows = []
    with pytest.raises(InputError, match="corrupt Parquet data after row 300"):
        for piece in read_inputs([str(path)], lazy=lazy):
            for b in piece.load():
                rows += b.rows.tolist()
    assert rows == list(range(300))


def _records(pieces, sink, cut: int | None = None):
    """``(source, row kind, row, record)`` of every record the pieces load, each piece cut into slices of
    ``cut`` rows first (as the driver's chunks cut them) and sent through pickle (as to a worker)."""
    import pickle

    out = []
    for piece in pieces:
        parts = [piece] if cut is None else [piece.slice(a, cut) for a in range(0, piece.num_rows, cut)]
        for part in parts:
            for b in pickle.loads(pickle.dumps(part)).load(sink):
                recs = zip(b.rows, b.batch.to_pylist(), strict=True)
                out += [(b.source, b.row_kind, int(r), rec) for r, rec in recs]
    return out


def _read_both(inputs, on_error="fail", cut=3, **kw):
    """The records read by the driver (``read_inputs``) and lazily (ranges loaded as workers load them),
    or the error each raised, with the skip counts."""
    from packtool.errors import ErrorSink

    got = []
    for lazy in (False, True):
        sink = ErrorSink(on_error)
        try:
            pieces = list(read_inputs([str(i) for i in inputs], sink=sink, lazy=lazy, **kw))
            if lazy:
                assert not any(type(p).__name__ == "SourceBatch" for p in pieces)  # nothing parsed here
            got.append((_records(pieces, sink, cut if lazy else None), dict(sink.counts)))
        except InputError as e:
            got.append((str(e), None))
    return got


@pytest.mark.parametrize(
    "data",
    [
        b"first\nsecond\nthird\n",
        b"no final newline\nlast",
        b"\xef\xbb\xbfbom\n\n   \n\t\nafter blanks\r\ncrlf\r\n",
        b"ok\nbad \xff here\nok again\n\xed\xa0\x80\nend\n",  # not UTF-8, a surrogate encoded
        b"\n\n \n",  # only blank lines
        "unicode \u00e9\u20ac\U0001f600\n".encode() * 5,
    ],
    ids=["plain", "no-final-newline", "bom-blank-crlf", "not-utf8", "only-blank", "unicode"],
)
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_lazy_text_lines_read_what_the_whole_file_reader_reads(tmp_path, data, on_error):
    """Workers read their own line ranges of a .txt file: the same texts, line numbers, errors and skip
    counts as the driver reading the whole file, however the ranges are cut."""
    path = tmp_path / "a.txt"
    path.write_bytes(data)
    for cut in (1, 2, 5):
        eager, lazy = _read_both([path], on_error, cut)
        assert eager == lazy, cut
    if b"\xff" in data and on_error == "fail":
        assert eager[0].startswith(f"{path}, line 2: not valid UTF-8 (byte 4) (--on-error skip")


def test_lazy_text_directory_reads_its_files_in_the_workers(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(12):
        (docs / f"{i:02d}.txt").write_bytes(b"\xef\xbb\xbf" * (i == 0) + f"doc {i}\nline two".encode())
    (docs / "07.txt").write_bytes(b"bad \xfe\n")
    (docs / "README").write_text("not a sample")
    eager, lazy = _read_both([docs], "skip", 5)
    assert eager == lazy and eager[1] == {"not_utf8": 1}
    assert [r[2] for r in eager[0]] == [i for i in range(12) if i != 7]
    assert eager[0][0] == (str(docs), "file", 0, {"text": "doc 0\nline two"})
    eager, lazy = _read_both([docs], "fail", 5)
    assert eager == lazy and eager[0].startswith(f"{docs / '07.txt'}: not valid UTF-8 (byte 4)")


def test_lazy_hf_datasets_are_read_from_their_arrow_files(tmp_path):
    """save_to_disk (3 shards, a DatasetDict) and hf:DIR (load_dataset's cache): ranges of the Arrow files,
    read by the worker; a sliced split is not its files, and is read by the driver."""
    from packtool.readers.hf_rows import HfRows

    rows = [{"text": f"sample {i}", "n": i} for i in range(50)]
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=3)
    datasets.DatasetDict({"train": ds, "test": ds.select([4, 2])}).save_to_disk(str(tmp_path / "dd"))
    write_jsonl(tmp_path / "hub" / "data.jsonl", rows)
    for inputs, split in (
        ([tmp_path / "ds"], "train"),
        ([tmp_path / "dd"], "test"),
        ([f"hf:{tmp_path / 'hub'}"], "train"),
    ):
        eager, lazy = _read_both(inputs, cut=7, split=split)
        assert eager == lazy and len(eager[0]) == (2 if split == "test" else 50)
        pieces = list(read_inputs([str(i) for i in inputs], lazy=True, split=split))
        assert all(isinstance(p, HfRows) for p in pieces)
    assert [r[2:] for r in lazy[0][:2]] == [(0, rows[0]), (1, rows[1])]
    pieces = list(read_inputs([f"hf:{tmp_path / 'hub'}"], lazy=True, split="train[10:20]"))
    assert [type(p).__name__ for p in pieces] == ["SourceBatch"]  # a slice of a file: the driver reads it
    assert pieces[0].batch.column("n").to_pylist() == list(range(10, 20))


@pytest.mark.parametrize("lazy", [False, True])
def test_a_deep_record_among_many_flat_ones_is_found(tmp_path, lazy):
    """The quick bracket counts (brackets that do not open a line) never skip a record nested too deep:
    3,000 one-object records (a bracket each, at the line's start) and one 129 deep at line 2,501."""
    lines = [json.dumps({"text": f"t{i}"}) for i in range(3000)]
    lines[2500] = '{"text": "x", "a": ' + "[" * 128 + "]" * 128 + "}"
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="line 2501: JSON nested deeper than 128 levels"):
        for piece in read_inputs([str(path)], lazy=lazy):
            piece.load()
