"""Child processes that die with the toolkit: a run killed with SIGKILL leaves no pip, compiler or worker
still writing into a folder that the next run cleans (toolkit/atomic.py's owned temporaries).

Ctrl-C and SIGTERM unwind the parent, and subprocess.run kills and waits for its child on the way out.
SIGKILL runs no code in the parent, so the kernel does it: each child asks for SIGKILL when its parent
dies (Linux PR_SET_PDEATHSIG), set between fork and exec. That covers the direct child only: the setting
is not inherited across fork, so what the child starts in turn (nvcc's cicc and ptxas) is orphaned, not
killed, when the child is.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, prctl: Callable[..., int] | None = None) -> None:
    """In a child: be sent SIGKILL when the parent thread ends (Linux; elsewhere nothing), and leave at once
    if the parent already died before this call. `prctl`: libc's, looked up before the fork."""
    prctl = prctl or _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def run(command: Sequence[str | os.PathLike[str]], **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run(command, **kwargs) for a child that is killed when this process dies, SIGKILL included.
    The kernel signals when the thread that started the child ends: call it from a thread that outlives the
    child (the main thread, or a pool worker that waits for it, as subprocess.run does)."""
    parent, prctl = os.getpid(), _prctl()  # looked up here: between fork and exec only the call itself runs
    return subprocess.run(command, preexec_fn=lambda: die_with_parent(parent, prctl), **kwargs)


def _prctl() -> Callable[..., int] | None:
    return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
