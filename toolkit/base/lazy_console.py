"""rich's Console, made when first used: rich's import (0.03-0.06 s of CPU) then happens where the verb first
shows something, which for `toolkit lock` is while it waits for other work (its solve in another process, uv's
resolves), not before it has started that work."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any


class LazyConsole:
    """Stands for `rich.console.Console(**options)`, which it makes at the first attribute asked for."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)

    def status(self, status: str) -> AbstractContextManager[object]:
        """rich's spinner at a terminal; elsewhere nothing, as rich's shows nothing there, without importing its
        live display or starting its refresh thread (0.01 s of a lock's CPU)."""
        if not self.is_terminal:  # the console is made here
            return nullcontext()
        return self._console.status(status)
