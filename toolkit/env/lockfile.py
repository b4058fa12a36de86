"""The lock file model: locks/<line>.conda-lock.yml read, verified and checked once, for every stage.

`read_lock` returns a typed `LockedEnv` (its sdist pin and every package) only after the file parsed,
its digest matched, and every value that later becomes a path, a URL or a command line has a strict
form: plain file names (no separator, no `..`), 64 lowercase hex digits for each sha256, URL schemes
https/http/file, names that are names, each package at most once per platform and manager.
`environment_problem` says whether the packages form the environment the spec describes.

Trust model: the digest (`fa-envkit.lock-sha256`) is a checksum inside the file it covers. Anyone who
edits a lock can recompute it, so it catches accidents (a hand edit, a bad merge, a truncated copy),
not attackers. What protects content is the sha256 of every archive, checked before anything is
installed or built; the lock itself must come from a trusted source (git review).
"""

from __future__ import annotations

import re
import sys
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.digest import sha256_file, sha256_json
from toolkit.base.errors import ToolkitError, first_problem, shown
from toolkit.base.paths import display_path
from toolkit.base.workspace import LOCK_SUFFIX, Workspace
from toolkit.spec.platforms import PLATFORMS

if TYPE_CHECKING:
    from packaging.version import Version

    from toolkit.spec.envspec import EnvSpec

# metadata.custom_metadata keys (conda-lock allows only str -> str there).
KEY_LINE = "fa-envkit.line"
KEY_INPUT_HASH = "fa-envkit.input-hash"
KEY_TOOLCHAIN = "fa-envkit.toolchain-kind"
KEY_SDIST_URL = "fa-envkit.flash-attn-sdist.url"
KEY_SDIST_FILENAME = "fa-envkit.flash-attn-sdist.filename"
KEY_SDIST_SHA256 = "fa-envkit.flash-attn-sdist.sha256"
KEY_PIP_RESOLVER = "fa-envkit.pip-resolver."  # + platform
KEY_DIGEST = "fa-envkit.lock-sha256"
KEY_CUDA = "fa-envkit.cuda"  # a pypi lock's CUDA release, whose wheels its components must be
KEY_PYLOCK_SHA256 = "fa-envkit.pylock-sha256"  # a pypi lock's pylock.<line>.toml, written with it
KEY_EXCLUDE_NEWER = (
    "fa-envkit.exclude-newer"  # a pypi lock's time: what the index held then is what it resolved
)
REQUIRED_KEYS = (
    KEY_LINE,
    KEY_INPUT_HASH,
    KEY_TOOLCHAIN,
    KEY_SDIST_URL,
    KEY_SDIST_FILENAME,
    KEY_SDIST_SHA256,
    KEY_DIGEST,
)

# The strict forms of values that become paths, URLs or command lines.
SHA256 = re.compile(r"[0-9a-f]{64}")
FILE_NAME = re.compile(
    r"[A-Za-z0-9_][A-Za-z0-9._+-]*"
)  # a plain file name: no separator, never "." or ".."
NAME = re.compile(
    r"_?[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"
)  # a conda (_libgcc_mutex) or PEP 508 project name
URL = re.compile(
    r"[!-~]+"
)  # printable ASCII, no space or control character (pip reads URLs line by line)
URL_SCHEMES = ("https", "http", "file")
TOOLCHAIN_KINDS = ("locked", "external", "pypi")
MAJOR_MINOR = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
UTC_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"
)  # uv's --exclude-newer, as recorded
CONDA_SUFFIXES = (".conda", ".tar.bz2")
SDIST_SUFFIXES = (".tar.gz", ".zip")
MAX_LOCK_BYTES = (
    64 << 20
)  # a lock of thousands of packages is a few MB; more is not one `toolkit lock` wrote


@dataclass(frozen=True)
class LockedSdist:
    """The flash-attn source archive the build stage compiles, pinned by hash."""

    url: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class LockedPackage:
    """One package entry of a lock: what install downloads, verifies and installs."""

    manager: str  # conda | pip
    name: str
    version: str
    url: str
    sha256: str
    platform: str = ""
    dependencies: tuple[
        str, ...
    ] = ()  # names of the packages it depends on (virtual ones left out)

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1].split("#", 1)[0]

    @property
    def channel(self) -> str:
        """A conda archive's channel: its URL without the subdir and file name."""
        return self.url.rsplit("/", 2)[0]


@dataclass(frozen=True)
class LockedEnv:
    """What later stages need from a lock file, read without network or solver."""

    line: str
    path: Path
    input_hash: str
    toolchain_kind: str
    platforms: tuple[str, ...]
    sdist: LockedSdist
    packages: tuple[LockedPackage, ...] = ()
    sources: tuple[str, ...] = ()  # the spec files it was made from, relative to the lock's folder
    digest: str = ""
    cuda: str = ""  # pypi: the CUDA release every NVIDIA wheel of the lock belongs to
    pylock_sha256: str = ""  # pypi: sha256 of locks/pylock.<line>.toml
    exclude_newer: str = (
        ""  # pypi: the time it was resolved at (uv --exclude-newer); "" in locks made before it
    )

    def packages_for(self, platform: str, manager: str | None = None) -> list[LockedPackage]:
        return [p for p in self.packages if p.platform == platform and manager in (None, p.manager)]

    @property
    def spec_file(self) -> Path | None:
        """The line's spec file this lock was made from (the first of its sources)."""
        return self.path.parent / self.sources[0] if self.sources else None


Check = Callable[
    [str, object, bool, str], None
]  # read_lock's check(field, value, ok, what): raises unless ok
_FORM = {
    "sha256": "sha256 (64 lowercase hex digits)",
    "filename": "plain file name (no / or ..)",
    "url": f"URL ({'/'.join(URL_SCHEMES)}, no spaces)",
}


def lock_path(line: str, locks_dir: Path = Workspace.locks) -> Path:
    """The line's lock file in locks_dir (Workspace names it; kept for the lock model's callers)."""
    return Workspace(locks=Path(locks_dir)).lock_file(line)


def relock_hint(path: Path) -> str:
    line = path.name[: -len(LOCK_SUFFIX)] if path.name.endswith(LOCK_SUFFIX) else "LINE"
    return f"re-run `toolkit lock {line}`"


def lock_digest(document: dict) -> str:
    """sha256 of a parsed lock file with the digest entry itself left out."""
    meta = dict(document.get("metadata") or {})
    custom = {k: v for k, v in (meta.get("custom_metadata") or {}).items() if k != KEY_DIGEST}
    meta["custom_metadata"] = custom
    return sha256_json({**document, "metadata": meta})


class YamlAlias(ValueError):
    """A YAML alias (or merge key) in a lock: `toolkit lock` writes none, and one can expand without bound."""


def fast_loader() -> type:
    """libyaml's loader where built in. PyYAML is imported here, where a lock is read or written: an install
    given its packages (the engine's own) reads no YAML."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def fast_dumper() -> type:
    """libyaml's emitter where built in: the bytes of PyYAML's pure-Python one (conda-lock's writer's), 5-10x
    faster."""
    import yaml

    return getattr(yaml, "CDumper", yaml.Dumper)


def load_lock_yaml(text: str) -> object:
    """A lock's text as plain data, parsed once: libyaml composes the node graph (where built in), an alias is
    refused (YamlAlias: a node reached twice) before anything walks what it would expand to, then the graph is
    constructed. The earlier reader scanned the events with libyaml, loaded with pure-Python PyYAML, then had
    conda-lock parse the file a third time (0.7 s of CPU for a lock of 40 packages)."""
    import yaml

    loader = fast_loader()(text)
    try:
        root = loader.get_single_node()
        seen: set[int] = set()
        stack = [root] if root is not None else []
        while stack:
            node = stack.pop()
            if id(node) in seen:
                raise YamlAlias("a YAML alias")
            seen.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                stack.extend(node.value)
            elif isinstance(node, yaml.MappingNode):
                stack.extend(part for pair in node.value for part in pair)
        return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


def load_lock_document(path: Path) -> dict:
    """The lock as plain data, read once, parsed once (load_lock_yaml), in the shape of conda-lock's lock model
    (conda_lock_problem, in place of its parser: neither conda-lock nor pydantic is imported to read a lock)
    and checked against its digest."""
    import yaml

    where, relock = display_path(path), relock_hint(path)
    try:
        document = load_lock_yaml(regular_file_bytes(path, MAX_LOCK_BYTES).decode())
    except Unreadable as exc:
        if exc.why == "missing":
            raise ToolkitError(f"{where}: no lock file ({relock})") from None
        raise ToolkitError(
            f"{where}: unreadable lock ({exc.reason(MAX_LOCK_BYTES)}; {relock})"
        ) from None
    except YamlAlias:
        raise ToolkitError(
            f"{where}: uses a YAML alias (`toolkit lock` writes none; an alias can expand "
            f"without bound: {relock})"
        ) from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ToolkitError(
            f"{where}: unreadable lock ({exc.__class__.__name__}; {relock})"
        ) from None
    except ValueError:  # no YAMLError: int() refusing a number of thousands of digits
        raise ToolkitError(
            f"{where}: unreadable lock (a number of more than {sys.get_int_max_str_digits()} "
            f"digits; {relock})"
        ) from None
    if not isinstance(document, dict):
        raise ToolkitError(f"{where}: not a conda-lock file ({relock})")
    problem = conda_lock_problem(document)
    if problem:
        raise ToolkitError(f"{where}: malformed conda-lock file ({problem}; {relock})")
    custom = document["metadata"]["custom_metadata"]
    missing = [key for key in REQUIRED_KEYS if not custom.get(key)]
    if missing:
        raise ToolkitError(
            f"{where}: metadata.custom_metadata lacks {', '.join(missing)} "
            f"(not written by `toolkit lock`; {relock})"
        )
    try:
        digest = lock_digest(document)
    except (TypeError, ValueError):  # a date, a set: YAML values that are not plain JSON data
        raise ToolkitError(f"{where}: holds values that are not plain data ({relock})") from None
    if digest != custom[KEY_DIGEST]:
        raise ToolkitError(
            f"{where}: edited after locking (contents do not match {KEY_DIGEST}; "
            f"{relock} instead of editing it)"
        )
    return document


@dataclass(frozen=True)
class Value:
    """A value that passes `ok` (`what` names it in a problem)."""

    what: str
    ok: Callable[[object], bool]


@dataclass(frozen=True)
class Fields:
    """A mapping of these fields and no other: conda-lock's models forbid extra fields."""

    required: Mapping[str, Shape]
    optional: Mapping[str, Shape] = field(default_factory=dict)


@dataclass(frozen=True)
class ListOf:
    item: Shape


@dataclass(frozen=True)
class MapOf:
    """A mapping of string keys to values of one shape."""

    value: Shape


@dataclass(frozen=True)
class OneOf:
    shapes: tuple[Shape, ...]


Shape = Value | Fields | ListOf | MapOf | OneOf
TEXT = Value("a string", lambda v: isinstance(v, str))
NO_VALUE = Value("null", lambda v: v is None)
MAYBE_TEXT = OneOf((TEXT, NO_VALUE))
# conda-lock's v1 lock model (conda_lock/lockfile/v1/models.py: Lockfile, LockMeta, LockedDependency), which its
# parser validates; toolkit/env/lock.py has conda-lock write every lock, and tests/test_lock_reading.py holds this
# to conda-lock's own verdicts. custom_metadata, optional in conda-lock's model, is required: the toolkit's keys.
CONDA_LOCK = Fields(
    {
        "version": Value("1", lambda v: type(v) is int and v == 1),
        "metadata": Fields(
            {
                "content_hash": MapOf(TEXT),
                "channels": ListOf(
                    OneOf((TEXT, Fields({"url": TEXT, "used_env_vars": ListOf(TEXT)})))
                ),
                "platforms": ListOf(TEXT),
                "sources": ListOf(TEXT),
                "custom_metadata": MapOf(TEXT),
            },
            {
                "time_metadata": OneOf((NO_VALUE, Fields({"created_at": TEXT}))),
                "git_metadata": OneOf(
                    (
                        NO_VALUE,
                        Fields(
                            {},
                            {
                                "git_user_name": MAYBE_TEXT,
                                "git_user_email": MAYBE_TEXT,
                                "git_sha": MAYBE_TEXT,
                            },
                        ),
                    )
                ),
                "inputs_metadata": OneOf(
                    (NO_VALUE, MapOf(Fields({"md5": MAYBE_TEXT, "sha256": MAYBE_TEXT})))
                ),
            },
        ),
        "package": ListOf(
            Fields(
                {
                    "name": TEXT,
                    "version": TEXT,
                    "manager": Value("conda or pip", lambda v: v in ("conda", "pip")),
                    "platform": TEXT,
                    "url": Value("a URL", lambda v: isinstance(v, str) and v != ""),
                    "hash": Fields({}, {"md5": MAYBE_TEXT, "sha256": MAYBE_TEXT}),
                    "optional": Value("true or false", lambda v: isinstance(v, bool)),
                },
                {
                    "dependencies": MapOf(TEXT),
                    "source": OneOf(
                        (
                            NO_VALUE,
                            Fields({"type": Value("url", lambda v: v == "url"), "url": TEXT}),
                        )
                    ),
                    "build": MAYBE_TEXT,
                    "category": TEXT,
                },
            )
        ),
    }
)


def conda_lock_problem(document: dict) -> str | None:
    """The first field of `document` that conda-lock's lock model refuses ("package[3].optional: missing"),
    or None."""
    problem = shape_problem(document, CONDA_LOCK, "")
    if problem:
        return problem
    for index, entry in enumerate(document["package"]):
        if entry["manager"] == "conda" and entry["hash"].get("md5") is None:
            return f"package[{index}].hash.md5: missing (conda package hashes must use MD5)"
    return None


def shape_problem(value: object, shape: Shape, at: str) -> str | None:
    """Where `value` is not of `shape`, as "field.path: problem", or None."""
    name = at or "top level"
    if isinstance(shape, Value):
        return None if shape.ok(value) else f"{name}: not {shape.what}"
    if isinstance(shape, OneOf):
        if any(shape_problem(value, one, at) is None for one in shape.shapes):
            return None
        return next(p for p in (shape_problem(value, one, at) for one in shape.shapes) if p)
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            return f"{name}: not a list"
        return next(
            (
                p
                for i, item in enumerate(value)
                if (p := shape_problem(item, shape.item, f"{at}[{i}]"))
            ),
            None,
        )
    if not isinstance(value, dict):
        return f"{name}: not a mapping"
    if isinstance(shape, MapOf):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{name}: key {shown(key)}: not a string"
            if problem := shape_problem(item, shape.value, f"{at}.{key}".lstrip(".")):
                return problem
        return None
    for key in value:
        if key not in shape.required and key not in shape.optional:
            return f"{f'{at}.{key}'.lstrip('.')}: not a field of a conda-lock file"
    for key, item_shape in (*shape.required.items(), *shape.optional.items()):
        here = f"{at}.{key}".lstrip(".")
        if key not in value:
            if key in shape.required:
                return f"{here}: missing"
        elif problem := shape_problem(value[key], item_shape, here):
            return problem
    return None


def conda_lock_modules_only() -> None:
    """Let `from conda_lock.<module> import ...` run without conda_lock/__init__.py, which imports all of
    conda-lock (its CLI, solvers, vendored poetry: 0.3 s of CPU) only to re-export the CLI's `main`: the package
    is registered unexecuted, as a namespace package is, and its modules import what they use. Call it before
    importing conda-lock's models; the toolkit uses no name of the package itself (conda-lock's CLI runs as
    `python -m conda_lock`, in its own process). A conda-lock already imported is left as it is."""
    import importlib.util

    if "conda_lock" not in sys.modules and (spec := importlib.util.find_spec("conda_lock")):
        sys.modules["conda_lock"] = importlib.util.module_from_spec(spec)


_HOLLOW = threading.Lock()


def import_without_package_init(package: str, module: str) -> ModuleType:
    """conda-lock's `package`.`module` imported without the package's __init__, which imports far more than the
    module uses: the package is registered unexecuted while the module is imported, then taken out again, so
    that a later import of the package in this process (conda-lock's own CLI, a test) runs its __init__."""
    import importlib
    import importlib.util

    with _HOLLOW:  # one import at a time: another thread's must not see the package taken out
        if (done := sys.modules.get(f"{package}.{module}")) is not None:
            return done
        conda_lock_modules_only()
        hollow = package not in sys.modules
        if hollow and (spec := importlib.util.find_spec(package)):
            sys.modules[package] = importlib.util.module_from_spec(spec)
        try:
            return importlib.import_module(f"{package}.{module}")
        finally:
            if hollow:
                del sys.modules[package]


def conda_common() -> ModuleType:
    """conda-lock's conda_lock.src_parser.conda_common (its spec -> dependency conversion) without the package's
    __init__, which imports every source parser, and through them conda-lock's PyPI solver and vendored poetry
    (0.15-0.3 s of CPU)."""
    return import_without_package_init("conda_lock.src_parser", "conda_common")


def conda_lock_models() -> tuple[ModuleType, ModuleType]:
    """conda-lock's v1 and v2prelim lock models without conda_lock/lockfile/__init__.py, which imports its
    lookup of PyPI names (filelock, asyncio) and vendored conda (requests): 0.15 s of CPU against 0.35."""
    return (
        import_without_package_init("conda_lock.lockfile", "v1.models"),
        import_without_package_init("conda_lock.lockfile", "v2prelim.models"),
    )


def sealed(document: dict) -> dict:
    """A lock's document (lock_document.lock_document: conda-lock's writer's, without its help text) with the
    lock's digest added (`lock_digest` of the document without it): what is checked and written."""
    # the digest of the data dumped, which is plain JSON data: what the text parses back to (read_lock of the
    # written file checks that, as for any lock)
    document["metadata"]["custom_metadata"][KEY_DIGEST] = lock_digest(document)
    return document


def lock_text(document: dict) -> str:
    """A sealed lock document dumped by libyaml's emitter, which writes PyYAML's bytes (tests/golden, the
    committed locks re-made) in a fraction of the pure-Python emitter's time."""
    return _dump(document)


def _dump(document: dict) -> str:
    import yaml

    return yaml.dump(document, sort_keys=False, Dumper=fast_dumper())


def check_with_conda_lock(path: Path, document: object) -> None:
    """conda-lock's own lock models on a lock `toolkit lock` just wrote (conda-lock is there: it wrote the file),
    so that what `conda-lock install` reads is checked by conda-lock itself; readers use conda_lock_problem.
    `document`: what the file at `path` parses to (the writer's: the document it dumped).

    What conda-lock's parse_conda_lock_file checks: version 1, its v1 model, the v1 -> v2 conversion (an entry
    repeated); on the text as libyaml parses it (the data PyYAML's pure-Python parser gives, several times
    faster), and without its topological sort, which orders packages and refuses nothing."""
    v1, v2prelim = conda_lock_models()
    from pydantic import ValidationError

    where, relock = display_path(path), relock_hint(path)
    try:
        if not isinstance(document, dict) or document.get("version") != 1:
            raise ValueError("not a version 1 conda-lock file")
        content = {key: value for key, value in document.items() if key != "version"}
        v2prelim.lockfile_v1_to_v2(v1.Lockfile.model_validate(content))
    except ValidationError as exc:
        raise ToolkitError(
            f"{where}: malformed conda-lock file ({first_problem(exc)}; {relock})"
        ) from None
    except (
        ValueError,
        TypeError,
        KeyError,
        AssertionError,
    ) as exc:  # AssertionError: an entry repeated
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ToolkitError(f"{where}: malformed conda-lock file ({first}; {relock})") from None


def read_lock(path: Path) -> LockedEnv:
    """Read and verify a lock; ToolkitError (one line) if it is missing, malformed, tampered, or holds a
    value without its strict form. Nothing is touched before this returns."""
    path = Path(path)
    return locked_env(path, load_lock_document(path))


def locked_env(path: Path, document: dict) -> LockedEnv:
    """read_lock's checks of a lock `path` that load_lock_document has read (and checked) as `document`."""
    relock = relock_hint(path)
    custom = document["metadata"]["custom_metadata"]
    check = _checker(path, relock)
    for key, pattern, what in (
        (KEY_LINE, NAME, "a line name"),
        (KEY_INPUT_HASH, SHA256, _FORM["sha256"]),
        (KEY_SDIST_SHA256, SHA256, _FORM["sha256"]),
        (KEY_SDIST_FILENAME, FILE_NAME, _FORM["filename"]),
    ):
        check(
            key,
            custom[key],
            isinstance(custom[key], str) and bool(pattern.fullmatch(custom[key])),
            "a " + what,
        )
    check(
        KEY_TOOLCHAIN,
        custom[KEY_TOOLCHAIN],
        custom[KEY_TOOLCHAIN] in TOOLCHAIN_KINDS,
        f"one of {', '.join(TOOLCHAIN_KINDS)}",
    )
    check(
        KEY_SDIST_FILENAME,
        custom[KEY_SDIST_FILENAME],
        custom[KEY_SDIST_FILENAME].endswith(SDIST_SUFFIXES),
        f"an sdist file name ({' or '.join(SDIST_SUFFIXES)})",
    )
    check(
        f"{KEY_SDIST_URL} (url)",
        custom[KEY_SDIST_URL],
        _url_ok(custom[KEY_SDIST_URL]),
        "a " + _FORM["url"],
    )
    platforms = document["metadata"].get("platforms") or []
    check(
        "metadata.platforms",
        platforms,
        bool(platforms)
        and all(p in PLATFORMS for p in platforms)
        and len(set(platforms)) == len(platforms),
        f"a list of distinct platforms of {', '.join(PLATFORMS)}",
    )
    sources = document["metadata"].get("sources") or []
    check(
        "metadata.sources",
        sources,
        all(isinstance(s, str) and s.endswith(".yaml") and "\0" not in s for s in sources),
        "a list of spec files",
    )
    pypi = custom[KEY_TOOLCHAIN] == "pypi"
    if pypi:
        for key, pattern, what in (
            (KEY_CUDA, MAJOR_MINOR, "CUDA release like 13.2"),
            (KEY_PYLOCK_SHA256, SHA256, _FORM["sha256"]),
        ):
            check(
                key,
                custom.get(key),
                isinstance(custom.get(key), str) and bool(pattern.fullmatch(custom[key])),
                "a " + what,
            )
        if KEY_EXCLUDE_NEWER in custom:
            check(
                KEY_EXCLUDE_NEWER,
                custom[KEY_EXCLUDE_NEWER],
                isinstance(custom[KEY_EXCLUDE_NEWER], str)
                and bool(UTC_TIME.fullmatch(custom[KEY_EXCLUDE_NEWER])),
                "a UTC time like 2026-11-23T21:44:12Z",
            )
    packages = tuple(_packages(document, platforms, check))
    if pypi:
        problem = pypi_release_problem(packages, custom[KEY_CUDA])
        if problem:
            raise ToolkitError(
                f"{display_path(path)}: {problem} (a pypi lock is one CUDA release: {relock})"
            )
    for package in packages:
        if package.manager == "pip":
            check_wheel_name(package, path)
    return LockedEnv(
        line=custom[KEY_LINE],
        path=path,
        input_hash=custom[KEY_INPUT_HASH],
        toolchain_kind=custom[KEY_TOOLCHAIN],
        platforms=tuple(platforms),
        sources=tuple(sources),
        digest=custom[KEY_DIGEST],
        sdist=LockedSdist(
            url=custom[KEY_SDIST_URL],
            filename=custom[KEY_SDIST_FILENAME],
            sha256=custom[KEY_SDIST_SHA256],
        ),
        packages=packages,
        cuda=custom.get(KEY_CUDA, "") if pypi else "",
        pylock_sha256=custom.get(KEY_PYLOCK_SHA256, "") if pypi else "",
        exclude_newer=custom.get(KEY_EXCLUDE_NEWER, "") if pypi else "",
    )


def _checker(path: Path, relock: str) -> Check:
    where = display_path(path)

    def check(field: str, value: object, ok: bool, what: str) -> None:
        if not ok:
            raise ToolkitError(
                f"{where}: {field}: {value!r} is not {what} ({relock}; a lock must come from "
                f"`toolkit lock` and a reviewed commit)"
            )

    return check


def locked_packages(document: dict, path: Path, relock: str) -> tuple[LockedPackage, ...]:
    """The package entries of a conda-lock document read_lock's way (every value in its strict form; one line
    naming the file and `relock` if not), for a lock of another kind than a build lock (a runtime lock)."""
    platforms = (document.get("metadata") or {}).get("platforms") or []
    return tuple(_packages(document, platforms, _checker(path, relock)))


def brief(text: str, limit: int = 64) -> str:
    """A value as a message quotes it: whole when short, else its start and its length (a 5000-digit version)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parsed_version(text: str) -> Version | None:
    """A PEP 440 version, or None for text that is none; a component of more digits than int() reads (4300)
    is none either (packaging raises ValueError for it, not InvalidVersion)."""
    from packaging.version import Version

    try:
        return Version(text)
    except ValueError:  # InvalidVersion too
        return None


def check_wheel_identity(
    package: LockedPackage, name: str, version: str, by: str, lock_file: Path
) -> None:
    """A pip entry must be the wheel it points at, by the wheel's file name and its METADATA: pip installs what
    the wheel is whatever the entry says, so an entry whose version was edited over an unchanged url and sha256
    would pass the lock's checks (a pypi lock's one CUDA release) and install another. The pip layer's
    counterpart of engine.check_identity (a conda archive's info/index.json)."""
    from packaging.utils import canonicalize_name

    wanted = parsed_version(package.version)
    if (
        canonicalize_name(name) != canonicalize_name(package.name)
        or wanted is None
        or parsed_version(version) != wanted
    ):
        raise ToolkitError(
            f"{display_path(lock_file)}: {package.name} {brief(package.version)} "
            f"({brief(package.filename, 160)}): its wheel is {brief(name)} {brief(version)} by its {by} "
            f"(the entry was edited: {relock_hint(lock_file)})"
        )


def check_wheel_name(package: LockedPackage, lock_file: Path) -> None:
    """The wheel file name a pip entry's URL ends in names the entry's package and version (check_wheel_identity);
    read without downloading, so `lock --check` refuses the edit as install does."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    filename = urllib.parse.unquote(
        package.filename
    )  # torch-2.9.0%2Bcu130-...whl: the + of a local version
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except (
        InvalidWheelFilename,
        ValueError,
    ):  # ValueError: a version component of thousands of digits
        raise ToolkitError(
            f"{display_path(lock_file)}: {package.name} {brief(package.version)} "
            f"({brief(package.filename, 160)}): not a wheel's file name (the pip layer installs wheels "
            f"only: {relock_hint(lock_file)})"
        ) from None
    check_wheel_identity(package, name, str(version), "file name", lock_file)


def pypi_release_problem(packages: tuple[LockedPackage, ...], cuda: str) -> str | None:
    """Why a pypi lock's NVIDIA wheels are not all CUDA `cuda`'s (toolkit/knowledge/pypi_cuda.yaml), or None.

    nvidia-cuda-nvcc does not pin its siblings: left floating, crt and nvvm of a newer release resolve beside
    it (nvcc 13.2.86 with crt 13.5.37), an nvcc whose headers are not its own."""
    from packaging.specifiers import SpecifierSet

    from toolkit.knowledge.facts import load_knowledge

    pypi = load_knowledge().pypi
    if cuda not in pypi.cudas:
        return f"CUDA {cuda} is not a pypi line of toolkit/knowledge/pypi_cuda.yaml"
    pip = {p.name: p.version for p in packages if p.manager == "pip"}
    releases = pypi.releases(cuda)
    line = (
        pypi.release(pip["cuda-toolkit"]) if parsed_version(pip.get("cuda-toolkit", "")) else None
    )
    known = " or ".join(release.cuda_toolkit for release in releases)
    if "cuda-toolkit" not in pip:
        return f"cuda-toolkit is missing: CUDA {cuda}'s cuda-toolkit {known} installs it"
    nvcc = (
        f" beside nvidia-cuda-nvcc {brief(pip['nvidia-cuda-nvcc'])}"
        if "nvidia-cuda-nvcc" in pip
        else ""
    )
    if line is None or line.cuda != cuda:
        pins = " or ".join(f"=={release.cuda_toolkit}" for release in releases)
        return (
            f"cuda-toolkit {brief(pip['cuda-toolkit'])}{nvcc} is not CUDA {cuda}'s (cuda-toolkit {known}: "
            f"cuda-toolkit{pins}, toolkit/knowledge/pypi_cuda.yaml)"
        )
    wanted = {
        "cuda-toolkit": f"=={line.cuda_toolkit}",
        **{n: f"=={v}.*" for n, v in line.components.items()},
    }
    for name, specifier in [*wanted.items(), *((n, p) for n, p in line.pins.items() if n in pip)]:
        if name not in pip:
            return f"{name} is missing: CUDA {cuda}'s cuda-toolkit {line.cuda_toolkit} installs it"
        version = parsed_version(pip[name])
        if version is None or not SpecifierSet(specifier).contains(version, prereleases=True):
            return (
                f"{name} {brief(pip[name])}{'' if name == 'nvidia-cuda-nvcc' else nvcc} is not CUDA {cuda}'s "
                f"(cuda-toolkit {line.cuda_toolkit}: {name}{specifier}, toolkit/knowledge/pypi_cuda.yaml)"
            )
    return None


def pylock_problem(locked: LockedEnv) -> str | None:
    """Why a pypi lock's pylock.<line>.toml beside it is not the one written with it, or None (other kinds)."""
    if locked.toolchain_kind != "pypi":
        return None
    path = Workspace(locks=locked.path.parent).pylock_file(locked.line)
    fix = relock_hint(locked.path)
    if not path.is_file():
        return f"{display_path(path)}: missing beside {display_path(locked.path)} ({fix})"
    if sha256_file(path) != locked.pylock_sha256:
        return f"{display_path(path)}: not the pylock written with {display_path(locked.path)} (edited? {fix})"
    return None


def _url_ok(url: object, file_name_suffixes: tuple[str, ...] | None = None) -> bool:
    """An allowed scheme, no whitespace; where the URL names a file that becomes a cache path, a plain name."""
    if not isinstance(url, str) or not URL.fullmatch(url):
        return False
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in URL_SCHEMES or (parts.scheme != "file" and not parts.netloc):
        return False
    name = url.rsplit("/", 1)[-1].split("#", 1)[0]
    return file_name_suffixes is None or (
        bool(FILE_NAME.fullmatch(name)) and name.endswith(file_name_suffixes)
    )


def _packages(document: dict, platforms: list[str], check: Check) -> list[LockedPackage]:
    packages, seen = [], set()
    for index, entry in enumerate(document.get("package") or []):
        name, platform, manager = entry.get("name"), entry.get("platform"), entry.get("manager")
        field = f"package[{index}]"
        check(
            f"{field}.name",
            name,
            isinstance(name, str) and bool(NAME.fullmatch(name)),
            "a package name",
        )
        field = f"package[{index}] {name}"
        check(f"{field}: platform", platform, platform in platforms, "one of metadata.platforms")
        check(f"{field}: manager", manager, manager in ("conda", "pip"), "conda or pip")
        check(
            f"{field}: url",
            entry.get("url"),
            _url_ok(entry.get("url"), CONDA_SUFFIXES if manager == "conda" else None),
            "a " + _FORM["url"] + (" naming a .conda/.tar.bz2 file" if manager == "conda" else ""),
        )
        given = (entry.get("hash") or {}).get("sha256")
        sha256 = given if isinstance(given, str) else ""
        check(
            f"{field}: hash.sha256", given, bool(SHA256.fullmatch(sha256)), "a " + _FORM["sha256"]
        )
        check(
            f"{field} ({platform}, {manager})",
            name,
            (platform, manager, name) not in seen,
            "listed once: it appears more than once",
        )
        seen.add((platform, manager, name))
        depends = tuple(
            sorted(str(d) for d in (entry.get("dependencies") or {}) if not str(d).startswith("__"))
        )
        packages.append(
            LockedPackage(
                manager, name, str(entry.get("version")), entry["url"], sha256, platform, depends
            )
        )
    return packages


def stale_reason(spec: EnvSpec, locked: LockedEnv) -> str | None:
    """Why a lock no longer matches its spec (one sentence with the fix), or None when it does."""
    relock = f"re-run `toolkit lock {spec.line}`"
    if locked.line != spec.line:
        return f"the lock is for line {locked.line}, not {spec.line} ({relock})"
    if locked.input_hash != spec.input_hash():
        # the lock records the inputs of the merged spec, not of each file: name the line's file, and the ones it
        # extends only as where the change may be (an edit to one no longer names the others as changed)
        first, *extended = (display_path(p) for p in spec.chain)
        where = f"{first} or what it extends ({', '.join(extended)})" if extended else first
        return f"{where} changed since this lock was made ({relock})"
    return None


def environment_problem(spec: EnvSpec, locked: LockedEnv, platform: str) -> str | None:
    """Why the lock's packages for `platform` are not the environment the spec describes, or None.

    Every package the spec asks for must be there, and every dependency of a locked package: an entry
    deleted (or all of them) is found even when the digest was recomputed over the edit."""
    from packaging.utils import canonicalize_name

    relock = f"an entry was deleted or the lock was edited; re-run `toolkit lock {locked.line}`"
    if locked.toolchain_kind == "external":
        return None
    managers = (
        ("conda", "pip") if locked.toolchain_kind == "locked" else ("pip",)
    )  # pypi: no conda layer
    by_manager = {m: {p.name: p for p in locked.packages_for(platform, m)} for m in managers}
    if "conda" in by_manager and not by_manager["conda"]:
        return f"{platform}: no conda packages for a locked toolchain ({relock})"
    wanted: dict[str, list[str]] = {
        "conda": list(spec.conda_packages),
        "pip": [
            canonicalize_name(re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0])
            for r in spec.pip_requirements()
        ],
    }
    for manager, names in ((m, wanted[m]) for m in managers):
        for name in names:
            if name not in by_manager[manager]:
                return f"{platform}: {name}, which the spec asks for, is not among the lock's {manager} packages ({relock})"
    for manager, packages in by_manager.items():
        for package in packages.values():
            missing = [d for d in package.dependencies if d not in packages]
            if missing:
                return (
                    f"{platform}: {missing[0]}, a dependency of {package.name}, is not among the lock's "
                    f"{manager} packages ({relock})"
                )
    return None
