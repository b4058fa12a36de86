"""FA4's lock: the pinned wheels' files and sha256s as the index serves them, written to and read back from
locks/<line>.fa4-lock.json (digest-checked), typed as `Fa4Lock`.

Schema 1 files carry no schema number: the committed locks are schema 1, and a re-lock must write them byte
for byte. A later schema writes its number, and `FORMAT` gains the upgrade from this one.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

from toolkit.base.atomic import write_atomic
from toolkit.base.errors import ToolkitError, first_problem
from toolkit.base.jsonfile import read_json
from toolkit.base.typed import adapter
from toolkit.base.versioned import Format
from toolkit.base.workspace import DEFAULT, Workspace
from toolkit.knowledge.fa4_pins import KNOWLEDGE_FILE, Release, release, wheel_fits_python
from toolkit.spec.envspec import EnvSpec

PYPI_SIMPLE = "https://pypi.org/simple"
RELOCK = "run `toolkit fa4 lock LINE`"
FORMAT = Format("FA4 lock", 1, unnumbered=1)
Text = Annotated[
    str, pydantic.Strict()
]  # a number where a string was written is an edit, not a version


@dataclass(frozen=True)
class Fa4LockWheel:
    """One pinned wheel (knowledge.fa4_pins.WheelPin) and the URL the index serves it at."""

    __pydantic_config__ = pydantic.ConfigDict(extra="forbid")
    name: Text
    version: Text
    file: Text
    sha256: Text
    size: Annotated[int, pydantic.Strict()]
    url: Text
    cuda: Text | None = None
    if_missing: Annotated[bool, pydantic.Strict()] = False
    replaces: Text | None = None


@dataclass(frozen=True)
class Fa4Lock:
    """locks/<line>.fa4-lock.json: FA4's wheels for one line's CUDA major and python, digest over the rest."""

    __pydantic_config__ = pydantic.ConfigDict(extra="forbid")
    kind: Literal["fa4-lock"]
    line: Text
    release: Text
    cuda_major: Text
    python: Text
    with_flash_attn_2: Annotated[bool, pydantic.Strict()]
    from_base: list[Text]
    wheels: list[Fa4LockWheel]
    digest: Text
    schema: Annotated[int, pydantic.Strict()] = FORMAT.schema


def pypi_files(project: str, index: str = PYPI_SIMPLE) -> list[dict[str, Any]]:
    """A project's files from a PEP 691 JSON simple index (name, url, hashes)."""
    import urllib.error
    import urllib.request

    url = f"{index.rstrip('/')}/{project}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["files"]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise ToolkitError(
            f"{url}: cannot read the release files ({getattr(exc, 'reason', exc)}; lock where "
            f"the index is reachable)"
        ) from None


def lock_entries(rel: Release, cuda_major: str, files_of: Any = pypi_files) -> list[dict[str, Any]]:
    """Each pinned wheel with its index URL; the index's sha256 must be the knowledge's pin."""
    entries = []
    for pin in rel.wheels_for(cuda_major):
        found = next(
            (f for f in files_of(pin.name) if f["filename"] == pin.file and not f.get("yanked")),
            None,
        )
        if found is None:
            raise ToolkitError(
                f"{pin.name}: the index has no (unyanked) {pin.file} (check {KNOWLEDGE_FILE.name})"
            )
        if found["hashes"].get("sha256") != pin.sha256:
            got = found["hashes"].get("sha256", "?")
            raise ToolkitError(
                f"{pin.file}: the index's sha256 {got[:12]}... is not the "
                f"pin {pin.sha256[:12]}... in {KNOWLEDGE_FILE.name} (a replaced file: do not lock it)"
            )
        entries.append({**asdict(pin), "url": found["url"]})
    return entries


def write_fa4_lock(
    spec: EnvSpec, files_of: Any = pypi_files, workspace: Workspace = DEFAULT
) -> Path:
    """locks/<line>.fa4-lock.json: the exact, hash-pinned FA4 wheels for the line's CUDA major and python."""
    from toolkit.base.digest import sha256_json

    if spec.flash_attn_4 is None:
        raise ToolkitError(
            f"{spec.path}: no flash_attn_4 section (add `flash_attn_4: {{version: ...}}`)"
        )
    rel = release(spec.flash_attn_4.version)
    cuda_major = spec.cuda.split(".")[0]
    unfit = [
        p.file for p in rel.wheels_for(cuda_major) if not wheel_fits_python(p.file, spec.python)
    ]
    if unfit:
        raise ToolkitError(
            f"{spec.path}: python {spec.python}: {unfit[0]} is pinned for another interpreter"
        )
    data = {
        "kind": "fa4-lock",
        "line": spec.line,
        "release": rel.version,
        "cuda_major": cuda_major,
        "python": spec.python,
        "with_flash_attn_2": spec.flash_attn_4.with_flash_attn_2,
        "from_base": list(rel.from_base),
        "wheels": lock_entries(rel, cuda_major, files_of),
    }
    data["digest"] = sha256_json(data)
    adapter(Fa4Lock).validate_python(data)  # what is written is an Fa4Lock
    path = workspace.fa4_lock_file(spec.line)
    write_atomic(path, json.dumps(data, indent=2) + "\n")
    return path


def read_fa4_lock(path: Path) -> tuple[Release, str]:
    """(the release, CUDA major) a lock pins, refusing an edited lock or one that disagrees with the knowledge."""
    lock = load_fa4_lock(path)
    return release(lock.release), lock.cuda_major


def load_fa4_lock(path: Path) -> Fa4Lock:
    """The lock itself (its wheels' URLs too: a runtime lock takes them), refused in one line where edited or
    where its wheels are not the knowledge's pins of its release."""
    from toolkit.base.digest import sha256_json

    data = read_json(Path(path), "FA4 lock", RELOCK)
    if not isinstance(data, dict) or not isinstance(data.get("digest"), str):
        raise ToolkitError(f"{path}: not an FA4 lock: no digest ({RELOCK})")
    if (
        sha256_json({key: value for key, value in data.items() if key != "digest"})
        != data["digest"]
    ):
        raise ToolkitError(
            f"{path}: edited after it was written (digest mismatch): run `toolkit fa4 lock` again"
        )
    try:
        lock = adapter(Fa4Lock).validate_python(FORMAT.current(data))
    except ValueError as exc:  # pydantic's ValidationError is one
        problem = first_problem(exc) if isinstance(exc, pydantic.ValidationError) else str(exc)
        raise ToolkitError(
            f"{path}: not an FA4 lock this toolkit reads ({problem}; {RELOCK} again)"
        ) from None
    rel = release(lock.release)
    pinned = {p.file: p.sha256 for p in rel.wheels_for(lock.cuda_major)}
    if {w.file: w.sha256 for w in lock.wheels} != pinned:
        raise ToolkitError(
            f"{path}: its wheels differ from {KNOWLEDGE_FILE.name} for flash-attn-4 {rel.version} "
            f"(lock again)"
        )
    for (
        wheel
    ) in lock.wheels:  # an installer fetches each from its URL: the pinned file, over http(s)
        parts = urllib.parse.urlsplit(wheel.url)
        if (
            parts.scheme not in ("https", "http")
            or urllib.parse.unquote(parts.path).rsplit("/", 1)[-1] != wheel.file
        ):
            raise ToolkitError(
                f"{path}: {wheel.file}'s URL {wheel.url!r} is not an http(s) URL of that file ({RELOCK} again)"
            )
    return lock
