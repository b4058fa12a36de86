"""The py-rattler worker (toolkit/env/isolated.py): run_forked runs a function in a fork of this process, whose
parent is this process itself (run_isolated's worker is a fresh interpreter below the children supervisor), falls
back to run_isolated where another thread runs, and reports a copy that dies as one line."""

from __future__ import annotations

import os
import threading

import pytest

from toolkit.base.errors import ToolkitError
from toolkit.env.isolated import run_forked, run_isolated


def refuse(what: str) -> None:
    raise ToolkitError(f"{what}: refused")


def test_a_forked_worker_is_a_child_of_this_process_and_returns_its_result():
    assert run_forked(os.getppid) == os.getpid()  # the fork itself, no interpreter between
    assert run_forked(os.getpid) != os.getpid()
    assert run_isolated(os.getppid) != os.getpid()  # the supervisor's child


def test_a_toolkit_error_crosses_back_and_a_dying_copy_is_one_line():
    with pytest.raises(ToolkitError, match=r"^archive\.conda: refused$"):
        run_forked(refuse, "archive.conda")
    with pytest.raises(ToolkitError, match=r"^_exit: worker process died \(exit 3; re-run the same command\)$"):
        run_forked(os._exit, 3)


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
