"""`toolkit modules`: every installed line as an Lmod and a Tcl (Environment Modules) modulefile.

On a cluster users type `module load flash-attn/2.8.3.post2-cu126-torch2.9-py312` instead of activating
an environment. This is the last stage: it reads what earlier stages left on disk (the installed conda
prefix or pypi line's venv, or the external interpreter the wheel was installed into; the lock; the build record), checks
every value that will land in a modulefile against a strict pattern (a spec field must never become
Lua, Tcl or shell code), and renders toolkit/site/templates/modulefile.{lua,tcl}. Same inputs, same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import textwrap
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from string import Template

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from toolkit.attention.recommend import Recommendation, read_if_any, summary
from toolkit.base.arguments import add_lines, add_prefix
from toolkit.base.atomic import write_atomic
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.workspace import DEFAULT, Workspace, add_workspace_options
from toolkit.build.record import BuildRecord
from toolkit.build.wheelhouse import records
from toolkit.env.lockfile import LockedEnv, read_lock
from toolkit.env.pypi_install import site_packages
from toolkit.knowledge.facts import load_knowledge, minor_of
from toolkit.machine import line_env
from toolkit.spec.envspec import EnvSpec, resolve_spec_arg, spec_paths
from toolkit.spec.rules import checked_spec

TEMPLATES = Path(__file__).parent / "templates"
PACKAGE = "flash-attn"
# Both module systems export LMOD_FAMILY_<NAME>, so the family must be a shell name (not flash-attn).
FAMILY = "flash_attn"
DEFAULT_NAMING = "flash-attn/{flash_attn}-{cuda_tag}-torch{torch_minor}-py{python_nodot}"
NAMING_FIELDS = (
    "line",
    "flash_attn",
    "cuda",
    "cuda_tag",
    "torch",
    "torch_minor",
    "python",
    "python_nodot",
)
PYPI_PAGE = "https://pypi.org/project/{}/"
PYPI_NVCC = "nvidia-cuda-nvcc"  # the wheel whose version is a pypi line's nvcc's (13.0.88), as cuda-nvcc's is conda's
METADATA_LIMIT = (
    16 << 20
)  # a dist-info file: torch's METADATA is about 50 KB, a long README as description < 1 MB

# What may reach a modulefile. None of these admits a quote, backslash, $, backtick, bracket, brace,
# newline or (in paths) a colon: nothing Lua, Tcl or a shell would read as code or as a second PATH entry.
SAFE = {
    "name": (
        r"[A-Za-z0-9_][A-Za-z0-9._+-]*",
        "a name of letters, digits and ._+- (not starting with . or -)",
    ),
    "module": (
        r"[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*",
        "a module name like cuda/12.6",
    ),
    "path": (r"/[A-Za-z0-9._+@%=,/-]*", "an absolute path of letters, digits and ._+@%=,/- only"),
    "text": (
        r"[A-Za-z0-9 ._,:;()/+=@%<>!?&*~^#-]*",
        "plain text without quotes, backslashes, $, backticks, brackets or newlines",
    ),
    "url": (
        r"https?://[A-Za-z0-9._~:/?#@&+,=%-]+",
        "an http(s) URL without quotes, brackets or spaces",
    ),
    "sha256": (r"[0-9a-f]{64}", "a sha256 (64 lowercase hex digits)"),
    "arch": (r"\d{2,3}[af]?", "an sm number like 90 or 90a"),
    "timestamp": (r"\d{4}-\d\d-\d\d[T ][0-9:.]+(Z|[+-]\d\d:?\d\d)?", "an ISO 8601 time"),
}


class NotInstalled(ToolkitError):
    """A line with nothing installed: skipped when publishing every line, an error when named.
    `has_environment`: its environment is there and lacks flash-attn (or torch), as opposed to no environment."""

    def __init__(self, message: str, has_environment: bool = True) -> None:
        super().__init__(message)
        self.has_environment = has_environment


def safe(kind: str, value: object, where: object, field: str) -> str:
    """`value` if it matches the SAFE pattern of `kind`, else a one-line error naming file and field."""
    pattern, hint = SAFE[kind]
    if (
        isinstance(value, bool)
        or not isinstance(value, (str, int))
        or not re.fullmatch(pattern, str(value))
    ):
        raise ToolkitError(
            f"{where}: {field}: {value!r} is not {hint} "
            f"(it would be written into a modulefile; fix the value)"
        )
    return str(value)


def safe_path(path: Path | str, where: object, field: str) -> str:
    """An absolute, normalised path (symlinks kept: sites publish their stable names), checked."""
    return safe("path", os.path.abspath(path), where, field)


# ---------------------------------------------------------------- what is installed


@dataclass(frozen=True)
class InstalledEnv:
    """What one line's environment provides, read from disk rather than from the spec."""

    kind: str  # "locked": a conda prefix; "pypi": the line's venv; "external": the toolchain's own interpreter
    prefix: str  # the conda prefix, the venv, or sys.prefix of the external interpreter
    bin_dir: str
    site_dir: str  # where flash-attn is installed
    target: str | None  # a --target site dir the interpreter would not search by itself
    man_dir: str | None
    venv: bool  # a pypi line's venv, or an external interpreter that is one (VIRTUAL_ENV applies)
    cuda_home: str  # the conda prefix (conda's nvcc and CUDA headers live there), the venv's nvidia/cu13, or the
    # toolchain's CUDA_HOME
    python: str
    cuda: str
    torch: str
    flash_attn: str
    url: str


def conda_packages(prefix: Path) -> dict[str, str]:
    """name -> version from conda-meta/*.json, the record conda keeps of every installed package."""
    found: dict[str, str] = {}
    for record_path in sorted((prefix / "conda-meta").glob("*.json")):
        record = read_json(record_path, "conda-meta record", "reinstall the environment")
        if not isinstance(record, dict) or not all(
            isinstance(record.get(k), str) for k in ("name", "version")
        ):
            raise ToolkitError(
                f"{record_path}: conda-meta record without name and version "
                f"(reinstall the environment)"
            )
        found[record["name"]] = record["version"]
    return found


class BoundedDistribution(metadata.PathDistribution):
    """importlib's view of one *.dist-info (or egg-info) whose files, METADATA first, are read as the input
    they are: a FIFO there would block `toolkit modules` for ever and a link to /dev/zero fill its memory, so
    such a file is refused in one line naming it (bounded_read); what importlib passes over (a missing or
    unreadable file, a folder) reads as nothing."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.folder = path

    def read_text(self, filename: str | os.PathLike[str]) -> str | None:
        path = self.folder / filename
        try:
            return regular_file_bytes(path, METADATA_LIMIT).decode("utf-8", errors="replace")
        except Unreadable as exc:
            if exc.why == "large" or exc.why == "special" and exc.detail != "a directory":
                kind = exc.detail or f"larger than {METADATA_LIMIT >> 20} MiB"
                raise ToolkitError(
                    f"{display_path(path)}: {kind}, not an installed package's metadata (remove it, "
                    f"or reinstall that package)"
                ) from None
            return None


def pip_distributions(site_dirs: list[Path]) -> dict[str, list[metadata.Distribution]]:
    """Normalised project name -> the *.dist-info found for it in these site dirs, read bounded."""
    found: dict[str, list[metadata.Distribution]] = {}
    for listed in metadata.distributions(path=[str(d) for d in site_dirs]):
        folder = getattr(listed, "_path", None)  # a path finder's (PathDistribution's) own folder
        if folder is None:
            continue
        dist = BoundedDistribution(Path(folder))
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), []).append(dist)
    return found


def one_distribution(
    dists: dict[str, list[metadata.Distribution]], name: str, where: Path
) -> metadata.Distribution | None:
    """The one installed copy of a project; two copies make `import` ambiguous, so refuse them."""
    copies = dists.get(canonicalize_name(name), [])
    if len({d.version for d in copies}) > 1:
        versions = ", ".join(sorted({d.version for d in copies}))
        raise ToolkitError(
            f"{where}: {name} is installed more than once ({versions}; uninstall all but one)"
        )
    return copies[0] if copies else None


def project_url(dist: metadata.Distribution, where: Path) -> str:
    """The project's home page as its own metadata gives it, else its PyPI page."""
    urls = [
        *(dist.metadata.get_all("Home-page") or []),
        *(u.split(",", 1)[-1].strip() for u in dist.metadata.get_all("Project-URL") or []),
    ]
    url = next((u for u in urls if u and u != "UNKNOWN"), PYPI_PAGE.format(PACKAGE))
    return safe("url", url, where, f"{PACKAGE} metadata Home-page")


def not_installed(spec: EnvSpec, found: line_env.LineEnvironment) -> NotInstalled:
    """A locked or pypi line's prefix that holds no environment, with the install that makes one there."""
    return NotInstalled(
        f"{display_path(found.root or Path('.'))}: no environment "
        f"here (run `{found.install_command(spec.line)}`, or pass --env-root/--prefix where it is)",
        has_environment=False,
    )


def installed_flash_attn(
    dists: dict[str, list[metadata.Distribution]], site: Path, line: str
) -> metadata.Distribution:
    """The line's flash-attn distribution in site-packages, or NotInstalled saying where its wheel is."""
    flash_attn = one_distribution(dists, PACKAGE, site)
    if flash_attn is None:
        raise NotInstalled(
            f"{site}: {PACKAGE} is not installed (pip install the wheel from "
            f"{Workspace.wheelhouse}/{line}/ into this environment)"
        )
    return flash_attn


def read_conda_prefix(spec: EnvSpec, found: line_env.LineEnvironment) -> InstalledEnv:
    """A locked line: the conda prefix `toolkit install` made, with flash-attn pip-installed into it."""
    prefix = found.root or Path(".")
    prefix_text = safe_path(prefix, "--env-root/--prefix", "environment prefix")
    if not (prefix / "conda-meta").is_dir():
        raise not_installed(spec, found)
    conda = conda_packages(prefix)
    sites = sorted(prefix.glob("lib/python3*/site-packages"))
    if len(sites) != 1:
        raise ToolkitError(
            f"{prefix_text}: expected one lib/python3.X/site-packages, found {len(sites)} "
            f"(reinstall with `toolkit install {spec.line}`)"
        )
    site = sites[0]
    dists = pip_distributions([site])
    flash_attn = installed_flash_attn(dists, site, spec.line)
    torch = one_distribution(dists, "torch", site)  # the lock's pip layer installs torch
    if torch is None:
        raise ToolkitError(
            f"{prefix_text}: torch is not installed (reinstall with `toolkit install {spec.line}`)"
        )
    man_dir = prefix / "share" / "man"
    meta = prefix / "conda-meta"
    return InstalledEnv(
        kind="locked",
        prefix=prefix_text,
        bin_dir=safe_path(prefix / "bin", prefix_text, "bin"),
        site_dir=safe_path(site, prefix_text, "site-packages"),
        target=None,
        man_dir=safe_path(man_dir, prefix_text, "share/man") if man_dir.is_dir() else None,
        venv=False,
        cuda_home=prefix_text,
        python=safe(
            "name",
            conda.get("python") or site.parent.name.removeprefix("python"),
            meta,
            "python version",
        ),
        cuda=safe(
            "name",
            conda.get("cuda-nvcc") or conda.get("cuda-version") or spec.cuda,
            meta,
            "cuda-nvcc version",
        ),
        torch=safe("name", torch.version, site, "torch version"),
        flash_attn=safe("name", flash_attn.version, site, f"{PACKAGE} version"),
        url=project_url(flash_attn, site),
    )


def pyvenv_version(root: Path) -> str | None:
    """The interpreter's X.Y.Z a venv records in pyvenv.cfg (`version`, or `version_info` before 3.11)."""
    config = root / "pyvenv.cfg"
    pairs = [
        line.partition("=")
        for line in (config.read_text(errors="replace").splitlines() if config.is_file() else [])
    ]
    values = {key.strip(): value.strip() for key, _, value in pairs}
    return values.get("version") or values.get("version_info")


def read_pypi_venv(spec: EnvSpec, found: line_env.LineEnvironment) -> InstalledEnv:
    """A pypi line: the venv `toolkit install` made from the lock's wheels, flash-attn pip-installed into it;
    CUDA_HOME and the layout are line_env's (site-packages/nvidia/cu13), the host compiler the machine's."""
    if found.missing or found.root is None or found.cuda_home is None:
        raise not_installed(spec, found)
    prefix_text = safe_path(found.root, "--env-root/--prefix", "environment prefix")
    site = site_packages(found.root, spec.python)
    if not site.is_dir():
        raise ToolkitError(
            f"{prefix_text}: no {display_path(site)} (reinstall with `{found.install_command(spec.line)}`)"
        )
    dists = pip_distributions([site])
    flash_attn = installed_flash_attn(dists, site, spec.line)
    torch = one_distribution(dists, "torch", site)
    if torch is None:
        raise ToolkitError(
            f"{prefix_text}: torch is not installed (reinstall with `{found.install_command(spec.line)}`)"
        )
    nvcc = one_distribution(dists, PYPI_NVCC, site)
    man_dir = found.root / "share" / "man"
    return InstalledEnv(
        kind="pypi",
        prefix=prefix_text,
        bin_dir=safe_path(found.root / "bin", prefix_text, "bin"),
        site_dir=safe_path(site, prefix_text, "site-packages"),
        target=None,
        man_dir=safe_path(man_dir, prefix_text, "share/man") if man_dir.is_dir() else None,
        venv=True,
        cuda_home=safe_path(found.cuda_home, prefix_text, "CUDA_HOME"),
        python=safe(
            "name", pyvenv_version(found.root) or spec.python, found.root / "pyvenv.cfg", "version"
        ),
        cuda=safe("name", nvcc.version if nvcc else spec.cuda, site, f"{PYPI_NVCC} version"),
        torch=safe("name", torch.version, site, "torch version"),
        flash_attn=safe("name", flash_attn.version, site, f"{PACKAGE} version"),
        url=project_url(flash_attn, site),
    )


# Asked of an external interpreter (-I: no PYTHONPATH, no user site) to learn where it installs packages.
INTERPRETER_PROBE = (
    "import json, sys, sysconfig; print(json.dumps({'prefix': sys.prefix, "
    "'purelib': sysconfig.get_path('purelib'), "
    "'python': '.'.join(map(str, sys.version_info[:3]))}))"
)


def read_external(
    spec: EnvSpec, found: line_env.LineEnvironment, target: Path | None
) -> InstalledEnv:
    """An external line: the wheel went into the toolchain's interpreter (or a --target site dir)."""
    where = spec.where("toolchain.python_executable")
    python = safe("path", str(found.python), where, "toolchain.python_executable")
    if not Path(python).is_file():
        raise NotInstalled(
            f"{where}: toolchain.python_executable: {python} is not on this machine "
            f"(generate the module where the toolchain lives)",
            has_environment=False,
        )
    try:
        probe = run_tied(
            [python, "-I", "-c", INTERPRETER_PROBE],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        info = json.loads(probe.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise ToolkitError(
            f"{where}: toolchain.python_executable: {python} did not run "
            f"({exc.__class__.__name__}; fix the path)"
        ) from None
    if minor_of(info["python"]) != spec.toolchain.python:
        raise ToolkitError(
            f"{where}: toolchain.python_executable: {python} is python {info['python']} but "
            f"toolchain.python says {spec.toolchain.python} (make them agree)"
        )
    purelib = Path(info["purelib"])
    site = target or purelib
    dists = pip_distributions([site] if site == purelib else [site, purelib])
    flash_attn = one_distribution(dists, PACKAGE, site)
    if flash_attn is None or Path(str(flash_attn.locate_file(""))).resolve() != site.resolve():
        raise NotInstalled(
            f"{site}: {PACKAGE} is not installed here (pip install the wheel from "
            f"{Workspace.wheelhouse}/{spec.line}/ with {python}"
            + (f" --target {site})" if target else ")")
        )
    torch = one_distribution(dists, "torch", purelib)
    if torch is None:
        raise ToolkitError(
            f"{purelib}: torch is not installed for {python} (the external toolchain "
            f"must provide torch {spec.toolchain.torch})"
        )
    prefix = Path(info["prefix"])
    man_dir = prefix / "share" / "man"
    return InstalledEnv(
        kind="external",
        prefix=safe_path(prefix, python, "sys.prefix"),
        bin_dir=safe_path(Path(python).parent, where, "toolchain.python_executable"),
        site_dir=safe_path(site, "--target" if target else python, "site dir"),
        target=safe_path(target, "--target", "site dir") if target else None,
        man_dir=safe_path(man_dir, python, "share/man") if man_dir.is_dir() else None,
        venv=(prefix / "pyvenv.cfg").is_file(),
        cuda_home=safe_path(
            str(found.cuda_home), spec.where("toolchain.cuda_home"), "toolchain.cuda_home"
        ),
        python=safe("name", info["python"], python, "python version"),
        cuda=safe("name", spec.toolchain.nvcc, spec.where("toolchain.nvcc"), "toolchain.nvcc"),
        torch=safe("name", torch.version, purelib, "torch version"),
        flash_attn=safe("name", flash_attn.version, site, f"{PACKAGE} version"),
        url=project_url(flash_attn, site),
    )


# ---------------------------------------------------------------- what the lock and the build say


@dataclass(frozen=True)
class BuildSummary:
    """What a module's help shows of the build record of the installed wheel, every value checked safe."""

    path: Path
    wheel: str
    wheel_sha256: str
    sdist_sha256: str
    archs: tuple[str, ...]
    toolchain: tuple[tuple[str, str], ...]  # the scalar entries of inputs.toolchain, sorted
    finished: str


@dataclass(frozen=True)
class Provenance:
    """Where the installed env came from: its lock and its build record, each optional."""

    lock_file: Path
    lock: LockedEnv | None
    builds_dir: Path
    build: BuildSummary | None
    recommendation: Recommendation | None = None  # reports/<line>/recommendation.json, checked


def same_version(a: object, b: str) -> bool:
    try:
        return Version(str(a)) == Version(b)
    except InvalidVersion:
        return False


def read_build_record(builds_dir: Path, env: InstalledEnv) -> BuildSummary | None:
    """The record of the wheel that is installed (matched by its exact version, local tag included).

    None when no recorded build made it: an env may carry a wheel built some other way."""
    for path, record in records(builds_dir) if builds_dir.is_dir() else []:
        if same_version(record.outputs.version, env.flash_attn):
            return summarize(path, record)
    return None


def summarize(path: Path, record: BuildRecord) -> BuildSummary:
    where = display_path(path)
    scalars = sorted(
        (k, v)
        for k, v in asdict(record.toolchain).items()
        if isinstance(v, (str, int, float, bool))
    )
    return BuildSummary(
        path=path,
        wheel=safe("name", record.outputs.wheel, where, "outputs.wheel"),
        wheel_sha256=safe("sha256", record.outputs.wheel_sha256, where, "outputs.wheel_sha256"),
        sdist_sha256=safe("sha256", record.sdist.sha256, where, "sdist.sha256"),
        archs=tuple(safe("arch", a, where, "inputs.archs") for a in record.archs),
        toolchain=tuple(
            (
                safe("name", k, where, "inputs.toolchain"),
                safe("text", str(v), where, f"inputs.toolchain.{k}"),
            )
            for k, v in scalars
        ),
        finished=safe("timestamp", record.finished, where, "finished"),
    )


def read_lock_if_any(path: Path) -> LockedEnv | None:
    """The verified lock (read_lock refuses a tampered one), or None when the line was never locked here."""
    if not path.exists():
        return None
    locked = read_lock(path)
    where = display_path(path)
    safe("sha256", locked.input_hash, where, "fa-envkit.input-hash")
    safe("name", locked.sdist.filename, where, "fa-envkit.flash-attn-sdist.filename")
    safe("sha256", locked.sdist.sha256, where, "fa-envkit.flash-attn-sdist.sha256")
    return locked


# ---------------------------------------------------------------- the module, format-neutral


@dataclass(frozen=True)
class ModuleOptions:
    naming: str = DEFAULT_NAMING
    prereqs: tuple[str, ...] = ()  # the site's modules, loaded before ours (--prereq)
    prereq_style: str = "depends_on"  # depends_on: loaded with ours; prereq: must be loaded already
    ld_library_path: bool = False  # conda prefixes use RPATH; set it only when a site asks


@dataclass(frozen=True)
class Modulefile:
    """One module as data; render() turns it into Lua or Tcl. Every string in it has passed safe()."""

    name: str  # flash-attn
    version: str  # 2.8.3.post2-cu126-torch2.9-py312
    line: str
    spec: str
    whatis: tuple[str, ...]
    help: tuple[str, ...]
    prereqs: tuple[str, ...]
    prereq_style: str
    prepend_path: tuple[tuple[str, str], ...]
    pushenv: tuple[tuple[str, str], ...]

    @property
    def full_name(self) -> str:
        return f"{self.name}/{self.version}"


def module_name(naming: str, fields: dict[str, str]) -> tuple[str, str]:
    """NAME/VERSION from the naming scheme, both parts checked (no '..', no quotes, no third level)."""
    try:
        full = naming.format_map(fields)
    except (KeyError, ValueError, IndexError, AttributeError) as exc:
        known = ", ".join("{" + f + "}" for f in NAMING_FIELDS)
        raise ToolkitError(
            f"--naming: bad placeholder in {naming!r} ({exc}; fields: {known})"
        ) from None
    name, slash, version = full.partition("/")
    if not slash:
        raise ToolkitError(
            f"--naming: {naming!r} gives {full!r}, not NAME/VERSION (e.g. {DEFAULT_NAMING})"
        )
    return safe("name", name, "--naming", "module name"), safe(
        "name", version, "--naming", "module version"
    )


def environment_changes(
    spec: EnvSpec, env: InstalledEnv, options: ModuleOptions
) -> tuple[list, list]:
    """(prepend_path, pushenv) pairs. pushenv, not setenv: unloading restores another module's value."""
    prepend = [("PATH", env.bin_dir)]
    if env.man_dir:
        prepend.append(("MANPATH", env.man_dir))
    if env.target:
        prepend.append(
            ("PYTHONPATH", env.target)
        )  # a --target dir is on no interpreter's path by itself
    if env.kind == "locked":
        if options.ld_library_path:
            prepend.append(
                ("LD_LIBRARY_PATH", safe_path(Path(env.prefix) / "lib", env.prefix, "lib"))
            )
        activation = [("CONDA_PREFIX", env.prefix), ("CONDA_DEFAULT_ENV", env.prefix)]
    elif (
        env.kind == "pypi"
    ):  # nvcc is in CUDA_HOME/bin, not the venv's bin (python, ninja); prepended last, it
        # comes first, as in line_env's PATH for the line
        prepend.insert(1, ("PATH", safe_path(Path(env.cuda_home) / "bin", env.cuda_home, "bin")))
        if options.ld_library_path:
            prepend.append(
                ("LD_LIBRARY_PATH", safe_path(Path(env.cuda_home) / "lib", env.cuda_home, "lib"))
            )
        activation = [("VIRTUAL_ENV", env.prefix)]
    else:
        if options.ld_library_path:
            prepend.append(
                (
                    "LD_LIBRARY_PATH",
                    safe_path(Path(env.cuda_home) / "lib64", env.cuda_home, "lib64"),
                )
            )
        activation = [("VIRTUAL_ENV", env.prefix)] if env.venv else []
    push = [
        ("FLASH_ATTN_ROOT", env.target or env.prefix),
        ("CUDA_HOME", env.cuda_home),
    ] + activation
    return prepend, push


def help_lines(
    module_full: str,
    spec: EnvSpec,
    env: InstalledEnv,
    provenance: Provenance,
    prereqs: tuple[str, ...],
    variables: list[str],
    options: ModuleOptions,
) -> list[str]:
    """`module help`: what is inside, and the lock and build it came from."""
    description = safe("text", spec.description, spec.where("description"), "description")
    where_from = {
        "locked": "conda prefix installed from the lock",
        "pypi": "venv installed from the lock's wheels; CUDA from NVIDIA's wheels, gcc the machine's",
    }.get(env.kind, f"external toolchain, installed with {spec.toolchain.python_executable}")
    lines = [
        f"{module_full}: FlashAttention ({PACKAGE} {env.flash_attn}) from line {spec.line}.",
        description,
        "",
        "Inside:",
        f"  {PACKAGE:<12}{env.flash_attn}",
        f"  {'torch':<12}{env.torch}",
        f"  {'CUDA':<12}{env.cuda}",
        f"  {'python':<12}{env.python}",
        "",
        f"Environment:  {env.prefix} ({where_from})",
        f"Installed in: {env.site_dir}",
        f"Spec:         {safe_path(spec.path, spec.path, 'spec file')}",
        f"              input sha256 {spec.input_hash()}",
    ]
    lock, build = provenance.lock, provenance.build
    lock_text = safe_path(provenance.lock_file, "--locks", "lock file")
    if lock:
        lines += [
            f"Lock:         {lock_text}",
            f"              input sha256 {lock.input_hash}",
            f"              {PACKAGE} sdist {lock.sdist.filename} sha256 {lock.sdist.sha256}",
        ]
    else:
        lines += [f"Lock:         none (no {lock_text} when this module was written)"]
    if build:
        lines += [
            f"Build:        {safe_path(build.path, '--wheelhouse', 'build record')}",
            f"              wheel {build.wheel}",
            f"              wheel sha256 {build.wheel_sha256}",
        ]
        lines += [f"              sdist sha256 {build.sdist_sha256}"]
        lines += (
            [f"              archs {' '.join('sm_' + a for a in build.archs)}"]
            if build.archs
            else []
        )
        lines += textwrap.wrap(
            ", ".join(f"{k}={v}" for k, v in build.toolchain),
            width=110,
            initial_indent=" " * 14 + "toolchain ",
            subsequent_indent=" " * 24,
        )
        lines += [f"              finished {build.finished}"]
    else:
        builds_text = safe_path(provenance.builds_dir, "--wheelhouse", "build records")
        lines += [
            f"Build:        no record in {builds_text} of building {PACKAGE} {env.flash_attn}"
        ]
    rec = provenance.recommendation
    if rec:
        where = safe_path(rec.path, "--reports", "recommendation")
        lines += [
            f"Attention:    fastest verified on {safe('text', rec.gpu, where, 'gpu')} "
            f"{safe('text', rec.date, where, 'date')} ({where}):"
        ]
        lines += [f"              {safe('text', text, where, 'rules')}" for text in summary(rec)]
    if prereqs:
        how = (
            "loaded with this module" if options.prereq_style == "depends_on" else "load them first"
        )
        lines += [f"Requires:     {' '.join(prereqs)} ({how})"]
    rpath = env.kind == "locked" and not options.ld_library_path
    ld_note = " (no LD_LIBRARY_PATH: conda prefixes use RPATH)" if rpath else ""
    lines += [f"Sets:         {' '.join(variables)}{ld_note}"]
    return lines


def installed_minor(env: InstalledEnv, package: str, version: str) -> str:
    try:
        return minor_of(version)
    except (InvalidVersion, IndexError):
        raise ToolkitError(
            f"{env.site_dir}: {package} version {version!r} is not a release like X.Y.Z "
            f"(reinstall the environment)"
        ) from None


def modulefile_for(
    spec: EnvSpec, env: InstalledEnv, provenance: Provenance, options: ModuleOptions
) -> Modulefile:
    """Everything one line's module says, from what is installed, the lock and the build record."""
    tag = load_knowledge().cuda_lines[spec.cuda].tag
    python_minor = installed_minor(env, "python", env.python)
    name, version = module_name(
        options.naming,
        {
            "line": spec.line,
            "flash_attn": env.flash_attn.split("+")[0],
            "cuda": spec.cuda,
            "cuda_tag": tag,
            "torch": env.torch,
            "torch_minor": installed_minor(env, "torch", env.torch),
            "python": python_minor,
            "python_nodot": python_minor.replace(".", ""),
        },
    )
    site_modules = tuple(
        safe("module", m, spec.where("toolchain.modules"), "toolchain.modules")
        for m in spec.toolchain.modules
    )
    prereqs = tuple(dict.fromkeys(site_modules + options.prereqs))
    prepend, push = environment_changes(spec, env, options)
    variables = list(dict.fromkeys(var for var, _ in prepend + push))
    description = (
        f"FlashAttention {env.flash_attn} for CUDA {spec.cuda} ({tag}), torch {env.torch}, "
        f"python {python_minor}"
    )
    return Modulefile(
        name=name,
        version=version,
        line=safe("name", spec.line, spec.path, "line (the spec's file name)"),
        spec=safe_path(spec.path, spec.path, "spec file"),
        whatis=(
            f"Name: {name}",
            f"Version: {version}",
            f"Description: {description}",
            f"URL: {env.url}",
        ),
        help=tuple(
            help_lines(f"{name}/{version}", spec, env, provenance, prereqs, variables, options)
        ),
        prereqs=prereqs,
        prereq_style=options.prereq_style,
        prepend_path=tuple(prepend),
        pushenv=tuple(push),
    )


# ---------------------------------------------------------------- Lua and Tcl


@dataclass(frozen=True)
class ModuleFormat:
    """One modulefile language: its template, file suffix, statement syntax and default marker."""

    name: str
    template: str
    suffix: str
    statements: dict[str, str]
    default_file: str
    default_text: str


FORMATS = {
    "lmod": ModuleFormat(
        "lmod",
        "modulefile.lua",
        ".lua",
        {
            "whatis": 'whatis("{}")',
            "help": "{}",
            "family": 'family("{}")',
            "depends_on": 'depends_on("{}")',
            "prereq": 'prereq("{}")',
            "prepend_path": 'prepend_path("{}", "{}")',
            "pushenv": 'pushenv("{}", "{}")',
        },
        ".modulerc.lua",
        'module_version("{}", "default")\n',
    ),
    "tcl": ModuleFormat(
        "tcl",
        "modulefile.tcl",
        "",
        {
            "whatis": 'module-whatis "{}"',
            "help": '    puts stderr "{}"',
            "family": "family {}",
            "depends_on": 'depends-on "{}"',
            "prereq": 'prereq "{}"',
            "prepend_path": 'prepend-path {} "{}"',
            "pushenv": 'pushenv {} "{}"',
        },
        ".modulerc",
        "#%Module1.0\nmodule-version {} default\n",
    ),
}
FORMAT_CHOICES = {"lmod": ("lmod",), "tcl": ("tcl",), "both": ("lmod", "tcl")}


def render(module: Modulefile, fmt: ModuleFormat) -> str:
    syntax = fmt.statements
    statements = [syntax["family"].format(FAMILY)]
    statements += [syntax[module.prereq_style].format(m) for m in module.prereqs]
    statements += [syntax["prepend_path"].format(var, value) for var, value in module.prepend_path]
    statements += [syntax["pushenv"].format(var, value) for var, value in module.pushenv]
    return Template((TEMPLATES / fmt.template).read_text()).substitute(
        module=module.full_name,
        spec=module.spec,
        whatis="\n".join(syntax["whatis"].format(text) for text in module.whatis),
        help="\n".join(syntax["help"].format(text) for text in module.help),
        statements="\n".join(statements),
    )


def module_path(root: Path, fmt: ModuleFormat, module: Modulefile) -> Path:
    return root / fmt.name / module.name / f"{module.version}{fmt.suffix}"


def write_atomically(path: Path, text: str) -> None:
    """A `module avail` running meanwhile sees the old file or the new one, never half of one (mode 0644)."""
    missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    try:
        for directory in reversed(missing):
            directory.mkdir()
            directory.chmod(0o755)
        write_atomic(path, text)
    except OSError as exc:
        raise ToolkitError(
            f"{path}: cannot write ({exc.strerror or exc}; check --root and its permissions)"
        ) from None


# ---------------------------------------------------------------- CLI


@dataclass(frozen=True)
class Sources:
    """Where the earlier stages' outputs are: the workspace (--env-root is its environments), or one line's own."""

    workspace: Workspace = DEFAULT
    prefix: Path | None = None  # one line's prefix, when it was installed with --prefix
    target: Path | None = None  # an external line's --target site dir


def plan_module(spec: EnvSpec, sources: Sources, options: ModuleOptions) -> Modulefile:
    """Read one line's installed env, lock and build record into its Modulefile (nothing written yet)."""
    found = line_env.resolve(spec, sources.prefix, workspace=sources.workspace)
    readers = {"locked": read_conda_prefix, "pypi": read_pypi_venv}
    env = (
        readers[found.kind](spec, found)
        if found.kind in readers
        else read_external(spec, found, sources.target)
    )
    lock_file = sources.workspace.lock_file(spec.line)
    builds_dir = sources.workspace.wheel_dir(spec.line)
    provenance = Provenance(
        lock_file,
        read_lock_if_any(lock_file),
        builds_dir,
        read_build_record(builds_dir, env),
        read_if_any(sources.workspace.recommendation_file(spec.line)),
    )
    return modulefile_for(spec, env, provenance, options)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "modules",
        description="One modulefile per installed line (all lines with an installed environment by default), "
        "named after what it provides, under ROOT/lmod/ (Lua) and ROOT/tcl/ (Environment Modules). "
        "Use them with `module use ROOT/lmod` (Lmod) or `module use ROOT/tcl`.",
    )
    add_lines(parser, "lines to publish (default: every installed one)")
    parser.add_argument(
        "--root", type=Path, required=True, metavar="ROOT", help="where the module trees go"
    )
    parser.add_argument(
        "--format",
        choices=tuple(FORMAT_CHOICES),
        default="both",
        metavar="FORMAT",
        help="lmod (Lua), tcl (Environment Modules; Lmod reads it too) or both (default)",
    )
    parser.add_argument(
        "--naming",
        default=DEFAULT_NAMING,
        metavar="SCHEME",
        help=f"module name scheme NAME/VERSION (default: {DEFAULT_NAMING}; fields: "
        f"{', '.join(NAMING_FIELDS)})",
    )
    parser.add_argument(
        "--default", metavar="LINE", help="mark this line's module as the default version"
    )
    parser.add_argument(
        "--prereq",
        action="append",
        default=[],
        metavar="MODULE",
        help="a site module ours needs (a cuda or gcc module), repeatable; an external line's "
        "toolchain.modules are always added",
    )
    parser.add_argument(
        "--prereq-style",
        choices=("depends_on", "prereq"),
        default="depends_on",
        metavar="STYLE",
        help="depends_on: loading ours loads them (default); prereq: users load them first",
    )
    parser.add_argument(
        "--ld-library-path",
        action="store_true",
        help="also prepend LD_LIBRARY_PATH (off: conda prefixes use RPATH, and it leaks conda's "
        "libraries into system tools)",
    )
    parser.add_argument(
        "--env-root",
        type=Path,
        default=Workspace.environments,
        metavar="DIR",
        help=f"installed prefixes, one per line (default: {Workspace.environments})",
    )
    add_prefix(parser, "the prefix of the one LINE given (installed with --prefix)")
    parser.add_argument(
        "--target",
        type=Path,
        metavar="DIR",
        help="external lines: the site dir the wheel was installed into "
        "with pip --target (default: the toolchain's interpreter)",
    )
    add_workspace_options(parser)
    parser.set_defaults(func=modules_command)


def modules_command(args: argparse.Namespace) -> int:
    if args.prefix and len(args.lines) != 1:
        raise ToolkitError(
            "--prefix: names the prefix of one line (give exactly one LINE, or use --env-root)"
        )
    options = ModuleOptions(
        naming=args.naming,
        prereqs=tuple(safe("module", m, "--prereq", "site module") for m in args.prereq),
        prereq_style=args.prereq_style,
        ld_library_path=args.ld_library_path,
    )
    workspace = replace(Workspace.from_args(args), environments=args.env_root)
    sources = Sources(workspace, args.prefix, args.target)
    paths = (
        [resolve_spec_arg(n, workspace) for n in args.lines]
        if args.lines
        else spec_paths(workspace.envs)
    )
    modules: list[Modulefile] = []
    unready: list[str] = []  # lines whose environment is there but lacks what a module needs
    for path in paths:
        spec = checked_spec(path)
        try:
            modules.append(plan_module(spec, sources, options))
        except NotInstalled as exc:
            if args.lines:
                raise
            print(f"skipped {spec.line}: {exc}")
            if exc.has_environment:
                unready.append(spec.line)
    if not modules and unready:  # "no line is installed" after naming installed ones above misled
        raise ToolkitError(
            f"{display_path(args.root)}: nothing written: {', '.join(unready)} "
            f"{'has an environment' if len(unready) == 1 else 'have environments'} but no flash-attn "
            f"there (`toolkit build LINE` builds it and installs it there; each skipped line above "
            f"says what is missing)"
        )
    if not modules:  # every line skipped (said above): exit 0 would read as "published"
        raise ToolkitError(
            f"{display_path(args.root)}: nothing written: no line has an installed environment "
            f"(run `toolkit install LINE` first, or pass --env-root where they are installed)"
        )
    by_name: dict[str, str] = {}
    for module in modules:
        if module.full_name in by_name:
            raise ToolkitError(
                f"--naming: lines {by_name[module.full_name]} and {module.line} both give "
                f"{module.full_name} (add {{line}} or {{cuda_tag}} to the scheme)"
            )
        by_name[module.full_name] = module.line
    default = next((m for m in modules if m.line == args.default), None)
    if args.default and default is None:
        raise ToolkitError(
            f"--default: line {args.default} is not among the modules written "
            f"({', '.join(by_name.values()) or 'none'})"
        )
    for fmt in (FORMATS[name] for name in FORMAT_CHOICES[args.format]):
        for module in modules:
            path = module_path(args.root, fmt, module)
            write_atomically(path, render(module, fmt))
            print(f"wrote {path}")
        if default:
            path = args.root / fmt.name / default.name / fmt.default_file
            write_atomically(path, fmt.default_text.format(default.full_name))
            print(f"wrote {path} (default: {default.full_name})")
    return 0
