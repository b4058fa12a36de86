"""py-rattler's solve of a conda layer, in run_isolated's worker interpreter: this module and what it imports
are all the worker loads (the engines' module, with everything an install needs, cost it 0.1 s of CPU), and the
request (CondaRequest) lives here so that unpickling it loads nothing more. engine.py re-exports its names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolkit.base.atomic import checkpoint
from toolkit.base.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.env.isolated import Prefork


@dataclass(frozen=True)
class CondaRequest:
    """The conda layer's inputs, derived from a spec: what either engine solves."""

    line: str
    spec_file: str  # for messages
    channels: tuple[str, ...]  # channel names or URLs (local paths already made file:// URLs)
    platforms: tuple[str, ...]
    specs: tuple[str, ...]  # match specs; none for an external toolchain
    virtual_packages: dict[
        str, dict[str, str]
    ]  # platform -> {"__cuda": "12.6", "__archspec": "1 x86_64", ...}


def rattler_imports() -> None:
    """What the solve (rattler_fetch_actions) and the link (rattler_link.rattler_install) import first (asyncio's
    and py-rattler's modules: 0.05-0.09 s), imported by a waiting copy (isolated.prefork) while the toolkit
    reads and checks the spec it locks, or verifies the archives it installs."""
    import asyncio  # noqa: F401

    import rattler  # noqa: F401


def forked_solver() -> Prefork:
    """rattler_fetch_actions forked ahead of its request (isolated.prefork): the copy imports py-rattler
    meanwhile. `toolkit lock`'s entry forks it before it imports the lock verb (lock_ahead.forked_early, cli.VERBS'
    `ahead`)."""
    from toolkit.env.isolated import prefork

    return prefork(rattler_fetch_actions, rattler_imports)


def rattler_virtual_packages(values: dict[str, str]) -> list[Any]:
    from rattler import BuildString, GenericVirtualPackage, PackageName, Version

    packages = []
    for name, value in sorted(values.items()):
        version, _, build = value.partition(" ")
        packages.append(
            GenericVirtualPackage(PackageName(name), Version(version), BuildString(build or "0"))
        )
    return packages


def rattler_solve(
    channels: tuple[str, ...],
    specs: tuple[str, ...],
    platform: str,
    virtual: dict[str, str],
    gateway: Any = None,
) -> list[Any]:
    """One platform's solve with py-rattler; solver and channel failures become one-line messages."""
    import asyncio

    import rattler
    from rattler.exceptions import SolverError

    try:
        return asyncio.run(
            rattler.solve(
                sources=[rattler.Channel(c) for c in channels],
                specs=list(specs),
                gateway=gateway or rattler.Gateway(),
                platforms=[rattler.Subdir(platform), rattler.Subdir("noarch")],
                virtual_packages=rattler_virtual_packages(virtual),
            )
        )
    except SolverError as exc:
        raise ToolkitError(
            f"conda layer does not solve for {platform} with __cuda={virtual.get('__cuda')}: "
            f"{_one_line(str(exc))}"
        ) from None
    except Exception as exc:  # py-rattler raises one exception type per transport/parse failure
        if exc.__class__.__module__ != "exceptions":
            raise
        causes = [part.strip() for part in str(exc).split("Caused by:")]
        reason = causes[0] if len(causes) == 1 else f"{causes[0]}: {causes[-1]}"
        raise ToolkitError(
            f"cannot read channels {', '.join(channels)} for {platform}: {_one_line(reason)} "
            f"(conda-forge unreachable? use a mirror or local channel in `channels:`, "
            f"or lock on a machine that reaches it: see locks/README.md)"
        ) from None


def _one_line(text: str) -> str:
    """A solver's tree-shaped explanation on one line."""
    parts = [line.strip(" │├└─") for line in text.splitlines()]
    return "; ".join(part for part in parts if part)


def fetch_action(record: Any) -> dict:
    """A py-rattler RepoDataRecord as the FETCH action a `micromamba create --dry-run --json` reports."""
    return {
        "name": record.name.normalized,
        "version": str(record.version),
        "build": str(record.build),
        "build_number": record.build_number,
        "depends": list(record.depends),
        "constrains": list(record.constrains),
        "url": record.url,
        "fn": record.file_name,
        "md5": record.md5.hex() if record.md5 else "",
        "sha256": record.sha256.hex() if record.sha256 else None,
        "subdir": record.subdir,
        "channel": record.channel or "",
        "timestamp": int(record.timestamp.timestamp() * 1000) if record.timestamp else 0,
    }


@dataclass(frozen=True)
class Solved:
    """A solve's FETCH actions of every platform, and the seconds each platform's solve took."""

    actions: dict[str, list[dict]]
    seconds: dict[str, float]


def rattler_fetch_actions(request: CondaRequest) -> Solved:
    """Solve every platform with py-rattler (in a worker: run_isolated's, or a fork of the lock verb's process,
    which says what was solved; the worker prints nothing, so nothing it says comes before the verb's own)."""
    import rattler

    gateway = rattler.Gateway()
    actions, seconds = {}, {}
    for platform in request.platforms:
        started = time.perf_counter()
        try:
            records = rattler_solve(
                request.channels,
                request.specs,
                platform,
                request.virtual_packages[platform],
                gateway,
            )
        except ToolkitError as exc:
            raise ToolkitError(f"{request.spec_file}: {exc}") from None
        actions[platform] = [fetch_action(r) for r in records]
        seconds[platform] = time.perf_counter() - started
        checkpoint("lock:solve")
    return Solved(actions, seconds)
