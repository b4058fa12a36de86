"""The py-rattler worker (toolkit/env/isolated.py): run_forked runs a function in a fork of this process, whose
parent is this process itself (run_isolated's worker is a fresh interpreter below the children supervisor), falls
back to run_isolated where another thread runs, and reports a copy that dies as one line; start_forked lets this
process go on meanwhile, and cancel ends the copy. The fork's cases run in
a fresh interpreter of one thread (pytest's own process may hold others: a test's server)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from toolkit.env.isolated import prefork, run_forked

ROOT = Path(__file__).resolve().parent.parent

FORKED = """
import os
from toolkit.base.errors import ToolkitError
from toolkit.env.isolated import run_forked, run_isolated

def refuse(what):
    raise ToolkitError(f"{what}: refused")

print(run_forked(os.getppid) == os.getpid(), run_forked(os.getpid) != os.getpid(), run_isolated(os.getppid) != os.getpid())
for call in (lambda: run_forked(refuse, "archive.conda"), lambda: run_forked(os._exit, 3)):
    try:
        call()
    except ToolkitError as exc:
        print(exc)
"""


def test_a_forked_worker_is_a_child_of_this_process_and_crosses_errors_back_in_one_line():
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True True True",  # the fork's parent is this process; run_isolated's is the supervisor
        "archive.conda: refused",
        "_exit: worker process died (exit 3; re-run the same command)",
    ]


def test_with_another_thread_running_the_worker_is_a_fresh_interpreter():
    """A fork copies only the calling thread: a lock the other one holds would stay held in the copy."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert run_forked(os.getppid) != os.getpid()
    finally:
        stop.set()
        other.join()


MISSING = """
import sys
from toolkit.base.errors import ToolkitError
from toolkit.env.isolated import run_forked

def needs_conda_lock():
    sys.modules["conda_lock"] = None  # in the copy only: a python without it (a partial install)
    import conda_lock  # noqa: F401

try:
    run_forked(needs_conda_lock)
except ToolkitError as exc:
    print(exc)
"""


def test_a_declared_dependency_missing_in_the_copy_is_the_one_line_run_main_gives():
    """The lock's writer imports conda-lock in its copy: where it is missing (a partial install), the copy's
    ModuleNotFoundError was an internal error with its traceback, where the same import in the process itself is
    run_main's one line naming the distribution and the command that installs it."""
    done = subprocess.run([sys.executable, "-c", MISSING], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("fa-envkit needs conda-lock, which this python lacks (no module 'conda_lock'): "
                                  f"{sys.executable} -m pip install 'conda-lock"), done.stdout


STARTED = """
import os, sys, time
from pathlib import Path
from toolkit.env.isolated import start_forked

def wait_for(path):  # the copy waits for a file only this process writes after the fork
    while not Path(path).exists():
        time.sleep(0.01)
    return os.getpid()

go, never = Path(sys.argv[1]), Path(sys.argv[2])
forked = start_forked(wait_for, str(go))
go.write_text("")  # this process goes on while the copy runs
print(forked.result() == forked.pid, flush=True)
forked.cancel()  # after result: nothing to end
stuck = start_forked(wait_for, str(never))
print(stuck.pid, flush=True)
stuck.cancel()
try:
    os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
except ChildProcessError:
    print("no child left", flush=True)  # not even a zombie
"""


def test_a_started_fork_runs_beside_this_process_and_a_cancelled_one_is_gone(tmp_path):
    """start_forked: the copy waits for what this process does after the fork, and gives its result; cancel ends
    one still running and reaps it."""
    import psutil

    done = subprocess.run([sys.executable, "-c", STARTED, str(tmp_path / "go"), str(tmp_path / "never")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    result, stuck, left = done.stdout.splitlines()
    assert result == "True" and left == "no child left"
    assert not psutil.pid_exists(int(stuck))


PREFORKED = """
import gc, os, sys, time
from pathlib import Path
from toolkit.base.errors import ToolkitError
from toolkit.env.isolated import prefork

ready = Path(sys.argv[1])

def prepare():  # the copy's imports, before its arguments exist
    ready.write_text(str(os.getpid()))

def add(a, b):
    if a < 0:
        raise ToolkitError(f"{a}: refused")
    return (os.getpid(), os.getppid(), a + b)

linker = prefork(add, prepare)
print(gc.get_freeze_count() == 0, flush=True)  # this process's collector is as it was
while not ready.exists():  # prepare ran in the copy before this process sent anything
    time.sleep(0.01)
pid, parent, total = linker.run(2, 3)
print(pid == int(ready.read_text()), pid != os.getpid(), parent == os.getpid(), total, flush=True)
try:
    prefork(add).run(-1, 0)
except ToolkitError as exc:
    print(exc, flush=True)
waiting = prefork(add)
print(waiting.copy.forked.pid, flush=True)
waiting.cancel()  # never given its arguments
try:
    os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
except ChildProcessError:
    print("no child left", flush=True)
"""


def test_a_preforked_copy_prepares_while_this_process_finds_its_arguments_and_a_cancelled_one_is_gone(tmp_path):
    """prefork: prepare() runs in the copy before run() is called (this process waits for its mark), run gives
    the copy's result (a ToolkitError as one line), and cancel ends a copy still waiting and reaps it."""
    import psutil

    done = subprocess.run([sys.executable, "-c", PREFORKED, str(tmp_path / "ready")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    unfrozen, ran, refused, waiting, left = done.stdout.splitlines()
    assert unfrozen == "True"
    assert ran == "True True True 5"
    assert refused == "-1: refused"
    assert left == "no child left"
    assert not psutil.pid_exists(int(waiting))


def test_with_another_thread_running_a_prefork_runs_in_a_fresh_interpreter():
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        waiting = prefork(os.getppid)
        assert waiting.copy is None
        assert waiting.run() != os.getpid()
    finally:
        stop.set()
        other.join()
