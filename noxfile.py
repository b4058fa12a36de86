"""nox sessions, generated from envs/*.yaml: thin wrappers over `python -m toolkit`.

Sessions run in the current interpreter (the toolkit's own environment); each line's build
environment is the one the toolkit installs from the lock, not a nox virtualenv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.spec.envspec import load_spec

nox.options.default_venv_backend = "none"
nox.options.sessions = ["check"]

WORKSPACE = Workspace(envs=Path(__file__).parent / Workspace.envs)  # envs/ of this checkout, wherever nox runs
LINES = sorted(p.stem for p in WORKSPACE.envs.glob("*.yaml") if p.stem != "base")

# Per-line sessions: session prefix -> toolkit verb. `nox -s build-cu126` runs `toolkit build cu126`.
PER_LINE = {
    "check": ("check",),
    "lock": ("lock",),
    "env": ("install",),
    "build": ("build",),
    "verify": ("verify",),
    "bench": ("bench",),
}
# An external toolchain is the machine's own (a site module, an image): there is nothing to install.
LOCKED_ONLY = {"env"}


def toolkit(session: nox.Session, *args: str) -> None:
    session.run(sys.executable, "-m", "toolkit", *args, *session.posargs, external=True)


@nox.session
def check(session: nox.Session) -> None:
    """Validate every env spec against the compatibility knowledge."""
    toolkit(session, "check")


@nox.session
def matrix(session: nox.Session) -> None:
    """Show every line side by side."""
    toolkit(session, "matrix", "show")


@nox.session(name="lock-all")
def lock_all(session: nox.Session) -> None:
    """Lock every line (locks/<line>.conda-lock.yml); lines whose inputs are unchanged are kept."""
    toolkit(session, "lock", "--all")


@nox.session
def doctor(session: nox.Session) -> None:
    """Explain this machine/environment (`nox -s doctor -- cu126 --json`)."""
    toolkit(session, "doctor")


@nox.session
def modules(session: nox.Session) -> None:
    """Lmod and Tcl modulefiles for every line with an installed environment, under build/modulefiles."""
    toolkit(session, "modules", "--root", "build/modulefiles")


@nox.session(name="matrix-run")
def matrix_run(session: nox.Session) -> None:
    """Lock, install, build and verify lines as Slurm jobs (`nox -s matrix-run -- cu126 --executor local`)."""
    toolkit(session, "matrix", "run")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (what CI runs)."""
    session.run(sys.executable, "-m", "pytest", external=True)


def _register_line_session(prefix: str, verb: tuple[str, ...], line: str) -> None:
    def session_fn(session: nox.Session) -> None:
        toolkit(session, *verb, line)

    session_fn.__doc__ = f"toolkit {' '.join(verb)} {line}"
    nox.session(name=f"{prefix}-{line}")(session_fn)


def _is_external(line: str) -> bool:
    try:
        return load_spec(WORKSPACE.spec_file(line)).toolchain.kind == "external"
    except ToolkitError:
        return False  # a broken spec keeps every session: `nox -s check` says what is wrong


for _line in LINES:
    for _prefix, _verb in PER_LINE.items():
        if not (_prefix in LOCKED_ONLY and _is_external(_line)):
            _register_line_session(_prefix, _verb, _line)
