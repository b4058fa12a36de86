"""What `toolkit lock` forks before it reads a spec, each copy importing what it needs meanwhile: py-rattler's
solver (rattler_solve.forked_solver) and the lock's checker (conda-lock's models, lockfile.check_with_conda_lock).

The entry forks both before it imports the lock verb (cli.VERBS' `ahead`: `forked_early`), while this process is
small: a copy forked once the verb's modules are loaded made this process copy every page it wrote afterwards
(0.013 s more of its system CPU, 0.02 s of a conda line's lock). This module imports neither the lock verb nor
an engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from toolkit.env.isolated import Prefork, prefork
from toolkit.env.lockfile import check_with_conda_lock, conda_lock_models
from toolkit.env.rattler_solve import forked_solver


@dataclass(frozen=True)
class Ahead:
    """The copies forked ahead: the engine's solver (None: an engine with none), and the lock's checker. Each
    copy is given its arguments or cancelled; `cancel` ends what still waits (after use it does nothing)."""

    solver: Prefork | None
    checker: Prefork

    def cancel(self) -> None:
        if self.solver is not None:
            self.solver.cancel()
        self.checker.cancel()


def forked_early() -> Ahead:
    """The entry's, before the lock verb is imported: py-rattler's solver first (the lock gives it its request
    first, once the spec is read; an engine without it ends it), then the checker."""
    return Ahead(forked_solver(), lock_checker())


def lock_checker() -> Prefork:
    """check_with_conda_lock forked now: the copy imports conda-lock's models (conda_lock_models, 0.15 s of CPU)
    while this process reads the spec, solves and resolves, and this process imports no module of conda-lock."""
    return prefork(check_with_conda_lock, checker_prepared)


def checker_prepared() -> None:
    """The checker's imports at a lower priority (nice 10): it is needed last, once the lock is written, and on a
    machine of two cores its 0.15 s of CPU would otherwise slow the solve and uv's resolves beside it."""
    os.nice(10)
    conda_lock_models()
