"""Lock stage: envs/<line>.yaml -> locks/<line>.conda-lock.yml (conda + pip layers, every platform; a pypi
line's pip layer alone, with its PEP 751 locks/pylock.<line>.toml: toolkit/env/pypi_lock.py).

The file is conda-lock's unified format, as conda-lock's own writer writes it (toolkit/env/lock_document.py),
checked by conda-lock's own models before it is published, so `conda-lock install` and `conda-lock render` read
it. What conda-lock has no field for (the flash-attn sdist pin, the spec's input hash, the line, the toolchain
kind, how each platform's pip layer was resolved) lives in `metadata.custom_metadata` under `fa-envkit.*` keys,
with a digest of the whole file so a hand-edited lock is refused. Reading and checking a lock is
toolkit/env/lockfile.py; the conda solvers (conda-lock CLI, py-rattler) are toolkit/env/engine.py, chosen once
by `--engine`.

Reading a lock needs neither network nor py-rattler: heavy libraries are imported inside functions.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from toolkit.base.arguments import add_lines
from toolkit.base.atomic import checkpoint, clean_stale, owned_dir, run_temporaries
from toolkit.base.digest import sha256_file, sha256_json
from toolkit.base.errors import ToolkitError
from toolkit.base.lazy_console import LazyConsole
from toolkit.base.paths import display_path
from toolkit.base.worker_pool import WorkerPool
from toolkit.base.workspace import DEFAULT, Workspace, add_workspace_options
from toolkit.env import pypi_lock
from toolkit.env.engine import (
    CondaLayer,
    CondaRequest,
    PendingSolve,
    RattlerEngine,
    SolvedConda,
    add_engine_options,
    choose_engine,
    conda_layer,
    locking_environment,
)
from toolkit.env.lock_ahead import Ahead, lock_checker
from toolkit.env.lock_document import LockMetadata, lock_document
from toolkit.env.lockfile import (
    KEY_CUDA,
    KEY_DIGEST,
    KEY_EXCLUDE_NEWER,
    KEY_INPUT_HASH,
    KEY_LINE,
    KEY_PIP_RESOLVER,
    KEY_PYLOCK_SHA256,
    KEY_SDIST_FILENAME,
    KEY_SDIST_SHA256,
    KEY_SDIST_URL,
    KEY_TOOLCHAIN,
    LockedEnv,
    LockedSdist,
    check_with_conda_lock,
    lock_text,
    locked_env,
    pylock_problem,
    read_lock,
    relock_hint,
    sealed,
    stale_reason,
)
from toolkit.env.wheels import target_markers
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.facts import load_knowledge
from toolkit.spec.envspec import EnvSpec, load_spec, resolve_spec_arg, spec_paths

if TYPE_CHECKING:
    from rich.console import Console

    from toolkit.env.wheels import WheelMetadata

# ---------------------------------------------------------------- what the solvers are asked

PYPI_SIMPLE = "https://pypi.org/simple"
CHANNEL_ALIAS = "https://conda.anaconda.org"  # where conda tools look up a channel given by name
SDIST_PROJECT = "flash-attn"
PIP_PYLOCK = "pylock.toml"  # the pip layer as uv's pylock, read for its wheels (uv wants this name)
VIRTUAL_PACKAGES_FILE = Path(__file__).parents[1] / "knowledge" / "virtual_packages.yaml"
console = cast("Console", LazyConsole(stderr=True, highlight=False))


def channel_url(channel: str, relative_to: Path) -> str:
    """A spec's channel entry as conda tools take it: names and URLs as written, paths as file:// URLs.

    Paths start with /, ./, ../ or ~ and are relative to the spec file that lists them."""
    if not channel.startswith(("/", "./", "../", "~")):
        return channel
    return (relative_to / Path(channel).expanduser()).resolve().as_uri()


def virtual_packages(spec: EnvSpec) -> dict[str, dict[str, str]]:
    """The target machines' virtual packages per platform, with __cuda set to the line's CUDA."""
    table = knowledge_files.typed(VIRTUAL_PACKAGES_FILE, lambda data: data["platforms"])
    return {platform: {**table[platform], "__cuda": spec.cuda} for platform in spec.platforms}


def conda_request(spec: EnvSpec) -> CondaRequest:
    base = spec.where("channels").file.parent
    return CondaRequest(
        line=spec.line,
        spec_file=display_path(spec.path),
        channels=tuple(channel_url(c, base) for c in spec.channels),
        platforms=spec.platforms,
        specs=tuple(spec.conda_specs()) if spec.toolchain.kind == "locked" else (),
        virtual_packages=virtual_packages(spec),
    )


# ---------------------------------------------------------------- pip layer


@dataclass
class PipLayer:
    """One platform's pip layer: the hash-pinned requirements file and the lock's pip entries."""

    platform: str
    resolver: str  # how it was resolved, recorded in the lock
    requirements: str  # uv's hash-pinned requirements.txt, for pip-sync
    packages: list[pypi_lock.PipEntry] = field(default_factory=list)
    pylock: str = ""  # a pypi line's layer as PEP 751 pylock.toml (uv's), written beside the lock
    exclude_newer: str = (
        ""  # a pypi line's: the time it was resolved at (uv --exclude-newer), recorded in the lock
    )


@dataclass(frozen=True)
class PipTarget:
    """The interpreter and machine a pip layer is resolved for."""

    platform: str  # linux-64 / linux-aarch64
    python: str  # "3.12" or "3.12.7"
    glibc: str  # "2.28"

    @property
    def machine(self) -> str:
        return {"linux-64": "x86_64", "linux-aarch64": "aarch64"}[self.platform]

    @property
    def python_platform(self) -> str:
        """uv's --python-platform for the target: x86_64-manylinux_2_28."""
        return f"{self.machine}-manylinux_{self.glibc.replace('.', '_')}"

    def markers(self) -> dict[str, str]:
        return target_markers(self.platform, self.python)


def check_index_reachable(index_url: str, spec_file: str) -> None:
    reason = unreachable(index_url)
    if reason is not None:
        raise ToolkitError(
            f"{spec_file}: torch.index {index_url} is unreachable from this machine ({reason}); "
            f"the pip layer needs it: lock on a machine that reaches it (see locks/README.md) "
            f"or set torch.index to a mirror"
        )


@functools.cache
def unreachable(source: str) -> str | None:
    """Why this machine cannot read `source` (a conda channel as conda_request gives it, or an index URL), or
    None where it answers: a host that answers at all (even 404 or 405 to HEAD) is there."""
    import urllib.error
    import urllib.request  # here: http.client and email, a tenth of the lock verb's imports

    if source.startswith("file://"):
        path = Path(urllib.parse.urlparse(source).path)
        return None if path.is_dir() else f"no folder {path}"
    url = source if "://" in source else f"{CHANNEL_ALIAS}/{source}/noarch/repodata.json"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(
                url.rstrip("/") + ("" if "://" not in source else "/"), method="HEAD"
            ),
            timeout=20,
        ):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))


def missing_lock(spec: EnvSpec, workspace: Workspace = DEFAULT) -> str:
    """The one line for a line without a lock: what `toolkit lock LINE` reads and which of it this machine cannot
    reach, so a conda-forge line on a machine without conda-forge hears the cause at once (not after build, install
    and lock each failed on the step before)."""
    path = display_path(workspace.lock_file(spec.line))
    sources = list(conda_request(spec).channels) if spec.toolchain.kind == "locked" else []
    if spec.toolchain.kind != "external":
        sources.append(spec.torch_index)
    lost = [(source, reason) for source in sources if (reason := unreachable(source)) is not None]
    if not lost:
        return f"{path}: missing (run `toolkit lock {spec.line}`)"
    names = ", ".join(source for source, _ in lost)
    return (
        f"{path}: missing, and this machine cannot make it: `toolkit lock {spec.line}` reads {names}, "
        f"unreachable from here ({lost[0][1]}): lock it on a machine that reaches "
        f"{'them' if len(lost) > 1 else 'it'} and commit locks/, or name a mirror in the spec (locks/README.md)"
    )


def lock_pip_requirements(
    requirements: list[str], index_urls: list[str], target: PipTarget, compile_command: str
) -> PipLayer:
    """One platform's pip layer (lock_pip_targets)."""
    return lock_pip_targets(requirements, index_urls, [target], compile_command)[0]


def lock_pip_targets(
    requirements: list[str],
    index_urls: list[str],
    targets: list[PipTarget],
    compile_command: str,
    meanwhile: Callable[[], object] = lambda: None,
) -> list[PipLayer]:
    """Resolve, hash-pin and pick each package's wheel for each platform, by uv whatever runs the toolkit.

    `uv pip compile --python-platform --python-version` resolves for the target from the indexes' metadata (no
    interpreter of the target, no download to hash a file the index gives a hash for), twice from one cache:
    as pylock.toml, whose wheels name each entry's file (pypi_lock.pylock_wheels: the one the target installs,
    as for a pypi line), and as requirements.txt, written beside the lock for pip-sync. Every platform's
    pylock resolves run side by side first (`meanwhile` with them: uv_compile_all's), then the requirements.txt
    ones while this process reads the chosen wheels' metadata (pypi_lock.wheel_metadata_of), whose requirements
    for the target are the entries' dependencies: two resolves at a time, on a machine of two cores, and the
    wheels' reads off the lock's path."""
    uv = pypi_lock.uv_executable()
    options = (
        "--index-strategy",
        "unsafe-best-match",
        "--emit-index-url",
        *_index_args(index_urls),
    )
    with ExitStack() as stack:
        workdirs = [
            stack.enter_context(owned_dir(Path(tempfile.gettempdir()), "pip")) for _ in targets
        ]
        for workdir in workdirs:
            (workdir / "requirements.in").write_text("\n".join(requirements) + "\n")

        def compiles(output: str, form: tuple[str, ...]) -> list[pypi_lock.Compile]:
            return [
                pypi_lock.Compile(
                    workdir, target.python, target.python_platform, (*options, *form), output
                )
                for workdir, target in zip(workdirs, targets)
            ]

        started = time.perf_counter()
        environment = locking_environment()
        with ExitStack() as shown:

            def while_uv_resolves() -> None:
                """What is said (rich's import, at the first line shown), the version the lock records, and
                what reads uv's resolution: once uv runs, not before."""
                meanwhile()
                shown.enter_context(
                    console.status(
                        f"{', '.join(t.platform for t in targets)}: uv is resolving the pip layer"
                    )
                )
                pypi_lock.uv_version(uv)
                pypi_lock.import_readers()

            pypi_lock.uv_compile_all(
                uv,
                compiles(PIP_PYLOCK, ("--format", "pylock.toml")),
                compile_command,
                "uv pip compile",
                environment,
                while_uv_resolves,
            )
            entries: list[list[pypi_lock.PipEntry]] = []
            pypi_lock.uv_compile_all(
                uv,
                compiles("requirements.txt", ()),
                compile_command,
                "uv pip compile",
                environment,
                lambda: entries.extend(pylock_entries(workdirs, targets)),
            )
        layers = []
        for workdir, target, packages in zip(workdirs, targets, entries):
            console.print(
                f"{target.platform}: {len(packages)} pip packages pinned (uv) "
                f"in {time.perf_counter() - started:.1f} s"
            )
            layers.append(
                PipLayer(
                    platform=target.platform,
                    resolver=(
                        f"uv {pypi_lock.uv_version(uv)} (uv pip compile --python-platform "
                        f"{target.python_platform} --python-version {target.python})"
                    ),
                    requirements=(workdir / "requirements.txt").read_text(),
                    packages=packages,
                )
            )
    return layers


def pylock_entries(
    workdirs: list[Path], targets: list[PipTarget]
) -> list[list[pypi_lock.PipEntry]]:
    """Each target's pip entries from uv's pylock.toml in its workdir: the wheels it names and their metadata,
    every platform's read side by side, each file once (a pure-Python wheel is every platform's)."""
    wheels_of = [
        pypi_lock.pylock_wheels(
            (workdir / PIP_PYLOCK).read_text(),
            f"uv's pylock.toml of {target.platform}",
            target.platform,
            target.python,
            target.glibc,
        )
        for workdir, target in zip(workdirs, targets)
    ]
    unique = {w.url: w for wheels in wheels_of for w in wheels}
    metadata_at = dict(
        zip(unique, pypi_lock.wheel_metadata_of(list(unique.values()), workdirs[0] / "wheels"))
    )
    return [
        pip_entries(wheels, [metadata_at[w.url] for w in wheels], target)
        for target, wheels in zip(targets, wheels_of)
    ]


def _index_args(index_urls: list[str]) -> list[str]:
    return [
        "--index-url",
        index_urls[0],
        *[a for url in index_urls[1:] for a in ("--extra-index-url", url)],
    ]


def pip_entries(
    wheels: list[pypi_lock.PylockWheel], metadata: list[WheelMetadata], target: PipTarget
) -> list[pypi_lock.PipEntry]:
    """The chosen wheels -> the lock's pip entries: url + sha256, and as dependencies the locked packages each
    wheel's Requires-Dist names for this platform (with their specifiers; an extra's requirements left out)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    locked_names = {canonicalize_name(m.name) for m in metadata}
    markers = target.markers()
    entries = []
    for wheel, meta in zip(wheels, metadata):
        dependencies: dict[str, str] = {}
        for line in meta.requires:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            if name in locked_names and (
                requirement.marker is None or requirement.marker.evaluate(markers)
            ):
                dependencies[name] = str(requirement.specifier) or "*"
        entries.append(
            pypi_lock.PipEntry(
                canonicalize_name(meta.name),
                meta.version,
                target.platform,
                pip_url(wheel.url),
                wheel.sha256,
                dependencies,
            )
        )
    return entries


def pip_url(url: str) -> str:
    """A wheel's URL as pip's install report wrote it into the locks made before uv picked every layer's files:
    each path segment quoted once (a local version's + as %2B; uv's pylock gives it unquoted)."""
    parts = urllib.parse.urlsplit(url)
    path = urllib.parse.quote(urllib.parse.unquote(parts.path), safe="/@")
    return urllib.parse.urlunsplit(parts._replace(path=path))


def lock_pip_layers(
    spec: EnvSpec,
    targets: list[PipTarget],
    pypi: str = PYPI_SIMPLE,
    meanwhile: Callable[[], object] = lambda: None,
) -> list[PipLayer]:
    """The line's pip layer for each platform: torch from the line's index, the rest from PyPI (or its mirror).
    `meanwhile` runs while uv resolves (lock_layers': the conda layer's lines said)."""
    if spec.toolchain.kind == "external":
        return [
            PipLayer(
                platform=target.platform,
                resolver="none: external toolchain (the machine provides python, "
                "torch and the build dependencies; `toolkit build` checks its fingerprint)",
                requirements="",
            )
            for target in targets
        ]

    def checks() -> None:
        meanwhile()
        check_index_reachable(spec.torch_index, display_path(spec.path))

    layers = lock_pip_targets(
        spec.pip_requirements(),
        [pypi, spec.torch_index],
        targets,
        f"toolkit lock {spec.line}",
        checks,
    )
    return [with_flash_attn_4(spec, layer) if spec.flash_attn_4 else layer for layer in layers]


def lock_pypi_layer(
    spec: EnvSpec,
    workspace: Workspace = DEFAULT,
    as_of: str | None = None,
    meanwhile: Callable[[], object] = lambda: None,
) -> tuple[PipLayer, CondaLayer]:
    """A pypi line's whole environment: its pip layer resolved by uv into pylock.toml from torch.index (PyPI or
    a mirror of it: torch and NVIDIA's wheels both live there), and the empty conda layer the lock format wants.

    `as_of`: the time to resolve at, the one the line's lock records, so that a re-lock gives the lock's wheels
    whatever the index released since; None resolves (and records) now. `meanwhile` runs while uv resolves,
    before the index's reachability is checked (lock_line's sdist pin); should either fail, uv is stopped."""
    if len(spec.platforms) != 1:
        raise ToolkitError(
            f"{spec.where('platforms')}: platforms: a pypi line locks one platform (one pylock.toml; "
            f"list one)"
        )
    platform = spec.platforms[0]
    target = PipTarget(platform, spec.python, virtual_packages(spec)[platform]["__glibc"])
    requirements, constraints = pypi_lock.pypi_inputs(spec, load_knowledge().pypi)
    pylock = workspace.pylock_file(spec.line)
    exclude_newer = as_of or pypi_lock.now_utc()
    started = time.perf_counter()

    def checks() -> None:
        meanwhile()
        check_index_reachable(spec.torch_index, display_path(spec.path))
        pypi_lock.import_readers()

    with owned_dir(Path(tempfile.gettempdir()), "pip") as workdir:
        with console.status(
            f"{platform}: uv is resolving {', '.join(requirements[:2])} (metadata only, no wheel "
            f"is downloaded)"
        ):
            try:
                text, resolver = pypi_lock.compile_pylock(
                    requirements,
                    constraints,
                    target.python,
                    target.python_platform,
                    spec.torch_index,
                    workdir,
                    pylock.name,
                    f"toolkit lock {spec.line}",
                    locking_environment(),
                    exclude_newer,
                    checks,
                )
            except pypi_lock.UvFailed as exc:
                if as_of is None:
                    raise
                raise ToolkitError(
                    f"{exc} (resolved as of {as_of}, the time {display_path(workspace.lock_file(spec.line))} "
                    f"records: `toolkit lock {spec.line} --update` resolves against the index as it is "
                    f"now)"
                ) from None
    packages = pypi_lock.pylock_entries(
        text, display_path(pylock), platform, target.python, target.glibc
    )
    console.print(
        f"{platform}: {len(packages)} wheels pinned (uv) in {time.perf_counter() - started:.1f} s"
    )
    inputs = sha256_json(
        {"requirements": requirements, "constraints": constraints, "index": spec.torch_index}
    )
    return (
        PipLayer(
            platform=platform,
            resolver=resolver,
            requirements="",
            packages=packages,
            pylock=text,
            exclude_newer=exclude_newer,
        ),
        CondaLayer(entries=(), content_hash={platform: inputs}, channels=()),
    )


def with_flash_attn_4(
    spec: EnvSpec, layer: PipLayer, files_of: Callable[[str], list[dict]] | None = None
) -> PipLayer:
    """The layer plus FlashAttention-4's exact wheels (knowledge/flash_attn_4.yaml, the line's CUDA-major flavor of
    nvidia-cutlass-dsl), each with its index URL and pinned sha256. They are not resolved: the meta package
    requires libs-cu12 even on CUDA 13, and every installer of this lock installs pip entries with --no-deps.
    An `if_missing` pin the layer already has is left to the layer's version."""
    from packaging.utils import canonicalize_name

    from toolkit.env import fa4_lock
    from toolkit.knowledge import fa4_pins
    from toolkit.spec import fa4 as fa4_rules

    assert spec.flash_attn_4 is not None
    rel = fa4_pins.release(spec.flash_attn_4.version)
    unpinned = fa4_rules.platforms_pinned(
        spec, None
    )  # `toolkit check` refuses it first; a spec given directly too
    if unpinned:
        raise ToolkitError(f"{spec.where('platforms')}: {unpinned}")
    have = {canonicalize_name(p.name): p.version for p in layer.packages}
    entries = fa4_lock.lock_entries(rel, spec.cuda.split(".")[0], files_of or fa4_lock.pypi_files)
    added = []
    for entry in entries:
        name = canonicalize_name(entry["name"])
        if name in have:
            if entry["if_missing"]:
                continue
            raise ToolkitError(
                f"{spec.where('flash_attn_4')}: the pip layer already pins {name} {have[name]} and "
                f"flash-attn-4 {rel.version} pins {entry['version']} (one of them must give way)"
            )
        added.append(
            pypi_lock.PipEntry(
                name, entry["version"], layer.platform, entry["url"], entry["sha256"]
            )
        )
    resolver = f"{layer.resolver}; + flash-attn-4 {rel.version}: {len(added)} pinned wheels (knowledge, not resolved)"
    return replace(layer, packages=[*layer.packages, *added], resolver=resolver)


# ---------------------------------------------------------------- flash-attn sdist


def fetch_sdist_pin(version: str, index: str = PYPI_SIMPLE) -> LockedSdist:
    """flash-attn's source archive for a version, from PyPI's JSON simple API (PEP 691). Run in a thread of
    its own while the line solves: its imports too."""
    import urllib.error
    import urllib.request

    from packaging.utils import InvalidSdistFilename, parse_sdist_filename
    from packaging.version import Version

    url = f"{index.rstrip('/')}/{SDIST_PROJECT}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            kind = response.headers.get_content_type()
            if not kind.endswith(
                "json"
            ):  # a PEP 503 mirror serves only HTML, whatever Accept asks for
                raise ToolkitError(
                    f"--pypi {index}: {url} answered {kind}, not PyPI's JSON simple API (PEP 691, "
                    f"application/vnd.pypi.simple.v1+json), which the sdist pin reads: give a mirror "
                    f"that serves it, or leave --pypi out (PyPI does)"
                )
            files = json.load(response)["files"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, RecursionError) as exc:
        raise ToolkitError(
            f"{url}: cannot read flash-attn's release files ({getattr(exc, 'reason', exc)}; "
            f"the sdist pin needs PyPI: lock where PyPI is reachable)"
        ) from None
    for entry in files:
        try:
            _, sdist_version = parse_sdist_filename(entry["filename"])
        except InvalidSdistFilename:
            continue
        if (
            sdist_version == Version(version)
            and not entry.get("yanked")
            and entry["hashes"].get("sha256")
        ):
            return LockedSdist(
                url=urllib.parse.urljoin(url, entry["url"]),
                filename=entry["filename"],
                sha256=entry["hashes"]["sha256"],
            )
    raise ToolkitError(f"{url}: no sdist of flash-attn {version} (check flash_attn_2.version)")


# ---------------------------------------------------------------- writing the lock


def lock_header(spec: EnvSpec, sources: list[str]) -> str:
    return (
        f"# fa-envkit lock of {sources[0]} in conda-lock's unified format "
        f"(conda-lock install/render read it).\n"
        f"# Written by `toolkit lock {spec.line}`; do not edit (metadata.custom_metadata."
        f"{KEY_DIGEST} refuses edits).\n"
        f"# Install: toolkit install {spec.line} --prefix DIR\n"
    )


def write_staged(path: Path, text: str) -> None:
    """One of the lock's files written in its staging folder; a full disk (or a quota) is one line: nothing was
    published yet, the lock's files are as they were."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise ToolkitError(
            f"{display_path(path)}: cannot write it ({exc.strerror or exc}); the lock's files are left as "
            f"they were: free some space and lock again"
        ) from None


def write_lock(
    spec: EnvSpec,
    conda: CondaLayer | SolvedConda,
    pip_layers: list[PipLayer],
    sdist: LockedSdist,
    workspace: Workspace = DEFAULT,
    check: Callable[[Path, dict], Callable[[], object]] | None = None,
) -> Path:
    """Assemble and write the lock (and its requirements files): temp files, the lock's document checked by
    conda-lock's own models and as every reader checks a lock (locked_env), then renamed. `check` starts the
    first and gives what waits for it: lock_line's is its checker's copy (Prefork.begin), which checks while
    this process writes the text; None: check_with_conda_lock runs here when waited for."""
    locks_dir = workspace.locks
    locks_dir.mkdir(parents=True, exist_ok=True)
    custom = {
        KEY_LINE: spec.line,
        KEY_INPUT_HASH: spec.input_hash(),
        KEY_TOOLCHAIN: spec.toolchain.kind,
        KEY_SDIST_URL: sdist.url,
        KEY_SDIST_FILENAME: sdist.filename,
        KEY_SDIST_SHA256: sdist.sha256,
    }
    custom.update({KEY_PIP_RESOLVER + layer.platform: layer.resolver for layer in pip_layers})
    pylocks = [layer.pylock for layer in pip_layers if layer.pylock]
    if spec.toolchain.kind == "pypi":
        custom[KEY_CUDA] = spec.cuda
        custom[KEY_EXCLUDE_NEWER] = pip_layers[0].exclude_newer  # one: a pypi line has one platform
    sources = [os.path.relpath(p.resolve(), locks_dir.resolve()) for p in spec.chain]
    path = workspace.lock_file(spec.line)
    check_destinations(lock_destinations(spec, workspace))
    with owned_dir(locks_dir, "lock") as tmp:
        draft = tmp / path.name
        staged = []
        for text in pylocks:  # one: a pypi line has one platform
            target = workspace.pylock_file(spec.line)
            write_staged(tmp / target.name, text)
            custom[KEY_PYLOCK_SHA256] = sha256_file(tmp / target.name)
            staged.append((tmp / target.name, target))
        solved = conda_layer(conda)
        document = sealed(
            lock_document(
                [
                    *solved.entries,
                    *(entry.entry() for layer in pip_layers for entry in layer.packages),
                ],
                LockMetadata(
                    solved.content_hash, solved.channels, spec.platforms, tuple(sources), custom
                ),
            )
        )
        checked = (
            check(draft, document)
            if check
            else functools.partial(check_with_conda_lock, draft, document)
        )
        # the document is what its text parses back to (plain data through PyYAML's emitter: each test that
        # reads a written lock checks its digest, made of the document, against the parse)
        write_staged(draft, lock_header(spec, sources) + lock_text(document))
        checked()
        locked_env(draft, document)  # what a reader checks of every lock
        for layer in pip_layers:
            if layer.requirements:
                target = workspace.requirements_file(spec.line, layer.platform)
                write_staged(tmp / target.name, layer.requirements)
                staged.append((tmp / target.name, target))
        checkpoint("lock:write")
        publish_together(
            [*staged, (draft, path)], tmp / "kept"
        )  # the lock last: it says the others are current
    return path


def lock_destinations(spec: EnvSpec, workspace: Workspace) -> list[Path]:
    """Every file `toolkit lock` writes for the line: its requirements files or pylock, and the lock."""
    if spec.toolchain.kind == "pypi":
        return [workspace.pylock_file(spec.line), workspace.lock_file(spec.line)]
    return [
        *(workspace.requirements_file(spec.line, platform) for platform in spec.platforms),
        workspace.lock_file(spec.line),
    ]


def check_destinations(targets: list[Path]) -> None:
    """Refuse, before anything is published, a destination that is not a file (a folder): found only when
    renaming onto it, the files renamed before it would be new and it old."""
    for target in targets:
        if target.exists() and not target.is_file():
            raise ToolkitError(
                f"{display_path(target)}: is not a file (a folder?), and `toolkit lock` writes there: "
                f"move it away and lock again (nothing was written)"
            )


def publish_together(moves: list[tuple[Path, Path]], kept: Path) -> None:
    """Rename each staged file onto its destination, in order; should one rename fail, the destinations already
    replaced get their old files back (copies kept in `kept`), so a lock never names files it did not write."""
    kept.mkdir()
    done: list[Path] = []
    try:
        for source, target in moves:
            if target.is_file():
                shutil.copy2(target, kept / target.name)
            os.replace(source, target)
            done.append(target)
    except OSError as exc:
        for target in done:
            if (kept / target.name).exists():
                os.replace(kept / target.name, target)
            else:
                target.unlink()
        failed = moves[len(done)][1]
        raise ToolkitError(
            f"{display_path(failed)}: cannot write it ({exc.strerror or exc}); the lock's files are "
            f"left as they were: lock again"
        ) from None


# ---------------------------------------------------------------- the `lock` verb


def lock_line(
    spec: EnvSpec,
    backend: str = "auto",
    conda_exe: str | None = None,
    workspace: Workspace = DEFAULT,
    force: bool = False,
    pypi: str = PYPI_SIMPLE,
    update: bool = False,
    ahead: Ahead | None = None,
) -> tuple[Path, bool]:
    """Lock one line unless its lock is current; returns (lock path, whether it was written).

    A pypi line is resolved as of the time its lock records (none: now), unless `update`: now. `ahead`: what
    the caller forked before it read the spec (forked_ahead); ended here, used or not. None: forked here."""
    ahead = ahead or forked_ahead(backend, conda_exe)
    try:
        return _lock_line(spec, backend, conda_exe, workspace, force, pypi, update, ahead)
    finally:
        ahead.cancel()  # what still waits: the lock was current, or something failed before it was written


def _lock_line(
    spec: EnvSpec,
    backend: str,
    conda_exe: str | None,
    workspace: Workspace,
    force: bool,
    pypi: str,
    update: bool,
    ahead: Ahead,
) -> tuple[Path, bool]:
    path = workspace.lock_file(spec.line)
    locked = None
    current = False
    # read where it decides something: whether the lock is current, or the time a pypi line resolves at
    if path.exists() and (not (force or update) or (spec.toolchain.kind == "pypi" and not update)):
        try:
            locked = read_lock(path)
            current = (
                not (force or update)
                and stale_reason(spec, locked) is None
                and pylock_problem(locked) is None
                and pylock_disagreement(spec, locked) is None
            )
        except ToolkitError:
            pass
    if current:
        return path, False
    check_destinations(lock_destinations(spec, workspace))
    # a conda line's solve starts first, in the solver forked ahead (else forked now, while this process has
    # one thread); the sdist pin, a request to PyPI, is read while it solves or uv resolves
    request = conda_request(spec) if spec.toolchain.kind != "pypi" else None
    engine = choose_engine(backend, conda_exe, console)
    solving = engine.start_solve(request, ahead.solver) if request else None
    try:
        with WorkerPool(1) as pool:
            pin = pool.submit(fetch_sdist_pin, spec.flash_attn_version, pypi)
            try:
                conda, pip_layers = lock_layers(
                    spec, request, solving, workspace, pypi, update, locked, pin.result
                )
            except ToolkitError:
                pin.result()  # its error first, as when the pin was read before the layers
                raise
            sdist = pin.result()
        return write_lock(spec, conda, pip_layers, sdist, workspace, ahead.checker.begin), True
    finally:
        if solving is not None:
            solving.cancel()  # a solve still running when something else failed


def forked_ahead(backend: str, conda_exe: str | None, early: Ahead | None = None) -> Ahead:
    """What lock_line takes: `early`, forked by the entry (lock_ahead.forked_early), with its py-rattler solver
    ended where the engine is another (whose own solver, if any, is forked now); None: both forked now, while
    this process has one thread (else each runs in a worker interpreter, or not ahead)."""
    engine = choose_engine(backend, conda_exe, console)
    if early is None:
        return Ahead(engine.solver(), lock_checker())
    if early.solver is not None and not isinstance(engine, RattlerEngine):
        early.solver.cancel()
        return Ahead(engine.solver(), early.checker)
    return early


def lock_layers(
    spec: EnvSpec,
    request: CondaRequest | None,
    solving: PendingSolve | None,
    workspace: Workspace,
    pypi: str,
    update: bool,
    locked: LockedEnv | None,
    sdist_pinned: Callable[[], object],
) -> tuple[CondaLayer | SolvedConda, list[PipLayer]]:
    """The line's conda layer and each platform's pip layer (lock_line's arguments; `request` and `solving`: a
    conda line's request and its solve, started; `locked`: its lock, if any). `sdist_pinned` waits for the sdist
    pin (its error raised), before anything is said of a layer: a pypi line's while uv resolves, a conda line's
    before the solve's result (said by the engine)."""
    if spec.toolchain.kind == "pypi":
        layer, empty = lock_pypi_layer(
            spec,
            workspace,
            None if update or locked is None else locked.exclude_newer or None,
            sdist_pinned,
        )
        return empty, [layer]
    # lock_line's, for every line with a conda layer
    assert request is not None and solving is not None
    sdist_pinned()
    pythons = solving.pythons()
    glibc = {platform: values["__glibc"] for platform, values in request.virtual_packages.items()}
    pip_layers = lock_pip_layers(
        spec,
        [
            PipTarget(platform, pythons.get(platform, spec.python), glibc[platform])
            for platform in spec.platforms
        ],
        pypi,
        solving.said,  # the solve's lines, said once uv runs
    )
    return solving.layer(), pip_layers


def pylock_disagreement(spec: EnvSpec, locked: LockedEnv) -> str | None:
    """Why a pypi lock's pip entries are not the wheels its pylock.<line>.toml names for the line's target (name,
    version, url, sha256), or None (other kinds). The pylock's sha256 in the lock says the file is the one
    written with it, not that the entries are still what was read from it: one deleted, added or edited, and
    the lock's digest recomputed, is found here."""
    if locked.toolchain_kind != "pypi":
        return None
    platform = locked.platforms[0]
    pylock = Workspace(locks=locked.path.parent).pylock_file(locked.line)
    wheels = pypi_lock.pylock_wheels(
        pylock.read_text(),
        display_path(pylock),
        platform,
        spec.python,
        virtual_packages(spec)[platform]["__glibc"],
    )
    in_pylock = {(w.name, w.version, w.url, w.sha256) for w in wheels}
    in_lock = {(p.name, p.version, p.url, p.sha256) for p in locked.packages_for(platform, "pip")}
    only = sorted((entry, display_path(locked.path)) for entry in in_lock - in_pylock) + sorted(
        (entry, display_path(pylock)) for entry in in_pylock - in_lock
    )
    if not only:
        return None
    (name, version, url, _), where = only[0]
    return (
        f"{display_path(locked.path)}: its pip entries are not the wheels of {display_path(pylock)}: {name} "
        f"{version} ({url.rsplit('/', 1)[-1]}) is only in {where} (an entry was deleted, added or edited after "
        f"locking: {relock_hint(locked.path)})"
    )


def check_locks(specs: list[EnvSpec], workspace: Workspace) -> list[str]:
    """One line per lock that is missing or does not match its spec."""
    problems = []
    for spec in specs:
        path = workspace.lock_file(spec.line)
        if not path.exists():
            problems.append(missing_lock(spec, workspace))
            continue
        try:
            locked = read_lock(path)
            reason = stale_reason(spec, locked)
            problem = (
                None if reason else pylock_problem(locked) or pylock_disagreement(spec, locked)
            )
        except ToolkitError as exc:
            problems.append(str(exc))
            continue
        if reason:
            problems.append(f"{display_path(path)}: stale: {reason}")
        elif problem:
            problems.append(problem)
    return problems


def newer_than_lock(spec: EnvSpec, workspace: Workspace) -> str:
    """Advisory, one line: which of a pypi lock's packages a resolve as of now gives at other versions. Kept out
    of `--check` and the tests: a lock stays correct while its index moves on; updating it is a decision."""
    path = workspace.lock_file(spec.line)
    if spec.toolchain.kind != "pypi":
        return f"{display_path(path)}: not a pypi line (its layers are not resolved as of a time): not checked"
    locked = read_lock(path)
    with run_temporaries("lock"):
        layer, _ = lock_pypi_layer(spec, workspace)
    was = {p.name: p.version for p in locked.packages}
    now = {p.name: p.version for p in layer.packages}
    changes = [
        f"{name} {was.get(name, '(none)')} -> {now.get(name, '(none)')}"
        for name in sorted(was.keys() | now.keys())
        if was.get(name) != now.get(name)
    ]
    since = locked.exclude_newer or "its making (it records no time)"
    if not changes:
        return f"{display_path(path)}: no newer release of its packages on the index since {since}"
    return (
        f"{display_path(path)}: advisory: since {since} the index resolves {', '.join(changes)} "
        f"(`toolkit lock {spec.line} --update` takes them)"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lock",
        description="Solve each line's conda layer (conda-lock CLI where micromamba/mamba/conda is on PATH, "
        "else embedded py-rattler) and pip layer (uv pip compile for the platform and python) for "
        "every platform of its spec, pin the flash-attn sdist, and write locks/<line>.conda-lock.yml "
        "plus, for a locked line (conda and pip layers), locks/<line>.<platform>.requirements.txt. A pypi line "
        "(toolchain kind pypi) has no conda layer and no requirements.txt: uv resolves its wheels from "
        "metadata into the lock and locks/pylock.<line>.toml. An external line's lock holds only the "
        "sdist pin. A lock whose inputs are unchanged is kept.",
    )
    add_lines(parser)
    parser.add_argument("--all", action="store_true", help="every line in envs/")
    parser.add_argument(
        "--check",
        action="store_true",
        help="only say which locks are missing, stale or broken (exit 1 if any)",
    )
    add_engine_options(parser)
    parser.add_argument(
        "--force", action="store_true", help="re-solve even when the lock is current"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="resolve a pypi line against its index as it is now (default: as of the time its lock "
        "records, so that a re-lock gives the same wheels)",
    )
    parser.add_argument(
        "--newer",
        action="store_true",
        help="advisory: name the packages of each pypi line's lock that its index has newer releases "
        "of since the lock's time (resolves as of now; writes nothing; exit 0)",
    )
    parser.add_argument(
        "--pypi",
        metavar="URL",
        default=PYPI_SIMPLE,
        help=f"PyPI's simple index or a site mirror of it, for the sdist pin and the pip layer "
        f"(default: {PYPI_SIMPLE})",
    )
    parser.add_argument(
        "--runtime",
        action="store_true",
        help="a line's runtime lock (torch and the published flash-attn/FA3 wheels of --index, a conda "
        "line's conda layer, no build-only package): locks/<line>.runtime.conda-lock.yml and, for "
        "a pypi line, locks/pylock.<line>-runtime.toml",
    )
    parser.add_argument(
        "--index", metavar="URL", help="with --runtime: the index `toolkit publish --to` wrote"
    )
    add_workspace_options(parser)
    parser.set_defaults(func=lock_command, ahead=None)


def lock_command(args: argparse.Namespace) -> int:
    """`args.ahead`: py-rattler's solver and the checker, forked by the entry before this module was imported
    (cli.VERBS, lock_ahead.forked_early), taken by the first spec locked; the entry ends them, used or not."""
    workspace = Workspace.from_args(args)
    paths = [resolve_spec_arg(s, workspace) for s in args.lines] or (
        spec_paths(workspace.envs) if args.all or args.check else []
    )
    if not paths:
        raise ToolkitError("toolkit lock: name a line (e.g. cu126), or pass --all or --check")
    if (
        args.runtime
    ):  # cache/runtime_lock.py's, set by toolkit/cli.py: it reads a published index (a higher wing)
        return args.runtime_command(args, workspace, paths)
    if args.newer:
        for path in paths:
            print(newer_than_lock(load_spec(path), workspace))
        return 0
    if args.check:
        problems = check_locks([load_spec(p) for p in paths], workspace)
        for line in problems:
            print(line)
        if not problems:
            print(
                f"{len(paths)} line{'s' if len(paths) != 1 else ''} checked: every lock is current"
            )
        return 1 if problems else 0
    clean_stale(workspace.locks)  # what earlier interrupted runs left
    with run_temporaries("lock"):
        return lock_paths(paths, args, workspace)


def lock_paths(paths: list[Path], args: argparse.Namespace, workspace: Workspace) -> int:
    """Lock each spec; with several, a failing one is reported and the others still locked."""
    from toolkit.spec.rules import checked_spec

    failed = 0
    early = args.ahead
    for path in paths:
        # before the spec is read: their imports run meanwhile
        ahead = forked_ahead(args.engine, args.conda, early)
        early = None
        try:
            written, changed = lock_line(
                checked_spec(path),
                args.engine,
                args.conda,
                workspace,
                args.force,
                args.pypi,
                args.update,
                ahead,
            )
        except ToolkitError as exc:
            if len(paths) == 1:
                raise
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
            continue
        finally:
            ahead.cancel()  # a spec refused before lock_line took it (which ends it otherwise)
        print(
            f"{display_path(written)}: {'written' if changed else 'up to date (inputs unchanged)'}"
        )
    return 1 if failed else 0
