"""Child processes that die with the toolkit, even when it is killed with SIGKILL.

PR_SET_PDEATHSIG alone is not enough for a build: it reaches only the direct child (it is cleared on
fork), pip starts setup.py, ninja, nvcc, cicc and cc1plus below it, and ninja puts every command in a
process group of its own, so a signal to pip's group misses nvcc. So `popen_tied` starts a small
supervisor (this file, run as a script by the same python) in a new session, and the command below it.
The supervisor asks the kernel for SIGTERM when its parent dies, and adopts every orphan below it
(PR_SET_CHILD_SUBREAPER), so it sees all that the command started, in whatever process group. On SIGTERM,
SIGINT or SIGHUP, and when the command ends, it stops them all: SIGTERM, then SIGKILL after STOP_GRACE_S.
`kill_group` is the parent's way to stop it (Ctrl-C, SIGTERM, an error while reading its output).

A command that starts nothing that outlives it (a resolver: `uv pip compile`, `uv --version`) needs no supervisor:
`leaf=True` has util-linux's setpriv set the parent-death signal on the command itself and exec it, where setpriv
is on PATH (a supervisor's python start is 15 ms of CPU; four of them were a third of a conda lock's resolves).

This module imports only the standard library: it runs as a script, one with every child, so it starts as little as
it can: `python -I -S children.py` (no site, whose .pth files cost a tenth of a second), and at the top only what
the supervisor needs (the parent's side imports subprocess and shutil where it uses them).
"""

from __future__ import annotations

import _signal as signal  # signal.py's C module: signal.py imports enum, a third of the supervisor's start
import ctypes
import errno
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Sequence
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_GRACE_S = 5.0  # the supervisor's wait between SIGTERM and SIGKILL to what is below it
KILL_GRACE_S = 3 * STOP_GRACE_S  # the parent's wait for the supervisor before SIGKILL to its group


def popen_tied(
    argv: Sequence[str | os.PathLike[str]], leaf: bool = False, **kwargs: Any
) -> subprocess.Popen:
    """subprocess.Popen(argv, **kwargs), tied to this process: argv and everything it starts end when this
    process dies, by any signal, or when argv itself ends.

    kwargs are Popen's (stdout, env, cwd, text, umask, ...), except start_new_session and preexec_fn,
    which this sets up. Call it from a thread that outlives the child (the main thread): the kernel's
    parent-death signal follows the thread that started the supervisor. The returned process is the
    supervisor: its pid is the group's id, its exit status argv's (128 + N when a signal N ended argv,
    as a shell reports it; 127 when argv cannot be started). `leaf`: argv starts nothing that outlives it, and
    is tied by setpriv alone where there is one (see above); the process returned is then argv itself (-N when
    a signal N ended it)."""
    for reserved in ("start_new_session", "preexec_fn", "process_group"):
        if reserved in kwargs:
            raise TypeError(f"popen_tied sets {reserved} itself")
    import subprocess

    _check_runnable(os.fspath(argv[0]), kwargs.get("env"), kwargs.get("cwd"))
    if leaf and (setpriv := _setpriv()):
        return subprocess.Popen(
            [setpriv, "--pdeathsig", "KILL", "--", *argv], start_new_session=True, **kwargs
        )
    supervisor = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), *argv]
    return subprocess.Popen(supervisor, start_new_session=True, **kwargs)


_SETPRIV: list[str | None] = []  # setpriv's path once looked up (None: none that has --pdeathsig)


def _setpriv() -> str | None:
    """util-linux's setpriv where it has --pdeathsig (2.33 and later), looked up once per process."""
    if not _SETPRIV:
        import shutil
        import subprocess

        found = shutil.which("setpriv")
        if found:
            usage = subprocess.run([found, "--help"], capture_output=True, text=True).stdout
            found = found if "--pdeathsig" in usage else None
        _SETPRIV.append(found)
    return _SETPRIV[0]


def _check_runnable(
    program: str, env: dict[str, str] | None, cwd: str | os.PathLike[str] | None
) -> None:
    """Raise what subprocess would (FileNotFoundError, PermissionError) for a program that cannot start, so
    callers that catch OSError keep working: the supervisor itself always starts."""
    import shutil

    if os.sep in program:
        path = os.path.join(cwd or "", program)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    elif (
        shutil.which(program, path=(os.environ if env is None else env).get("PATH", os.defpath))
        is None
    ):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def kill_group(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """Stop a popen_tied process and everything it started, and wait for it: SIGTERM to its group (the
    supervisor then ends all below it), SIGKILL to the group if the supervisor is still there after grace_s."""
    import subprocess

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def run_tied(
    argv: Sequence[str | os.PathLike[str]],
    *,
    leaf: bool = False,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=..., timeout=..., check=..., **kwargs) through popen_tied: an
    interruption or a timeout here (Ctrl-C, SIGTERM) ends all that argv started before it goes on."""
    import subprocess

    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = popen_tied(argv, leaf, **kwargs)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        kill_group(proc)
        raise
    done = subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
    if check:
        done.check_returncode()
    return done


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """This process gets `signum` when its parent dies (Linux PR_SET_PDEATHSIG), so a parent killed with
    SIGKILL leaves no orphan still working; it exits at once if the parent is already gone."""
    _prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent_pid:  # the parent died before prctl
        os._exit(1)


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(
            option, value
        )  # libc, linked in; find_library runs ldconfig


# ---------------------------------------------------------------- the supervisor's side


class _Stop(Exception):
    """A stop signal reached the supervisor."""


def _raise_stop(signum: int, frame: object) -> None:
    _ignore_stop_signals()  # once: the ending that follows is not interrupted
    raise _Stop()


def _ignore_stop_signals() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _descendants() -> list[int]:
    """The processes below this one, from /proc (orphans are re-parented to this subreaper), zombies too: a
    multi-threaded process whose main thread has ended shows as a zombie while its other threads run on, and
    its children still name it as their parent (sccache's server ended by SIGTERM is one: a walk that
    skipped zombies missed the nvcc below it and left its compiler running). A zombie below ends the wait
    once its parent reaps it; this process reaps its own (_reap) before each look."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = stat.read().rsplit(")", 1)[1].split()[1]
        except (OSError, ValueError, IndexError):
            continue  # gone
        children.setdefault(int(ppid), []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _reap() -> bool:
    """Collect the exit status of every ended child (the command's and adopted orphans'); whether a child is left.
    None left, nothing is below this process: an orphan is re-parented to this subreaper, so whatever is still
    running below has an ancestor among its children."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _end_descendants() -> None:
    """SIGTERM to everything below this process, SIGKILL to what is still there after STOP_GRACE_S."""
    signalled: set[int] = set()
    start = time.monotonic()
    while True:
        pids = _descendants() if _reap() else []  # the walk of /proc only where a child is left
        if not pids or time.monotonic() > start + 2 * STOP_GRACE_S:
            return
        late = time.monotonic() > start + STOP_GRACE_S
        for pid in pids:
            if late or pid not in signalled:
                try:
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                except ProcessLookupError:
                    pass
                signalled.add(pid)
        time.sleep(0.05)


def supervise(parent_pid: int, argv: list[str]) -> int:
    """Run argv below this process, end all it started when told to, when the parent dies, or when argv
    ends, and return argv's exit status."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_stop)
    try:
        try:
            die_with_parent(parent_pid, signal.SIGTERM)
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            # as subprocess.Popen would start it (SIGPIPE as a shell leaves it), without importing subprocess
            child = os.posix_spawnp(
                argv[0], argv, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
            )
            status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        finally:
            _ignore_stop_signals()
    except _Stop:
        status = -signal.SIGTERM
    except OSError as exc:
        print(f"{argv[0]}: cannot run it ({exc.strerror})", file=sys.stderr, flush=True)
        return 127
    _end_descendants()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(supervise(int(sys.argv[1]), sys.argv[2:]))
