"""storage.folders against a real S3-protocol server: objects put whole, listed, removed; the run lock."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from packtool.errors import ConfigError
from packtool.storage import folders
from packtool.storage.folders import StoreFolder, StoreLock
from tests.fixtures.s3 import s3, s3_server  # noqa: F401 - fixtures


def test_put_get_list_remove(s3, tmp_path):
    folder = StoreFolder(f"{s3.url}/out")
    folder.put_bytes("a/b.json", b"{}")
    (tmp_path / "big.bin").write_bytes(os.urandom(3 << 20))
    folder.put_file(tmp_path / "big.bin", "big.bin")
    assert sorted(folder.list()) == ["a/b.json", "big.bin"] and folder.list("a") == {
        "a/b.json": folder.stat("a/b.json")
    }
    folder.get_file("big.bin", tmp_path / "copy" / "big.bin")
    assert (tmp_path / "copy" / "big.bin").read_bytes() == (tmp_path / "big.bin").read_bytes()
    assert folder.read_json("a/b.json") == {} and folder.read_bytes("none") is None
    with pytest.raises(FileExistsError):
        folder.put_bytes("a/b.json", b"[]", create=True)  # a conditional PUT
    folder.remove(["big.bin", "not-there"])
    folder.remove_prefix("a")
    assert folder.list() == {}


def test_read_bytes_is_bounded(s3):
    folder = StoreFolder(s3.url)
    folder.put_bytes("x", b"12345")
    with pytest.raises(ConfigError, match="larger than 4 bytes"):
        folder.read_bytes("x", limit=4)


def test_the_lock_refuses_a_second_holder_and_is_released(s3):
    folder = StoreFolder(f"{s3.url}/out/.partial")
    first = StoreLock(folder, "lock.json", "s3://x/out").acquire()
    with pytest.raises(ConfigError, match=r"another packtool job \(pid \d+ on .*\) is writing it"):
        StoreLock(folder, "lock.json", "s3://x/out").acquire()
    first.release()
    assert not folder.exists("lock.json")
    StoreLock(folder, "lock.json", "s3://x/out").acquire().release()


def test_a_dead_holders_lock_is_taken_over_and_said(s3):
    folder = StoreFolder(s3.url)
    holder = {"host": "elsewhere", "pid": 1, "token": "t", "started": time.time() - 900}
    folder.put_bytes("lock.json", json.dumps({**holder, "expires": time.time() - 1}).encode())
    lock = StoreLock(folder, "lock.json", "out").acquire()
    assert "pid 1 on elsewhere" in lock.taken_over and "lease ran out" in lock.taken_over
    lock.release()


def test_a_live_lock_on_another_machine_is_taken_over_only_when_told(s3):
    folder = StoreFolder(s3.url)
    holder = {
        "host": "elsewhere",
        "pid": 1,
        "token": "t",
        "started": time.time(),
        "expires": time.time() + 60,
    }
    folder.put_bytes("lock.json", json.dumps(holder).encode())
    with pytest.raises(ConfigError, match="pass --overwrite if that job is dead"):
        StoreLock(folder, "lock.json", "out").acquire()
    lock = StoreLock(folder, "lock.json", "out").acquire(take_over=True)
    assert "taken over by --overwrite" in lock.taken_over
    lock.release()


def _soon(condition, seconds: float = 10.0) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (polled: the lock's thread runs on its own)."""
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_the_lease_is_renewed_and_a_lost_lock_is_noticed(s3, monkeypatch):
    monkeypatch.setattr(folders, "RENEW_SECONDS", 0.05)
    folder = StoreFolder(s3.url)
    lock = StoreLock(folder, "lock.json", "out").acquire()
    first = folder.read_json("lock.json")["expires"]
    assert _soon(lambda: folder.read_json("lock.json")["expires"] > first)  # renewed
    theirs = {
        "host": socket.gethostname(),
        "pid": 1,
        "token": "theirs",
        "started": 0,
        "expires": time.time() + 60,
    }
    folder.put_bytes("lock.json", json.dumps(theirs).encode())  # another job took it over meanwhile
    assert _soon(lambda: lock.lost is not None)
    with pytest.raises(ConfigError, match="another job took the lock over"):
        lock.check()
    lock.release()
    assert folder.read_json("lock.json")["token"] == "theirs"  # theirs is left alone
