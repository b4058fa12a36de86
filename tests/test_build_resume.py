"""An interrupted `toolkit build` continues where it stopped, and says how long it takes (issue 33, items 1-2).

The end-to-end tests build tests/fixtures/fa_fixture with the real nvcc (tests/cuda_toolchain.py) through the
CLI, kill it mid-compile and build again; the pieces (the time model, the ETA's correction, the build folders'
pruning) are checked against figures worked out by hand here.
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

import psutil
import pytest
from conda_channel import build_simple_index, serve_directory
from cuda_toolchain import require_nvcc
from fixtures.fa_fixture_project import make_stub_torch_env, pack_fixture_sdist, write_external_spec
from processes import names_below

from toolkit.base.fslock import locked
from toolkit.build.build_dirs import SLOT, SLOT_MARKER, keyed_build_folder, prune
from toolkit.build.estimate import CompileProgress, Sizing, compile_wall, duration_text
from toolkit.build.ninja_shim import MANIFEST_OBJECTS

pytestmark = pytest.mark.slow

STEP = re.compile(r"^\s*\[\d+/\d+\] .* -o (\S+\.o)\b", re.MULTILINE)  # a compile ninja ran, in the build log


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def locked_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture locked (no build): spec, lock, and the sdist for each test's own cache."""
    require_nvcc()
    root = tmp_path_factory.mktemp("resume-project")
    python = make_stub_torch_env(root / "venv", "2.13.0", "13.0")
    write_external_spec(root / "envs", "fixture", python, "2.13.0")
    sdist = pack_fixture_sdist(root / "sdist")
    build_simple_index(root / "index", [sdist])
    lock_line(root, "fixture")
    return root


def lock_line(root: Path, line: str) -> None:
    """`toolkit lock LINE` of a spec in root/envs, from the project's index of the fixture's sdist."""
    with serve_directory(root / "index") as url:
        done = subprocess.run([sys.executable, "-m", "toolkit", "lock", line, "--pypi", f"{url}/simple"],
                              cwd=root, env={**os.environ, "TOOLKIT_CACHE": str(root / ".cache")},
                              capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def cache_with_sdist(root: Path, cache: Path) -> Path:
    (sdist,) = (root / "sdist").glob("*.tar.gz")
    pinned = cache / "sdist" / sha256_of(sdist) / sdist.name
    pinned.parent.mkdir(parents=True)
    pinned.write_bytes(sdist.read_bytes())
    return cache


def build_argv(wheelhouse: Path) -> list[str]:
    # one job: the objects finish one by one, so there is a moment with some done and some not
    return [sys.executable, "-m", "toolkit", "build", "fixture", "--jobs", "1", "--no-install",
            "--wheelhouse", str(wheelhouse)]


def start_build(root: Path, wheelhouse: Path, cache: Path, **env: str) -> subprocess.Popen:
    """As a terminal runs it in the foreground: its own process group, SIGINT at its default (a test run started
    in the background inherits it ignored, and the toolkit then rightly ignores Ctrl-C: CI's build finished)."""
    return subprocess.Popen(build_argv(wheelhouse), cwd=root, env={**os.environ, "TOOLKIT_CACHE": str(cache), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_line(proc: subprocess.Popen, prefix: str) -> list[str]:
    """stderr's lines up to the first that starts with prefix (the build goes on)."""
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if line.startswith(prefix):
            return seen
    proc.wait()
    pytest.fail(f"the build ended before {prefix!r}: {''.join(seen)}")


def the_record(wheelhouse: Path) -> dict:
    (path,) = (wheelhouse / "fixture").glob("*.build.json")
    return json.loads(path.read_text())


def compiles_in_log(root: Path, record: dict) -> list[str]:
    """The objects ninja compiled in the build's log (its [n/N] lines name each compile's output)."""
    return [Path(out).name for out in STEP.findall((root / record["log"]).read_text())]


def wait_until_gone(cache: Path) -> None:
    """Until nothing runs that works in the cache (the killed toolkit's supervisor ends it all in seconds)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        running = []
        for process in psutil.process_iter():
            try:
                if process.pid != os.getpid() and any(str(cache) in part for part in process.cmdline()):
                    running.append(process)
            except psutil.Error:
                pass
        if not running:
            return
        time.sleep(0.1)
    pytest.fail(f"still running after 30 s: {running}")


def test_a_build_killed_mid_compile_resumes_with_the_wheel_of_an_uninterrupted_one(locked_project, tmp_path):
    """SIGKILL after the first object: nothing could clean up. The next build of the same inputs compiles
    only the objects that were not finished (counted in its log) and makes the same wheel, byte for byte, as
    a build that was never interrupted. A caller's NINJA_STATUS changes neither the log nor the progress."""
    root = locked_project
    clean_house, clean = tmp_path / "clean-wh", subprocess.run(
        build_argv(tmp_path / "clean-wh"), cwd=root, capture_output=True, text=True,
        env={**os.environ, "TOOLKIT_CACHE": str(cache_with_sdist(root, tmp_path / "clean-cache"))})
    assert clean.returncode == 0, clean.stderr
    clean_record = the_record(clean_house)
    assert sorted(compiles_in_log(root, clean_record)) == ["api.cpp.o", "scale_kernel.cu.o",
                                                                  "softmax_kernel.cu.o"]

    cache, wheelhouse = cache_with_sdist(root, tmp_path / "cache"), tmp_path / "wh"
    proc = start_build(root, wheelhouse, cache)
    wait_for_line(proc, "compiling 1/3 objects")
    os.killpg(proc.pid, signal.SIGKILL)  # the toolkit and its supervisor's group; ninja's jobs die with them
    proc.wait()
    wait_until_gone(cache)
    proc.communicate()  # the rest of its output, to the end, and its pipes closed (nothing holds them now)
    key = clean_record["inputs_key"]
    # killed in the compile slot (it compiled through the compile cache): the folder lies there, its marker
    # naming its keyed folder, until the next build puts it back
    assert (cache / "build" / SLOT / SLOT_MARKER).read_text() == key and not (cache / "build" / key).exists()

    again = subprocess.run(build_argv(wheelhouse), cwd=root, capture_output=True, text=True,
                           env={**os.environ, "TOOLKIT_CACHE": str(cache), "NINJA_STATUS": "%e> "})
    assert again.returncode == 0, again.stderr
    record = the_record(wheelhouse)
    compiled = compiles_in_log(root, record)
    assert 0 < len(compiled) < 3, compiled  # fewer than a clean build's three
    assert record["resumed"]["objects_compiled"] == len(compiled)
    assert record["resumed"]["objects_kept"] == 3 - len(compiled)
    assert f"{3 - len(compiled)} kept from the interrupted build" in again.stderr
    assert re.search(r"^compiling 3/3 objects", again.stderr, re.MULTILINE)  # NINJA_STATUS did not break it
    assert record["neutralised_environment"] == {"NINJA_STATUS": "%e> "}
    (wheel,) = (wheelhouse / "fixture").glob("*.whl")
    (clean_wheel,) = (clean_house / "fixture").glob("*.whl")
    assert wheel.name == clean_wheel.name and sha256_of(wheel) == sha256_of(clean_wheel)
    assert not (cache / "build" / key).exists() and not (cache / "build" / SLOT).exists()  # done: its folder is gone


def test_ctrl_c_answers_within_seconds_and_keeps_the_finished_objects(locked_project, tmp_path):
    """Ctrl-C (SIGINT to the terminal's foreground group) while nvcc compiles: the toolkit is gone within
    2 s on an idle machine (asserted < 5 s: CI's machine is shared), says what it kept, and exits 130."""
    cache, wheelhouse = cache_with_sdist(locked_project, tmp_path / "cache"), tmp_path / "wh"
    proc = start_build(locked_project, wheelhouse, cache)
    try:
        wait_for_line(proc, "compiling 1/3 objects")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until nvcc works on the next object
            if names_below(proc.pid) & {"cicc", "ptxas", "cudafe++", "cc1plus"}:
                break
            time.sleep(0.02)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        answered = time.monotonic() - started
    finally:  # a failure above leaves no build running into the next test
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    print(f"Ctrl-C answered in {answered:.2f} s")
    assert proc.returncode == 130
    assert answered < 5.0
    assert re.search(rf"^stopped: [12] finished objects kept in {re.escape(str(cache))}/build/[0-9a-f]{{64}}; "
                     r"`toolkit build fixture` continues from them$", stderr, re.MULTILINE), stderr
    # answered at the signal (base/atomic.terminate_like_interrupt), before the build says what it kept
    lines = stderr.strip().splitlines()
    answer = [i for i, line in enumerate(lines) if line.startswith("error: interrupted by Ctrl-C")]
    kept = [i for i, line in enumerate(lines) if line.startswith("stopped: ")]
    assert answer and kept and answer[0] < kept[0], stderr


# ---------------------------------------------------------------- pieces


def test_the_model_runs_objects_longest_first_on_the_jobs_and_cpus():
    # one job: the sum; two jobs on two CPUs: the 4 s object bounds it; 2 threads an object: half the time
    assert compile_wall([1.0, 4.0, 1.0], jobs=1, threads=1, cpus=2) == pytest.approx(6.0)
    assert compile_wall([1.0, 4.0, 1.0], jobs=2, threads=1, cpus=2) == pytest.approx(4.0)
    assert compile_wall([1.0, 4.0, 1.0], jobs=1, threads=2, cpus=2) == pytest.approx(3.0)
    # two jobs of two threads on two CPUs: both objects at half speed
    assert compile_wall([4.0, 4.0], jobs=2, threads=2, cpus=2) == pytest.approx(4.0)
    assert [duration_text(s) for s in (42, 35 * 60, 9.8 * 3600)] == ["42 s", "35 min", "9.8 h"]


def test_the_eta_follows_the_costs_left_corrected_by_the_finished_objects(tmp_path):
    """Three objects of 10 s each by their costs, one job: 30 s before any finishes. The first takes 20 s
    (ninja's .ninja_log says so): the machine is half as fast as the costs, so the two left take 40 s."""
    ninja_dir = tmp_path / "temp"
    ninja_dir.mkdir()
    shim = tmp_path / "schedule"
    shim.mkdir()
    (shim / MANIFEST_OBJECTS).write_text(json.dumps(
        {"directory": str(ninja_dir), "objects": {"a.o": 10.0, "b.o": 10.0, "c.o": 10.0}}))
    progress = CompileProgress(shim, 3, 0, Sizing(jobs=1, threads=1, cpus=1), [10.0, 10.0, 10.0])
    assert progress.eta_text() == "ETA about 30 s"
    assert progress.feed("toolkit: build.ninja: 0 nvcc objects seeded\n")
    assert (progress.total, progress.completed) == (3, 0)
    (ninja_dir / "a.o").write_bytes(b"")
    (ninja_dir / ".ninja_log").write_text(f"# ninja log v5\n0\t20000\t0\t{ninja_dir / 'a.o'}\t0\n")
    assert progress.feed(f"[1/4] nvcc -c a.cu -o {ninja_dir / 'a.o'}\n")
    assert progress.completed == 1 and progress.eta_s == pytest.approx(40.0)
    assert not progress.feed("a compiler warning\n")
    # without costs: this run's pace, unknown until an object finished
    (shim / MANIFEST_OBJECTS).write_text(json.dumps({"directory": str(ninja_dir), "objects": {"a.o": None, "b.o": None}}))
    counted = CompileProgress(shim, None, 0, Sizing(1, 1, 1), None)
    assert counted.feed("toolkit: ...\n") and counted.total == 2 and counted.completed == 1  # a.o: built before
    assert counted.eta_text() == "ETA unknown until the first objects finish"


def test_build_folders_are_per_inputs_and_pruned_by_age_and_budget(tmp_path):
    one, two, three = ("1" * 64, "2" * 64, "3" * 64)
    with keyed_build_folder(tmp_path, one, fresh=False, keep=False) as folder:
        (folder.path / "obj.o").write_bytes(b"x" * 1000)
    assert not (tmp_path / one).exists()  # a finished build's folder goes
    with pytest.raises(KeyboardInterrupt):
        with keyed_build_folder(tmp_path, one, fresh=False, keep=False) as folder:
            (folder.path / "obj.o").write_bytes(b"x" * 1000)
            raise KeyboardInterrupt
    assert (tmp_path / one / "obj.o").exists()  # an interrupted one's stays
    with keyed_build_folder(tmp_path, two, fresh=False, keep=True) as folder:
        assert not (folder.path / "obj.o").exists()  # other inputs: another folder
        (folder.path / "obj.o").write_bytes(b"x" * 3000)
    (tmp_path / three).mkdir()
    (tmp_path / three / "obj.o").write_bytes(b"x" * 2000)
    (tmp_path / "not-a-key").mkdir()
    old = time.time() - 30 * 86400
    os.utime(tmp_path / one, (old, old))
    assert prune(tmp_path, in_use=two, max_age_days=14, budget_gb=1.0) == [tmp_path / one]  # too old
    os.utime(tmp_path / three, (old, old))
    with locked(tmp_path / three):  # a live build holds it: never removed
        assert prune(tmp_path, in_use=two, max_age_days=14, budget_gb=1.0) == []
    assert prune(tmp_path, in_use=two, max_age_days=1e9, budget_gb=4000 / 1e9) == [tmp_path / three]  # over budget
    assert prune(tmp_path, in_use=two, max_age_days=1e9, budget_gb=0.0) == []  # the one in use stays
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted([two, "not-a-key"])
