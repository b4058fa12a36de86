"""nox sessions, generated from envs/*.yaml: thin wrappers over `python -m toolkit`.

Sessions run in the current interpreter (the toolkit's own environment); each line's build
environment is the one the toolkit installs from the lock, not a nox virtualenv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["check"]

ENVS = Path(__file__).parent / "envs"
LINES = sorted(p.stem for p in ENVS.glob("*.yaml") if p.stem != "base")

# Per-line sessions: session prefix -> toolkit verb. `nox -s build-cu126` runs `toolkit build cu126`.
PER_LINE = {
    "check": ("check",),
}


def toolkit(session: nox.Session, *args: str) -> None:
    session.run(sys.executable, "-m", "toolkit", *args, *session.posargs, external=True)


@nox.session
def check(session: nox.Session) -> None:
    """Validate every env spec against the compatibility knowledge."""
    toolkit(session, "check")


@nox.session
def matrix(session: nox.Session) -> None:
    """Show every line side by side."""
    toolkit(session, "matrix")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (what CI runs)."""
    session.run(sys.executable, "-m", "pytest", external=True)


def _register_line_session(prefix: str, verb: tuple[str, ...], line: str) -> None:
    def session_fn(session: nox.Session) -> None:
        toolkit(session, *verb, line)

    session_fn.__doc__ = f"toolkit {' '.join(verb)} {line}"
    nox.session(name=f"{prefix}-{line}")(session_fn)


for _line in LINES:
    for _prefix, _verb in PER_LINE.items():
        _register_line_session(_prefix, _verb, _line)
