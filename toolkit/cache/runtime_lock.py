"""Runtime locks of a pypi or conda line: the environment users run in (torch, its runtime dependencies and the
published wheels, and a conda line's conda layer), without the compiler and build tools the line's
build lock carries.

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

A conda line (toolchain kind locked) is not resolved again: its runtime lock is the build lock's own records. The
conda layer is the build lock's conda entries minus the build-only ones (toolkit/knowledge/conda_forge_nvcc.yaml
`runtime.build_only`, by name) that no kept record depends on, each kept exactly (url, md5, sha256, dependencies);
a build-only package a runtime package depends on stays, so the lock's graph stays closed. The pip
layer is the published wheels plus the build lock's pip entries that torch and their Requires-Dist (the index's
PEP 658 `.metadata`) reach through the lock's dependencies. No pylock is written for it: its python is the conda
layer's.

A line with a `flash_attn_4:` section adds FA4's pins to either kind's pip layer: the exact wheels of
locks/<line>.fa4-lock.json (`toolkit fa4 lock`, digest-checked against knowledge/flash_attn_4.yaml), each by its
URL and pinned sha256, not resolved (nvidia-cutlass-dsl requires libs-cu12 even where the pinned libs-cu13
`replaces` it). The release's `from_base` (torch) is the lock's own torch; an `if_missing` pin the layer already
holds is left to the layer's version. A line with FA4 instead of flash-attn 2.x and no FA3 builds no wheel: its
runtime lock is torch and FA4's pins, and no index is read.

`toolkit install LINE --runtime` makes a venv (uv venv) and `uv pip sync`s the pylock into it; for a conda line, the
line's conda engine (py-rattler, or `conda-lock install`) installs the runtime lock into a new prefix.

Both verbs are env's (`toolkit lock`, `toolkit install`), but a runtime lock reads a published index, which is
the cache wing's, above env: toolkit/cli.py hands lock_runtime_command and install_runtime_command down to them
(`runtime_command`), so env never imports upward.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import tempfile
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from toolkit.base.atomic import checkpoint, owned_dir, run_temporaries
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.digest import sha256_file
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.base.paths import display_path
from toolkit.base.workspace import LOCK_SUFFIX, Workspace, checked_line
from toolkit.cache.config import CacheSite, checked_url, configured_caches
from toolkit.cache.index import MAX_RECORD_BYTES, PublishedBuild, line_links, read_url, vouched
from toolkit.cache.simple import normalize
from toolkit.env import pypi_lock
from toolkit.env.engine import locking_environment
from toolkit.env.lockfile import (
    KEY_DIGEST,
    KEY_LINE,
    KEY_PYLOCK_SHA256,
    KEY_TOOLCHAIN,
    MAX_LOCK_BYTES,
    LockedEnv,
    LockedPackage,
    YamlAlias,
    load_lock_yaml,
    lock_digest,
    locked_packages,
    read_lock,
)
from toolkit.knowledge import files as knowledge_files
from toolkit.spec.envspec import EnvSpec

if TYPE_CHECKING:
    from toolkit.env.fa4_lock import Fa4Lock, Fa4LockWheel

KEY_KIND = "fa-envkit.lock-kind"  # "runtime": not a build lock (read_lock refuses it for lacking the sdist pin)
KEY_BUILD_LOCK = "fa-envkit.build-lock-sha256"  # sha256 of locks/<line>.conda-lock.yml the wheels were built from
KEY_RESOLVER = "fa-envkit.pip-resolver"
KEY_PUBLISHED = (
    "fa-envkit.published."  # + project: the build record's URL of the published wheel taken
)
KEY_FA4_LOCK = (
    "fa-envkit.fa4-lock-sha256"  # sha256 of locks/<line>.fa4-lock.json whose pins the lock carries
)
RUNTIME = "runtime"
MARKER = ".fa-envkit-runtime"  # in a prefix `install --runtime` made: the runtime lock's digest
THEN = "no runtime lock was written"


PLATFORM = "{platform}"  # in conda_forge_nvcc.yaml's build-only names: the lock's platform (cuda-nvcc_{platform})


@dataclass(frozen=True)
class RuntimeFacts:
    """pypi_cuda.yaml `runtime`: the projects asked of a published index, and the build-only pip packages (why);
    conda_forge_nvcc.yaml `runtime`: the build-only conda packages (why), names with {platform} in them."""

    projects: tuple[str, ...]
    build_only: dict[str, str]
    conda_build_only: dict[str, str] = field(default_factory=dict)

    def conda_build_only_for(self, platform: str) -> dict[str, str]:
        return {
            name.replace(PLATFORM, platform): why for name, why in self.conda_build_only.items()
        }


def runtime_facts() -> RuntimeFacts:
    conda = knowledge_files.typed(
        "conda_forge_nvcc.yaml",
        lambda data: {str(k): str(v) for k, v in data["runtime"]["build_only"].items()},
    )
    return knowledge_files.typed(
        "pypi_cuda.yaml",
        lambda data: RuntimeFacts(
            projects=tuple(normalize(str(p)) for p in data["runtime"]["projects"]),
            build_only={
                normalize(str(k)): str(v) for k, v in data["runtime"]["build_only"].items()
            },
            conda_build_only=conda,
        ),
    )


@dataclass(frozen=True)
class RuntimeLayers:
    """What a runtime lock holds before it is written: its entries (conda-lock models), the published wheels taken,
    how it was made, a pypi line's pylock text (None for a conda line), a conda line's channels and the FA4 lock
    whose pins it carries."""

    entries: list[Any]
    wheels: list[PublishedBuild]
    resolver: str
    pylock: str | None = None
    channels: list[Any] = field(default_factory=list)
    fa4: Fa4Pins | None = None


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


@dataclass(frozen=True)
class Published:
    """The line's build lock and the published wheels built from it (the start of either kind's runtime lock)."""

    build_lock: Path
    locked: LockedEnv
    root: str | None  # the index's URL; None for a line that builds no wheel
    wheels: list[PublishedBuild]
    facts: RuntimeFacts
    fa4: Fa4Pins | None = None


@dataclass(frozen=True)
class Fa4Pins:
    """The line's FA4 lock, read and checked: the wheels a runtime lock carries by URL and sha256."""

    path: Path
    lock: Fa4Lock


def line_fa4_pins(spec: EnvSpec, workspace: Workspace) -> Fa4Pins | None:
    """locks/<line>.fa4-lock.json of a line with a flash_attn_4 section (None without one), digest-checked and
    checked against the knowledge's pins (env/fa4_lock.py); a lock of another release, CUDA major or python than
    the line asks is refused in one line."""
    if spec.flash_attn_4 is None:
        return None
    from toolkit.env.fa4_lock import load_fa4_lock

    path = workspace.fa4_lock_file(spec.line)
    lock = load_fa4_lock(path)
    asked = (spec.line, spec.flash_attn_4.version, spec.cuda.split(".")[0], spec.python)
    if (lock.line, lock.release, lock.cuda_major, lock.python) != asked:
        raise ToolkitError(
            f"{display_path(path)}: pins flash-attn-4 {lock.release} of line {lock.line} for CUDA "
            f"{lock.cuda_major}, python {lock.python}; {display_path(spec.path)} asks {asked[1]} for CUDA "
            f"{asked[2]}, python {asked[3]} (run `toolkit fa4 lock {spec.line}`; {THEN})"
        )
    return Fa4Pins(path, lock)


def published_for(spec: EnvSpec, workspace: Workspace, index: str | None) -> Published:
    """The line's build lock, read and verified, its FA4 pins, and the index's wheels of this line built from
    it; one line if none (a line that builds no wheel reads no index)."""
    if spec.toolchain.kind not in ("pypi", "locked"):
        raise ToolkitError(
            f"{display_path(spec.path)}: a runtime lock is made for pypi and locked (conda) lines; "
            f"{spec.line} is kind {spec.toolchain.kind} (the machine provides its environment)"
        )
    build_lock = workspace.lock_file(spec.line)
    locked_env = read_lock(build_lock)
    facts = runtime_facts()
    fa4 = line_fa4_pins(spec, workspace)
    # a line that compiles nothing (FA4 instead of FA2, no FA3) publishes nothing: its runtime lock is torch and
    # FA4's pins
    if not spec.compiled_implementations():
        return Published(build_lock, locked_env, None, [], facts, fa4)
    if not index:
        raise ToolkitError(
            "toolkit lock --runtime: name the published index with --index URL (the folder "
            "`toolkit publish --to` wrote: file://, http:// or https://)"
        )
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
    return Published(build_lock, locked_env, root, wheels, facts, fa4)


def resolve_runtime(spec: EnvSpec, workspace: Workspace, index: str | None) -> RuntimeLayers:
    """A line's runtime layers: a pypi line's resolved by uv (resolve_pypi_runtime), a conda line's taken from its
    build lock (conda_runtime)."""
    published = published_for(spec, workspace, index)
    return (
        resolve_pypi_runtime(spec, workspace, published)
        if spec.toolchain.kind == "pypi"
        else conda_runtime(spec, published)
    )


def resolve_pypi_runtime(
    spec: EnvSpec, workspace: Workspace, published: Published
) -> RuntimeLayers:
    """The runtime pylock (uv's resolve of torch and the published wheels within the build lock) and its entries."""
    from toolkit.env.lock import PipTarget, virtual_packages

    build_lock, locked, root, wheels, facts = (
        published.build_lock,
        published.locked,
        published.root,
        published.wheels,
        published.facts,
    )
    platform = locked.platforms[0]  # a pypi line locks one platform
    target = PipTarget(platform, spec.python, virtual_packages(spec)[platform]["__glibc"])
    pip = {p.name: p for p in locked.packages_for(platform, "pip")}
    requirements = [
        f"torch=={pip['torch'].version}",
        *(f"{w.project}=={w.link.version}" for w in wheels),
        *(f"{name}=={pip[name].version}" for name in fa4_kept(published.fa4, set(pip))),
    ]
    constraints = [f"{p.name}=={p.version}" for p in pip.values()]
    pylock = runtime_pylock_file(workspace, spec.line)
    uv = pypi_lock.uv_executable()
    command = f"toolkit lock {spec.line} --runtime" + (f" --index {root}" if root else "")
    # --extra-index-url is asked first: the published flash-attn comes from there, torch from the line's index
    published_index = ["--extra-index-url", f"{root}/simple"] if root else []
    with owned_dir(Path(tempfile.gettempdir()), "runtime") as workdir:
        (workdir / "requirements.in").write_text("\n".join(requirements) + "\n")
        (workdir / "constraints.txt").write_text("\n".join(constraints) + "\n")
        pypi_lock.uv_compile(
            uv,
            target.python,
            target.python_platform,
            [
                "--format",
                "pylock.toml",
                "--index-url",
                spec.torch_index,
                *published_index,
                "--constraints",
                "constraints.txt",
            ],
            pylock.name,
            command,
            workdir,
            "uv pip compile (runtime)",
            locking_environment(),
        )
        text = (workdir / pylock.name).read_text()
    where = display_path(pylock)
    entries = pylock_models(text, where, platform, target)
    if published.fa4:
        text = pylock_with(text, fa4_additions(published.fa4.lock, entries, where), where)
        entries = pylock_models(text, where, platform, target)
    problem = runtime_problem(entries, pip, wheels, facts, display_path(build_lock), published.fa4)
    if problem:
        raise ToolkitError(f"{display_path(pylock)}: {problem} (not written)")
    resolver = (
        f"uv {pypi_lock.uv_version(uv)} (uv pip compile --format pylock.toml --python-platform "
        f"{target.python_platform} --python-version {target.python}; {', '.join(requirements)}; every "
        f"package constrained to {display_path(build_lock)}'s version)"
        + fa4_resolver(published.fa4)
    )
    return RuntimeLayers(entries, wheels, resolver, pylock=text, fa4=published.fa4)


def pylock_models(text: str, where: str, platform: str, target: Any) -> list[Any]:
    """conda-lock's pip entries of a runtime pylock (pypi_lock.pylock_entries), which the runtime checks compare
    with the build lock's models."""
    return [
        e.model()
        for e in pypi_lock.pylock_entries(text, where, platform, target.python, target.glibc)
    ]


def runtime_conda_names(records: list[Any], build_only: dict[str, str]) -> set[str]:
    """The conda records a runtime keeps: every one not build-only, and every build-only one a kept record
    depends on (transitively), since a package that runs needs its run dependencies (conda-forge's triton needs
    ptxas from cuda-nvcc-tools, say); so each kept record's `dependencies` stay the build lock's own and the
    lock's graph (what conda-lock and py-rattler read) stays closed."""
    depends = {m.name: set(m.dependencies) for m in records}
    kept = {name for name in depends if name not in build_only}
    wanted = set(kept)
    while wanted:
        wanted = {dep for name in wanted for dep in depends[name] if dep in depends} - kept
        kept |= wanted
    return kept


def conda_runtime(spec: EnvSpec, published: Published) -> RuntimeLayers:
    """A conda line's runtime layers, per platform: the build lock's conda records minus the build-only ones no
    kept record depends on (runtime_conda_names), and the pip entries torch and the published wheels need, each
    the build lock's own record."""
    from conda_lock.lockfile import parse_conda_lock_file

    from toolkit.env.lock import PipTarget, virtual_packages

    build_lock, where = published.build_lock, display_path(published.build_lock)
    models = parse_conda_lock_file(
        build_lock
    ).package  # read_lock verified the file (digest, strict forms)
    entries: list[Any] = []
    for platform in published.locked.platforms:
        records = [m for m in models if (m.platform, m.manager) == (platform, "conda")]
        kept = runtime_conda_names(records, published.facts.conda_build_only_for(platform))
        conda = [m for m in records if m.name in kept]
        pythons = [m.version for m in conda if m.name == "python"]
        if not pythons:
            raise ToolkitError(
                f"{where}: no python among {platform}'s conda packages (re-run `toolkit lock "
                f"{spec.line}`)"
            )
        target = PipTarget(platform, pythons[0], virtual_packages(spec)[platform]["__glibc"])
        pip_models = {m.name: m for m in models if (m.platform, m.manager) == (platform, "pip")}
        wheels = [published_entry(w, target, pip_models, where) for w in published.wheels]
        pip = [
            *wheels,
            *pip_closure(
                [
                    "torch",
                    *(d for w in wheels for d in w.dependencies),
                    *fa4_kept(published.fa4, set(pip_models)),
                ],
                pip_models,
                where,
            ),
        ]
        if published.fa4:
            pip += [
                fa4_entry(pin, platform)
                for pin in fa4_additions(published.fa4.lock, pip, f"{where}: {platform}")
            ]
        problem = runtime_problem(
            pip,
            {p.name: p for p in published.locked.packages_for(platform, "pip")},
            published.wheels,
            published.facts,
            where,
            published.fa4,
        )
        if problem:
            raise ToolkitError(f"{where}: {platform}: {problem} (no runtime lock was written)")
        entries += conda
        entries += pip
    resolver = (
        f"taken from {where} (not resolved again): its conda records less "
        f"toolkit/knowledge/conda_forge_nvcc.yaml runtime.build_only, and the pip records torch and the "
        f"published wheels' Requires-Dist reach" + fa4_resolver(published.fa4)
    )
    return RuntimeLayers(
        entries,
        published.wheels,
        resolver,
        channels=list(parse_conda_lock_file(build_lock).metadata.channels),
        fa4=published.fa4,
    )


# ---------------------------------------------------------------- FA4's pins


def fa4_kept(fa4: Fa4Pins | None, build: set[str]) -> list[str]:
    """FA4's `if_missing` distributions the build lock's pip layer holds: the line's environment has them, so
    FA4 runs with that file there (`toolkit fa4 install` and `toolkit lock` leave such a pin out), and the runtime
    layer asks for them at the build lock's version."""
    from packaging.utils import canonicalize_name

    pins = fa4.lock.wheels if fa4 else []
    return [
        name for pin in pins if pin.if_missing and (name := canonicalize_name(pin.name)) in build
    ]


def fa4_additions(fa4: Fa4Lock, held: list[Any], where: str) -> list[Fa4LockWheel]:
    """FA4's pinned wheels a runtime layer adds to the entries it holds. FA4 takes its `from_base` (torch) from
    the environment: here the layer's own torch, the build lock's, which must be there. An `if_missing` pin the
    layer holds (fa4_kept asked for it, or torch or a published wheel requires it) is left to the layer's
    version; any other pin the layer holds as another file is refused, since one environment installs one file
    of a distribution."""
    from packaging.utils import canonicalize_name

    have = {entry.name: (entry.version, entry.url, entry.hash.sha256) for entry in held}
    base = [name for name in fa4.from_base if canonicalize_name(name) not in have]
    if base:
        raise ToolkitError(
            f"{where}: flash-attn-4 {fa4.release} takes {', '.join(base)} from the environment and the "
            f"runtime layer holds none ({THEN})"
        )
    added = []
    for pin in fa4.wheels:
        name = canonicalize_name(pin.name)
        if name not in have:
            added.append(pin)
        elif have[name] != (pin.version, pin.url, pin.sha256) and not pin.if_missing:
            raise ToolkitError(
                f"{where}: the runtime layer holds {name} {have[name][0]} ({have[name][1]}) and flash-attn-4 "
                f"{fa4.release} pins {pin.version} ({pin.file}; one of them must give way, {THEN})"
            )
    return added


def pylock_with(text: str, pins: list[Fa4LockWheel], where: str) -> str:
    """uv's pylock plus FA4's pins as PEP 751 packages (name, version, the one wheel by URL, size and sha256),
    appended by tomlkit so that uv's text stays as uv wrote it, and read back by packaging.pylock."""
    import tomlkit
    from packaging.utils import canonicalize_name

    document = tomlkit.parse(text)
    packages = document["packages"]
    assert isinstance(
        packages, tomlkit.items.AoT
    )  # read_pylock read uv's text: PEP 751's [[packages]]
    for pin in pins:
        wheel = tomlkit.inline_table()
        wheel.update(
            {"name": pin.file, "url": pin.url, "size": pin.size, "hashes": {"sha256": pin.sha256}}
        )
        wheels = tomlkit.array()
        wheels.append(wheel)  # one line, as uv writes a package's wheels
        package = tomlkit.table()
        package.update(
            {"name": canonicalize_name(pin.name), "version": pin.version, "wheels": wheels}
        )
        packages[-1].add(tomlkit.nl())  # a blank line between packages, as uv's
        packages.append(package)
    written = tomlkit.dumps(document)
    pypi_lock.read_pylock(written, where)
    return written


def fa4_entry(pin: Fa4LockWheel, platform: str) -> Any:
    """An FA4 pin as a conda-lock pip entry: its URL and sha256, no dependencies (installed as pinned)."""
    from packaging.utils import canonicalize_name

    return pypi_lock.PipEntry(
        canonicalize_name(pin.name), pin.version, platform, pin.url, pin.sha256
    ).model()


def fa4_resolver(fa4: Fa4Pins | None) -> str:
    if fa4 is None:
        return ""
    return (
        f"; + flash-attn-4 {fa4.lock.release}'s pinned wheels from {display_path(fa4.path)} (not resolved; "
        f"an if_missing pin the layer holds is left to its version)"
    )


def published_entry(build: PublishedBuild, target: Any, pip: dict[str, Any], where: str) -> Any:
    """The published wheel as a conda-lock pip entry: its page URL and sha256, and the dependencies its Requires-Dist
    names for the target (read from the index's PEP 658 `<wheel>.metadata`, checked against the page's sha256);
    each must be in the build lock's pip layer."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    then, url = THEN, f"{build.link.url}.metadata"
    data = read_url(url, MAX_RECORD_BYTES, "core metadata", then)
    if data is None or hashlib.sha256(data).hexdigest() != build.link.metadata_sha256:
        raise ToolkitError(
            f"{url}: missing, or not the metadata file the index's page pins for "
            f"{build.link.filename} (refused; {then})"
        )
    markers = target.markers()
    dependencies: dict[str, str] = {}
    for line in (
        email.parser.BytesParser().parsebytes(data, headersonly=True).get_all("Requires-Dist") or []
    ):
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(markers):
            name = canonicalize_name(requirement.name)
            if name not in pip:
                raise ToolkitError(
                    f"{where}: {build.link.filename} requires {requirement}, which the line's pip "
                    f"layer does not hold ({then}; add it to pip_packages and lock again)"
                )
            dependencies[name] = str(requirement.specifier) or "*"
    return pypi_lock.PipEntry(
        canonicalize_name(build.project),
        str(build.link.version),
        target.platform,
        build.link.url,
        build.link.sha256,
        dependencies,
    ).model()


def pip_closure(roots: list[str], pip: dict[str, Any], where: str) -> list[Any]:
    """The build lock's pip records `roots` reach through their dependencies, in the lock's order."""
    reached: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        if name not in pip:
            raise ToolkitError(
                f"{where}: {name} is not among its pip packages (re-run `toolkit lock`)"
            )
        reached.add(name)
        todo += [d for d in pip[name].dependencies if d in pip]
    return [model for name, model in pip.items() if name in reached]


def runtime_problem(
    entries: list[Any],
    build: dict[str, Any],
    wheels: list[PublishedBuild],
    facts: RuntimeFacts,
    build_lock: str,
    fa4: Fa4Pins | None = None,
) -> str | None:
    """Why a resolved runtime layer is not the build lock's files plus the published wheels and FA4's pins (the
    FA4 lock's files; an `if_missing` one may be the build lock's instead), or None."""
    from packaging.utils import canonicalize_name

    published = {w.project: w for w in wheels}
    pinned = {canonicalize_name(w.name): w for w in fa4.lock.wheels} if fa4 else {}
    held = {entry.name: entry for entry in entries}
    names = set(held)
    for wheel in wheels:
        if wheel.project not in names:
            return f"the resolve left out the published {wheel.link.filename}"
    for name, pin in pinned.items():
        entry = held.get(name)
        if entry is None or (
            not pin.if_missing and (entry.url, entry.hash.sha256) != (pin.url, pin.sha256)
        ):
            return (
                f"{name} is not flash-attn-4's pinned {pin.file} ({pin.url}, sha256 {pin.sha256})"
            )
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
        elif entry.name in pinned and (entry.version, entry.url, entry.hash.sha256) == (
            pinned[entry.name].version,
            pinned[entry.name].url,
            pinned[entry.name].sha256,
        ):
            continue  # FA4's pin, vouched for by the FA4 lock (its sha256 the knowledge's)
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
    spec: EnvSpec, workspace: Workspace, layers: RuntimeLayers
) -> tuple[Path, Path | None]:
    """locks/<line>.runtime.conda-lock.yml and, for a pypi line, locks/pylock.<line>-runtime.toml, staged and
    renamed (the lock last: it names the pylock's sha256)."""
    from conda_lock.lockfile import write_conda_lock_file
    from conda_lock.lockfile.v2prelim.models import Lockfile, LockMeta

    build_lock = workspace.lock_file(spec.line)
    path = runtime_lock_file(workspace, spec.line)
    pylock = runtime_pylock_file(workspace, spec.line) if layers.pylock is not None else None
    custom = {
        KEY_LINE: spec.line,
        KEY_KIND: RUNTIME,
        KEY_TOOLCHAIN: spec.toolchain.kind,
        KEY_BUILD_LOCK: sha256_file(build_lock),
        KEY_RESOLVER: layers.resolver,
        **{KEY_PUBLISHED + w.project: w.record_url for w in layers.wheels},
        **({KEY_FA4_LOCK: sha256_file(layers.fa4.path)} if layers.fa4 else {}),
    }
    sources = [os.path.relpath(build_lock.resolve(), workspace.locks.resolve())]
    platforms = sorted({e.platform for e in layers.entries})
    lockfile = Lockfile(
        package=layers.entries,
        metadata=LockMeta(
            content_hash=dict.fromkeys(platforms, custom[KEY_BUILD_LOCK]),
            channels=layers.channels,
            platforms=platforms,
            sources=sources,
            custom_metadata=custom,
        ),
    )
    custom = lockfile.metadata.custom_metadata  # pydantic's copy: what the writer writes
    assert custom is not None
    carried = [
        "torch",
        *(f"the published {w.project}" for w in layers.wheels),
        *(["flash-attn-4's pins"] if layers.fa4 else []),
    ]
    # FA4's nvidia-cutlass-dsl requires libs-cu12, which the pinned libs-cu13 replaces: pip must not resolve
    no_deps = " --no-deps" if layers.fa4 else ""
    install = (
        f"uv pip sync / pip install{no_deps} -r {pylock.name}"
        if pylock
        else f"conda-lock install --prefix DIR {path.name}"
    )
    with owned_dir(workspace.locks, "runtime-lock") as tmp:
        if pylock and layers.pylock is not None:
            (tmp / pylock.name).write_text(layers.pylock)
            custom[KEY_PYLOCK_SHA256] = sha256_file(tmp / pylock.name)
        draft = tmp / path.name
        write_conda_lock_file(lockfile, draft, metadata_choices=None, include_help_text=False)
        custom[KEY_DIGEST] = lock_digest(yaml.safe_load(draft.read_text()))
        write_conda_lock_file(lockfile, draft, metadata_choices=None, include_help_text=False)
        draft.write_text(
            f"# fa-envkit runtime lock of {spec.line} ({', '.join(carried)}; no build-only packages) in "
            f"conda-lock's format.\n"
            f"# Written by `toolkit lock {spec.line} --runtime`; do not "
            f"edit ({KEY_DIGEST} refuses edits).\n# Install: toolkit install {spec.line} --runtime, or "
            f"{install}\n" + draft.read_text()
        )
        checkpoint("runtime-lock:write")
        if pylock:
            os.replace(tmp / pylock.name, pylock)
        os.replace(draft, path)  # last: it names the pylock's sha256
    read_runtime_lock(workspace, spec.line, spec.toolchain.kind)
    return path, pylock


@dataclass(frozen=True)
class RuntimeLock:
    """A runtime lock read back and verified: its custom metadata and its package entries."""

    path: Path
    custom: dict[str, Any]
    packages: tuple[LockedPackage, ...]


def read_runtime_lock(workspace: Workspace, line: str, kind: str | None = None) -> RuntimeLock:
    """The runtime lock of a line of toolchain `kind` (None: the kind it records), after its digest (and a pypi
    line's pylock's sha256) matched and every entry has its strict form (lockfile.locked_packages); one line if
    not."""
    path = runtime_lock_file(workspace, line)
    where, fix = display_path(path), f"toolkit lock {line} --runtime --index URL"
    try:
        document = load_lock_yaml(regular_file_bytes(path, MAX_LOCK_BYTES).decode())
    except YamlAlias:
        raise ToolkitError(
            f"{where}: uses a YAML alias (`toolkit lock` writes none; {fix})"
        ) from None
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
    # runtime locks written before conda lines had them name no kind: pypi
    if (
        not isinstance(document, dict)
        or not isinstance(custom, dict)
        or custom.get(KEY_KIND) != RUNTIME
        or custom.get(KEY_LINE) != line
        or custom.get(KEY_TOOLCHAIN, "pypi") != (kind or custom.get(KEY_TOOLCHAIN, "pypi"))
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
    if custom.get(KEY_TOOLCHAIN, "pypi") == "pypi":
        pylock = runtime_pylock_file(workspace, line)
        if not pylock.is_file() or sha256_file(pylock) != custom.get(KEY_PYLOCK_SHA256):
            raise ToolkitError(
                f"{display_path(pylock)}: missing or not the pylock written with {where} ({fix})"
            )
    return RuntimeLock(path, custom, locked_packages(document, path, fix))


def lock_runtime_command(args: argparse.Namespace, workspace: Workspace, paths: list[Path]) -> int:
    from toolkit.spec.rules import checked_spec

    for path in paths:
        spec = checked_spec(path)
        layers = resolve_runtime(spec, workspace, args.index)
        lock, pylock = write_runtime_lock(spec, workspace, layers)
        taken = (
            ", ".join(w.link.filename for w in layers.wheels) or "none, the line builds no wheel"
        )
        if layers.fa4:
            taken += f"; flash-attn-4 {layers.fa4.lock.release} pinned by {display_path(layers.fa4.path)}"
        written = f"{display_path(lock)}, {display_path(pylock)}" if pylock else display_path(lock)
        counts = {m: sum(e.manager == m for e in layers.entries) for m in ("conda", "pip")}
        what = (
            f"{counts['pip']} wheels"
            if pylock
            else f"{counts['conda']} conda packages, {counts['pip']} wheels"
        )
        print(f"{written}: written ({what}; published: {taken})")
    return 0


# ---------------------------------------------------------------- install


SAFE_PREFIX = re.compile(
    r"/[A-Za-z0-9._+@%=,/-]*"
)  # as toolkit modules takes paths: nothing a shell reads as code


def runtime_prefix(workspace: Workspace, line: str, prefix: Path | None) -> Path:
    """Where `install --runtime` goes (default .envs/<line>-runtime): refused in one line unless a plain path that is
    new, empty or an environment it made before (its MARKER)."""
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
    return prefix


def install_runtime(
    lock: RuntimeLock, line: str, workspace: Workspace, prefix: Path | None, python: Path | None
) -> Path:
    """A venv at prefix (default .envs/<line>-runtime) holding exactly the runtime pylock, by `uv pip sync`
    (`lock`: the line's runtime lock of a pypi line, read and checked)."""
    custom = lock.custom
    pylock = runtime_pylock_file(workspace, line)
    prefix = runtime_prefix(workspace, line, prefix)
    marker = prefix / MARKER
    uv = pypi_lock.uv_executable()
    env = locking_environment()
    if not marker.is_file():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        spec_python = (
            str(python)
            if python
            else shutil.which(f"python{_spec(workspace, line).python}") or "python3"
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


def install_conda_runtime(
    lock: RuntimeLock,
    line: str,
    workspace: Workspace,
    prefix: Path | None,
    args: argparse.Namespace,
) -> Path:
    """A conda prefix (default .envs/<line>-runtime) of the runtime lock (`lock`: a conda line's, read and
    checked), by the line's conda engine: py-rattler from hash-checked archives, built beside the prefix and
    swapped in, or `conda-lock install` in place."""
    from rich.console import Console

    from toolkit.env.engine import InstallJob, choose_engine
    from toolkit.env.install import old_env_aside, replace_prefix, running_platform

    if args.python:
        raise ToolkitError(
            f"--python: {line} is a conda line, whose python comes from "
            f"{display_path(lock.path)} (drop --python)"
        )
    platform = running_platform()
    if not any(p.platform == platform for p in lock.packages):
        raise ToolkitError(
            f"{display_path(lock.path)}: not locked for {platform} (lock the line for it, then "
            f"toolkit lock {line} --runtime --index URL)"
        )
    prefix = runtime_prefix(workspace, line, prefix)
    engine = choose_engine(args.engine, args.conda, Console(stderr=True, highlight=False))
    job = InstallJob(
        lock_file=lock.path,
        platform=platform,
        staging=prefix,
        prefix=prefix,
        conda=tuple(p for p in lock.packages if (p.platform, p.manager) == (platform, "conda")),
        pip=tuple(p for p in lock.packages if (p.platform, p.manager) == (platform, "pip")),
    )
    marker = json.dumps({"lock_sha256": lock.custom[KEY_DIGEST]}) + "\n"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with run_temporaries("install"), locked(prefix):
        if not engine.relocates:
            with old_env_aside(prefix):
                engine.install(job)
                (prefix / MARKER).write_text(marker)
            return prefix
        with owned_dir(prefix.parent, f"runtime-{prefix.name}") as work:
            staging = work / "env"
            staging.mkdir()
            engine.install(replace(job, staging=staging))
            (staging / MARKER).write_text(marker)  # last: a prefix without it is not a finished one
            replace_prefix(staging, prefix)
    return prefix


def _spec(workspace: Workspace, line: str) -> EnvSpec:
    from toolkit.spec.envspec import load_spec

    return load_spec(workspace.spec_file(line))


def install_runtime_command(line: str, args: argparse.Namespace, workspace: Workspace) -> int:
    """The runtime lock is read first (a FIFO, an alias or another lock is refused before anything else is
    read or made); the toolchain kind it records says which installer makes the environment."""
    lock = read_runtime_lock(workspace, line)
    if lock.custom.get(KEY_TOOLCHAIN, "pypi") == "locked":
        prefix = install_conda_runtime(lock, line, workspace, args.prefix, args)
    else:
        prefix = install_runtime(lock, line, workspace, args.prefix, args.python)
    print(
        f"{display_path(prefix)}: runtime environment of {display_path(runtime_lock_file(workspace, line))} "
        f"installed"
    )
    return 0
