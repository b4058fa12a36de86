"""Env specs: envs/<line>.yaml files, inheritance through `extends`, typed into EnvSpec.

Merge rules (child over parent, applied down the `extends` chain):
  * mappings merge key by key, recursively;
  * scalars and lists in the child replace the parent's value whole;
  * a key set to null in the child removes the parent's key (not a `build:` knob: each always has a value).
Every value remembers the file and line it came from, so errors point at the right place.

A spec is input from anyone, so loading it is bounded and strict: a regular UTF-8 file of at most
64 KiB without control characters; YAML without anchors, aliases or tags, at most 16 levels deep, with names
as keys; at most 16 files in an `extends` chain, each named (never a path); every value in the form its
consumer takes (PEP 440 versions and specifiers, rattler match specs, http(s)/file URLs, module names) in
ASCII. Whatever is wrong ends in one ToolkitError line "file:line: field: problem (fix)".
"""

from __future__ import annotations

import os
import re
import unicodedata
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.digest import sha256_json
from toolkit.base.entry import rename_notice
from toolkit.base.errors import ToolkitError, shown
from toolkit.base.paths import display_path, printable
from toolkit.base.workspace import DEFAULT, Workspace, checked_line
from toolkit.spec.platforms import PLATFORMS

BASE_NAME = "base"
# Placeholders allowed in conda_packages / pip_packages version strings.
TEMPLATE_FIELDS = ("cuda", "python", "gcc")
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# Bounds that make a hostile file cost no more than a real one (the real specs are under 2 KB, nest 3 levels
# deep and inherit through at most 3 files); each is far above any legitimate use.
MAX_SPEC_BYTES = 64 * 1024
MAX_DEPTH = 16
MAX_EXTENDS = 16
MAX_NUMBER_CHARS = (
    40  # longer ints take quadratic time to convert and more than 4300 digits raise ValueError
)
# Control and invisible characters (C0 but tab/LF/CR, DEL, C1, soft hyphen, bidi marks and overrides, zero-width
# characters, line/paragraph separators, BOM, specials): none belongs in a spec; each can hide text, end a line
# for YAML but not for an editor, or break the one-line message.
CONTROL = (
    "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\uffff"
)
FILE_CONTROL = re.compile(f"[{CONTROL}]")


@dataclass(frozen=True)
class Location:
    file: Path
    line: int | None

    def __str__(self) -> str:
        return f"{display_path(self.file)}:{self.line}" if self.line else display_path(self.file)


# ---------------------------------------------------------------- schema


@dataclass(frozen=True)
class FieldType:
    """A leaf type: accepted Python types, then (on the value as text) a regex that must match all of it in
    ASCII (Python's \\d and int() also take Arabic-Indic and full-width digits), choices, a numeric range and
    a library parser (raising ValueError on what it rejects); `hint` is the fix shown on error."""

    name: str
    types: tuple[type, ...]
    pattern: str | None = None
    choices: tuple[Any, ...] | None = None
    hint: str = ""
    bounds: tuple[float, float] | None = None
    parse: Callable[[str], object] | None = None
    null_fix: str | None = None  # set: null (removing the inherited value) is refused with this fix

    def problem(self, value: Any) -> str | None:
        hint = f" ({self.hint})" if self.hint else ""
        if isinstance(value, bool) and bool not in self.types:
            return f"expected {self.name}, got a boolean"
        if not isinstance(value, self.types):
            return f"expected {self.name}, got {type(value).__name__} {shown(value)}{hint}"
        if self.choices is not None and value not in self.choices:
            return f"{shown(value)} is not one of {', '.join(map(str, self.choices))}"
        text = str(value)
        if self.pattern and not re.fullmatch(self.pattern, text, re.ASCII):
            return f"{shown(value)} is not {self.name}{hint}"
        number = _number(value)
        if self.bounds and number is not None and not self.bounds[0] <= number <= self.bounds[1]:
            return f"{shown(value)} is out of range ({self.bounds[0]:g} to {self.bounds[1]:g})"
        return self._parse_problem(text)

    def _parse_problem(self, text: str) -> str | None:
        if self.parse is None:
            return None
        try:
            self.parse(text)
        except ValueError as exc:
            return f"{shown(text)} is not {self.name} ({printable(str(exc))}{'; ' + self.hint if self.hint else ''})"
        return None


def _number(value: Any) -> float | None:
    """The value as a number when it is one or is written as ASCII digits ("8"), else None ("auto"); a
    string of more digits than any field takes is infinite (int() of 5000 digits raises ValueError)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value, re.ASCII):
        return float(value) if len(value) <= MAX_NUMBER_CHARS else float("inf")
    return None


@dataclass(frozen=True)
class ListOf:
    """A list of items, never with the same item twice; with `example` set it must not be empty."""

    item: FieldType
    example: str | None = None


@dataclass(frozen=True)
class MapOf:
    """A mapping with free keys (package names) and typed values; `rendered` is what a value must be once its
    placeholders are filled in (checked after merging, at the line that set it)."""

    key_pattern: str
    key_hint: str
    value: FieldType
    rendered: FieldType


Struct = dict  # a fixed set of named fields: {name: type}


def _url(text: str) -> None:
    """Raise ValueError unless `text` is an http(s) URL with a host or a file:// URL of an absolute path."""
    parts = urllib.parse.urlsplit(text)
    parts.port  # noqa: B018 - raises ValueError for a port that is not a number up to 65535
    if parts.scheme in ("http", "https") and parts.hostname:
        return
    if parts.scheme == "file" and parts.netloc in ("", "localhost") and parts.path.startswith("/"):
        return
    raise ValueError(
        "no host"
        if parts.scheme in ("http", "https")
        else f"unsupported form of {parts.scheme} URL"
    )


def _channel(text: str) -> None:
    """Raise ValueError for a channel URL that is not a valid URL (names and paths are checked by regex)."""
    if "://" in text:
        _url(text)


def _printable(text: str) -> None:
    """Raise ValueError at the first character that is not printable (a control, format, separator other than
    space, private-use or unassigned code point: what can hide text or end a line in a terminal)."""
    bad = next((char for char in text if not char.isprintable()), None)
    if bad is not None:
        raise ValueError(f"U+{ord(bad):04X} is not printable")


def _pip_specifier(text: str) -> None:
    """Raise ValueError unless packaging (what pip uses) reads `text` as a specifier set; "*" means any."""
    if text != "*":
        SpecifierSet(text)


# versions rattler's strict parse reads without a doubt (tests/test_spec_versions.py holds each form to it): any,
# a release with a trailing .*, or comparisons of releases joined by commas; checked without importing py-rattler,
# which `toolkit lock` imports in its solver's process meanwhile (its spec's "{python}.*", "*", ...)
PLAIN_CONDA_VERSION = re.compile(
    r"\*|[0-9]+(\.[0-9]+)*\.\*|(>=|<=|>|<|==|!=)[0-9]+(\.[0-9]+)*(,(>=|<=|>|<|==|!=)[0-9]+(\.[0-9]+)*)*"
)


def _conda_version(text: str) -> None:
    """Raise ValueError unless rattler, which solves the conda layer, reads `text` as a version spec in its
    strict mode (which refuses the ambiguous bare "1.2": "==1.2" or "1.2.*")."""
    if PLAIN_CONDA_VERSION.fullmatch(text):
        return
    from rattler import (
        MatchSpec,
    )  # the solver's own parser; imported here to keep `toolkit check` quick to start
    from rattler.exceptions import InvalidMatchSpecError

    try:
        MatchSpec(f"x {text}", strict=True)
    except InvalidMatchSpecError as exc:
        raise ValueError(str(exc)) from None


URL_CHARS = r"[A-Za-z0-9._~%+,=:@/\[\]-]"
URL = rf"(https?|file)://{URL_CHARS}+"
SPEC_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
ABSOLUTE_PATH = r"/[A-Za-z0-9._+@%=,/~-]*"  # what toolkit/site/modules.py lets into a modulefile
SIGNED_VERSION = r"(===?|~=|!=|<=?|>=?)[0-9A-Za-z.*+!]+"

MAJOR_MINOR = FieldType(
    'a quoted version like "12.6"',
    (str,),
    r"[0-9]{1,3}\.[0-9]{1,3}",
    hint="quote it: YAML reads 12.10 as 12.1",
)
VERSION = FieldType(
    'a quoted version like "2.7.1"',
    (str,),
    r"[0-9]{1,4}(\.[0-9]{1,6}){1,4}([a-z]{1,7}[0-9]{1,4})?(\.post[0-9]{1,4})?(\.dev[0-9]{1,4})?"
    r"(\+[a-z0-9]{1,24}(\.[a-z0-9]{1,24}){0,3})?",
    hint="write major.minor[.patch] in ASCII digits, quoted",
    parse=Version,
)
TEXT = FieldType(
    "a string",
    (str,),
    r".{0,200}",
    hint="write one line of at most 200 printable characters",
    parse=_printable,
)
INDEX_URL = FieldType(
    "an index URL",
    (str,),
    URL,
    hint="https://host/path, http://host/path or file:///absolute/path",
    parse=_url,
)
CHANNEL = FieldType(
    "a channel",
    (str,),
    rf"{URL}|(/|\./|\.\./|~/)[A-Za-z0-9._+@%=,/~-]*|"
    r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*",
    hint="a name like conda-forge or nvidia/label/cuda-12.6.3, an http(s):// or file:// URL, "
    "or a path starting with /, ./, ../ or ~/",
    parse=_channel,
)
GCC = FieldType("a gcc major version like 13", (int, str), r"[1-9][0-9]?")
ARCH = FieldType("an sm number like 90 or 90a", (int, str), r"[0-9]{2,3}[af]?")
# The build knobs are never null: base.yaml sets each, and null would fall back to a value no file shows.
SIZED = "write auto to size it from cores and RAM"
JOBS = FieldType(
    "a positive integer or auto", (int, str), r"auto|[1-9][0-9]*", bounds=(1, 4096), null_fix=SIZED
)
NVCC_THREADS = FieldType(
    "a positive integer or auto", (int, str), r"auto|[1-9][0-9]*", bounds=(1, 64), null_fix=SIZED
)
GB_PER_THREAD = FieldType(
    "a positive number",
    (int, float),
    bounds=(0.1, 1024),
    null_fix="write a number: base.yaml has 4.5",
)
THREADS_PER_CPU = FieldType(
    "a positive number",
    (int, float),
    bounds=(0.1, 64),
    null_fix="write a number: base.yaml has 1.25",
)
PACKAGE_SPEC = FieldType('a version spec string like "*" or ">=1.2"', (str,), hint="quote it")
PIP_SPEC = FieldType(
    'a pip version specifier like "*", ">=1.2" or "==2.0.*"',
    (str,),
    rf"\*|{SIGNED_VERSION}(,{SIGNED_VERSION})*",
    parse=_pip_specifier,
    hint="comparisons joined by commas, no spaces, markers or URLs; ==1.2 for one version",
)
CONDA_SPEC = FieldType(
    'a conda version spec like "*", "1.2.*" or ">=1.2,<2"',
    (str,),
    r"[0-9A-Za-z.*+!<>=~,|_]+",
    parse=_conda_version,
    hint="no spaces, build strings, brackets or channels",
)
BOOL = FieldType("true or false", (bool,))
PLATFORM = FieldType("a platform", (str,), choices=PLATFORMS)
KIND = FieldType("locked, external or pypi", (str,), choices=("locked", "external", "pypi"))
MODULE = FieldType(
    "a module name like cuda/12.6",
    (str,),
    r"[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*",
)
PATH = FieldType(
    "an absolute path",
    (str,),
    ABSOLUTE_PATH,
    hint="/ followed by letters, digits and ._+@%=,/~- only",
)
COMMIT = FieldType(
    "a git commit",
    (str,),
    r"[0-9a-f]{40}",
    hint="the full 40-hex-digit commit, lowercase; quote it",
)
PROFILE = FieldType(
    "a profile name",
    (str,),
    r"[a-z0-9][a-z0-9-]{0,63}",
    hint="a name from toolkit/knowledge/flash_attn_3.yaml profiles, like hopper-training",
)

SCHEMA: Struct = {
    "extends": FieldType(
        "a spec name like base",
        (str,),
        SPEC_NAME,
        hint="the name of a spec in the same folder, not a path",
    ),
    "description": TEXT,
    "cuda": MAJOR_MINOR,
    "python": MAJOR_MINOR,
    "gcc": GCC,
    "platforms": ListOf(PLATFORM, example="[linux-64]"),
    "channels": ListOf(CHANNEL, example="[conda-forge]"),
    "conda_packages": MapOf(
        r"[a-z0-9_][a-z0-9_.-]{0,99}", "lowercase letters, digits and _.-", PACKAGE_SPEC, CONDA_SPEC
    ),
    "pip_packages": MapOf(
        r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,98}[A-Za-z0-9])?",
        "a PEP 508 name: letters, digits and _.- inside",
        PACKAGE_SPEC,
        PIP_SPEC,
    ),
    "torch": {"version": VERSION, "index": INDEX_URL},
    # flash-attn 2.x from its sdist (written `flash_attn:` before issue 31: RENAMED_SECTIONS)
    "flash_attn_2": {"version": VERSION},
    # FlashAttention-4: pinned wheels from knowledge/flash_attn_4.yaml, beside FA2 or instead of it
    "flash_attn_4": {"version": VERSION, "with_flash_attn_2": BOOL},
    # FlashAttention-3 (Hopper): hopper/ of a pinned commit, built with a profile of its DISABLE switches
    "flash_attn_3": {"commit": COMMIT, "profile": PROFILE, "with_flash_attn_2": BOOL},
    "archs": ListOf(ARCH, example='["80", "90"]'),
    "build": {
        "jobs": JOBS,
        "nvcc_threads": NVCC_THREADS,
        "gb_per_nvcc_thread": GB_PER_THREAD,
        "threads_per_cpu": THREADS_PER_CPU,
    },
    "toolchain": {
        "kind": KIND,
        "cuda_home": PATH,
        "python_executable": PATH,
        "nvcc": MAJOR_MINOR,
        "gcc": GCC,
        "python": MAJOR_MINOR,
        "torch": VERSION,
        "cxx11_abi": BOOL,
        "modules": ListOf(MODULE),
    },
}
REQUIRED = (
    "cuda",
    "python",
    "gcc",
    "platforms",
    "channels",
    "torch.version",
    "torch.index",
    "flash_attn_2.version",
    "archs",
    "toolchain.kind",
)
# Sections renamed since (old -> new): an old name still reads, after one notice naming the file. The input hash
# is taken under the old names, so that a lock or a published build of an unchanged spec stays current.
RENAMED_SECTIONS = {"flash_attn": "flash_attn_2"}
# A pypi toolchain has no conda layer: it may set channels to null (its wheels come from torch.index).
PYPI_REQUIRED = tuple(name for name in REQUIRED if name != "channels")
# An external toolchain's fields that say where it is, not what it is (its versions are checked against the machine).
NOT_BUILD_INPUTS = ("cuda_home", "python_executable", "modules")
EXTERNAL_REQUIRED = (
    "toolchain.cuda_home",
    "toolchain.python_executable",
    "toolchain.nvcc",
    "toolchain.gcc",
    "toolchain.python",
    "toolchain.torch",
    "toolchain.cxx11_abi",
)


# ---------------------------------------------------------------- typed result


@dataclass(frozen=True)
class BuildKnobs:
    jobs: int | None  # None: sized from cores and RAM
    nvcc_threads: int | None
    gb_per_nvcc_thread: float
    threads_per_cpu: (
        float  # nvcc threads per CPU when sized (above 1: the tail keeps every core busy)
    )


@dataclass(frozen=True)
class Toolchain:
    kind: str  # "locked" | "external" | "pypi"
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
class Fa3Request:
    """A line's `flash_attn_3:` section: which commit of hopper/, which profile, and whether FA2 is built too."""

    commit: str
    profile: str
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
    flash_attn_3: Fa3Request | None = None

    def where(self, dotted: str) -> Location:
        """Where a field's effective value was written (the defining file and line)."""
        return self.locations.get(dotted) or Location(self.path, None)

    def flash_attn_2_left_out(self) -> str | None:
        """The setting by which the line has no flash-attn 2.x (FA3 built instead of it, or FA4's pinned wheels
        installed instead of it), or None where the line builds FA2."""
        if self.flash_attn_3 is not None and not self.flash_attn_3.with_flash_attn_2:
            return "flash_attn_3.with_flash_attn_2: false"
        if self.flash_attn_4 is not None and not self.flash_attn_4.with_flash_attn_2:
            return "flash_attn_4.with_flash_attn_2: false"
        return None

    def compiled_implementations(self) -> tuple[str, ...]:
        """The attention implementations `toolkit build` compiles for the line, in build order (the names of
        build/builder.WHEEL_SOURCES): flash-attn 2.x unless left out, FA3 where asked; none for a line with FA4
        instead of FA2 and no FA3 (FA4 is pinned wheels)."""
        return (
            *(("flash-attn-2",) if self.flash_attn_2_left_out() is None else ()),
            *(("flash-attn-3",) if self.flash_attn_3 is not None else ()),
        )

    def conda_specs(self) -> list[str]:
        """Conda match specs, 'name version' or 'name', in file order."""
        return [
            name if version in ("", "*") else f"{name} {version}"
            for name, version in self.conda_packages.items()
        ]

    def pip_requirements(self) -> list[str]:
        """Pip requirement lines: torch from the line's index, then the build deps."""
        reqs = [f"torch=={self.torch_version}"]
        reqs += [
            name if version in ("", "*") else f"{name}{version}"
            for name, version in self.pip_packages.items()
        ]
        return reqs

    def input_hash(self) -> str:
        """sha256 of the merged spec, what every later stage keys its caches on, without the build sizing
        (`build:` jobs, threads, memory figures change how fast a wheel is built, never what is locked or
        built, so tuning them must not make a lock stale or miss the wheel cache)."""
        hashed_as = {new: old for old, new in RENAMED_SECTIONS.items()}
        return sha256_json(
            {hashed_as.get(key, key): value for key, value in self.merged.items() if key != "build"}
        )

    def build_input_hash(self) -> str:
        """input_hash without what only says where a toolchain is or what the line is called in words
        (NOT_BUILD_INPUTS): the wheel cache's key part, so an external line at another site's paths, whose
        versions the build checks against the machine, finds the same published build."""
        merged = {
            key: value for key, value in self.merged.items() if key not in ("build", "description")
        }
        toolchain = merged.get("toolchain")
        if isinstance(toolchain, dict):
            merged["toolchain"] = {
                key: value for key, value in toolchain.items() if key not in NOT_BUILD_INPUTS
            }
        return sha256_json(merged)


# ---------------------------------------------------------------- YAML with line numbers


def read_spec_text(path: Path) -> str:
    """The file's text, refused in one line unless it is a regular file of at most MAX_SPEC_BYTES of UTF-8
    without control characters (bounded_read: a FIFO or a device named x.yaml never blocks and /dev/zero or
    a sparse 8 GiB file is never read)."""
    where = display_path(path)
    try:
        data = regular_file_bytes(Path(path), MAX_SPEC_BYTES)
    except Unreadable as exc:
        raise ToolkitError(
            {
                "missing": f"{where}: file not found",
                "error": f"{where}: cannot read ({exc.detail})",
                "special": f"{where}: not a regular file ({exc.detail}; a spec is a YAML file)",
                "large": f"{where}: larger than {MAX_SPEC_BYTES // 1024} KiB (a spec is a few dozen lines: is this the "
                f"right file?)",
            }[exc.why]
        ) from None
    return _decoded(where, data)


def _decoded(where: str, data: bytes) -> str:
    """UTF-8 text without control or invisible characters (a leading BOM is dropped), or a one-line refusal."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ToolkitError(
            f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}; save the file as UTF-8)"
        ) from None
    bad = FILE_CONTROL.search(text)
    if bad:
        char = bad.group()
        name = unicodedata.name(char, "a control character")
        raise ToolkitError(
            f"{where}:{text.count(chr(10), 0, bad.start()) + 1}: U+{ord(char):04X} ({name}) in the "
            f"file (delete it: a spec is plain text)"
        )
    return text


class SpecLoader(yaml.SafeLoader):
    """yaml.SafeLoader that composes only what a spec can mean, so that no document costs more than its size.

    Refused while composing, before anything is built or walked: anchors and aliases (a 10-line alias bomb
    expands to 387 million nodes and a recursive alias never ends; specs share values through `extends`),
    explicit tags (a spec has no use for !!binary, !!set or !!python/...), nesting deeper than MAX_DEPTH
    (the composer recurses), and numbers longer than MAX_NUMBER_CHARS. Dates stay text: no field is a date
    and "2024-13-45" must not raise ValueError."""

    yaml_implicit_resolvers = {
        first: [
            (tag, regexp)
            for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value")
        ]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, text: str, where: str):
        super().__init__(text)
        self.where = where
        self.depth = 0

    def refuse(self, mark: yaml.Mark, problem: str) -> ToolkitError:
        return ToolkitError(f"{self.where}:{mark.line + 1}: {problem}")

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or event.anchor is not None:
            raise self.refuse(
                event.start_mark,
                "anchors and aliases (&name, *name) are not allowed in a spec "
                "(write the value out; specs share values through `extends`)",
            )
        if event.tag is not None:
            raise self.refuse(
                event.start_mark,
                f"YAML tag {printable(event.tag)} is not allowed in a spec (write a plain value)",
            )
        if self.depth == MAX_DEPTH:
            raise self.refuse(
                event.start_mark,
                f"nesting deeper than {MAX_DEPTH} levels (a spec nests 3: flatten it)",
            )
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if node is None:  # the end of a document
            return None
        if (
            node.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
            and len(node.value) > MAX_NUMBER_CHARS
        ):
            raise self.refuse(
                node.start_mark,
                f"a number of {len(node.value)} characters (no field takes more "
                f"than {MAX_NUMBER_CHARS}: shorten it)",
            )
        return node


def read_yaml(path: Path) -> tuple[dict, dict[tuple, int]]:
    """Parse one YAML file into (data, {key path: line}); every failure is a one-line ToolkitError."""
    where = display_path(path)
    loader = SpecLoader(read_spec_text(path), where)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ToolkitError(f"{where}: empty file (a spec needs at least `extends: base`)")
        lines: dict[tuple, int] = {}
        _collect_lines(where, node, (), lines)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = exc.problem or exc.context or "malformed YAML"
        if "'\\t'" in str(problem):
            problem = "tab character in indentation (indent with spaces)"
        raise ToolkitError(f"{where}{line}: malformed YAML: {printable(problem)}") from None
    except yaml.YAMLError as exc:
        raise ToolkitError(
            f"{where}: malformed YAML: {printable(' '.join(str(exc).split()))}"
        ) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ToolkitError(
            f"{where}:1: top level must be a mapping of fields, got {type(data).__name__}"
        )
    return data, lines


def _collect_lines(where: str, node: yaml.Node, prefix: tuple, lines: dict[tuple, int]) -> None:
    """Record the line of every key path; refuse keys that are not names, and duplicates. The tree is no
    larger than the file (no aliases), so walking it is cheap."""
    lines.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = _key(where, key_node, prefix)
            if key in seen:
                raise ToolkitError(
                    f"{where}:{key_node.start_mark.line + 1}: "
                    f"{'.'.join(prefix + (key,))}: duplicate key (keep one)"
                )
            seen.add(key)
            lines[prefix + (key,)] = key_node.start_mark.line + 1
            _collect_lines(where, value_node, prefix + (key,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _collect_lines(
                where, item, prefix[:-1] + (f"{prefix[-1] if prefix else ''}[{index}]",), lines
            )


def _key(where: str, node: yaml.Node, prefix: tuple) -> str:
    """A mapping key as a name: a plain or quoted string of at most 100 printable characters. A list or
    mapping as key (`? [a, b]`) is unhashable; `null:`, `yes:`, `1:` and `<<:` read as null, bool, int
    and merge, which no field or package is called."""
    field_part = f"{'.'.join(prefix)}: " if prefix else ""
    here = f"{where}:{node.start_mark.line + 1}: {field_part}"
    if not isinstance(node, yaml.ScalarNode):
        kind = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
        raise ToolkitError(f"{here}a key must be a name, not a {kind} (write name: value)")
    if node.tag != "tag:yaml.org,2002:str":
        kind = node.tag.rsplit(":", 1)[-1]
        raise ToolkitError(
            f"{here}key {shown(node.value)} reads as YAML {kind}: a key must be a name "
            f"(quote it if it is one)"
        )
    if len(node.value) > 100 or not node.value.isprintable():
        raise ToolkitError(
            f"{here}key {shown(node.value)}: a key must be a name of at most 100 printable characters"
        )
    return node.value


# ---------------------------------------------------------------- validation of one file


_NOTICED: set[str] = (
    set()
)  # files whose rename notice this process printed (a base is read with every line)


def renamed_sections(
    path: Path, data: Any, lines: dict[tuple, int]
) -> tuple[Any, dict[tuple, int]]:
    """One file's sections under their current names (RENAMED_SECTIONS), with one notice per file that used an
    old name; a file with both names is refused."""
    if not isinstance(data, dict):
        return data, lines  # validate_layer names what it is
    for old, new in RENAMED_SECTIONS.items():
        if old not in data:
            continue
        where = f"{display_path(path)}:{lines.get((old,), 1)}"
        if new in data:
            raise ToolkitError(
                f"{where}: {old}: the old name of {new}, which the file sets too (keep {new}: only)"
            )
        if where not in _NOTICED:
            _NOTICED.add(where)
            rename_notice(where, f"{old}:", f"{new}:")
        data = {(new if key == old else key): value for key, value in data.items()}
        lines = {
            ((new, *key[1:]) if key[:1] == (old,) else key): line for key, line in lines.items()
        }
    return data, lines


def validate_layer(path: Path, data: dict, lines: dict[tuple, int]) -> None:
    """Unknown fields and wrong types in one file, before merging."""
    _validate(path, data, SCHEMA, (), lines)


def _validate(path: Path, value: Any, schema: Any, prefix: tuple, lines: dict[tuple, int]) -> None:
    dotted = ".".join(prefix)
    where = f"{display_path(path)}:{lines.get(prefix, 1)}"
    if value is None and prefix:
        if isinstance(schema, FieldType) and schema.null_fix:
            raise ToolkitError(f"{where}: {dotted}: null is not allowed here ({schema.null_fix})")
        return  # null removes an inherited value
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ToolkitError(
                f"{where}: {dotted}: expected a mapping with fields {', '.join(schema)}, "
                f"got {type(value).__name__}"
            )
        for key, item in value.items():
            if key not in schema:
                known = ", ".join(schema)
                name = ".".join(prefix + (key,))
                raise ToolkitError(
                    f"{display_path(path)}:{lines.get(prefix + (key,), 1)}: {name}: unknown field "
                    f"(known fields{' of ' + dotted if dotted else ''}: {known})"
                )
            _validate(path, item, schema[key], prefix + (key,), lines)
    elif isinstance(schema, ListOf):
        _validate_list(where, dotted, value, schema)
    elif isinstance(schema, MapOf):
        _validate_map(path, dotted, value, schema, prefix, lines)
    else:
        problem = schema.problem(value)
        if problem:
            raise ToolkitError(f"{where}: {dotted}: {problem}")


def _validate_list(where: str, dotted: str, value: Any, schema: ListOf) -> None:
    """Items of the list's type, none twice ("90" and 90 are the same arch), and at least one where the
    field needs one: `archs: []` used to build a wheel for the default arch only and call it a success."""
    if not isinstance(value, list):
        raise ToolkitError(
            f"{where}: {dotted}: expected a list, got {type(value).__name__} {shown(value)}"
        )
    if not value and schema.example:
        raise ToolkitError(
            f"{where}: {dotted}: empty (list at least one, e.g. {dotted}: {schema.example})"
        )
    first: dict[str, int] = {}
    for index, item in enumerate(value):
        problem = schema.item.problem(item)
        if problem:
            raise ToolkitError(f"{where}: {dotted}[{index}]: {problem}")
        earlier = first.setdefault(str(item), index)
        if earlier != index:
            raise ToolkitError(
                f"{where}: {dotted}[{index}]: duplicate of {dotted}[{earlier}] {shown(item)} (keep one)"
            )


def _validate_map(
    path: Path, dotted: str, value: Any, schema: MapOf, prefix: tuple, lines: dict[tuple, int]
) -> None:
    if not isinstance(value, dict):
        raise ToolkitError(
            f"{display_path(path)}:{lines.get(prefix, 1)}: {dotted}: expected a mapping of package "
            f"name to version spec, got {type(value).__name__}"
        )
    for key, item in value.items():
        line = lines.get(prefix + (key,), 1)
        if not re.fullmatch(schema.key_pattern, key, re.ASCII):
            raise ToolkitError(
                f"{display_path(path)}:{line}: {dotted}: {shown(key)} is not a package name "
                f"({schema.key_hint})"
            )
        problem = None if item is None else schema.value.problem(item)
        if problem:
            raise ToolkitError(f"{display_path(path)}:{line}: {dotted}.{key}: {problem}")


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


def _locations_of(
    path: Path, data: dict, lines: dict[tuple, int], prefix: tuple = ()
) -> dict[str, Location]:
    out: dict[str, Location] = {}
    for key, value in data.items():
        dotted = ".".join(prefix + (key,))
        out[dotted] = Location(path, lines.get(prefix + (key,)))
        if isinstance(value, dict):
            out.update(_locations_of(path, value, lines, prefix + (key,)))
    return out


def resolve_chain(path: Path) -> tuple[dict, dict[str, Location], tuple[Path, ...]]:
    """Read a spec and its ancestors, validate each file, merge base-first. Files are told apart by their
    real path (a symlink to a spec in the chain is a cycle) and the chain is at most MAX_EXTENDS long."""
    chain: list[Path] = []
    layers: list[tuple[dict, dict[str, Location]]] = []
    seen: set[str] = set()
    current = path
    while True:
        if os.path.realpath(current) in seen:
            cycle = " -> ".join(display_path(p) for p in chain + [current])
            raise ToolkitError(
                f"{display_path(path)}: cyclic extends: {cycle} (remove one `extends`)"
            )
        if len(chain) == MAX_EXTENDS:
            raise ToolkitError(
                f"{display_path(path)}: extends: more than {MAX_EXTENDS} specs in the chain (at "
                f"{display_path(current)}; inherit from fewer levels)"
            )
        seen.add(os.path.realpath(current))
        data, lines = read_yaml(current)
        data, lines = renamed_sections(current, data, lines)
        validate_layer(current, data, lines)
        chain.append(current)
        layers.append((data, _locations_of(current, data, lines)))
        parent_name = data.get("extends")
        if parent_name is None:
            break
        current = _parent(current, parent_name, lines.get(("extends",), 1))
    merged: dict = {}
    locations: dict[str, Location] = {}
    for data, where in reversed(layers):
        merged = merge(merged, data)
        locations.update(where)
    merged.pop("extends", None)
    return merged, locations, tuple(chain)


def _parent(child: Path, name: str, line: int) -> Path:
    """The spec a child extends: `name`.yaml beside it (the schema let only a plain name through)."""
    parent = child.parent / f"{name}.yaml"
    if os.path.lexists(parent):
        return parent
    stems = sorted(printable(p.stem) for p in child.parent.glob("*.yaml"))
    known = ", ".join(stems[:20]) + (f" and {len(stems) - 20} more" if len(stems) > 20 else "")
    raise ToolkitError(
        f"{display_path(child)}:{line}: extends: no spec named {name!r} "
        f"in {display_path(child.parent)}/ (known: {known})"
    )


def _get(data: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _render(value: str, fields: dict[str, str], where: Location, dotted: str) -> str:
    """Fill in {cuda}, {python} and {gcc} by plain substitution. Not str.format: that would also evaluate
    {cuda.real}, {cuda[0]}, {cuda!r} and {cuda:>9} (attribute and index access driven by a file)."""

    def refuse(detail: str) -> ToolkitError:
        allowed = ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
        return ToolkitError(
            f"{where}: {dotted}: bad placeholder in {shown(value)} ({detail}; allowed: {allowed})"
        )

    def fill(match: re.Match) -> str:
        if match.group(1) not in fields:
            raise refuse(shown(match.group(1)))
        return fields[match.group(1)]

    filled = PLACEHOLDER.sub(fill, value)
    if "{" in filled or "}" in filled:
        raise refuse("a brace that is no placeholder")
    return filled


def _packages(
    merged: dict, section: str, fields: dict[str, str], locations: dict[str, Location], path: Path
) -> dict[str, str]:
    """A package section with placeholders filled in, each value then checked as what it becomes: a pip
    requirement's specifier or a conda match spec's version. A newline or `--index-url` in a version
    reached requirements.in before."""
    schema: MapOf = SCHEMA[section]
    packages: dict[str, str] = {}
    for name, spec in (merged.get(section) or {}).items():
        where = locations.get(f"{section}.{name}", Location(path, None))
        value = _render(spec or "*", fields, where, f"{section}.{name}")
        problem = schema.rendered.problem(value)
        if problem:
            raise ToolkitError(f"{where}: {section}.{name}: {problem}")
        packages[name] = value
    if section == "pip_packages":
        _pip_names_distinct(packages, locations, path)
    return packages


def _pip_names_distinct(
    packages: dict[str, str], locations: dict[str, Location], path: Path
) -> None:
    """pip compares names case-blind with -_. alike (PEP 503), and torch comes from torch.version."""
    first: dict[str, str] = {"torch": "torch.version"}
    for name in packages:
        where = locations.get(f"pip_packages.{name}", Location(path, None))
        earlier = first.setdefault(canonicalize_name(name), f"pip_packages.{name}")
        if earlier != f"pip_packages.{name}":
            raise ToolkitError(
                f"{where}: pip_packages.{name}: duplicate of {earlier} (pip names ignore case and "
                f"-_.: keep one)"
            )


def load_spec(path: Path) -> EnvSpec:
    """Load, merge and type one spec; raises ToolkitError (one line) on any bad input."""
    path = Path(path)
    line = checked_line(path.stem, display_path(path))
    merged, locations, chain = resolve_chain(path)
    kind = _get(merged, "toolchain.kind")
    required = {"external": REQUIRED + EXTERNAL_REQUIRED, "pypi": PYPI_REQUIRED}.get(kind, REQUIRED)
    missing = [name for name in required if _get(merged, name) is None]
    if missing:
        raise ToolkitError(
            f"{display_path(path)}: missing required field{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} (set {'them' if len(missing) > 1 else 'it'} here or in "
            f"{display_path(chain[-1])})"
        )
    fields = {"cuda": merged["cuda"], "python": merged["python"], "gcc": str(merged["gcc"])}
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
        channels=tuple(merged.get("channels") or ()),
        conda_packages=_packages(merged, "conda_packages", fields, locations, path),
        pip_packages=_packages(merged, "pip_packages", fields, locations, path),
        torch_version=merged["torch"]["version"],
        torch_index=merged["torch"]["index"],
        flash_attn_version=merged["flash_attn_2"]["version"],
        archs=tuple(str(a) for a in merged["archs"]),
        build=BuildKnobs(
            jobs=None if str(build.get("jobs", "auto")) == "auto" else int(build["jobs"]),
            nvcc_threads=None
            if str(build.get("nvcc_threads", "auto")) == "auto"
            else int(build["nvcc_threads"]),
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
        flash_attn_3=_fa3_request(merged.get("flash_attn_3")),
    )


def _fa4_request(section: dict | None) -> Fa4Request | None:
    if not section or section.get("version") is None:
        return None
    return Fa4Request(section["version"], bool(section.get("with_flash_attn_2", True)))


def _fa3_request(section: dict | None) -> Fa3Request | None:
    """None unless both commit and profile are set (spec/fa3.py names what a partial section lacks)."""
    if not section or section.get("commit") is None or section.get("profile") is None:
        return None
    return Fa3Request(
        section["commit"], section["profile"], bool(section.get("with_flash_attn_2", True))
    )


def spec_paths(envs_dir: Path = Workspace.envs) -> list[Path]:
    """Every line's spec in envs/ (base.yaml is a parent, not a line)."""
    if not envs_dir.is_dir():
        raise ToolkitError(
            f"{display_path(envs_dir)}: no such directory (run from the project root or pass --envs)"
        )
    return sorted(p for p in envs_dir.glob("*.yaml") if p.stem != BASE_NAME)


def resolve_spec_arg(arg: str, workspace: Workspace = DEFAULT) -> Path:
    """A CLI argument that is a line name (cu126) or a path to a spec file. Every verb that takes a line
    resolves it here, so a typo (cu26) is named as one, with the nearest real line, before any other file
    (its lock, its prefix) is looked for."""
    candidate = Path(arg)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    path = workspace.spec_file(arg)
    if not path.exists():
        known = [p.stem for p in spec_paths(workspace.envs)]
        import difflib

        near = difflib.get_close_matches(arg, known, n=1)
        guess = f"did you mean {near[0]}? " if near else ""
        raise ToolkitError(
            f"{display_path(path)}: no spec for line {arg!r} ({guess}known lines: "
            f"{', '.join(known) or 'none'})"
        )
    return path
