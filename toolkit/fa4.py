"""FlashAttention-4 (`flash-attn-4`, flash_attn.cute): its pinned wheels, their fetch and install.

FA4 is pure Python on NVIDIA's CuTe DSL and compiles its kernels at run time, so "building" it means
installing exact wheels and warming its kernel cache (toolkit/fa4_jit.py). The facts (which wheels,
their hashes, which CUDA flavor, which features on which sm) live in knowledge/flash_attn_4.yaml.

Two traps this module exists for (both seen on the H200, 2026-12-01):
- nvidia-cutlass-dsl requires libs-cu12 unconditionally, also on CUDA 13: the toolkit installs the
  exact list with --no-deps and checks every Requires-Dist itself, with libs-cu13 standing in.
- the `cutlass` package is found only through nvidia_cutlass_dsl_packages.pth, which `--target` +
  PYTHONPATH never runs: the toolkit puts nvidia_cutlass_dsl/dsl_packages on the path explicitly
  (`python_path`), so every way of installing (prefix, --target, external python) imports alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass
from email.parser import HeaderParser
from functools import cache
from pathlib import Path
from typing import BinaryIO

from toolkit import children, knowledge_files
from toolkit.atomic import clean_stale, owned_dir, publish_dir, publish_file, run_temporaries, write_atomic
from toolkit.bounded_read import Unreadable, open_regular
from toolkit.digest import sha256_file
from toolkit.errors import ToolkitError
from toolkit.install_record import Fa4Record
from toolkit.jsonfile import read_json
from toolkit.paths import display_path, folder_argument, plain_path
from toolkit.workspace import Workspace, add_workspace_options

KNOWLEDGE_FILE = Path(__file__).parent / "knowledge" / "flash_attn_4.yaml"
DEFAULT_RELEASE = "4.0.0b36"
DSL_PACKAGES = Path("nvidia_cutlass_dsl") / "dsl_packages"  # where `cutlass` lives (knowledge: pth)
# The pinned wheels are built for one interpreter; pip download asks PyPI for exactly these tags.
DOWNLOAD_TAGS = ("--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
                 "--abi", "none", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_24_x86_64",
                 "--platform", "manylinux2014_x86_64", "--platform", "any")
PART_BYTES = 34 * 2 ** 20  # chunks of the one wheel too large to carry: 3 of them, 1 + 2 per carry


@dataclass(frozen=True)
class WheelPin:
    name: str
    version: str
    file: str
    sha256: str
    size: int
    cuda: str | None = None  # only for this CUDA major
    if_missing: bool = False  # only when the target python lacks the distribution
    replaces: str | None = None  # the requirement this wheel satisfies instead (libs-cu12 -> libs-cu13)


@dataclass(frozen=True)
class Release:
    version: str
    python: str
    min_arch: int
    archs: tuple[str, ...]
    cuda_majors: tuple[str, ...]
    torch: str
    wheels: tuple[WheelPin, ...]
    from_base: tuple[str, ...]
    platforms: tuple[str, ...] = ("linux-64",)  # the conda platforms the compiled pins are for

    @property
    def pinned_cuda_majors(self) -> tuple[str, ...]:
        """The CUDA majors whose libs flavor is pinned (a wheel limited to that major)."""
        return tuple(sorted({w.cuda for w in self.wheels if w.cuda and w.replaces}))

    def wheels_for(self, cuda_major: str) -> list[WheelPin]:
        """The wheels of this release for one CUDA major, in install order."""
        if cuda_major not in self.pinned_cuda_majors:
            raise ToolkitError(f"{KNOWLEDGE_FILE.name}: flash-attn-4 {self.version} has no CUDA {cuda_major} "
                               f"flavor pinned (pinned: {', '.join(self.pinned_cuda_majors)}; use such a CUDA line "
                               f"or pin the flavor)")
        return [w for w in self.wheels if w.cuda in (None, cuda_major)]


@cache
def knowledge(path: Path = KNOWLEDGE_FILE) -> dict:
    return knowledge_files.read(path)


def _wheel_pin(entry: dict) -> WheelPin:
    """One `wheels:` entry; YAML reads versions like 13 or 4.8 as numbers, pins keep them as text."""
    return WheelPin(name=entry["name"], version=str(entry["version"]), file=entry["file"], sha256=entry["sha256"],
                    size=int(entry["size"]), cuda=None if entry.get("cuda") is None else str(entry["cuda"]),
                    if_missing=bool(entry.get("if_missing", False)), replaces=entry.get("replaces"))


def release(version: str = DEFAULT_RELEASE, path: Path = KNOWLEDGE_FILE) -> Release:
    entry = knowledge(path)["releases"].get(version)
    if entry is None:
        known = ", ".join(knowledge(path)["releases"])
        raise ToolkitError(f"{path.name}: flash-attn-4 {version} is not in the knowledge (known: {known}; "
                           f"add it with its wheels' sha256)")
    wheels = tuple(_wheel_pin(w) for w in entry["wheels"])
    return Release(version, entry["python"], int(entry["min_arch"]), tuple(entry["archs"]),
                   tuple(entry["cuda_majors"]), entry["torch"], wheels, tuple(entry["from_base"]),
                   tuple(entry["platforms"]))


# ---------------------------------------------------------------- wheels on disk


def check_wheel(path: Path, pin: WheelPin) -> None:
    """The file is the pinned one (size, then sha256), or a one-line error naming it."""
    if not path.is_file():
        raise ToolkitError(f"{path}: missing (run scripts/fetch_fa4_wheels.sh, or carry the folder)")
    if path.stat().st_size != pin.size or sha256_file(path) != pin.sha256:
        raise ToolkitError(f"{path}: does not match the pin in {KNOWLEDGE_FILE.name} (size {pin.size}, "
                           f"sha256 {pin.sha256[:12]}...): delete it and fetch again")


def fetch(rel: Release, cuda_major: str, dest: Path, pip: list[str] | None = None) -> list[Path]:
    """Download each pinned wheel from PyPI (exact version, --no-deps, binary only) and check its hash."""
    pip = pip or [sys.executable, "-m", "pip"]
    dest.mkdir(parents=True, exist_ok=True)
    clean_stale(dest)  # what a killed fetch left
    paths = []
    for pin in rel.wheels_for(cuda_major):
        path = dest / pin.file
        if not (path.is_file() and path.stat().st_size == pin.size and sha256_file(path) == pin.sha256):
            with owned_dir(dest, "download") as scratch, publish_file(path) as staged:
                done = children.run([*pip, "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                                       *DOWNLOAD_TAGS, "--dest", scratch, f"{pin.name}=={pin.version}"],
                                      capture_output=True, text=True)
                got = scratch / pin.file
                if done.returncode != 0 or not got.is_file():
                    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    raise ToolkitError(f"pip download {pin.name}=={pin.version}: {tail} (is PyPI reachable?)")
                check_wheel(got, pin)
                got.rename(staged)
        paths.append(path)
    return paths


def split_file(path: Path, dest: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """Cut a file too large to carry into numbered parts beside a manifest holding the whole file's hash."""
    dest.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(path, "rb") as handle:
        for index, block in enumerate(iter(lambda: handle.read(part_bytes), b"")):
            part = dest / f"{path.name}.part{index:03d}"
            write_atomic(part, block)
            parts.append(part)
    manifest = {"file": path.name, "size": path.stat().st_size, "sha256": sha256_file(path),
                "parts": [p.name for p in parts]}
    write_atomic(dest / f"{path.name}.parts.json", json.dumps(manifest, indent=2) + "\n")
    return parts


@dataclass(frozen=True)
class Joined:
    """One file `fa4 join` writes into --dest: a carried wheel copied as it is, or a file put together from
    the parts its manifest lists. Every source was a regular file of the recorded size when planned."""
    name: str
    sources: tuple[Path, ...]
    size: int
    sha256: str | None  # the manifest's whole-file hash; None for a wheel copied as it is
    origin: Path  # the wheel or the manifest, for messages


def join_parts(manifest_path: Path, search: list[Path], dest: Path) -> Path:
    """Reassemble a split file from parts found in any of `search`; the whole file's sha256 must match."""
    item = parts_of(manifest_path, search)
    check_join([item], dest)
    return write_joined(item, dest)


def parts_of(manifest_path: Path, search: list[Path]) -> Joined:
    """What a parts manifest puts together, checked before anything is written: plain names, each part a
    regular file (no symlink, device or FIFO) found once in `search` and listed once (no two names of one
    file), and the parts' sizes adding up to the manifest's `size`."""
    fix = "split again with scripts/fetch_fa4_wheels.sh"
    manifest = read_json(manifest_path, "parts manifest", fix)
    where = display_path(manifest_path)
    try:
        names = [manifest["file"], *manifest["parts"]]
        if not (isinstance(manifest["sha256"], str) and len(manifest["sha256"]) == 64):
            raise ValueError("sha256")
        if not isinstance(manifest["size"], int) or isinstance(manifest["size"], bool) or manifest["size"] < 0:
            raise ValueError("size")
    except (ValueError, KeyError, TypeError) as exc:
        raise ToolkitError(f"{where}: not a readable parts manifest ({type(exc).__name__}) ({fix})") from None
    if not all(isinstance(n, str) and _plain_name(n) for n in names):
        raise ToolkitError(f"{where}: file and part names must be plain file names (split again)")
    parts: list[tuple[Path, int]] = []
    seen: dict[tuple[int, int], str] = {}
    for name in manifest["parts"]:
        found = next((d / name for d in search if os.path.lexists(d / name)), None)
        if found is None:
            raise ToolkitError(f"{where}: part {name} is in none of {', '.join(map(display_path, search))} "
                               f"(carry the other part folder too)")
        info = _regular(found)
        if (info.st_dev, info.st_ino) in seen:
            raise ToolkitError(f"{where}: part {name} is the same file as part {seen[(info.st_dev, info.st_ino)]} "
                               f"(listed twice, or a hard link; {fix})")
        seen[(info.st_dev, info.st_ino)] = name
        parts.append((found, info.st_size))
    total = sum(size for _, size in parts)
    if total != manifest["size"]:
        raise ToolkitError(f"{where}: its parts hold {total:,} bytes, the manifest's size is {manifest['size']:,} "
                           f"({fix})")
    return Joined(manifest["file"], tuple(p for p, _ in parts), total, manifest["sha256"], manifest_path)


def carried_wheel(wheel: Path) -> Joined:
    """A wheel in a parts folder, copied as it is: a regular file under a plain name (a symlink is refused,
    not followed: it may name a private file or /dev/zero)."""
    if not _plain_name(wheel.name):
        raise ToolkitError(f"{display_path(wheel)}: a file name with a control character (rename it or fetch again)")
    return Joined(wheel.name, (wheel,), _regular(wheel).st_size, None, wheel)


def _plain_name(name: str) -> bool:
    return name == Path(name).name and name not in ("", ".", "..") and name.isprintable()


def _open_regular(path: Path) -> int:
    """A descriptor of the regular file at `path`, the name itself not followed; a one-line error for a
    symlink, a device, a FIFO or a folder."""
    try:
        return open_regular(path, follow_symlinks=False)
    except Unreadable as exc:
        reason = exc.detail if exc.why != "missing" else "file not found"
        raise ToolkitError(f"{display_path(path)}: {reason}, not a regular file (carry the file itself: fetch "
                           f"and split again)") from None


def _regular(path: Path) -> os.stat_result:
    fd = _open_regular(path)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def check_join(items: list[Joined], dest: Path) -> None:
    """Refuse, before anything is written, a join that would replace a file in `dest` by another content
    (an identical file is left as it is), write one name twice, or not fit on dest's filesystem."""
    names: dict[str, Path] = {}
    for item in items:
        if item.name in names:
            raise ToolkitError(f"{display_path(item.origin)}: {item.name} also comes from "
                               f"{display_path(names[item.name])} (pass each part folder once)")
        names[item.name] = item.origin
        there = dest / item.name
        if os.path.lexists(there) and not _already_there(item, there):
            raise ToolkitError(f"{display_path(there)}: already there and not {item.name} of "
                               f"{display_path(item.origin)}; nothing was written (move it away or pass another "
                               f"--dest)")
    needed = sum(item.size for item in items if not os.path.lexists(dest / item.name))
    existing = next(folder for folder in (dest, *dest.parents) if folder.is_dir())
    free = shutil.disk_usage(existing).free
    if needed >= free:
        raise ToolkitError(f"{display_path(dest)}: the join needs {needed / 2 ** 20:.1f} MiB and "
                           f"{free / 2 ** 20:.1f} MiB are free; nothing was written (free space or pass another "
                           f"--dest)")


def _already_there(item: Joined, there: Path) -> bool:
    """Is the file at `there` a regular file with the content `item` would write (a rerun of the join)?"""
    if there.is_symlink() or not there.is_file() or there.stat().st_size != item.size:
        return False
    want = item.sha256 or sha256_file(item.sources[0])
    return sha256_file(there) == want


def write_joined(item: Joined, dest: Path) -> Path:
    """Write `item` into `dest` through a temporary beside it, at most its checked size (a source swapped or
    grown since is refused); a manifest's file must match its sha256."""
    out = dest / item.name
    if os.path.lexists(out):  # check_join found it identical
        return out
    dest.mkdir(parents=True, exist_ok=True)
    with publish_file(out) as staged:
        with open(staged, "xb") as joined:
            left = item.size
            for source in item.sources:
                left -= _append(source, joined, left)
        if left:
            raise ToolkitError(f"{display_path(item.origin)}: a source changed while joining (join again)")
        if item.sha256 and sha256_file(staged) != item.sha256:
            raise ToolkitError(f"{display_path(item.origin)}: the joined file's sha256 differs from the manifest "
                               f"(a part is damaged: fetch and split again)")
    return out


def _append(source: Path, out: BinaryIO, limit: int) -> int:
    """Copy the regular file `source` (the name not followed) to `out`, refused if it now holds more than
    `limit` bytes; the bytes copied."""
    with open(_open_regular(source), "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise ToolkitError(f"{display_path(source)}: grew while joining (join again)")
        copied = 0
        while block := handle.read(min(2 ** 20, size - copied)):
            out.write(block)
            copied += len(block)
        return copied


def wheel_fits_python(filename: str, python: str) -> bool:
    """Does a wheel's tag run on CPython `python` ("3.12")? cpXY exactly, py3, or abi3 from cpXY on."""
    from packaging.utils import parse_wheel_filename

    major, minor = (int(part) for part in python.split(".")[:2])
    for tag in parse_wheel_filename(filename)[3]:
        if tag.interpreter in ("py3", f"py{major}", f"cp{major}{minor}"):
            return True
        if tag.abi == "abi3" and tag.interpreter.startswith(f"cp{major}") and int(tag.interpreter[3:] or 0) <= minor:
            return True
    return False


# ---------------------------------------------------------------- the line's FA4 lock

PYPI_SIMPLE = "https://pypi.org/simple"


def pypi_files(project: str, index: str = PYPI_SIMPLE) -> list[dict]:
    """A project's files from a PEP 691 JSON simple index (name, url, hashes)."""
    import urllib.error
    import urllib.request

    url = f"{index.rstrip('/')}/{project}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["files"]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise ToolkitError(f"{url}: cannot read the release files ({getattr(exc, 'reason', exc)}; lock where "
                           f"the index is reachable)") from None


def lock_entries(rel: Release, cuda_major: str, files_of=pypi_files) -> list[dict]:
    """Each pinned wheel with its index URL; the index's sha256 must be the knowledge's pin."""
    entries = []
    for pin in rel.wheels_for(cuda_major):
        found = next((f for f in files_of(pin.name) if f["filename"] == pin.file and not f.get("yanked")), None)
        if found is None:
            raise ToolkitError(f"{pin.name}: the index has no (unyanked) {pin.file} (check {KNOWLEDGE_FILE.name})")
        if found["hashes"].get("sha256") != pin.sha256:
            got = found["hashes"].get("sha256", "?")
            raise ToolkitError(f"{pin.file}: the index's sha256 {got[:12]}... is not the "
                               f"pin {pin.sha256[:12]}... in {KNOWLEDGE_FILE.name} (a replaced file: do not lock it)")
        entries.append({**asdict(pin), "url": found["url"]})
    return entries


def write_lock(spec, files_of=pypi_files, locks_dir: Path = Workspace.locks) -> Path:
    """locks/<line>.fa4-lock.json: the exact, hash-pinned FA4 wheels for the line's CUDA major and python."""
    from toolkit.digest import sha256_json

    if spec.flash_attn_4 is None:
        raise ToolkitError(f"{spec.path}: no flash_attn_4 section (add `flash_attn_4: {{version: ...}}`)")
    rel = release(spec.flash_attn_4.version)
    cuda_major = spec.cuda.split(".")[0]
    unfit = [p.file for p in rel.wheels_for(cuda_major) if not wheel_fits_python(p.file, spec.python)]
    if unfit:
        raise ToolkitError(f"{spec.path}: python {spec.python}: {unfit[0]} is pinned for another interpreter")
    data = {"kind": "fa4-lock", "line": spec.line, "release": rel.version, "cuda_major": cuda_major,
            "python": spec.python, "with_flash_attn_2": spec.flash_attn_4.with_flash_attn_2,
            "from_base": list(rel.from_base), "wheels": lock_entries(rel, cuda_major, files_of)}
    data["digest"] = sha256_json(data)
    path = Workspace(locks=Path(locks_dir)).fa4_lock_file(spec.line)
    write_atomic(path, json.dumps(data, indent=2) + "\n")
    return path


def read_lock(path: Path) -> tuple[Release, str]:
    """(the release, CUDA major) a lock pins, refusing an edited lock or one that disagrees with the knowledge."""
    from toolkit.digest import sha256_json

    data = read_json(Path(path), "FA4 lock", "run `toolkit fa4 lock LINE`")
    if not isinstance(data, dict) or not isinstance(data.get("digest"), str):
        raise ToolkitError(f"{path}: not an FA4 lock: no digest (run `toolkit fa4 lock LINE`)")
    digest = data.pop("digest")
    if sha256_json(data) != digest:
        raise ToolkitError(f"{path}: edited after it was written (digest mismatch): run `toolkit fa4 lock` again")
    wheels = data.get("wheels")
    if not (isinstance(data.get("release"), str) and isinstance(data.get("cuda_major"), str)
            and isinstance(wheels, list) and all(isinstance(w, dict) and isinstance(w.get("file"), str)
                                                 and isinstance(w.get("sha256"), str) for w in wheels)):
        raise ToolkitError(f"{path}: release, cuda_major (strings) and wheels (file, sha256 each) are not all "
                           f"there (run `toolkit fa4 lock LINE` again)")
    rel = release(data["release"])
    pinned = {p.file: p.sha256 for p in rel.wheels_for(data["cuda_major"])}
    if {w["file"]: w["sha256"] for w in data["wheels"]} != pinned:
        raise ToolkitError(f"{path}: its wheels differ from {KNOWLEDGE_FILE.name} for flash-attn-4 {rel.version} "
                           f"(lock again)")
    return rel, data["cuda_major"]


# ---------------------------------------------------------------- requirements


def wheel_metadata(path: Path) -> dict:
    """Name, version and Requires-Dist lines of a wheel, read from its METADATA (no code run)."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        headers = HeaderParser().parsestr(archive.read(name).decode())
    return {"name": headers["Name"], "version": headers["Version"], "requires": headers.get_all("Requires-Dist") or []}


def unmet_requirements(metadata: list[dict], available: dict[str, str], replaced: dict[str, str],
                       environment: dict[str, str]) -> list[str]:
    """Every unconditional (marker-true, no extra) requirement that neither the installed set nor a
    replacement satisfies, as "wheel: requirement (why)"."""
    return [f"{wheel}: {req} ({why})" for wheel, req, why in _unmet(metadata, available, replaced, environment)]


def _unmet(metadata: list[dict], available: dict[str, str], replaced: dict[str, str],
           environment: dict[str, str]) -> list[tuple]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    problems = []
    for meta in metadata:
        for line in meta["requires"]:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**environment, "extra": ""}):
                continue
            name = canonicalize_name(req.name)
            if name in replaced:
                continue
            have = available.get(name)
            if have is None:
                problems.append((meta["name"], line, "not installed and not pinned"))
            elif not req.specifier.contains(have, prereleases=True):
                problems.append((meta["name"], line, f"found {have}"))
    return problems


# ---------------------------------------------------------------- install


_PROBE = ("import importlib.metadata as m, json, platform, sys\n"
          "from packaging.markers import default_environment\n"
          "print(json.dumps({'dists': {d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']},"
          " 'env': default_environment(), 'py': '%d.%d' % sys.version_info[:2]}))")


def probe_python(python: str, extra_path: list[str] | None = None) -> dict:
    """What the target interpreter has: distributions, marker environment, python minor."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(extra_path or [])}
    fix = "pass --python of an interpreter with torch and packaging"
    try:
        done = children.run([python, "-c", _PROBE], capture_output=True, text=True, env=env)
    except OSError as exc:
        raise ToolkitError(f"{python}: cannot be run ({exc.strerror or type(exc).__name__}) ({fix})") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(f"{python}: cannot be inspected ({tail}) ({fix})")
    try:
        data = json.loads(done.stdout)
        data["dists"].items()
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ToolkitError(f"{python}: did not answer as a Python interpreter does ({fix})") from None
    from packaging.utils import canonicalize_name

    data["dists"] = {canonicalize_name(k): v for k, v in data["dists"].items()}
    return data


def python_path(target: Path) -> list[str]:
    """The entries that make `import flash_attn.cute` work from a --target folder (see module doc)."""
    return [str(target), str(target / DSL_PACKAGES)]


def plan(rel: Release, cuda_major: str, present: dict[str, str], environment: dict[str, str] | None = None,
         metadata_of=None) -> list[WheelPin]:
    """The wheels to install: all pins of the CUDA major, less `if_missing` ones the python already has
    at a version every chosen wheel accepts (`metadata_of(pin)` reads a wheel's requirements; without it
    only absence counts)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = rel.wheels_for(cuda_major)
    chosen = [w for w in pins if not (w.if_missing and canonicalize_name(w.name) in present)]
    while metadata_of is not None:
        available: dict[str, str] = {**present, **{canonicalize_name(p.name): p.version for p in chosen}}
        replaced: dict[str, str] = {canonicalize_name(p.replaces): p.name for p in chosen if p.replaces}
        wanted = {canonicalize_name(Requirement(line).name) for _, line, _ in
                  _unmet([metadata_of(p) for p in chosen], available, replaced, environment or {})}
        extra = [w for w in pins if w not in chosen and canonicalize_name(w.name) in wanted]
        if not extra:
            break
        chosen = [w for w in pins if w in chosen or w in extra]
    return chosen


def python_argument(python: str) -> str:
    """--python as the absolute path records name it by (found on PATH like a shell would), and a plain one:
    the record's PYTHONPATH and NAME=VALUE lines cannot carry a newline or a second entry."""
    found = os.path.abspath(shutil.which(python) or python)
    if not plain_path(found):
        raise ToolkitError(f"--python {found!r}: not a plain absolute path (pass the interpreter's path)")
    return found


def install(rel: Release, cuda_major: str, wheel_dir: Path, target: Path, python: str) -> Fa4Record:
    """Install the pinned wheels into `target` for `python`, check every requirement, record it."""
    from packaging.utils import canonicalize_name

    target = folder_argument(target, "--target")
    python = python_argument(python)
    probe = probe_python(python)
    from packaging.specifiers import SpecifierSet

    if not SpecifierSet(rel.python).contains(probe["py"]):
        raise ToolkitError(f"{python}: Python {probe['py']} but flash-attn-4 {rel.version} needs {rel.python}")
    present = probe["dists"]
    missing_base = [name for name in rel.from_base if canonicalize_name(name) not in present]
    if missing_base:
        raise ToolkitError(f"{python}: lacks {', '.join(missing_base)}, which flash-attn-4 takes from the base "
                           f"environment (install the line's torch environment first)")
    for pin in rel.wheels_for(cuda_major):
        check_wheel(wheel_dir / pin.file, pin)
    chosen = plan(rel, cuda_major, present, probe["env"], lambda pin: wheel_metadata(wheel_dir / pin.file))
    metadata = [wheel_metadata(wheel_dir / pin.file) for pin in chosen]
    available: dict[str, str] = {**present, **{canonicalize_name(p.name): p.version for p in chosen}}
    replaced: dict[str, str] = {canonicalize_name(p.replaces): p.name for p in chosen if p.replaces}
    problems = unmet_requirements(metadata, available, replaced, probe["env"])
    if problems:
        raise ToolkitError(f"{KNOWLEDGE_FILE.name}: flash-attn-4 {rel.version} pins leave requirements unmet: "
                           f"{'; '.join(problems)} (add the wheel to the release's pins)")
    beside = flash_attn_2_beside(target)
    target.mkdir(parents=True, exist_ok=True)
    clean_stale(target)  # the staging folders of killed installs (their pip died with them: children.run)
    with owned_dir(target, "fa4-staging") as staging:
        done = children.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--target", str(staging),
                               *[str(wheel_dir / p.file) for p in chosen]], capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ToolkitError(f"pip install --target {target}: {tail}")
        foreign = foreign_entries(staging, target, owned_paths(target, rel, beside))
        if foreign:
            raise ToolkitError(f"{target}: installing FA4 here would replace {len(foreign)} file(s) no earlier FA4 "
                               f"or flash-attn 2.x install wrote, e.g. {foreign[0]} (nothing was changed; install "
                               f"into an empty --target folder, or move those files away)")
        handed_over = hand_over_cute(beside) if beside else []
        (target / Fa4Record.FILE).unlink(missing_ok=True)  # first: a folder merged in part is no finished install
        merge_into(staging, target)
    used_base = {n: present[canonicalize_name(n)] for n in rel.from_base}
    used_base.update({p.name: present[canonicalize_name(p.name)] for p in rel.wheels_for(cuda_major)
                      if p.if_missing and p not in chosen})  # present and good enough
    record = Fa4Record(rel.version, cuda_major, str(target), python, [f"{p.name}=={p.version}" for p in chosen],
                       used_base, python_path(target), beside.version if beside else None, handed_over)
    if not (target / DSL_PACKAGES / "cutlass").is_dir():
        raise ToolkitError(f"{target}: no {DSL_PACKAGES}/cutlass after the install (the nvidia-cutlass-dsl "
                           f"layout changed: update {KNOWLEDGE_FILE.name})")
    record.write(target)
    return record


@dataclass(frozen=True)
class Fa2Install:
    """flash-attn 2.x installed in the folder FA4 goes to: its dist-info owns flash_attn/__init__.py."""
    version: str
    dist_info: Path

    @property
    def record_file(self) -> Path:
        return self.dist_info / "RECORD"


def flash_attn_2_beside(target: Path) -> Fa2Install | None:
    """The flash-attn 2.x in `target`, when there is one, and only one the knowledge says FA4 may sit beside
    (its flash_attn/cute is not imported by the rest of the package: knowledge beside_flash_attn_2).
    A flash_attn/__init__.py that no flash-attn dist-info lists is nobody's to change: refused."""
    init = target / "flash_attn" / "__init__.py"
    if not init.is_file():
        return None
    for dist_info in sorted(target.glob("flash_attn-*.dist-info")):
        rows = _record_rows(dist_info / "RECORD")
        if any(row[0] == "flash_attn/__init__.py" for row in rows):
            version = dist_info.name[len("flash_attn-"):-len(".dist-info")]
            known = knowledge()["beside_flash_attn_2"]
            if version.split("+")[0] not in known:  # a toolkit-built wheel carries a local tag (+cu130torch2.11)
                raise ToolkitError(f"{target}: holds flash-attn {version}, whose flash_attn/cute the knowledge has "
                                   f"not read (known beside FA4: {', '.join(known)}; add it to "
                                   f"{KNOWLEDGE_FILE.name} beside_flash_attn_2 or install FA4 into its own folder)")
            return Fa2Install(version, dist_info)
    raise ToolkitError(f"{target}: holds a flash_attn/__init__.py that no flash-attn dist-info lists; flash-attn-4 "
                       f"writes flash_attn/cute into that package (install FA4 into its own --target folder)")


def _record_rows(path: Path) -> list[list[str]]:
    import csv

    try:
        with open(path, newline="") as handle:
            return [row for row in csv.reader(handle) if row]
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise ToolkitError(f"{path}: unreadable ({exc}) (reinstall flash-attn 2.x there)") from None


def hand_over_cute(fa2: Fa2Install) -> list[str]:
    """FA2's own copy of flash_attn/cute gives way to FA4's: its rows leave FA2's RECORD first (so
    `pip uninstall flash-attn` never deletes FA4's files), then the files it listed are removed. Only
    paths FA2's RECORD names, inside flash_attn/cute, are touched. Returns them.

    Each file is unlinked relative to its folder, opened from the site folder down without following a
    symlink (as merge_into holds its folders), so a folder swapped for a symlink after the check below
    makes the hand-over stop in one line, never delete outside."""
    rows = _record_rows(fa2.record_file)
    prefix = "flash_attn/cute/"
    ours = [row[0] for row in rows if row[0].startswith(prefix) and ".." not in Path(row[0]).parts]
    root = fa2.dist_info.parent
    linked = next((name for name in ours if _through_link(root, name) or (root / name).is_dir()), None)
    if linked:  # unlinking through a link would delete another folder's file
        raise ToolkitError(f"{root / linked}: a folder, or reached through a symlink (flash_attn, flash_attn/cute or "
                           f"a folder in it); nothing is removed (reinstall flash-attn 2.x as a plain folder)")
    if ours:
        import csv
        import io

        kept = io.StringIO()
        csv.writer(kept, lineterminator="\n").writerows(row for row in rows if row[0] not in ours)
        write_atomic(fa2.record_file, kept.getvalue())
        with _held_folder(root) as site:
            for name in ours:
                _unlink_held(root, Path(name).parts, site)
            with _held_folder(root / "flash_attn", site) as inner, _held_folder(root / prefix, inner) as cute:
                _remove_pycache(cute)
    return ours


def _unlink_held(root: Path, parts: tuple[str, ...], root_fd: int) -> None:
    """Unlink root/parts, each folder on the way opened in the one before it without following a symlink."""
    with ExitStack() as stack:
        folder = root_fd
        for depth in range(1, len(parts)):
            folder = stack.enter_context(_held_folder(root.joinpath(*parts[:depth]), folder))
        with suppress(FileNotFoundError):
            os.unlink(parts[-1], dir_fd=folder)


def _remove_pycache(folder: int) -> None:
    """Remove the __pycache__ folder in a held folder, its entries unlinked through its own descriptor."""
    try:
        cache = os.open("__pycache__", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
    except OSError:
        return  # none, or not a plain folder: nothing of FA2's to remove
    try:
        for name in os.listdir(cache):
            with suppress(OSError):
                os.unlink(name, dir_fd=cache)
    finally:
        os.close(cache)
    with suppress(OSError):
        os.rmdir("__pycache__", dir_fd=folder)


def _through_link(root: Path, name: str) -> bool:
    """Does RECORD path `name` under `root` pass through a symlinked folder (flash_attn/, cute/, ...)?"""
    parts = Path(name).parts
    return any((root.joinpath(*parts[:depth])).is_symlink() for depth in range(1, len(parts)))


def restore_after_flash_attn_2(python: str, url: str, sha256: str, log: Path) -> list[str]:
    """flash-attn 2.x installed by pip into an environment that holds FA4 (a locked line's prefix, where the
    lock's pip layer put FA4 first) writes its own flash_attn/cute over FA4's. FA2's copy gives way again
    (hand_over_cute), then FA4's wheel is reinstalled from the lock's pin (pip checks its sha256), so both
    import. Returns the FA2 files that gave way ([] where the environment holds no FA4)."""
    site = Path(children.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    if not any(site.glob("flash_attn_4-*.dist-info")):
        return []
    beside = flash_attn_2_beside(site)
    handed = hand_over_cute(beside) if beside else []
    with owned_dir(log.parent, "fa4-restore") as scratch:
        requirement = scratch / "requirements.txt"
        requirement.write_text(f"flash-attn-4 @ {url} --hash=sha256:{sha256}\n")
        done = children.run([python, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--require-hashes",
                               "--no-index", "--quiet", "--requirement", str(requirement)],
                              capture_output=True, text=True, errors="replace")
    with open(log, "a") as out:
        out.write(f"\n$ pip install --force-reinstall flash-attn-4 @ {url}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(f"{site}: flash-attn-4 could not be reinstalled after flash-attn 2.x ({tail}; is {url} "
                           f"reachable?)")
    return handed


def merge_plan(staging: Path, target: Path) -> list[tuple[Path, Path]]:
    """(staged entry, its place in `target`) for each entry the install moves in, as `pip install --target
    --upgrade` would, except that flash_attn/ is merged one level down: FA4 adds flash_attn/cute to a package
    flash-attn 2.x may own."""
    pairs = []
    for entry in sorted(staging.iterdir()):
        if entry.name == "flash_attn" and entry.is_dir():
            pairs += [(sub, target / "flash_attn" / sub.name) for sub in sorted(entry.iterdir())]
        else:
            pairs.append((entry, target / entry.name))
    return pairs


def merge_into(staging: Path, target: Path) -> None:
    """Move the staged install into `target`, replacing the entries of the same name (foreign_entries has
    checked that each one is an earlier install's; they go to an owned folder that is removed after).

    A folder in target can be swapped for a symlink while this runs: target and target/flash_attn are opened
    once, never through a symlink, and every rename is relative to those held folders, so nothing outside is
    reached; after each step both must still be what their names point to, or the install stops in one line."""
    pairs = merge_plan(staging, target)
    inner = target / "flash_attn"
    with owned_dir(target, "fa4-replaced") as replaced, ExitStack() as stack:
        folders = {path: stack.enter_context(_held_folder(path)) for path in (target, staging, replaced)}
        if any(dest.parent == inner for _, dest in pairs):
            with suppress(FileExistsError):
                os.mkdir(inner.name, dir_fd=folders[target])
            for path in (inner, staging / inner.name):
                folders[path] = stack.enter_context(_held_folder(path, folders[path.parent]))
        for index, (entry, dest) in enumerate(pairs):
            source, into = folders[entry.parent], folders[dest.parent]
            if _lexists(dest.name, into):
                os.rename(dest.name, str(index), src_dir_fd=into, dst_dir_fd=folders[replaced])
            os.rename(entry.name, dest.name, src_dir_fd=source, dst_dir_fd=into)
            _still_held(target, folders)


@contextmanager
def _held_folder(path: Path, parent: int | None = None) -> Iterator[int]:
    """A descriptor of the folder at `path` (its name in the held folder `parent`, if given), opened without
    following a symlink; a one-line error where it is a symlink or not a folder."""
    try:
        fd = os.open(path if parent is None else path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                     dir_fd=parent)
    except OSError as exc:
        raise ToolkitError(f"{display_path(path)}: a symlink or not a folder ({exc.strerror}); nothing outside "
                           f"it was touched (make it a plain folder and install again)") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _lexists(name: str, folder: int) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _still_held(target: Path, folders: dict[Path, int]) -> None:
    """Refuse to go on when target or target/flash_attn is no longer the folder held open (swapped)."""
    for path in (target, target / "flash_attn"):
        if path not in folders:
            continue
        try:
            now = os.stat(path, follow_symlinks=False) if path == target else \
                os.stat(path.name, dir_fd=folders[target], follow_symlinks=False)
            swapped = (now.st_dev, now.st_ino) != (os.fstat(folders[path]).st_dev, os.fstat(folders[path]).st_ino)
        except FileNotFoundError:
            swapped = True
        if swapped:
            raise ToolkitError(f"{display_path(path)}: replaced while installing (by a symlink or another folder); "
                               f"the install stopped and nothing outside {display_path(target)} was touched (put "
                               f"the folder back and install again)")


def _pip_target_path(row: str) -> str:
    """A RECORD path of a `pip install --target` install, relative to the target: pip writes console scripts
    as ../../bin/NAME (relative to its temporary lib/python) and moves them to TARGET/bin/NAME."""
    return "bin/" + row[len("../../bin/"):] if row.startswith("../../bin/") else row


def owned_paths(target: Path, rel: Release, beside: Fa2Install | None) -> set[str]:
    """The files of `target` an install may replace: those the RECORDs of an earlier install of this
    release's wheels list, and the flash_attn/cute rows of the flash-attn 2.x beside it."""
    from packaging.utils import canonicalize_name

    projects = {canonicalize_name(pin.name) for pin in rel.wheels}
    owned: set[str] = set()
    for dist_info in target.glob("*.dist-info"):
        project = dist_info.name[:-len(".dist-info")].rsplit("-", 1)[0]
        if canonicalize_name(project) in projects and (dist_info / "RECORD").is_file():
            owned.update(_pip_target_path(row[0]) for row in _record_rows(dist_info / "RECORD"))
    if beside:
        owned.update(row[0] for row in _record_rows(beside.record_file) if row[0].startswith("flash_attn/cute/"))
    return owned


def foreign_entries(staging: Path, target: Path, owned: set[str]) -> list[str]:
    """What merging `staging` into `target` would replace or write through that no `owned` path covers:
    a user's file, a symlink, a folder with files an install did not write. Compiled __pycache__ files
    of owned sources are the install's too."""
    if (target / "flash_attn").is_symlink():
        return ["flash_attn (a symlink)"]
    foreign = []
    for _, dest in merge_plan(staging, target):
        if not (dest.exists() or dest.is_symlink()):
            continue
        if dest.is_symlink() or not dest.is_dir():
            found = [dest]
        else:
            found = [Path(root) / name for root, dirs, files in os.walk(dest)
                     for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]]
        foreign += [rel for rel in (path.relative_to(target).as_posix() for path in found)
                    if rel not in owned and "__pycache__" not in rel.split("/")]
    return sorted(foreign)


def load_record(target: Path, python: str | None = None) -> Fa4Record:
    """The folder's install record, with the values the env, warm and cache-install verbs hand to a shell or
    run checked: written for this folder, PYTHONPATH entries inside it, no control character or path separator.
    `python`: the interpreter the user named for a verb that runs one (--python); the record must be for it,
    so that no program a record names is run (a hand-edited record could name any)."""
    record = Fa4Record.load(target, "run `toolkit fa4 install` first")
    path = display_path(target / Fa4Record.FILE)
    fix = f"install again: toolkit fa4 install --target {target}"
    if Path(record.target).resolve() != target.resolve():
        raise ToolkitError(f"{path}: target: written for {record.target!r}, not this folder ({fix})")
    odd = next((v for v in (record.python, *record.python_path) if not plain_path(v)), None)
    if odd is not None:
        raise ToolkitError(f"{path}: {odd!r} is not a plain absolute path ({fix})")
    outside = next((p for p in record.python_path if not Path(p).resolve().is_relative_to(target.resolve())), None)
    if outside is not None:
        raise ToolkitError(f"{path}: python_path: {outside} is outside {target} ({fix})")
    if python is not None and record.python != python:
        raise ToolkitError(f"{path}: written for the python {record.python!r}, not --python {python} (pass the "
                           f"--python of that install, or {fix})")
    return record


def import_check(record: Fa4Record, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Does `import flash_attn.cute` work in a fresh process of the recorded python? (ok, last line)"""
    probe = "import flash_attn.cute as f, cutlass; print(f.__file__, cutlass.__file__)"
    done = children.run([record.python, "-c", probe],
                          capture_output=True, text=True, env={**os.environ, **record.env(), **(env or {})})
    text = (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines() or ["no output"]
    return done.returncode == 0, text[-1]


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    from toolkit import fa4_jit
    from toolkit.attention import recommend

    parser = subparsers.add_parser("fa4", help="FlashAttention-4: fetch, install, warm its kernel cache",
                                   description="FlashAttention-4 (flash-attn-4) from the pinned wheels of "
                                               "knowledge/flash_attn_4.yaml.")
    verbs = parser.add_subparsers(dest="fa4_verb", metavar="STEP", required=True)
    fetch_parser = verbs.add_parser("fetch", help="download the pinned wheels from PyPI and check their hashes")
    _release_options(fetch_parser)
    fetch_parser.add_argument("--dest", type=Path, required=True)
    fetch_parser.add_argument("--split-into", type=Path, help="also cut the wheels into two carryable folders")
    fetch_parser.set_defaults(func=_fetch_command)
    lock_parser = verbs.add_parser("lock", help="write locks/LINE.fa4-lock.json: the line's exact wheels + URLs")
    lock_parser.add_argument("line", metavar="LINE", help="line name or spec file (with a flash_attn_4 section)")
    add_workspace_options(lock_parser)
    lock_parser.add_argument("--locks-dir", dest="locks", type=Path, default=argparse.SUPPRESS,
                             help=argparse.SUPPRESS)  # the earlier spelling of --locks
    lock_parser.set_defaults(func=_lock_command)
    install_parser = verbs.add_parser("install", help="install the pinned wheels into a --target folder")
    _release_options(install_parser)
    install_parser.add_argument("--lock", type=Path, help="a `toolkit fa4 lock` file (sets release and CUDA major)")
    install_parser.add_argument("--wheels", type=Path, required=True, help="folder with the pinned wheels")
    add_target_option(install_parser)
    install_parser.add_argument("--python", default=sys.executable, help="interpreter the install is for")
    install_parser.set_defaults(func=_install_command)
    join_parser = verbs.add_parser("join", help="reassemble split wheels (folders of parts) into one folder")
    join_parser.add_argument("--dest", type=Path, required=True)
    join_parser.add_argument("parts", type=Path, nargs="+", help="folders holding parts and manifests")
    join_parser.set_defaults(func=_join_command)
    env_parser = verbs.add_parser("env", help="print NAME=VALUE lines an install (and its kernel cache) needs")
    add_target_option(env_parser)
    env_parser.add_argument("--cache-dir", type=Path, help="the warmed kernel cache folder to use")
    env_parser.set_defaults(func=_env_command)
    fa4_jit.register(verbs)
    recommend.register(verbs)


def add_target_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=Path, required=True, help="the `toolkit fa4 install` folder")


def _release_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--release", default=DEFAULT_RELEASE, help=f"flash-attn-4 version (default {DEFAULT_RELEASE})")
    parser.add_argument("--cuda-major", default="13", help="CUDA major of the line (picks the libs-cuN flavor)")


def _fetch_command(args: argparse.Namespace) -> int:
    rel = release(args.release)
    paths = fetch(rel, args.cuda_major, args.dest)
    for path in paths:
        print(f"ok {path.name} sha256 {sha256_file(path)[:16]}")
    if args.split_into:
        carry_split(paths, args.split_into)
    return 0


def carry_split(paths: list[Path], dest: Path, limit: int = 60 * 2 ** 20) -> tuple[Path, Path]:
    """Two folders, each under `limit` bytes: part1 = the small wheels + the first chunk of the big one,
    part2 = the other chunks (one carry is at most 64 MiB; docs gpu-machine.md)."""
    part1, part2 = dest / "part1", dest / "part2"
    with publish_dir(part1) as staged1, publish_dir(part2) as staged2:  # both kept as they were if one is over
        big = [p for p in paths if p.stat().st_size > PART_BYTES]
        for path in paths:
            if path not in big:
                shutil.copy2(path, staged1 / path.name)
        for path in big:
            chunks = split_file(path, staged2)
            chunks[0].rename(staged1 / chunks[0].name)
            shutil.copy2(staged2 / f"{path.name}.parts.json", staged1 / f"{path.name}.parts.json")
        for folder, staged in ((part1, staged1), (part2, staged2)):
            size = sum(f.stat().st_size for f in staged.iterdir())
            if size >= limit:
                raise ToolkitError(f"{folder}: {size / 2 ** 20:.1f} MiB, over the {limit / 2 ** 20:.0f} MiB of one "
                                   f"carry (lower PART_BYTES)")
            print(f"{folder}: {size / 2 ** 20:.1f} MiB")
    return part1, part2


def _join_command(args: argparse.Namespace) -> int:
    missing = next((folder for folder in args.parts if not folder.is_dir()), None)
    if missing is not None:
        raise ToolkitError(f"{missing}: not a folder of parts (pass the carried part1/part2 folders)")
    dest = folder_argument(args.dest, "--dest")
    manifests = {m.name: m for folder in args.parts for m in folder.glob("*.parts.json")}
    wheels = [w for folder in args.parts for w in sorted(folder.glob("*.whl"))]
    if not manifests and not wheels:
        raise ToolkitError(f"{', '.join(map(str, args.parts))}: no wheels and no parts manifests there "
                           f"(pass the folders scripts/fetch_fa4_wheels.sh wrote)")
    items = [*map(carried_wheel, wheels), *(parts_of(m, list(args.parts)) for m in manifests.values())]
    check_join(items, dest)  # everything refused before the first write
    dest.mkdir(parents=True, exist_ok=True)
    clean_stale(dest)  # what a killed join left
    for item in items:
        out = write_joined(item, dest)
        if item.sha256:
            print(f"joined {display_path(out)}")
    return 0


def _env_command(args: argparse.Namespace) -> int:
    """For a shell to read as data (`while IFS== read -r name value`), never to eval."""
    from toolkit.fa4_jit import cache_env

    env = load_record(args.target).env()  # its values checked there
    if args.cache_dir and not str(args.cache_dir.absolute()).isprintable():
        raise ToolkitError(f"--cache-dir {str(args.cache_dir.absolute())!r}: holds a control character (pass a "
                           f"plain folder path)")
    env.update(cache_env(args.cache_dir.absolute()) if args.cache_dir else {})
    for name, value in env.items():
        print(f"{name}={value}")
    return 0


def _lock_command(args: argparse.Namespace) -> int:
    from toolkit.rules import checked_spec
    from toolkit.spec import resolve_spec_arg

    workspace = Workspace.from_args(args)
    path = write_lock(checked_spec(resolve_spec_arg(args.line, workspace.envs)), locks_dir=workspace.locks)
    print(f"wrote {path}")
    return 0


def _install_command(args: argparse.Namespace) -> int:
    rel, cuda_major = read_lock(args.lock) if args.lock else (release(args.release), args.cuda_major)
    with run_temporaries("fa4-install"):  # pip's own temporaries: removed by the next run if this one is killed
        record = install(rel, cuda_major, args.wheels, args.target, args.python)
    print(f"installed {', '.join(record.installed)} into {record.target}")
    print(f"from the base python: {', '.join(f'{k}=={v}' for k, v in record.from_base.items())}")
    print(f"PYTHONPATH={os.pathsep.join(record.python_path)}")
    if record.flash_attn_2:
        print(f"beside flash-attn {record.flash_attn_2}: its {len(record.replaced_from_flash_attn_2)} flash_attn/cute "
              f"files gave way to FA4's (and left its RECORD)")
    ok, line = import_check(record)
    print(f"import flash_attn.cute: {'ok' if ok else 'FAILED'}: {line}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m toolkit.fa4 STEP ...`: the fa4 verbs without loading every other stage."""
    parser = argparse.ArgumentParser(prog="python -m toolkit.fa4")
    register(parser.add_subparsers())
    args = parser.parse_args(["fa4", *(argv if argv is not None else sys.argv[1:])])
    try:
        return args.func(args)
    except ToolkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
