"""WorkerPool: its threads leave SIGINT and SIGTERM to the main thread (the kernel's view of each thread's blocked
signals, read from /proc, is the oracle)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from toolkit.base.worker_pool import WorkerPool


def blocked_signals(tid: int) -> set[int]:
    """The signals the kernel holds blocked for thread `tid` (SigBlk in /proc/self/task/<tid>/status)."""
    status = Path(f"/proc/self/task/{tid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return {signum for signum in range(1, 65) if mask & (1 << (signum - 1))}


def test_a_pools_threads_block_sigint_and_sigterm_and_the_main_thread_does_not():
    main_before = blocked_signals(threading.get_native_id())
    with WorkerPool(3) as pool:
        seen = list(pool.map(lambda _: (threading.get_native_id(), blocked_signals(threading.get_native_id())),
                             range(6)))
    assert {signal.SIGINT, signal.SIGTERM} <= set.intersection(*(blocked for _, blocked in seen))
    assert threading.get_native_id() not in {tid for tid, _ in seen}
    assert blocked_signals(threading.get_native_id()) == main_before
    assert not {signal.SIGINT, signal.SIGTERM} & main_before
