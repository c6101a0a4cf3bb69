"""storage.urls: what a URL is, the filesystem that serves it, and a store's failures as one line."""

from __future__ import annotations

import pytest

from packtool.errors import ConfigError, InputError
from packtool.storage import urls
from packtool.storage.urls import filesystem, is_url, join, local_path, options_for, store_error


@pytest.mark.parametrize(
    "path, url",
    [
        ("s3://bucket/key.jsonl", True),
        ("gs://bucket/prefix/", True),
        ("az://container/blob", True),
        ("hf://datasets/x", True),
        ("file:///tmp/a.jsonl", False),  # a local path, written as a URL
        ("data/train.jsonl", False),
        ("/abs/path", False),
        ("C:\\data\\x.jsonl", False),  # a drive letter is no scheme
        ("c://x", False),
        ("hf:name", False),  # packtool's hf: inputs are datasets names, not fsspec URLs
        ("s3:/bucket/key", False),  # one slash: what a URL becomes through pathlib, a local path
    ],
)
def test_is_url(path, url):
    assert is_url(path) is url


def test_local_path_and_join():
    assert local_path("file:///tmp/x") == "/tmp/x"
    assert join("s3://b/out", "packs-000000.parquet") == "s3://b/out/packs-000000.parquet"
    assert join("s3://b/out/", ".partial", "lock.json") == "s3://b/out/.partial/lock.json"


def test_a_scheme_not_installed_names_the_extra():
    with pytest.raises(ConfigError, match=r"gs://.*needs gcsfs \(pip install 'packtool\[gcs\]'\)"):
        filesystem("gs://bucket/x.jsonl")


def test_an_unknown_scheme_is_a_usage_error():
    with pytest.raises(ConfigError, match=r"no filesystem serves nosuch://"):
        filesystem("nosuch://bucket/x")


def test_storage_options_shared_and_per_scheme(monkeypatch):
    monkeypatch.setattr(urls, "_OPTIONS", {})
    monkeypatch.setenv(urls.ENV_OPTIONS, '{"anon": false, "s3": {"client_kwargs": {"region_name": "x"}}}')
    got = options_for("s3")
    assert got["anon"] is False and got["client_kwargs"] == {"region_name": "x"}
    assert got["config_kwargs"]["retries"]["max_attempts"] == 2  # bounded retries by default
    assert options_for("gs") == {"use_listings_cache": False, "anon": False}


def test_storage_options_must_be_a_json_object():
    with pytest.raises(ConfigError, match="must be a JSON object"):
        urls.parse_options("[1, 2]")
    with pytest.raises(ConfigError, match="not JSON"):
        urls.parse_options("{nope")


class EndpointConnectionError(Exception):  # named as botocore names it: store_error reads the class name
    pass


class NoCredentialsError(Exception):
    pass


@pytest.mark.parametrize(
    "error, kind, words",
    [
        (EndpointConnectionError("Could not connect"), ConfigError, "cannot reach the object store"),
        (NoCredentialsError("Unable to locate credentials"), ConfigError, "no credentials"),
        (PermissionError("Access Denied"), ConfigError, "access denied for write"),
        (FileNotFoundError("The specified bucket does not exist"), ConfigError, "no such bucket"),
        (FileNotFoundError("x"), InputError, "no such file or object"),
    ],
)
def test_store_errors_are_one_line(error, kind, words):
    e = store_error(error, "s3://b/k", "write")
    assert isinstance(e, kind) and words in str(e) and "\n" not in str(e)
