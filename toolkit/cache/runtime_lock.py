"""Runtime locks of a pypi line: the environment users run in (torch, its runtime dependencies and the published
published wheels), without the compiler and build tools the line's build lock carries.

`toolkit lock LINE --runtime --index URL` reads the published index (`toolkit publish`) for a wheel of this line
built from its current lock: each link of simple/<project>/ in the line's folders is vouched for by the index as
cache/index.py reads it (its build record `<wheel>.build.json`, the table entry naming that wheel and record, signed
by the key .fa-envkit/caches.toml configures for the URL), and the record's inputs name the line and the sha256 of
the lock it was built from. uv then resolves torch==<locked> and the published wheels, every package constrained to
its build-lock version, into locks/pylock.<line>-runtime.toml (PEP 751) and locks/<line>.runtime.conda-lock.yml
(conda-lock's format, the pip layer). The result is checked, not trusted: every entry is the build lock's file (same
version, URL, sha256) or the published wheel (its link's sha256), and none is build-only
(toolkit/knowledge/pypi_cuda.yaml `runtime.build_only`).

Not resolved as of the lock's time (uv --exclude-newer): uv drops every file without an upload time under it,
and a PEP 503 page (the published index's) has none, so the published wheel would be filtered out (uv 0.13.9).
The pins do that job: each package is pinned to the build lock's version and checked against its file.

`toolkit install LINE --runtime` makes a venv (uv venv) and `uv pip sync`s the pylock into it.

Both verbs are env's (`toolkit lock`, `toolkit install`), but a runtime lock reads a published index, which is
the cache wing's, above env: toolkit/cli.py hands lock_runtime_command and install_runtime_command down to them
(`runtime_command`), so env never imports upward.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from toolkit.base.atomic import checkpoint, owned_dir
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.digest import sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import LOCK_SUFFIX, Workspace, checked_line
from toolkit.cache.config import CacheSite, checked_url, configured_caches
from toolkit.cache.index import PublishedBuild, line_links, vouched
from toolkit.cache.simple import normalize
from toolkit.env import pypi_lock
from toolkit.env.engine import locking_environment
from toolkit.env.lockfile import (
    FAST_LOADER,
    KEY_DIGEST,
    KEY_LINE,
    KEY_PYLOCK_SHA256,
    lock_digest,
    read_lock,
)
from toolkit.knowledge import files as knowledge_files
from toolkit.spec.envspec import EnvSpec

MAX_LOCK_BYTES = 64 << 20
KEY_KIND = "fa-envkit.lock-kind"  # "runtime": not a build lock (read_lock refuses it for lacking the sdist pin)
KEY_BUILD_LOCK = "fa-envkit.build-lock-sha256"  # sha256 of locks/<line>.conda-lock.yml the wheels were built from
KEY_RESOLVER = "fa-envkit.pip-resolver"
KEY_PUBLISHED = (
    "fa-envkit.published."  # + project: the build record's URL of the published wheel taken
)
RUNTIME = "runtime"
MARKER = ".fa-envkit-runtime"  # in a prefix `install --runtime` made: the runtime lock's digest
THEN = "no runtime lock was written"


@dataclass(frozen=True)
class RuntimeFacts:
    """pypi_cuda.yaml `runtime`: the projects asked of a published index, and the build-only packages (why)."""

    projects: tuple[str, ...]
    build_only: dict[str, str]


def runtime_facts() -> RuntimeFacts:
    return knowledge_files.typed(
        "pypi_cuda.yaml",
        lambda data: RuntimeFacts(
            projects=tuple(normalize(str(p)) for p in data["runtime"]["projects"]),
            build_only={
                normalize(str(k)): str(v) for k, v in data["runtime"]["build_only"].items()
            },
        ),
    )


def runtime_lock_file(workspace: Workspace, line: str) -> Path:
    return workspace.locks / f"{checked_line(line)}.{RUNTIME}{LOCK_SUFFIX}"


def runtime_pylock_file(workspace: Workspace, line: str) -> Path:
    """PEP 751 names a pylock pylock.<name>.toml with no dot in <name>: a line with one has no runtime pylock."""
    if "." in checked_line(line):
        raise ToolkitError(
            f"{line}: a runtime lock is locks/pylock.{line}-{RUNTIME}.toml, and PEP 751 allows no dot "
            f"in that name (rename envs/{line}.yaml without dots)"
        )
    return workspace.pylock_file(f"{line}-{RUNTIME}")


# ---------------------------------------------------------------- the published index


def index_root(url: str) -> str:
    """The published folder's URL (what `toolkit publish --to` wrote, or its simple/ page), without the slash."""
    root = checked_url(url, "--index")
    return root[: -len("/simple")] if root.endswith("/simple") else root


def published_builds(
    site: CacheSite, line: str, lock_sha256: str, projects: tuple[str, ...]
) -> list[PublishedBuild]:
    """Per project, the newest wheel in the line's folders whose build record names this line and this lock's
    sha256; each of the line's wheels is vouched for first (cache/index.py: record, table entry, signature), so a
    wheel the publisher's table does not name is refused, never locked."""
    found = []
    for project in projects:
        builds = [vouched(site, link, THEN) for link in line_links(site, project, line, THEN)]
        current = [
            build
            for build in builds
            if build.record.inputs.get("line") == line
            and build.record.inputs.get("lock_sha256") == lock_sha256
        ]
        if current:
            found.append(max(current, key=lambda build: build.record.finished))
    return found


# ---------------------------------------------------------------- the resolve and its checks


def resolve_runtime(
    spec: EnvSpec, workspace: Workspace, index: str
) -> tuple[str, list[Any], list[PublishedBuild], str]:
    """(the runtime pylock's text, its conda-lock pip entries, the published wheels taken, how it was resolved)."""
    from toolkit.env.lock import PipTarget, virtual_packages

    if spec.toolchain.kind != "pypi":
        raise ToolkitError(
            f"{display_path(spec.path)}: a runtime lock is made for pypi lines (toolchain kind pypi); "
            f"{spec.line} is kind {spec.toolchain.kind}"
        )
    build_lock = workspace.lock_file(spec.line)
    locked = read_lock(build_lock)
    facts = runtime_facts()
    root = index_root(index)
    (site,) = [
        s for s in configured_caches([root]) if s.url == root
    ]  # a URL the config lists keeps its key
    wheels = published_builds(site, spec.line, sha256_file(build_lock), facts.projects)
    if not wheels:
        raise ToolkitError(
            f"no published build of {spec.line} for its current lock at {root}: toolkit publish "
            f"{spec.line} --to DIR on the machine that built it"
        )
    platform = locked.platforms[0]  # a pypi line locks one platform
    target = PipTarget(platform, spec.python, virtual_packages(spec)[platform]["__glibc"])
    pip = {p.name: p for p in locked.packages_for(platform, "pip")}
    requirements = [
        f"torch=={pip['torch'].version}",
        *(f"{w.project}=={w.link.version}" for w in wheels),
    ]
    constraints = [f"{p.name}=={p.version}" for p in pip.values()]
    pylock = runtime_pylock_file(workspace, spec.line)
    uv = pypi_lock.uv_executable()
    command = f"toolkit lock {spec.line} --runtime --index {root}"
    with owned_dir(Path(tempfile.gettempdir()), "runtime") as workdir:
        (workdir / "requirements.in").write_text("\n".join(requirements) + "\n")
        (workdir / "constraints.txt").write_text("\n".join(constraints) + "\n")
        # --extra-index-url is asked first: the published flash-attn comes from there, torch from the line's index
        pypi_lock.run_uv(
            [
                uv,
                "pip",
                "compile",
                "--quiet",
                "--no-config",
                "--no-python-downloads",
                "--format",
                "pylock.toml",
                "--generate-hashes",
                "--python-version",
                target.python,
                "--python-platform",
                target.python_platform,
                "--index-url",
                spec.torch_index,
                "--extra-index-url",
                f"{root}/simple",
                "--constraints",
                "constraints.txt",
                "--custom-compile-command",
                command,
                "--output-file",
                pylock.name,
                "requirements.in",
            ],
            workdir,
            "uv pip compile (runtime)",
            locking_environment(),
        )
        text = (workdir / pylock.name).read_text()
    entries = pypi_lock.pylock_entries(
        text, display_path(pylock), platform, target.python, target.glibc
    )
    problem = runtime_problem(entries, pip, wheels, facts, display_path(build_lock))
    if problem:
        raise ToolkitError(f"{display_path(pylock)}: {problem} (not written)")
    resolver = (
        f"uv {pypi_lock.uv_version(uv)} (uv pip compile --format pylock.toml --python-platform "
        f"{target.python_platform} --python-version {target.python}; {', '.join(requirements)}; every "
        f"package constrained to {display_path(build_lock)}'s version)"
    )
    return text, entries, wheels, resolver


def runtime_problem(
    entries: list[Any],
    build: dict[str, Any],
    wheels: list[PublishedBuild],
    facts: RuntimeFacts,
    build_lock: str,
) -> str | None:
    """Why a resolved runtime layer is not the build lock's files plus the published wheels, or None."""
    published = {w.project: w for w in wheels}
    names = {entry.name for entry in entries}
    for wheel in wheels:
        if wheel.project not in names:
            return f"the resolve left out the published {wheel.link.filename}"
    for entry in entries:
        if entry.name in published:
            wheel = published[entry.name]
            if (urllib.parse.unquote(entry.url.rsplit("/", 1)[-1]), entry.hash.sha256) != (
                wheel.link.filename,
                wheel.link.sha256,
            ):
                return (
                    f"{entry.name} resolved to {entry.url} (sha256 {entry.hash.sha256}), not the published "
                    f"{wheel.link.url} (sha256 {wheel.link.sha256})"
                )
        elif entry.name in facts.build_only:
            return (
                f"{entry.name} is build-only ({facts.build_only[entry.name]}; toolkit/knowledge/pypi_cuda.yaml) "
                f"but a runtime package requires it"
            )
        elif entry.name not in build:
            return f"{entry.name} {entry.version} is not in {build_lock} (a runtime lock is a part of the build lock)"
        elif (entry.version, entry.url, entry.hash.sha256) != (
            build[entry.name].version,
            build[entry.name].url,
            build[entry.name].sha256,
        ):
            locked = build[entry.name]
            return (
                f"{entry.name} resolved to {entry.version} ({entry.url}), not {build_lock}'s {locked.version} "
                f"({locked.url})"
            )
    return None


# ---------------------------------------------------------------- writing and reading the lock


def write_runtime_lock(
    spec: EnvSpec,
    workspace: Workspace,
    text: str,
    entries: list[Any],
    wheels: list[PublishedBuild],
    resolver: str,
) -> tuple[Path, Path]:
    """locks/pylock.<line>-runtime.toml and locks/<line>.runtime.conda-lock.yml, staged and renamed (lock last)."""
    from conda_lock.lockfile import write_conda_lock_file
    from conda_lock.lockfile.v2prelim.models import Lockfile, LockMeta

    build_lock = workspace.lock_file(spec.line)
    pylock, path = (
        runtime_pylock_file(workspace, spec.line),
        runtime_lock_file(workspace, spec.line),
    )
    custom = {
        KEY_LINE: spec.line,
        KEY_KIND: RUNTIME,
        KEY_BUILD_LOCK: sha256_file(build_lock),
        KEY_RESOLVER: resolver,
        **{KEY_PUBLISHED + w.project: w.record_url for w in wheels},
    }
    sources = [os.path.relpath(build_lock.resolve(), workspace.locks.resolve())]
    lockfile = Lockfile(
        package=entries,
        metadata=LockMeta(
            content_hash={entries[0].platform: custom[KEY_BUILD_LOCK]},
            channels=[],
            platforms=sorted({e.platform for e in entries}),
            sources=sources,
            custom_metadata=custom,
        ),
    )
    custom = lockfile.metadata.custom_metadata  # pydantic's copy: what the writer writes
    assert custom is not None
    with owned_dir(workspace.locks, "runtime-lock") as tmp:
        (tmp / pylock.name).write_text(text)
        custom[KEY_PYLOCK_SHA256] = sha256_file(tmp / pylock.name)
        draft = tmp / path.name
        write_conda_lock_file(lockfile, draft, metadata_choices=None, include_help_text=False)
        custom[KEY_DIGEST] = lock_digest(yaml.safe_load(draft.read_text()))
        write_conda_lock_file(lockfile, draft, metadata_choices=None, include_help_text=False)
        draft.write_text(
            f"# fa-envkit runtime lock of {spec.line} (torch and the published flash-attn, no build-only "
            f"packages) in conda-lock's format.\n# Written by `toolkit lock {spec.line} --runtime`; do not "
            f"edit ({KEY_DIGEST} refuses edits).\n# Install: toolkit install {spec.line} --runtime, or "
            f"uv pip sync / pip install -r {pylock.name}\n" + draft.read_text()
        )
        checkpoint("runtime-lock:write")
        os.replace(tmp / pylock.name, pylock)
        os.replace(draft, path)  # last: it names the pylock's sha256
    read_runtime_lock(workspace, spec.line)
    return path, pylock


def read_runtime_lock(workspace: Workspace, line: str) -> dict[str, Any]:
    """The runtime lock's custom metadata, after its digest and its pylock's sha256 matched; one line if not."""
    path, pylock = runtime_lock_file(workspace, line), runtime_pylock_file(workspace, line)
    where, fix = display_path(path), f"toolkit lock {line} --runtime --index URL"
    try:
        text = regular_file_bytes(path, MAX_LOCK_BYTES).decode()
        if any(
            isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=FAST_LOADER)
        ):
            raise ToolkitError(f"{where}: uses a YAML alias (`toolkit lock` writes none; {fix})")
        document = yaml.safe_load(text)
    except UnicodeDecodeError:
        raise ToolkitError(f"{where}: not UTF-8 text ({fix})") from None
    except Unreadable as exc:
        why = "missing" if exc.why == "missing" else f"unreadable ({exc.detail or exc.why})"
        raise ToolkitError(f"{where}: {why} ({fix})") from None
    except yaml.YAMLError as exc:
        raise ToolkitError(f"{where}: not YAML ({exc.__class__.__name__}; {fix})") from None
    custom = (
        ((document or {}).get("metadata") or {}).get("custom_metadata")
        if isinstance(document, dict)
        else None
    )
    if (
        not isinstance(custom, dict)
        or custom.get(KEY_KIND) != RUNTIME
        or custom.get(KEY_LINE) != line
    ):
        raise ToolkitError(f"{where}: not a runtime lock of {line} ({fix})")
    try:
        digest = lock_digest(document)
    except (TypeError, ValueError):
        digest = ""
    if digest != custom.get(KEY_DIGEST):
        raise ToolkitError(
            f"{where}: edited after locking (contents do not match {KEY_DIGEST}; {fix})"
        )
    if not pylock.is_file() or sha256_file(pylock) != custom.get(KEY_PYLOCK_SHA256):
        raise ToolkitError(
            f"{display_path(pylock)}: missing or not the pylock written with {where} ({fix})"
        )
    return custom


def lock_runtime_command(args: argparse.Namespace, workspace: Workspace, paths: list[Path]) -> int:
    from toolkit.spec.rules import checked_spec

    if not args.index:
        raise ToolkitError(
            "toolkit lock --runtime: name the published index with --index URL (the folder "
            "`toolkit publish --to` wrote: file://, http:// or https://)"
        )
    for path in paths:
        spec = checked_spec(path)
        text, entries, wheels, resolver = resolve_runtime(spec, workspace, args.index)
        lock, pylock = write_runtime_lock(spec, workspace, text, entries, wheels, resolver)
        taken = ", ".join(w.link.filename for w in wheels)
        print(
            f"{display_path(lock)}, {display_path(pylock)}: written ({len(entries)} wheels; published: {taken})"
        )
    return 0


# ---------------------------------------------------------------- install


SAFE_PREFIX = re.compile(
    r"/[A-Za-z0-9._+@%=,/-]*"
)  # as toolkit modules takes paths: nothing a shell reads as code


def install_runtime(
    line: str, workspace: Workspace, prefix: Path | None, python: Path | None
) -> Path:
    """A venv at prefix (default .envs/<line>-runtime) holding exactly the runtime pylock, by `uv pip sync`."""
    custom = read_runtime_lock(workspace, line)
    pylock = runtime_pylock_file(workspace, line)
    prefix = Path(prefix or workspace.prefix(f"{line}-{RUNTIME}")).absolute()
    if not SAFE_PREFIX.fullmatch(str(prefix)):
        raise ToolkitError(
            f"--prefix: {ascii(str(prefix))} holds characters a shell would read (use letters, digits "
            f"and ._+@%=,/- only)"
        )
    marker = prefix / MARKER
    if prefix.is_symlink() or (
        prefix.exists()
        and not marker.is_file()
        and (not prefix.is_dir() or next(prefix.iterdir(), None) is not None)
    ):
        raise ToolkitError(
            f"{display_path(prefix)}: exists and is not an environment `toolkit install --runtime` "
            f"made (choose a new or empty --prefix)"
        )
    uv = pypi_lock.uv_executable()
    env = locking_environment()
    if not marker.is_file():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        spec_python = (
            str(python)
            if python
            else shutil.which(f"python{_spec_python(workspace, line)}") or "python3"
        )
        pypi_lock.run_uv(
            [
                uv,
                "venv",
                "--quiet",
                "--no-config",
                "--no-python-downloads",
                "--python",
                spec_python,
                str(prefix),
            ],
            prefix.parent,
            "uv venv",
            env,
        )
    pypi_lock.run_uv(
        [
            uv,
            "pip",
            "sync",
            "--quiet",
            "--no-config",
            "--python",
            str(prefix / "bin" / "python"),
            "--preview-features",
            "pylock",
            str(pylock.absolute()),
        ],
        Path.cwd(),
        "uv pip sync",
        env,
    )
    marker.write_text(json.dumps({"lock_sha256": custom[KEY_DIGEST]}) + "\n")
    return prefix


def _spec_python(workspace: Workspace, line: str) -> str:
    from toolkit.spec.envspec import load_spec

    return load_spec(workspace.spec_file(line)).python


def install_runtime_command(line: str, args: argparse.Namespace, workspace: Workspace) -> int:
    prefix = install_runtime(line, workspace, args.prefix, args.python)
    print(
        f"{display_path(prefix)}: runtime environment of {display_path(runtime_lock_file(workspace, line))} "
        f"installed"
    )
    return 0
