"""LazyConsole: rich's console made when first used; its status spinner only where rich would show one."""

import subprocess
import sys

SCRIPT = """
import io, sys, threading
from toolkit.base.lazy_console import LazyConsole

for options in ({}, {"force_terminal": True}):
    out = io.StringIO()
    console = LazyConsole(file=out, **options)
    with console.status("resolving"):  # rich's redirects sys.stdout meanwhile
        seen = (threading.active_count(), "rich.live" in sys.modules)
    print(*seen, repr(out.getvalue()) if not options else "shown")
"""


def test_a_status_shows_nothing_at_no_terminal_and_starts_no_live_display():
    """Where the console is no terminal, rich's status shows nothing: LazyConsole's does the same without
    importing rich's live display or starting its refresh thread (a thread, and 0.01 s of a lock's CPU); at a
    terminal it is rich's, with its thread. Read from the threading module and sys.modules of a fresh python."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["1 False ''", "2 True shown"]
