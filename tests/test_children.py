"""toolkit/base/children.py: a command and everything it starts end with the toolkit, even one killed by SIGKILL,
and even processes that left the command's process group (ninja runs each compile in a group of its own); and the
toolkit's own children go through it (uv of a pypi install, uv and pip-compile of lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from toolkit.base.children import kill_group, popen_tied, run_tied

ROOT = Path(__file__).resolve().parent.parent
# a command that starts one sleeper in its own process group and one in the command's, prints their pids
TWO_SLEEPERS = "setsid sleep 600 & echo $!; sleep 600 & echo $!; wait"


def running(pids: list[int]) -> list[int]:
    """The pids still running something (a zombie waiting for its reaper runs nothing)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """Those of pids still running after timeout (killed then, so that no test leaves them behind)."""
    deadline = time.monotonic() + timeout
    while running(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = running(pids)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def read_pids(stream, count: int) -> list[int]:
    """The sleepers' pids, once the first has its own session (setsid(1) calls setsid(2) after the fork)."""
    pids = [int(stream.readline()) for _ in range(count)]
    deadline = time.monotonic() + 10
    while os.getsid(pids[0]) != pids[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.getsid(pids[0]) == pids[0] and len(running(pids)) == count
    return pids


def test_a_parent_killed_by_sigkill_takes_everything_below_with_it():
    code = ("import sys; from toolkit.base.children import popen_tied; "
            f"proc = popen_tied(['sh', '-c', {TWO_SLEEPERS!r}]); proc.wait()")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    sleepers = read_pids(parent.stdout, 2)
    parent.kill()
    parent.wait()
    parent.stdout.close()
    assert wait_gone(sleepers) == []


def test_kill_group_ends_what_left_the_group():
    proc = popen_tied(["sh", "-c", TWO_SLEEPERS], stdout=subprocess.PIPE, text=True)
    sleepers = read_pids(proc.stdout, 2)
    kill_group(proc)
    proc.stdout.close()
    assert proc.returncode is not None
    assert wait_gone(sleepers, timeout=1) == []


def test_orphans_end_when_the_command_ends():
    proc = popen_tied(["sh", "-c", "setsid sleep 600 & echo $!; read line; exit 0"], stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, text=True)
    (orphan,) = read_pids(proc.stdout, 1)
    proc.stdin.close()  # `read` ends, and the command with it
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
    assert wait_gone([orphan], timeout=1) == []


@pytest.mark.parametrize("command, status", [("exit 3", 3), ("kill -9 $$", 128 + 9), ("exit 0", 0)])
def test_the_commands_exit_status_is_the_supervisors(command, status):
    assert popen_tied(["sh", "-c", command]).wait(timeout=30) == status


def test_a_command_that_cannot_start_raises_as_subprocess_does_and_the_supervisor_says_127():
    """popen_tied raises what subprocess.Popen raises for a missing or non-executable program (callers catch
    OSError); the supervisor itself, should the program vanish after that check, exits 127 with one line."""
    for program, error in (("/nonexistent/tool", FileNotFoundError), ("no-such-tool-anywhere", FileNotFoundError),
                           (__file__, PermissionError)):
        with pytest.raises(error):
            subprocess.Popen([program])
        with pytest.raises(error):
            popen_tied([program, "--version"])
    import toolkit.base.children

    done = subprocess.run([sys.executable, "-I", toolkit.base.children.__file__, str(os.getpid()), "/nonexistent/tool"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 127
    assert done.stderr == "/nonexistent/tool: cannot run it (No such file or directory)\n"


def test_a_leaf_is_its_own_process_and_dies_with_a_parent_killed_by_sigkill():
    """leaf=True: setpriv sets the parent-death signal and execs the command, no supervisor between (the
    command's parent is the toolkit's process); a SIGKILL of the toolkit ends it all the same."""
    code = ("import sys; from toolkit.base.children import popen_tied; "
            "proc = popen_tied(['sleep', '600'], leaf=True); print(proc.pid, flush=True); proc.wait()")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    leaf = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while psutil.Process(leaf).name() != "sleep" and time.monotonic() < deadline:  # setpriv, until it execs
        time.sleep(0.01)
    assert (psutil.Process(leaf).name(), psutil.Process(leaf).ppid(), os.getsid(leaf)) == ("sleep", parent.pid, leaf)
    parent.kill()
    parent.wait()
    parent.stdout.close()
    assert wait_gone([leaf]) == []


@pytest.mark.parametrize("command, status", [("exit 3", 3), ("kill -9 $$", -9), ("exit 0", 0)])
def test_a_leafs_exit_status_is_its_own(command, status):
    assert popen_tied(["sh", "-c", command], leaf=True).wait(timeout=30) == status


def test_popen_tied_keeps_its_own_session_options():
    with pytest.raises(TypeError, match="start_new_session"):
        popen_tied(["true"], start_new_session=False)


def test_run_tied_is_subprocess_run_with_the_tie():
    done = run_tied(["sh", "-c", "echo out; echo err >&2; exit 4"], capture_output=True, text=True)
    assert (done.args, done.returncode, done.stdout, done.stderr) == (["sh", "-c", "echo out; echo err >&2; exit 4"],
                                                                      4, "out\n", "err\n")


def test_kill_group_kills_a_group_whose_supervisor_cannot_answer():
    """The supervisor stopped (SIGSTOP: it cannot end what is below it) and the command ignoring SIGTERM:
    kill_group's SIGKILL to the group after grace_s ends them all, and it returns."""
    proc = popen_tied(["sh", "-c", "trap '' TERM; sleep 600 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    sleeper = int(proc.stdout.readline())
    command = [child.pid for child in psutil.Process(proc.pid).children()]
    os.kill(proc.pid, signal.SIGSTOP)
    stopper = threading.Thread(target=kill_group, args=(proc, 1.0), daemon=True)
    stopper.start()
    stopper.join(timeout=30)
    try:
        assert not stopper.is_alive(), "kill_group did not return"
        assert proc.returncode == -signal.SIGKILL
        assert wait_gone([sleeper, *command], timeout=5) == []
    finally:
        proc.stdout.close()
        wait_gone([proc.pid, sleeper, *command], timeout=0)  # what a failed kill_group left


# A command like sccache's server after SIGTERM: its main thread ended (pthread_exit; /proc shows the process as a
# zombie), another thread still at work, and below it a child that ignores SIGTERM, in the command's process group
ZOMBIE_LEADER = """
import ctypes, signal, subprocess, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "600"])
print(child.pid, flush=True)
threading.Thread(target=time.sleep, args=(600,)).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def test_kill_group_ends_the_children_of_a_process_whose_main_thread_has_ended():
    """The supervisor's look below it goes through a zombie main thread: a look that stopped there saw nothing
    left, the supervisor exited at once, and kill_group, answered before its grace_s, never sent the SIGKILL
    the sleeper needs."""
    proc = popen_tied([sys.executable, "-c", ZOMBIE_LEADER], stdout=subprocess.PIPE, text=True)
    sleeper = int(proc.stdout.readline())
    (command,) = psutil.Process(proc.pid).children()
    deadline = time.monotonic() + 10
    while command.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert command.status() == psutil.STATUS_ZOMBIE and command.num_threads() == 2  # the ended one counts
        kill_group(proc, grace_s=1.0)
        assert wait_gone([sleeper, command.pid], timeout=1) == []
    finally:
        proc.stdout.close()
        wait_gone([proc.pid, command.pid, sleeper], timeout=0)


# A uv that writes its pid and then works for ten minutes, and the toolkit's own call of it, by the code
# that calls it (NOT REAL: no package of this name and URL exists; nothing is downloaded, the tool is this script).
SLOW_TOOL = "#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n"
CALLS = {
    "uv of a pypi install": ("{staging}/bin/uv", """
import hashlib, zipfile
from pathlib import Path
from rich.console import Console
import toolkit.env.pypi_lock
from toolkit.env.engine import install_pip_layer
from toolkit.env.lockfile import LockedPackage
staging = Path({staging!r})
(staging / "bin" / "python").symlink_to("/bin/true")
wheel = staging.parent / "slow-1.0-py3-none-any.whl"
with zipfile.ZipFile(wheel, "w") as archive:
    archive.writestr("slow-1.0.dist-info/METADATA", "Metadata-Version: 2.1\\nName: slow\\nVersion: 1.0\\n")
toolkit.env.pypi_lock.uv_executable = lambda: {tool!r}
package = LockedPackage("pip", "slow", "1.0", wheel.as_uri(), hashlib.sha256(wheel.read_bytes()).hexdigest(), "linux-64")
install_pip_layer([package], staging, staging.with_name("prefix"), Console(), Path("lock"))
"""),
    "uv pip compile of lock": ("{staging}/bin/uv", """
import os
from pathlib import Path
from toolkit.env.pypi_lock import run_uv
run_uv([{tool!r}, "pip", "compile", "requirements.in"], Path({staging!r}), "uv pip compile", dict(os.environ))
"""),
    "uv's resolves of a conda line's pip layer (leaf: setpriv)": ("{staging}/bin/uv", """
import os
from pathlib import Path
from toolkit.env.pypi_lock import Compile, uv_compile_all
uv_compile_all({tool!r}, [Compile(Path({staging!r}), "3.12", "x86_64-manylinux_2_28", (), "requirements.txt")] * 2,
               "toolkit lock test", "uv pip compile", dict(os.environ))
"""),
}


@pytest.mark.parametrize("call", CALLS)
def test_a_sigkill_of_the_toolkit_leaves_no_child_of_its_own_running(tmp_path, call):
    """Before: the toolkit killed by SIGKILL while pip installed or uv resolved left it running (4 of 4), writing
    into a folder that the next run deletes."""
    staging, pidfile = tmp_path / "staging", tmp_path / "tool.pid"
    (staging / "bin").mkdir(parents=True)
    where, code = CALLS[call]
    tool = Path(where.format(staging=staging))
    tool.write_text(SLOW_TOOL.format(pidfile=pidfile))
    tool.chmod(0o755)
    toolkit = subprocess.Popen([sys.executable, "-c", code.format(staging=str(staging), tool=str(tool))], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text().endswith("\n")) and toolkit.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert toolkit.poll() is None and pidfile.exists(), "the toolkit did not start the tool"
    slow = int(pidfile.read_text())
    assert running([slow]) == [slow]
    toolkit.kill()
    toolkit.wait()
    assert wait_gone([slow], timeout=10) == []
