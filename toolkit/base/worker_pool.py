"""Thread pools whose threads leave SIGINT and SIGTERM to the main thread.

The kernel gives a signal sent to the process to any thread that does not block it. Python runs the handler in
the main thread only, and a wait there (a read from a worker's pipe, waitpid) is cut short only where the signal
was delivered to the main thread itself: delivered to a pool's thread, Ctrl-C at a lock's solve was answered only
when the solve's result came (30 s and more in the Ctrl-C test, whose solve waits). A pool's threads are started
with both signals blocked (a thread takes the mask of the thread that starts it), so only the main thread takes them.

A process is started by the main thread, never in a pool's thread: it would inherit the blocked mask across exec
(seen: SigBlk 0x4002 in a child started from a pool's thread), and `kill_group`'s SIGTERM would not reach it. The
pools' work today is HTTP (the sdist pin, the wheels' metadata).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

MAIN_THREAD_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class WorkerPool(ThreadPoolExecutor):
    """ThreadPoolExecutor whose threads, started in submit (map submits), block MAIN_THREAD_SIGNALS."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, MAIN_THREAD_SIGNALS)
        try:
            return super().submit(fn, *args, **kwargs)
        finally:  # a signal that came meanwhile is taken here, by this thread
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
