"""The wheelhouse under interruption (issue 14): a wheel and its record appear as a pair or not at all,
and the PEP 503 index is there whenever a recorded wheel is.

The interrupted placement is a real `python` subprocess running wheelhouse.place on a real wheel file,
stopped between wheel and record by the FA_ENVKIT_PAUSE_AT hook and sent a real SIGTERM or SIGKILL."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conda_channel import make_wheel

from toolkit.build.record import BuildRecord
from toolkit.build.wheelhouse import find_cached, place, record_path_for

ROOT = Path(__file__).resolve().parent.parent
REAL_RECORD = ROOT / "docs/results/2026-11-29-h200-seeded-build/build-record.json"

KEY = "ab" * 32


def sha256_of(path: Path) -> str:
    """hashlib's sha256 of the whole file, for expected values independent of toolkit/base/digest.py."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def record_for(wheel: Path) -> BuildRecord:
    """The record a real H200 build wrote, made through BuildRecord for this wheel and key."""
    real = BuildRecord.read(REAL_RECORD)
    return replace(real, inputs_key=KEY, finished="2026-12-01T10:00:00+00:00",
                   outputs=replace(real.outputs, wheel=wheel.name, wheel_sha256=sha256_of(wheel)))


def test_a_cache_hit_writes_the_missing_index(tmp_path):
    """A build killed between its record and its index left no simple/: the rerun's cache hit writes it."""
    wheel = make_wheel(tmp_path / "built", "flash_attn", "2.8.3")
    line_dir = tmp_path / "wheelhouse" / "cu126"
    placed = place(wheel, line_dir, record_for(wheel))
    assert not (tmp_path / "wheelhouse" / "simple").exists()  # killed here, before write_index
    hit = find_cached(line_dir, KEY)
    assert hit is not None and hit.wheel == placed
    page = (tmp_path / "wheelhouse" / "simple" / "flash-attn" / "index.html").read_text()
    assert f"cu126/{placed.name}#sha256={sha256_of(placed)}" in page


PLACE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from toolkit.base.atomic import terminate_like_interrupt
    from toolkit.build.record import BuildRecord
    from toolkit.build.wheelhouse import place
    try:
        with terminate_like_interrupt():
            place(Path(sys.argv[1]), Path(sys.argv[2]), BuildRecord.from_json(json.loads(sys.argv[3]), "argv"))
    except KeyboardInterrupt:
        sys.exit(143)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_placement_interrupted_between_wheel_and_record_leaves_no_unrecorded_wheel(tmp_path, signum):
    wheel = make_wheel(tmp_path / "built", "flash_attn", "2.8.3")
    line_dir = tmp_path / "wheelhouse" / "cu126"
    marker = tmp_path / "paused"
    env = {**os.environ, "FA_ENVKIT_PAUSE_AT": "wheelhouse:record", "FA_ENVKIT_PAUSE_FILE": str(marker)}
    process = subprocess.Popen([sys.executable, "-c", PLACE, str(wheel), str(line_dir), json.dumps(record_for(wheel).to_json())],
                               env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.05)
    os.kill(process.pid, signum)
    _, err = process.communicate(timeout=20)
    assert "Traceback" not in err, err
    if signum == signal.SIGTERM:
        assert process.returncode == 143
        assert sorted(p.name for p in line_dir.iterdir()) == []  # the wheel went with its missing record
    assert find_cached(line_dir, KEY) is None  # a wheel without its record is no cache hit ...
    assert [p.name for p in line_dir.iterdir()] == []  # ... and is cleaned, as are the temporaries
    placed = place(wheel, line_dir, record_for(wheel))  # the rerun places the pair
    assert record_path_for(placed).is_file() and find_cached(line_dir, KEY).wheel == placed



# ---------------------------------------------------------------- doctor's published-build check of an installed dist


@pytest.mark.parametrize("hostile", ["fifo", "link-out"])
def test_an_installed_record_that_is_a_fifo_or_a_file_linked_out_never_blocks_nor_is_read(tmp_path, hostile):
    """toolkit doctor hashes what an installed RECORD lists: a FIFO RECORD is one line (never a hang), and a
    listed file that links out of site-packages (to /dev/zero here) is not followed."""
    from toolkit.base.errors import ToolkitError
    from toolkit.cache.installed import disk_hash, identify

    site = tmp_path / "site-packages"
    dist_info = site / "flash_attn-2.8.3.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.8.3\n")
    if hostile == "fifo":
        os.mkfifo(dist_info / "RECORD")
        with pytest.raises(ToolkitError, match=r"RECORD: unreadable \(a FIFO, not a regular file; reinstall"):
            identify(dist_info, [], tmp_path / "downloads")
    else:
        (site / "flash_attn").mkdir()
        (site / "flash_attn" / "big.so").symlink_to("/dev/zero")
        assert disk_hash(site, "flash_attn/big.so") is None
        (site / "flash_attn" / "ok.py").write_text("x = 1\n")
        assert disk_hash(site, "flash_attn/ok.py") == base64.urlsafe_b64encode(
            hashlib.sha256(b"x = 1\n").digest()).rstrip(b"=").decode()
