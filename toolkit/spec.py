"""Env specs: envs/<line>.yaml files, inheritance through `extends`, typed into EnvSpec.

Merge rules (child over parent, applied down the `extends` chain):
  * mappings merge key by key, recursively;
  * scalars and lists in the child replace the parent's value whole;
  * a key set to null in the child removes the parent's key.
Every value remembers the file and line it came from, so errors point at the right place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from toolkit.digest import sha256_json
from toolkit.errors import ToolkitError

ENVS_DIR = Path("envs")
BASE_NAME = "base"
PLATFORMS = ("linux-64", "linux-aarch64")
# Placeholders allowed in conda_packages / pip_packages version strings.
TEMPLATE_FIELDS = ("cuda", "python", "gcc")


@dataclass(frozen=True)
class Location:
    file: Path
    line: int | None

    def __str__(self) -> str:
        return f"{display_path(self.file)}:{self.line}" if self.line else display_path(self.file)


def display_path(path: Path) -> str:
    """A path relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- schema


@dataclass(frozen=True)
class FieldType:
    """A leaf type: accepted Python types, optional regex or choices, and the hint shown on error."""

    name: str
    types: tuple[type, ...]
    pattern: str | None = None
    choices: tuple[Any, ...] | None = None
    hint: str = ""

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) and bool not in self.types:
            return f"expected {self.name}, got a boolean"
        if not isinstance(value, self.types):
            got = type(value).__name__
            return f"expected {self.name}, got {got} {value!r}" + (f" ({self.hint})" if self.hint else "")
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {', '.join(map(str, self.choices))}"
        if self.pattern and not re.fullmatch(self.pattern, str(value)):
            return f"{value!r} is not {self.name}" + (f" ({self.hint})" if self.hint else "")
        return None


@dataclass(frozen=True)
class ListOf:
    item: FieldType


@dataclass(frozen=True)
class MapOf:
    """A mapping with free keys (package names) and typed values."""

    key_pattern: str
    value: FieldType


Struct = dict  # a fixed set of named fields: {name: type}

MAJOR_MINOR = FieldType("a quoted version like \"12.6\"", (str,), r"\d+\.\d+", hint='quote it: YAML reads 12.10 as 12.1')
VERSION = FieldType("a quoted version like \"2.7.1\"", (str,), r"\d+(\.\d+)*([a-z]+\d+)?(\.post\d+)?(\+[\w.]+)?",
                    hint="quote it")
TEXT = FieldType("a string", (str,))
URL_OR_PATH = FieldType("a URL or path", (str,), r"\S+")
GCC = FieldType("a gcc major version like 13", (int, str), r"\d+")
ARCH = FieldType("an sm number like 90 or 90a", (int, str), r"\d{2,3}[af]?")
JOBS = FieldType("a positive integer or auto", (int, str), r"auto|[1-9]\d*")
POSITIVE = FieldType("a positive number", (int, float), r"[0-9.]*[1-9][0-9.]*")
PACKAGE_SPEC = FieldType("a version spec string like \"*\" or \">=1.2\"", (str,), hint="quote it")
BOOL = FieldType("true or false", (bool,))
PLATFORM = FieldType("a platform", (str,), choices=PLATFORMS)
KIND = FieldType("locked or external", (str,), choices=("locked", "external"))

SCHEMA: Struct = {
    "extends": FieldType("a spec name like base", (str,), r"[A-Za-z0-9][\w.-]*"),
    "description": TEXT,
    "cuda": MAJOR_MINOR,
    "python": MAJOR_MINOR,
    "gcc": GCC,
    "platforms": ListOf(PLATFORM),
    "channels": ListOf(URL_OR_PATH),
    "conda_packages": MapOf(r"[a-z0-9][a-z0-9_.-]*", PACKAGE_SPEC),
    "pip_packages": MapOf(r"[A-Za-z0-9][A-Za-z0-9_.-]*", PACKAGE_SPEC),
    "torch": {"version": VERSION, "index": URL_OR_PATH},
    "flash_attn": {"version": VERSION},
    # FlashAttention-4 (issue 16): pinned wheels from knowledge/flash_attn_4.yaml, beside FA2 or instead of it
    "flash_attn_4": {"version": VERSION, "with_flash_attn_2": BOOL},
    "archs": ListOf(ARCH),
    "build": {"jobs": JOBS, "nvcc_threads": JOBS, "gb_per_nvcc_thread": POSITIVE, "threads_per_cpu": POSITIVE},
    "toolchain": {
        "kind": KIND,
        "cuda_home": TEXT,
        "python_executable": TEXT,
        "nvcc": MAJOR_MINOR,
        "gcc": GCC,
        "python": MAJOR_MINOR,
        "torch": VERSION,
        "cxx11_abi": BOOL,
        "modules": ListOf(TEXT),
    },
}
REQUIRED = ("cuda", "python", "gcc", "platforms", "channels", "torch.version", "torch.index",
            "flash_attn.version", "archs", "toolchain.kind")
EXTERNAL_REQUIRED = ("toolchain.cuda_home", "toolchain.python_executable", "toolchain.nvcc",
                     "toolchain.gcc", "toolchain.python", "toolchain.torch", "toolchain.cxx11_abi")


# ---------------------------------------------------------------- typed result


@dataclass(frozen=True)
class BuildKnobs:
    jobs: int | None  # None: sized from cores and RAM
    nvcc_threads: int | None
    gb_per_nvcc_thread: float
    threads_per_cpu: float  # nvcc threads per CPU when sized (above 1: the tail keeps every core busy)


@dataclass(frozen=True)
class Toolchain:
    kind: str  # "locked" | "external"
    cuda_home: str | None = None
    python_executable: str | None = None
    nvcc: str | None = None
    gcc: str | None = None
    python: str | None = None
    torch: str | None = None
    cxx11_abi: bool | None = None
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fa4Request:
    """A line's `flash_attn_4:` section: which FA4 release, and whether FA2 is built beside it."""

    version: str
    with_flash_attn_2: bool = True


@dataclass(frozen=True)
class EnvSpec:
    """One CUDA line's environment, fully merged and type-checked (not yet compat-checked)."""

    line: str
    path: Path
    chain: tuple[Path, ...]  # this file first, then its ancestors
    description: str
    cuda: str
    python: str
    gcc: str
    platforms: tuple[str, ...]
    channels: tuple[str, ...]
    conda_packages: dict[str, str]
    pip_packages: dict[str, str]
    torch_version: str
    torch_index: str
    flash_attn_version: str
    archs: tuple[str, ...]
    build: BuildKnobs
    toolchain: Toolchain
    merged: dict = field(repr=False, compare=False)
    locations: dict[str, Location] = field(repr=False, compare=False)
    flash_attn_4: Fa4Request | None = None

    def where(self, dotted: str) -> Location:
        """Where a field's effective value was written (the defining file and line)."""
        return self.locations.get(dotted) or Location(self.path, None)

    def conda_specs(self) -> list[str]:
        """Conda match specs, 'name version' or 'name', in file order."""
        return [name if version in ("", "*") else f"{name} {version}" for name, version in self.conda_packages.items()]

    def pip_requirements(self) -> list[str]:
        """Pip requirement lines: torch from the line's index, then the build deps."""
        reqs = [f"torch=={self.torch_version}"]
        reqs += [name if version in ("", "*") else f"{name}{version}" for name, version in self.pip_packages.items()]
        return reqs

    def input_hash(self) -> str:
        """sha256 of the merged spec, what every later stage keys its caches on, without the build sizing
        (`build:` jobs, threads, memory figures change how fast a wheel is built, never what is locked or
        built, so tuning them must not make a lock stale or miss the wheel cache)."""
        return sha256_json({key: value for key, value in self.merged.items() if key != "build"})


# ---------------------------------------------------------------- YAML with line numbers


def read_yaml(path: Path) -> tuple[dict, dict[tuple, int]]:
    """Parse one YAML file into (data, {key path: line}); every failure is a one-line ToolkitError."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ToolkitError(f"{display_path(path)}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolkitError(f"{display_path(path)}: cannot read ({exc.__class__.__name__}: {exc})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ToolkitError(f"{display_path(path)}: empty file (a spec needs at least `extends: base`)")
        lines: dict[tuple, int] = {}
        _collect_lines(path, node, (), lines)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = exc.problem or exc.context or "malformed YAML"
        if "'\\t'" in str(problem):
            problem = "tab character in indentation (indent with spaces)"
        raise ToolkitError(f"{display_path(path)}{line}: malformed YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ToolkitError(f"{display_path(path)}: malformed YAML: {exc}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ToolkitError(f"{display_path(path)}:1: top level must be a mapping of fields, got {type(data).__name__}")
    return data, lines


def _collect_lines(path: Path, node: yaml.Node, prefix: tuple, lines: dict[tuple, int]) -> None:
    lines.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise ToolkitError(f"{display_path(path)}:{key_node.start_mark.line + 1}: "
                                   f"{'.'.join(map(str, prefix + (key,)))}: duplicate key (keep one)")
            seen.add(key)
            lines[prefix + (key,)] = key_node.start_mark.line + 1
            _collect_lines(path, value_node, prefix + (key,), lines)


# ---------------------------------------------------------------- validation of one file


def validate_layer(path: Path, data: dict, lines: dict[tuple, int]) -> None:
    """Unknown fields and wrong types in one file, before merging."""
    _validate(path, data, SCHEMA, (), lines)


def _validate(path: Path, value: Any, schema: Any, prefix: tuple, lines: dict[tuple, int]) -> None:
    dotted = ".".join(map(str, prefix))
    where = f"{display_path(path)}:{lines.get(prefix, 1)}"
    if value is None and prefix:
        return  # null removes an inherited value
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ToolkitError(f"{where}: {dotted}: expected a mapping with fields {', '.join(schema)}, "
                               f"got {type(value).__name__}")
        for key, item in value.items():
            if key not in schema:
                known = ", ".join(schema)
                name = ".".join(map(str, prefix + (key,)))
                raise ToolkitError(f"{display_path(path)}:{lines.get(prefix + (key,), 1)}: {name}: unknown field "
                                   f"(known fields{' of ' + dotted if dotted else ''}: {known})")
            _validate(path, item, schema[key], prefix + (key,), lines)
    elif isinstance(schema, ListOf):
        if not isinstance(value, list):
            raise ToolkitError(f"{where}: {dotted}: expected a list, got {type(value).__name__} {value!r}")
        for index, item in enumerate(value):
            problem = schema.item.problem(item)
            if problem:
                raise ToolkitError(f"{where}: {dotted}[{index}]: {problem}")
    elif isinstance(schema, MapOf):
        if not isinstance(value, dict):
            raise ToolkitError(f"{where}: {dotted}: expected a mapping of package name to version spec, "
                               f"got {type(value).__name__}")
        for key, item in value.items():
            line = lines.get(prefix + (key,), 1)
            if not re.fullmatch(schema.key_pattern, str(key)):
                raise ToolkitError(f"{display_path(path)}:{line}: {dotted}: {key!r} is not a package name")
            problem = None if item is None else schema.value.problem(item)
            if problem:
                raise ToolkitError(f"{display_path(path)}:{line}: {dotted}.{key}: {problem}")
    else:
        problem = schema.problem(value)
        if problem:
            raise ToolkitError(f"{where}: {dotted}: {problem}")


# ---------------------------------------------------------------- inheritance


def merge(parent: dict, child: dict) -> dict:
    """Child over parent: mappings merge recursively, other values replace, null deletes."""
    merged = dict(parent)
    for key, value in child.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _locations_of(path: Path, data: dict, lines: dict[tuple, int], prefix: tuple = ()) -> dict[str, Location]:
    out: dict[str, Location] = {}
    for key, value in data.items():
        dotted = ".".join(map(str, prefix + (key,)))
        out[dotted] = Location(path, lines.get(prefix + (key,)))
        if isinstance(value, dict):
            out.update(_locations_of(path, value, lines, prefix + (key,)))
    return out


def resolve_chain(path: Path) -> tuple[dict, dict[str, Location], tuple[Path, ...]]:
    """Read a spec and its ancestors, validate each file, merge base-first."""
    chain: list[Path] = []
    layers: list[tuple[dict, dict[str, Location]]] = []
    current = path
    while True:
        if current.resolve() in [p.resolve() for p in chain]:
            cycle = " -> ".join(display_path(p) for p in chain + [current])
            raise ToolkitError(f"{display_path(path)}: cyclic extends: {cycle} (remove one `extends`)")
        data, lines = read_yaml(current)
        validate_layer(current, data, lines)
        chain.append(current)
        layers.append((data, _locations_of(current, data, lines)))
        parent_name = data.get("extends")
        if parent_name is None:
            break
        parent = current.parent / f"{parent_name}.yaml"
        if not parent.exists():
            line = lines.get(("extends",), 1)
            known = ", ".join(sorted(p.stem for p in current.parent.glob("*.yaml")))
            raise ToolkitError(f"{display_path(current)}:{line}: extends: no spec named {parent_name!r} "
                               f"in {display_path(current.parent)}/ (known: {known})")
        current = parent
    merged: dict = {}
    locations: dict[str, Location] = {}
    for data, where in reversed(layers):
        merged = merge(merged, data)
        locations.update(where)
    merged.pop("extends", None)
    return merged, locations, tuple(chain)


def _get(data: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _render(value: str, fields: dict[str, str], where: Location, dotted: str) -> str:
    try:
        return value.format_map(fields)
    except (KeyError, ValueError, IndexError) as exc:
        allowed = ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
        raise ToolkitError(f"{where}: {dotted}: bad placeholder in {value!r} ({exc}; allowed: {allowed})") from None


def load_spec(path: Path) -> EnvSpec:
    """Load, merge and type one spec; raises ToolkitError (one line) on any bad input."""
    path = Path(path)
    merged, locations, chain = resolve_chain(path)
    line = path.stem
    kind = _get(merged, "toolchain.kind")
    required = REQUIRED + (EXTERNAL_REQUIRED if kind == "external" else ())
    missing = [name for name in required if _get(merged, name) is None]
    if missing:
        raise ToolkitError(f"{display_path(path)}: missing required field{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(missing)} (set {'them' if len(missing) > 1 else 'it'} here or in "
                           f"{display_path(chain[-1])})")
    fields = {"cuda": merged["cuda"], "python": merged["python"], "gcc": str(merged["gcc"])}

    def rendered(section: str) -> dict[str, str]:
        return {
            name: _render(spec or "*", fields, locations.get(f"{section}.{name}", Location(path, None)),
                          f"{section}.{name}")
            for name, spec in (merged.get(section) or {}).items()
        }

    build = merged.get("build") or {}
    toolchain = merged["toolchain"]
    return EnvSpec(
        line=line,
        path=path,
        chain=chain,
        description=merged.get("description", ""),
        cuda=merged["cuda"],
        python=merged["python"],
        gcc=str(merged["gcc"]),
        platforms=tuple(merged["platforms"]),
        channels=tuple(merged["channels"]),
        conda_packages=rendered("conda_packages"),
        pip_packages=rendered("pip_packages"),
        torch_version=merged["torch"]["version"],
        torch_index=merged["torch"]["index"],
        flash_attn_version=merged["flash_attn"]["version"],
        archs=tuple(str(a) for a in merged["archs"]),
        build=BuildKnobs(
            jobs=None if str(build.get("jobs", "auto")) == "auto" else int(build["jobs"]),
            nvcc_threads=None if str(build.get("nvcc_threads", "auto")) == "auto" else int(build["nvcc_threads"]),
            gb_per_nvcc_thread=float(build.get("gb_per_nvcc_thread", 4.5)),
            threads_per_cpu=float(build.get("threads_per_cpu", 1.0)),
        ),
        toolchain=Toolchain(
            kind=toolchain["kind"],
            cuda_home=toolchain.get("cuda_home"),
            python_executable=toolchain.get("python_executable"),
            nvcc=toolchain.get("nvcc"),
            gcc=None if toolchain.get("gcc") is None else str(toolchain["gcc"]),
            python=toolchain.get("python"),
            torch=toolchain.get("torch"),
            cxx11_abi=toolchain.get("cxx11_abi"),
            modules=tuple(toolchain.get("modules") or ()),
        ),
        merged=merged,
        locations=locations,
        flash_attn_4=_fa4_request(merged.get("flash_attn_4")),
    )


def _fa4_request(section: dict | None) -> Fa4Request | None:
    if not section or section.get("version") is None:
        return None
    return Fa4Request(section["version"], bool(section.get("with_flash_attn_2", True)))


def spec_paths(envs_dir: Path = ENVS_DIR) -> list[Path]:
    """Every line's spec in envs/ (base.yaml is a parent, not a line)."""
    if not envs_dir.is_dir():
        raise ToolkitError(f"{display_path(envs_dir)}: no such directory (run from the project root or pass --envs)")
    return sorted(p for p in envs_dir.glob("*.yaml") if p.stem != BASE_NAME)


def resolve_spec_arg(arg: str, envs_dir: Path = ENVS_DIR) -> Path:
    """A CLI argument that is a line name (cu126) or a path to a spec file."""
    candidate = Path(arg)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    path = envs_dir / f"{arg}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in spec_paths(envs_dir)) or "none"
        raise ToolkitError(f"{display_path(path)}: no spec for line {arg!r} (known lines: {known})")
    return path
