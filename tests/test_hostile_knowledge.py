"""Hostile index answers for `toolkit knowledge check-updates`, recorded (--recorded) or live: every one ends
in one line and a non-zero exit, never a traceback, a hang or unbounded memory; `--record` never overwrites
a file of the user's. Each recorded case is the real command in a subprocess, on a folder of real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from toolkit.knowledge import upstream

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests/data/upstream"
TORCH = "https://pypi.org/pypi/torch/json"
INFO = {"name": "torch", "version": "2.15.0"}


def check_updates(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", "knowledge", "check-updates", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def recording(folder: Path, index: object, answer: object = None) -> Path:
    """A recording whose index.json is `index` and whose file `a` holds `answer` as JSON."""
    folder.mkdir()
    (folder / "index.json").write_text(json.dumps(index))
    if answer is not None:
        (folder / "a").write_text(json.dumps(answer))
    return folder


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


ANSWERS = {  # an answer of the wrong shape -> the field the error names
    "a list": ([1], "top level: input should be a dictionary"),
    "a number": (5, "top level: input should be a dictionary"),
    "no info": ({"releases": {}}, "info: field required"),
    "releases a list": ({"info": INFO, "releases": [1]}, "releases: input should be a valid dictionary, not [1]"),
    "files a number": ({"info": INFO, "releases": {"2.7.0": 5}}, "releases.2.7.0: input should be a valid list, not 5"),
    "a file a string": ({"info": INFO, "releases": {"2.7.0": ["x"]}}, "releases.2.7.0[0]: input should be"),
    "upload_time a number": ({"info": INFO, "releases": {"2.7.0": [{"upload_time": 5}]}},
                             "releases.2.7.0[0].upload_time: input should be a valid string, not 5"),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_an_answer_of_the_wrong_shape_is_one_line(tmp_path, case):
    answer, problem = ANSWERS[case]
    line = one_line_error(check_updates("--recorded", str(recording(tmp_path / "r", {TORCH: {"file": "a"}}, answer))))
    assert line.startswith(f"error: {TORCH}: unreadable PyPI answer ({problem}")


INDEXES = {
    "a list": ([1], "top level: input should be a valid dictionary, not [1]"),
    "a number": (5, "top level: input should be a valid dictionary, not 5"),
    "an entry a list": ({TORCH: [1]}, f"{TORCH}: input should be a dictionary"),
    "a file a number": ({TORCH: {"file": 5}}, f"{TORCH}.file: input should be a valid string, not 5"),
    "an absolute file": ({TORCH: {"file": "/etc/hostname"}}, f"{TORCH}.file: '/etc/hostname' is not a file name"),
    "a ../ file": ({TORCH: {"file": "../index.json"}}, f"{TORCH}.file: '../index.json' is not a file name"),
}


@pytest.mark.parametrize("case", sorted(INDEXES))
def test_an_index_of_the_wrong_shape_is_one_line(tmp_path, case):
    index, problem = INDEXES[case]
    folder = recording(tmp_path / "r", index)
    line = one_line_error(check_updates("--recorded", str(folder)))
    assert line.startswith(f"error: {folder}/index.json: unreadable index of recorded answers ({problem}")


def test_odd_versions_are_judged_or_left_out(tmp_path):
    """A 5000-digit version is no version (left out); torch `3` is 3.0, a minor the knowledge lacks."""
    answer = {"info": INFO, "releases": {"2." + "1" * 5000: [{"upload_time": "2026-12-01T00:00:00"}],
                                         "3": [{"upload_time": "2026-12-02T00:00:00"}]}}
    done = check_updates("--recorded", str(recording(tmp_path / "r", {TORCH: {"file": "a"}}, answer)))
    assert done.returncode == 1 and done.stderr == ""
    torch = [line for line in done.stdout.splitlines() if line.startswith("torch ")]
    assert torch == ["torch 3: torch 3.0 (released 2026-12-02) is not in toolkit/knowledge/torch_releases.yaml "
                     "(add it with the CUDA lines and Pythons it ships, and the source)"]


def test_dev_zero_and_a_fifo_are_refused_unread(tmp_path):
    """/dev/zero (a symlink named as the answer) would fill memory, a FIFO block forever: both are named
    "not checked" after an fstat, without a byte read."""
    folder = recording(tmp_path / "r", {TORCH: {"file": "zero"}, "https://pypi.org/pypi/flash-attn/json": {"file": "fifo"}})
    (folder / "zero").symlink_to("/dev/zero")
    os.mkfifo(folder / "fifo")
    done = check_updates("--recorded", str(folder), timeout=30)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"not checked: {TORCH} ({folder}/zero: a character device, not a regular file)" in done.stdout
    assert (f"not checked: https://pypi.org/pypi/flash-attn/json ({folder}/fifo: a FIFO, not a regular file)"
            in done.stdout)


class _Endless(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        chunk = b"0" * (1 << 20)
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:  # the client stopped reading
            pass

    def log_message(self, *args: object) -> None:
        pass


def test_a_live_answer_is_read_bounded():
    """A real loopback server that never stops answering: the fetch stops after the limit, and the URL is
    named "not checked" (before: response.read() read until memory ran out)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/pypi/torch/json"
    try:
        with pytest.raises(ValueError, match=f"answer larger than {upstream.MAX_ANSWER_BYTES:,} bytes"):
            upstream.live_fetch(url)
    finally:
        server.shutdown()
        server.server_close()


def test_record_never_overwrites_a_users_files(tmp_path):
    """--record into a folder with files (the user's, or an earlier recording) refuses before fetching."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "index.json").write_text("my notes\n")
    line = one_line_error(check_updates("--recorded", str(RECORDED), "--record", str(folder)))
    assert line == (f"error: --record {folder}: not empty (a recording goes into a new or empty folder: name one, "
                    f"or remove this one's files first)")
    assert os.listdir(folder) == ["index.json"] and (folder / "index.json").read_text() == "my notes\n"


def test_record_into_a_new_folder_replays(tmp_path):
    done = check_updates("--recorded", str(RECORDED), "--record", str(tmp_path / "new"))
    assert done.returncode == 1 and done.stderr == ""  # 1: the recording lacks download.pytorch.org
    again = check_updates("--recorded", str(tmp_path / "new"))
    assert again.stdout == done.stdout
