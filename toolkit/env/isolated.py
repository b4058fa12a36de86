"""Process isolation: run one function in another process that ends with os._exit.

py-rattler sometimes crashes at interpreter exit after a solve or install (3-10% of runs in 2026-11, 22 of 150
installs with py-rattler 0.28.0: a segfault or "PyGILState_Release" abort while its runtime's threads outlive
finalization); a worker that skips finalization avoids it, and keeps py-rattler's runtime out of the caller's
process. `run_isolated` starts a fresh interpreter: the function travels by module and name, its arguments by
pickle. `run_forked` forks this process instead (no interpreter start, no imports again: most of a warm conda
install's fixed cost), where that is safe; `start_forked` forks and lets this process go on meanwhile (a lock's
solve beside its other work), and `prefork` forks before the arguments are known, so that the copy's imports
run while this process finds them (a warm install's archive checks). Either way the result comes back by pickle;
ToolkitErrors cross back as ToolkitErrors, anything else as one line after its traceback. Each fork freezes the
collector's objects first (gc.freeze): a collection in the copy would otherwise touch every object inherited and
copy each page it is on (the link of a warm install took a fifth longer).
"""

from __future__ import annotations

import functools
import gc
import importlib
import os
import pickle
import select
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from toolkit.base.atomic import owned_dir
from toolkit.base.children import die_with_parent, run_tied
from toolkit.base.errors import ToolkitError


def run_isolated(function: Callable[..., Any], *args: Any) -> Any:
    """function(*args) in a worker interpreter; its result, or its ToolkitError raised here."""
    with owned_dir(Path(tempfile.gettempdir()), "worker") as tmp:
        job, result = tmp / "job.pickle", tmp / "result.pickle"
        job.write_bytes(pickle.dumps((function.__module__, function.__qualname__, args)))
        code = "from toolkit.env.isolated import worker_main; worker_main()"
        # an interruption kills and waits for the worker (run_tied does) before tmp is removed; a SIGKILL of this
        # process ends it too (base/children's supervisor)
        process = run_tied([sys.executable, "-c", code, str(job), str(result)])
        if not result.exists():
            raise ToolkitError(
                f"{function.__qualname__}: worker process died (exit {process.returncode}; "
                f"re-run the same command)"
            )
        status, value = pickle.loads(result.read_bytes())
    if status == "error":
        raise ToolkitError(value)
    return value


def run_forked(function: Callable[..., Any], *args: Any) -> Any:
    """function(*args) in a forked copy of this process (start_forked), else in a worker interpreter
    (run_isolated); its result, or its ToolkitError raised here."""
    return prefork(function).run(*args)


def start_forked(function: Callable[..., Any], *args: Any) -> Forked | None:
    """function(*args) started in a forked copy of this process, which goes on meanwhile; None where a fork is
    not safe.

    A fork copies only the thread that calls it: a lock another thread held (a console's, py-rattler's runtime)
    would stay held in the copy, and a runtime whose threads are gone would wait for them forever. So with more
    than one thread in this process (threads of native code too: /proc/self/task) there is no fork. The copy
    dies with this process, leaves Ctrl-C to it (which then ends the copy), runs none of its signal handlers (a
    SIGTERM must not remove this run's temporaries twice) and leaves by os._exit: no exit hooks, no finalization."""
    return _fork(function, lambda: args)


def prefork(function: Callable[..., Any], prepare: Callable[[], object] = lambda: None) -> Prefork:
    """function forked before its arguments are known: the copy runs prepare() at once (the imports function
    needs: py-rattler's and asyncio's, a third of a warm conda install) while this process finds the arguments
    (verifies the archives), then waits for them; Prefork.run sends them and gives the result. Where a fork is
    not safe (start_forked), run starts a worker interpreter instead."""
    read, write = os.pipe()

    def arguments() -> tuple[Any, ...]:  # in the copy
        os.close(write)
        try:
            prepare()
        except Exception:  # an import that fails here fails again in function, which says so
            pass
        with os.fdopen(read, "rb") as incoming:
            return tuple(pickle.load(incoming))

    forked = _fork(function, arguments)
    os.close(read)
    if forked is None:
        os.close(write)
        return Prefork(function, None)
    return Prefork(function, WaitingCopy(forked, os.fdopen(write, "wb")))


def _fork(function: Callable[..., Any], arguments: Callable[[], tuple[Any, ...]]) -> Forked | None:
    """start_forked's copy, which gets function's arguments from `arguments()` (prefork's wait for them)."""
    if len(os.listdir("/proc/self/task")) > 1:
        return None
    sys.stdout.flush()  # else the copy would write what is still buffered a second time
    sys.stderr.flush()
    parent = os.getpid()
    read, write = os.pipe()
    gc.freeze()
    pid = os.fork()
    if pid != 0:
        gc.unfreeze()
    if pid == 0:  # the copy
        try:
            os.close(read)
            die_with_parent(parent)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for signum in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_DFL)
            data = pickle.dumps(_outcome(function, arguments()))
            with os.fdopen(write, "wb") as out:
                out.write(data)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0)
    os.close(write)
    return Forked(function.__qualname__, pid, os.fdopen(read, "rb"))


@dataclass(frozen=True)
class WaitingCopy:
    """prefork's copy, waiting for its arguments: the copy itself, and the pipe they are sent down."""

    forked: Forked
    outgoing: BinaryIO


@dataclass(frozen=True)
class Prefork:
    """A function forked ahead of its arguments (prefork): `run`, `start` or `cancel` must be called (`cancel`
    after `run` does nothing, after `start` ends the copy unless its result was read: a caller may cancel in a
    `finally`). `copy`: None where prefork could not fork."""

    function: Callable[..., Any]
    copy: WaitingCopy | None

    def run(self, *args: Any) -> Any:
        """function(*args) in the waiting copy (a worker interpreter where there is none); its result, or its
        ToolkitError raised here."""
        return self.begin(*args)()

    def begin(self, *args: Any) -> Callable[[], Any]:
        """function(*args) started in the waiting copy, which runs it while this process goes on; what `begin`
        gives waits for its result (run's), or runs it in a worker interpreter where there is no copy."""
        forked = self.start(*args)
        return (
            functools.partial(run_isolated, self.function, *args)
            if forked is None
            else forked.result
        )

    def start(self, *args: Any) -> Forked | None:
        """function(*args) started in the waiting copy, which runs it while this process goes on: the copy's
        Forked (its `result` or `cancel` must be called); None where there is no copy."""
        if self.copy is None:
            return None
        try:
            with self.copy.outgoing:
                pickle.dump(args, self.copy.outgoing)
        except BrokenPipeError:  # the copy is gone: its result says so
            pass
        except (
            BaseException
        ):  # Ctrl-C, SIGTERM while sending: the copy ends before this process goes on
            self.copy.forked.cancel()
            raise
        return self.copy.forked

    def cancel(self) -> None:
        """End the copy (this process stopped before its arguments were found: an archive refused, Ctrl-C)."""
        if self.copy is not None:
            self.copy.outgoing.close()
            self.copy.forked.cancel()


class Forked:
    """A function running in a forked copy of this process (start_forked): `result` waits for its outcome,
    `cancel` ends it; one of them must be called (the copy's outcome is read once)."""

    def __init__(self, name: str, pid: int, stream: BinaryIO) -> None:
        self.name, self.pid, self.stream = name, pid, stream
        self.status: int | None = None  # the copy's wait status, once it was waited for

    def ready(self) -> bool:
        """Whether `result` would not wait: the copy has ended, or is writing its outcome."""
        return bool(select.select([self.stream], [], [], 0)[0])

    def result(self) -> Any:
        """The function's result, or its ToolkitError raised here."""
        try:
            with self.stream:
                data = self.stream.read()
            _, self.status = os.waitpid(self.pid, 0)
        except BaseException:  # Ctrl-C, SIGTERM: end the copy before this process goes on
            self.cancel()
            raise
        try:
            outcome, value = pickle.loads(data)
        except (pickle.UnpicklingError, EOFError, ValueError):  # it died before or while writing
            raise ToolkitError(
                f"{self.name}: worker process died (exit {os.waitstatus_to_exitcode(self.status)}; "
                f"re-run the same command)"
            ) from None
        if outcome == "error":
            raise ToolkitError(value)
        return value

    def cancel(self) -> None:
        """End the copy unless it was waited for (SIGKILL: it holds nothing of this process's to finish)."""
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            _, self.status = os.waitpid(self.pid, 0)
        self.stream.close()


def _outcome(function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    """("ok", function(*args)), or ("error", one line): a ToolkitError's, a declared dependency's that this python
    lacks (run_main's line for it: the lock's writer imports conda-lock in its copy), or an internal error's after
    its traceback."""
    try:
        return ("ok", function(*args))
    except ToolkitError as exc:
        return ("error", str(exc))
    except ModuleNotFoundError as exc:
        from toolkit.base.entry import missing_dependency

        missing = missing_dependency(exc)
        if missing is None:  # a module no declared dependency provides: a bug
            return _internal_error(function, exc)
        return ("error", missing)
    except Exception as exc:
        return _internal_error(function, exc)


def _internal_error(function: Callable[..., Any], exc: Exception) -> tuple[str, str]:
    """A bug, not bad input: its traceback printed, and one line that points at it."""
    traceback.print_exc()
    return (
        "error",
        f"{function.__name__}: internal error {exc.__class__.__name__}: {exc} (traceback above)",
    )


def worker_main() -> None:
    """The worker's side: run the pickled job, write the outcome, and leave without finalization."""
    job, result = Path(sys.argv[1]), Path(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its parent handles Ctrl-C (and kills it)
    module, name, args = pickle.loads(job.read_bytes())
    outcome = _outcome(getattr(importlib.import_module(module), name), args)
    result.write_bytes(pickle.dumps(outcome))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
