"""toolkit/base/digest.py against hashlib on files of several MiB (the function reads in 1 MiB chunks: a copy that
hashed only the first chunk, or dropped the last partial one, must fail here), and the download cache's check
of a file that differs from its pin only past the first MiB."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from toolkit.base.digest import CHUNK, sha256_file, sha256_json
from toolkit.base.errors import ToolkitError
from toolkit.env.download import fetch_verified
from toolkit.env.lockfile import LockedSdist


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12345])
def test_sha256_file_is_hashlibs_over_the_whole_file(tmp_path, size):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_files_that_differ_only_in_their_last_byte_hash_apart(tmp_path):
    data = bytearray(os.urandom(3 * CHUNK + 7))
    (tmp_path / "a").write_bytes(data)
    data[-1] ^= 0xFF
    (tmp_path / "b").write_bytes(data)
    assert sha256_file(tmp_path / "a") != sha256_file(tmp_path / "b") == hashlib.sha256(data).hexdigest()


def test_sha256_json_is_of_the_canonical_json():
    data = {"b": [1, 2], "a": {"y": None, "x": "é"}}
    canonical = '{"a":{"x":"\\u00e9","y":null},"b":[1,2]}'
    assert json.dumps(data, sort_keys=True, separators=(",", ":")) == canonical
    assert sha256_json(data) == sha256_json(dict(reversed(list(data.items())))) == \
        hashlib.sha256(canonical.encode()).hexdigest()


def test_the_download_cache_refuses_a_file_changed_past_its_first_mib(tmp_path):
    """The pin is hashlib's of the real bytes; the served file differs from them at its end only."""
    real = os.urandom(2 * CHUNK + 99)
    served = tmp_path / "flash_attn-9.9.tar.gz"
    served.write_bytes(real[:-1] + bytes([real[-1] ^ 1]))
    pin = LockedSdist(served.as_uri(), served.name, hashlib.sha256(real).hexdigest())
    with pytest.raises(ToolkitError, match="downloaded file has sha256"):
        fetch_verified(pin, tmp_path / "cache", "sdist")
    assert not any(p.is_file() and not p.name.endswith(".lock") for p in (tmp_path / "cache").rglob("*"))
    served.write_bytes(real)
    assert Path(fetch_verified(pin, tmp_path / "cache", "sdist")).read_bytes() == real
