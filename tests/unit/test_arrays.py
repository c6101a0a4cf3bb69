"""packtool.arrays: the pandas-free builders give what ``pa.array`` gives, and do not import pandas."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from packtool.arrays import bytes_array, int_array

TEXT_TYPES = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]


@pytest.mark.parametrize("type_", TEXT_TYPES, ids=str)
@pytest.mark.parametrize("seed", range(5))
def test_bytes_array_equals_pa_array(type_, seed):
    rng = np.random.default_rng(seed)
    words = ["", "a", "été", "日本語", "x" * 300, None]
    values = [words[i] for i in rng.integers(0, len(words), int(rng.integers(0, 40)))]
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        values = [None if v is None else v.encode() for v in values]
    got = bytes_array(values, type_)
    got.validate(full=True)
    assert got.type == type_
    assert got.equals(pa.array(values, type_))
    assert got.null_count == sum(v is None for v in values)


def test_bytes_array_takes_str_for_binary_and_keeps_all_null():
    assert bytes_array(["é"], pa.large_binary()).to_pylist() == ["é".encode()]
    nulls = bytes_array([None, None], pa.string())
    nulls.validate(full=True)
    assert nulls.to_pylist() == [None, None]
    assert bytes_array([], pa.string()).to_pylist() == []


@pytest.mark.parametrize("type_", [pa.int32(), pa.int64()], ids=str)
def test_int_array_equals_pa_array(type_):
    values = [0, None, 2**31 - 1, -5, None, 7]
    got = int_array(values, type_)
    got.validate(full=True)
    assert got.equals(pa.array(values, type_))
    assert int_array([], type_).to_pylist() == []


def test_int_array_refuses_a_value_beyond_its_type():
    with pytest.raises(OverflowError):
        int_array([2**31], pa.int32())


def test_the_builders_do_not_import_pandas():
    code = (
        "import sys, pyarrow as pa\n"
        "from packtool.arrays import bytes_array, int_array\n"
        "bytes_array(['a', None], pa.string()); int_array([1, None], pa.int64())\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
