"""Hostile inputs to the fa4 verbs: carried part folders, a folder swapped during an install, hand-edited
install records, a killed install, and paths that would break a later step.

The joins use files made here by fa4_wheels.split_file, their expected bytes and hashes from hashlib and the files
themselves. The killed install is the real verb in a subprocess with the real pinned wheels (run
scripts/fetch_fa4_wheels.sh first) for a real Python 3.12 whose torch is a dist-info stand-in (test_fa4).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_fa4 import fetched_parts, python312_base
from test_fa4_jit_cache_install import KEY, artifact, entry, key_packages, tree

from toolkit.cli import main
from toolkit.env.install_record import Fa4Record
from toolkit.fa4 import install as fa4
from toolkit.fa4 import wheels as fa4_wheels

ROOT = Path(__file__).resolve().parent.parent


def one_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def split(tmp_path: Path, name: str = "big.whl", size: int = 3000) -> tuple[Path, bytes]:
    """A parts folder of a random file cut in 1000-byte parts, as fetch_fa4_wheels.sh cuts the big wheel."""
    data = os.urandom(size)
    (tmp_path / name).write_bytes(data)
    fa4_wheels.split_file(tmp_path / name, tmp_path / "parts", part_bytes=1000)
    return tmp_path / "parts", data


def join(dest: Path, *parts: Path) -> int:
    return main(["fa4", "join", "--dest", str(dest), *map(str, parts)])


# ---------------------------------------------------------------- fa4 join


def test_join_never_replaces_a_file_in_dest_and_a_rerun_keeps_identical_ones(tmp_path, capsys):
    parts, data = split(tmp_path)
    (parts / "small.whl").write_bytes(b"the carried wheel")
    dest = tmp_path / "dest"
    dest.mkdir()
    for name in ("small.whl", "big.whl"):  # a wheel's name, then the manifest's
        (dest / name).write_bytes(b"the user's file")
        assert join(dest, parts) == 1
        assert "already there" in one_line(capsys)
        assert (dest / name).read_bytes() == b"the user's file" and len(list(dest.iterdir())) == 1
        (dest / name).unlink()
    assert join(dest, parts) == 0 and join(dest, parts) == 0  # a rerun finds the same files: kept
    assert (dest / "big.whl").read_bytes() == data and (dest / "small.whl").read_bytes() == b"the carried wheel"


def _repeat_one_part(parts: Path) -> None:
    """One 1000-byte part listed 5 times, the size and sha256 made to fit: 5x its bytes from a 1 KB part."""
    block = (parts / "big.whl.part000").read_bytes()
    manifest = {"file": "big.whl", "size": 5 * len(block), "sha256": hashlib.sha256(block * 5).hexdigest(),
                "parts": ["big.whl.part000"] * 5}
    (parts / "big.whl.parts.json").write_text(json.dumps(manifest))


def _hard_links(parts: Path) -> None:
    block = (parts / "big.whl.part000").read_bytes()
    for index in (1, 2):
        (parts / f"big.whl.part00{index}").unlink()
        os.link(parts / "big.whl.part000", parts / f"big.whl.part00{index}")
    manifest = json.loads((parts / "big.whl.parts.json").read_text())
    manifest["sha256"] = hashlib.sha256(block * 3).hexdigest()
    (parts / "big.whl.parts.json").write_text(json.dumps(manifest))


def _size_lies(parts: Path) -> None:
    manifest = json.loads((parts / "big.whl.parts.json").read_text())
    (parts / "big.whl.parts.json").write_text(json.dumps({**manifest, "size": 2 ** 40}))


def _part_is_a_symlink(parts: Path) -> None:
    (parts / "big.whl.part001").unlink()
    (parts / "big.whl.part001").symlink_to(parts / "big.whl.part000")


@pytest.mark.parametrize("edit, says", [(_repeat_one_part, "same file as part"), (_hard_links, "same file as part"),
                                        (_size_lies, "manifest's size is"), (_part_is_a_symlink, "a symlink")],
                         ids=["one-part-listed-5-times", "hard-links", "size-lies", "part-a-symlink"])
def test_join_writes_no_more_than_the_parts_hold(tmp_path, capsys, edit, says):
    parts, _ = split(tmp_path)
    edit(parts)
    assert join(tmp_path / "dest", parts) == 1
    assert says in one_line(capsys) and not (tmp_path / "dest").exists()


def test_join_copies_no_symlinked_wheel(tmp_path, capsys):
    (tmp_path / "private").write_text("mode 600\n")
    (tmp_path / "private").chmod(0o600)
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "w-1.0-py3-none-any.whl").symlink_to(tmp_path / "private")
    assert join(tmp_path / "dest", tmp_path / "parts") == 1
    assert "a symlink, not a regular file" in one_line(capsys) and not (tmp_path / "dest").exists()


def test_join_of_a_wheel_linked_to_dev_zero_ends_at_once(tmp_path):
    """In a subprocess with a timeout: the old join copied /dev/zero until the disk was full."""
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "zero.whl").symlink_to("/dev/zero")
    done = subprocess.run([sys.executable, "-m", "toolkit.fa4", "join", "--dest", str(tmp_path / "dest"),
                           str(tmp_path / "parts")], capture_output=True, text=True, timeout=15, cwd=ROOT)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "a symlink" in done.stderr, done.stderr
    assert not (tmp_path / "dest").exists()


def test_a_name_with_a_newline_is_refused_not_printed(tmp_path, capsys):
    parts, _ = split(tmp_path)
    manifest = json.loads((parts / "big.whl.parts.json").read_text())
    (parts / "big.whl.parts.json").write_text(json.dumps({**manifest, "file": "big\nEVIL=1.whl"}))
    assert join(tmp_path / "dest", parts) == 1
    assert "plain file names" in one_line(capsys) and not (tmp_path / "dest").exists()


def test_a_join_that_does_not_fit_on_the_disk_writes_nothing(tmp_path, capsys, monkeypatch):
    import shutil

    parts, _ = split(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 ** 9, 10 ** 9 - 2000, 2000))
    assert join(tmp_path / "dest", parts) == 1
    assert "MiB are free" in one_line(capsys) and not (tmp_path / "dest").exists()


# ---------------------------------------------------------------- fa4 install: a folder swapped meanwhile


def _staged_and_target(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An install to merge (staging), an earlier one (target), and a folder outside with a flash_attn/cute."""
    staging, target, outside = tmp_path / "staging", tmp_path / "target", tmp_path / "outside"
    for root, text in ((staging, "new"), (target, "old")):
        for name in ("aaa/__init__.py", "flash_attn/cute/interface.py", "zzz/__init__.py"):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(f"{text}\n")
    (outside / "flash_attn" / "cute").mkdir(parents=True)
    (outside / "flash_attn" / "cute" / "precious.py").write_text("not the toolkit's\n")
    return staging, target, outside


def _swap(target: Path, outside: Path) -> None:
    (target / "flash_attn").rename(target.parent / "moved-away")
    (target / "flash_attn").symlink_to(outside / "flash_attn")


@pytest.mark.parametrize("when", ["after-the-plan", "after-the-first-move"])
def test_a_folder_swapped_for_a_symlink_during_the_merge_touches_nothing_outside(tmp_path, monkeypatch, when):
    """Deterministic: the swap happens at a known step (the race won 3 of 8 tries against the old merge)."""
    staging, target, outside = _staged_and_target(tmp_path)
    if when == "after-the-plan":
        real_plan = fa4.merge_plan

        def plan_then_swap(*args):
            pairs = real_plan(*args)
            _swap(target, outside)
            return pairs

        monkeypatch.setattr(fa4, "merge_plan", plan_then_swap)
    else:
        swapped = []
        for name in ("rename", "replace"):  # the move the merge makes, whichever call it uses
            real = getattr(os, name)

            def move_then_swap(*args, real=real, **kwargs):
                real(*args, **kwargs)
                if not swapped:
                    swapped.append(True)
                    _swap(target, outside)

            monkeypatch.setattr(os, name, move_then_swap)
    try:
        fa4.merge_into(staging, target)
        error = ""
    except fa4.ToolkitError as exc:
        error = str(exc)
    monkeypatch.undo()
    assert tree(outside) == {"flash_attn": None, "flash_attn/cute": None,
                             "flash_attn/cute/precious.py": b"not the toolkit's\n"}
    assert re.search(r"flash_attn: .*(symlink|replaced while installing)", error) and "\n" not in error, error


# ---------------------------------------------------------------- warm and cache-install run no program a record names


@pytest.fixture
def site(tmp_path) -> Path:
    """A `fa4 install` folder whose record a user edited to name another program as its python."""
    return key_packages(tmp_path / "site")


def _program(tmp_path: Path, answer: str) -> Path:
    """A stand-in interpreter that leaves a mark when it runs and answers `answer`."""
    program = tmp_path / "not-python"
    program.write_text(f"#!/bin/sh\ntouch {tmp_path / 'it-ran'}\necho '{answer}'\n")
    program.chmod(0o755)
    return program


@pytest.mark.parametrize("verb", ["warm", "cache-install"])
def test_no_program_a_record_names_is_run(tmp_path, capsys, site, verb):
    program = _program(tmp_path, json.dumps({k: v for k, v in KEY.items() if k != "arch"}))
    Fa4Record("4.0.0b36", "13", str(site), str(program), [], {}, [str(site)]).write(site)
    record = artifact(tmp_path / "wh", [entry("a.o")])
    extra = {"warm": ["--cache-dir", str(tmp_path / "c"), "--artifacts", str(tmp_path / "wh2"), "--report",
                      str(tmp_path / "r.json")],
             "cache-install": ["--cache-record", str(record), "--dest", str(tmp_path / "dest")]}[verb]
    assert main(["fa4", verb, "--target", str(site), "--arch", "90", *extra]) == 1
    assert "written for the python" in one_line(capsys)
    assert not (tmp_path / "it-ran").exists()


def test_cache_install_reads_its_cache_record_before_running_python_and_a_non_json_answer_is_one_line(
        tmp_path, capsys, site):
    program = _program(tmp_path, "hello, not JSON")
    Fa4Record("4.0.0b36", "13", str(site), str(program), [], {}, [str(site)]).write(site)
    (tmp_path / "damaged.kernel-cache.json").write_text("{not json")
    args = ["fa4", "cache-install", "--target", str(site), "--arch", "90", "--python", str(program), "--dest",
            str(tmp_path / "dest")]
    assert main([*args, "--cache-record", str(tmp_path / "damaged.kernel-cache.json")]) == 1
    assert "damaged.kernel-cache.json" in one_line(capsys) and not (tmp_path / "it-ran").exists()
    assert main([*args, "--cache-record", str(artifact(tmp_path / "wh", [entry("a.o")]))]) == 1
    assert "version probe" in one_line(capsys) and not (tmp_path / "dest").exists()


# ---------------------------------------------------------------- paths that break a later step


@pytest.mark.parametrize("odd", ["a:b", "a\nLD_PRELOAD=x", "a\x1b[31m"], ids=["colon", "newline", "escape"])
def test_a_target_or_dest_that_is_not_a_plain_path_is_refused_at_the_door(tmp_path, capsys, site, odd):
    Fa4Record("4.0.0b36", "13", str(site), sys.executable, [], {}, [str(site)]).write(site)
    record = artifact(tmp_path / "wh", [entry("a.o")])
    for args in (["install", "--wheels", str(tmp_path), "--target"], ["join", str(tmp_path / "wh"), "--dest"],
                 ["cache-install", "--target", str(site), "--arch", "90", "--cache-record", str(record), "--dest"]):
        assert main(["fa4", *args, str(tmp_path / odd)]) == 1
        assert "or a control character (pass a plain folder path)" in one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site", "wh"]


@pytest.mark.parametrize("name", [f"{'f' * 8}/a\nb.o", f"{'f' * 8}/\x1b[2Ja.o"], ids=["newline", "escape"])
def test_cache_install_refuses_a_member_name_with_a_control_character(tmp_path, name):
    from toolkit.fa4 import jit as fa4_jit

    with pytest.raises(fa4.ToolkitError, match="a name with a control character") as caught:
        fa4_jit.unpack(artifact(tmp_path / "wh", [entry("good.o"), entry(name)]), KEY, tmp_path / "dest")
    assert "\n" not in str(caught.value) and "\x1b" not in str(caught.value)
    assert not (tmp_path / "dest").exists()


# ---------------------------------------------------------------- the kernel-cache record beside build records


def _a_built_wheel(line_dir: Path) -> str:
    """A build record the real H200 build wrote (docs/results/), its wheel beside it: what `toolkit build` left."""
    from toolkit.build.record import BuildRecord

    record = BuildRecord.read(ROOT / "docs/results/2026-11-29-h200-seeded-build/build-record.json")
    line_dir.mkdir(parents=True)
    (line_dir / record.outputs.wheel).write_bytes(b"stand-in wheel")
    (line_dir / f"{record.outputs.wheel}.build.json").write_text(record.text())
    return record.outputs.wheel


def test_a_warmed_cache_packed_into_a_line_folder_leaves_its_build_records_readable(tmp_path):
    """`fa4 warm --artifacts wheelhouse/LINE` (pack) named its record <key>.build.json, the build records' suffix:
    `toolkit build`'s cache lookup, doctor and the PEP 503 index then refused the line's folder ("not a build
    record of schema 1"). Its record is <key>.kernel-cache.json now; the build's readers see their records only."""
    from toolkit.build.wheelhouse import find_cached, records, write_index
    from toolkit.fa4 import jit as fa4_jit

    line_dir = tmp_path / "wheelhouse" / "gpu-machine"
    wheel = _a_built_wheel(line_dir)
    (tmp_path / "cache" / "fp").mkdir(parents=True)
    (tmp_path / "cache" / "fp" / "a.o").write_bytes(b"kernel")
    archive, record_path = fa4_jit.pack(tmp_path / "cache", line_dir, KEY, {"variants": [{"variant": "fwd"}]})
    assert record_path.name == f"{archive.name.removesuffix('.tar.gz')}.kernel-cache.json"
    assert [path.name for path, _ in records(line_dir)] == [f"{wheel}.build.json"]
    assert find_cached(line_dir, "0" * 64) is None
    index = (write_index(tmp_path / "wheelhouse") / "flash-attn" / "index.html").read_text()
    assert wheel in index and archive.name not in index
    assert fa4_jit.unpack(record_path, KEY, tmp_path / "dest")  # and the cache record itself still installs
    old_name = line_dir / f"{archive.name.removesuffix('.tar.gz')}.build.json"  # what warm wrote before
    record_path.rename(old_name)
    with pytest.raises(fa4.ToolkitError) as caught:
        records(line_dir)
    assert str(caught.value) == (f"{old_name}: a kernel cache's record (`toolkit fa4 warm`), not a build record "
                                 f"(rename it to {record_path})")


@pytest.mark.parametrize("edit, phrase", [
    ({"entries": "many"}, "entries: input should be a valid integer, not 'many'"),
    ({"key": {**KEY, "arch": 90}}, "key.arch: input should be a valid string, not 90"),
    ({"sha256": "$(id)"}, "sha256: not a sha256 hex digest"),
    ({"artifact": "../x.tar.gz"}, "artifact: must be a file name beside the record"),
    ({"kind": "fa4-cache-install"}, "kind: input should be 'fa4-kernel-cache'"),
    ({"comment": "mine"}, "comment: unexpected keyword argument"),
], ids=["entries", "key.arch", "sha256", "artifact", "kind", "extra"])
def test_a_hand_edited_cache_record_is_one_line_naming_the_field(tmp_path, capsys, site, edit, phrase):
    """Read before any program runs: the stand-in interpreter never runs, nothing is unpacked."""
    from toolkit.fa4 import jit as fa4_jit

    program = _program(tmp_path, "{}")
    Fa4Record("4.0.0b36", "13", str(site), str(program), [], {}, [str(site)]).write(site)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "a.o").write_bytes(b"kernel")
    _, record_path = fa4_jit.pack(tmp_path / "cache", tmp_path / "wh", KEY, {"variants": []})
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), **edit}))
    assert main(["fa4", "cache-install", "--target", str(site), "--arch", "90", "--python", str(program),
                 "--cache-record", str(record_path), "--dest", str(tmp_path / "dest")]) == 1
    said = one_line(capsys)
    assert said.startswith(f"error: {record_path}: not a cache record: {phrase}") and said.endswith("(warm again)\n")
    assert not (tmp_path / "it-ran").exists() and not (tmp_path / "dest").exists()


# ---------------------------------------------------------------- a killed install


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.python312
@pytest.mark.fa4_wheels
def test_a_killed_install_leaves_no_pip_running_and_a_rerun_no_staging_folder(tmp_path):
    """SIGKILL while pip fills the staging folder: pip dies with the verb, and the next install removes it."""
    wheels = tmp_path / "wheels"
    assert main(["fa4", "join", "--dest", str(wheels), *map(str, fetched_parts())]) == 0
    python = python312_base(tmp_path)
    target = tmp_path / "fa4"
    command = [sys.executable, "-m", "toolkit.fa4", "install", "--wheels", str(wheels), "--target", str(target),
               "--python", str(python)]
    verb = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    pip: list[int] = []
    while time.monotonic() < deadline and not pip:
        pip = [pid for pid in _children(verb.pid) if b"-m\0pip\0install" in _cmdline(pid)]
        time.sleep(0.05)
    time.sleep(1)  # pip unpacks into its own temporary folder, then moves everything into the staging folder
    assert pip and _alive(pip[0]), "pip never ran, or ended within a second"
    verb.send_signal(signal.SIGKILL)
    verb.wait()
    time.sleep(0.5)  # the kernel kills a child that asked for it as its parent dies
    assert not [pid for pid in pip if _alive(pid)], "pip outlived the killed install"
    assert list(target.glob(".fa-envkit-tmp-*"))  # what the killed run left
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert Fa4Record.read(target) is not None, done.stderr[-2000:]  # installed (the import check needs real torch)
    assert not list(target.glob(".fa-envkit-tmp-*"))
