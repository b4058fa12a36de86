"""The verification wing: `toolkit verify` (command.py, one suite per implementation behind suite.py's Suite,
named in command.SUITES) and `toolkit bench` (bench.py), measured in the line's own python.

This package stays light (no torch at import): the CLI loads its verbs' modules to register them.
"""

from __future__ import annotations

import warnings

# torch warns "Failed to initialize NumPy" when it is imported where numpy is missing (a line's venv need not
# have it: attention never converts to numpy); the warning came before verify's own answer and read as the
# cause. Every measuring entry (python -m toolkit.verify, python -m toolkit.verify.bench) imports this package first.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "bench.register",
    "command.register",
)
