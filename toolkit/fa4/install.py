"""FlashAttention-4 (`flash-attn-4`, flash_attn.cute): its pinned wheels, their fetch and install.

FA4 is pure Python on NVIDIA's CuTe DSL and compiles its kernels at run time, so "building" it means
installing exact wheels and warming its kernel cache (toolkit/fa4/jit.py). The facts (which wheels,
their hashes, which CUDA flavor, which features on which sm) live in knowledge/flash_attn_4.yaml.

Two traps this module exists for (both seen on the H200, 2026-12-01):
- nvidia-cutlass-dsl requires libs-cu12 unconditionally, also on CUDA 13: the toolkit installs the
  exact list with --no-deps and checks every Requires-Dist itself, with libs-cu13 standing in.
- the `cutlass` package is found only through nvidia_cutlass_dsl_packages.pth, which `--target` +
  PYTHONPATH never runs: the toolkit puts nvidia_cutlass_dsl/dsl_packages on the path explicitly
  (`python_path`), so every way of installing (prefix, --target, external python) imports alike.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from toolkit.base import children
from toolkit.base.atomic import clean_stale, owned_dir, write_atomic
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path, folder_argument, plain_path
from toolkit.env.install_record import Fa4Record, record_rows
from toolkit.fa4.wheels import check_wheel
from toolkit.knowledge.fa4_pins import DSL_PACKAGES, KNOWLEDGE_FILE, Release, WheelPin, knowledge


def wheel_metadata(path: Path) -> dict:
    """Name, version and Requires-Dist lines of a wheel, read from its METADATA (no code run)."""
    with zipfile.ZipFile(path) as archive:
        name = next(
            n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1
        )
        headers = HeaderParser().parsestr(archive.read(name).decode())
    return {
        "name": headers["Name"],
        "version": headers["Version"],
        "requires": headers.get_all("Requires-Dist") or [],
    }


def unmet_requirements(
    metadata: list[dict],
    available: dict[str, str],
    replaced: dict[str, str],
    environment: dict[str, str],
) -> list[str]:
    """Every unconditional (marker-true, no extra) requirement that neither the installed set nor a
    replacement satisfies, as "wheel: requirement (why)"."""
    return [
        f"{wheel}: {req} ({why})"
        for wheel, req, why in _unmet(metadata, available, replaced, environment)
    ]


def _unmet(
    metadata: list[dict],
    available: dict[str, str],
    replaced: dict[str, str],
    environment: dict[str, str],
) -> list[tuple]:
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


FA2_FIX = "reinstall flash-attn 2.x there"  # what an unreadable FA2 RECORD asks for
_PROBE = (
    "import importlib.metadata as m, json, platform, sys\n"
    "from packaging.markers import default_environment\n"
    "print(json.dumps({'dists': {d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']},"
    " 'env': default_environment(), 'py': '%d.%d' % sys.version_info[:2]}))"
)


def probe_python(python: str, extra_path: list[str] | None = None) -> dict:
    """What the target interpreter has: distributions, marker environment, python minor."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(extra_path or [])}
    fix = "pass --python of an interpreter with torch and packaging"
    try:
        done = children.run_tied([python, "-c", _PROBE], capture_output=True, text=True, env=env)
    except OSError as exc:
        raise ToolkitError(
            f"{python}: cannot be run ({exc.strerror or type(exc).__name__}) ({fix})"
        ) from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(f"{python}: cannot be inspected ({tail}) ({fix})")
    try:
        data = json.loads(done.stdout)
        data["dists"].items()
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ToolkitError(
            f"{python}: did not answer as a Python interpreter does ({fix})"
        ) from None
    from packaging.utils import canonicalize_name

    data["dists"] = {canonicalize_name(k): v for k, v in data["dists"].items()}
    return data


def python_path(target: Path) -> list[str]:
    """The entries that make `import flash_attn.cute` work from a --target folder (see module doc)."""
    return [str(target), str(target / DSL_PACKAGES)]


def plan(
    rel: Release,
    cuda_major: str,
    present: dict[str, str],
    environment: dict[str, str] | None = None,
    metadata_of: Callable[[WheelPin], dict] | None = None,
) -> list[WheelPin]:
    """The wheels to install: all pins of the CUDA major, less `if_missing` ones the python already has
    at a version every chosen wheel accepts (`metadata_of(pin)` reads a wheel's requirements; without it
    only absence counts)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = rel.wheels_for(cuda_major)
    chosen = [w for w in pins if not (w.if_missing and canonicalize_name(w.name) in present)]
    while metadata_of is not None:
        available: dict[str, str] = {
            **present,
            **{canonicalize_name(p.name): p.version for p in chosen},
        }
        replaced: dict[str, str] = {
            canonicalize_name(p.replaces): p.name for p in chosen if p.replaces
        }
        wanted = {
            canonicalize_name(Requirement(line).name)
            for _, line, _ in _unmet(
                [metadata_of(p) for p in chosen], available, replaced, environment or {}
            )
        }
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
        raise ToolkitError(
            f"--python {found!r}: not a plain absolute path (pass the interpreter's path)"
        )
    return found


def install(rel: Release, cuda_major: str, wheel_dir: Path, target: Path, python: str) -> Fa4Record:
    """Install the pinned wheels into `target` for `python`, check every requirement, record it."""
    from packaging.utils import canonicalize_name

    target = folder_argument(target, "--target")
    python = python_argument(python)
    probe = probe_python(python)
    from packaging.specifiers import SpecifierSet

    if not SpecifierSet(rel.python).contains(probe["py"]):
        raise ToolkitError(
            f"{python}: Python {probe['py']} but flash-attn-4 {rel.version} needs {rel.python}"
        )
    present = probe["dists"]
    missing_base = [name for name in rel.from_base if canonicalize_name(name) not in present]
    if missing_base:
        raise ToolkitError(
            f"{python}: lacks {', '.join(missing_base)}, which flash-attn-4 takes from the base "
            f"environment (install the line's torch environment first)"
        )
    for pin in rel.wheels_for(cuda_major):
        check_wheel(wheel_dir / pin.file, pin)
    chosen = plan(
        rel, cuda_major, present, probe["env"], lambda pin: wheel_metadata(wheel_dir / pin.file)
    )
    metadata = [wheel_metadata(wheel_dir / pin.file) for pin in chosen]
    available: dict[str, str] = {
        **present,
        **{canonicalize_name(p.name): p.version for p in chosen},
    }
    replaced: dict[str, str] = {canonicalize_name(p.replaces): p.name for p in chosen if p.replaces}
    problems = unmet_requirements(metadata, available, replaced, probe["env"])
    if problems:
        raise ToolkitError(
            f"{KNOWLEDGE_FILE.name}: flash-attn-4 {rel.version} pins leave requirements unmet: "
            f"{'; '.join(problems)} (add the wheel to the release's pins)"
        )
    beside = flash_attn_2_beside(target)
    target.mkdir(parents=True, exist_ok=True)
    clean_stale(
        target
    )  # the staging folders of killed installs (their pip died with them: children.run)
    with owned_dir(target, "fa4-staging") as staging:
        done = children.run_tied(
            [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--target",
                str(staging),
                *[str(wheel_dir / p.file) for p in chosen],
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ToolkitError(f"pip install --target {target}: {tail}")
        foreign = foreign_entries(staging, target, owned_paths(target, rel, beside))
        if foreign:
            raise ToolkitError(
                f"{target}: installing FA4 here would replace {len(foreign)} file(s) no earlier FA4 "
                f"or flash-attn 2.x install wrote, e.g. {foreign[0]} (nothing was changed; install "
                f"into an empty --target folder, or move those files away)"
            )
        handed_over = hand_over_cute(beside) if beside else []
        (target / Fa4Record.FILE).unlink(
            missing_ok=True
        )  # first: a folder merged in part is no finished install
        merge_into(staging, target)
    used_base = {n: present[canonicalize_name(n)] for n in rel.from_base}
    used_base.update(
        {
            p.name: present[canonicalize_name(p.name)]
            for p in rel.wheels_for(cuda_major)
            if p.if_missing and p not in chosen
        }
    )  # present and good enough
    record = Fa4Record(
        rel.version,
        cuda_major,
        str(target),
        python,
        [f"{p.name}=={p.version}" for p in chosen],
        used_base,
        python_path(target),
        beside.version if beside else None,
        handed_over,
    )
    if not (target / DSL_PACKAGES / "cutlass").is_dir():
        raise ToolkitError(
            f"{target}: no {DSL_PACKAGES}/cutlass after the install (the nvidia-cutlass-dsl "
            f"layout changed: update {KNOWLEDGE_FILE.name})"
        )
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
        rows = record_rows(dist_info / "RECORD", FA2_FIX)
        if any(row[0] == "flash_attn/__init__.py" for row in rows):
            version = dist_info.name[len("flash_attn-") : -len(".dist-info")]
            known = knowledge()["beside_flash_attn_2"]
            if (
                version.split("+")[0] not in known
            ):  # a toolkit-built wheel carries a local tag (+cu130torch2.11)
                raise ToolkitError(
                    f"{target}: holds flash-attn {version}, whose flash_attn/cute the knowledge has "
                    f"not read (known beside FA4: {', '.join(known)}; add it to "
                    f"{KNOWLEDGE_FILE.name} beside_flash_attn_2 or install FA4 into its own folder)"
                )
            return Fa2Install(version, dist_info)
    raise ToolkitError(
        f"{target}: holds a flash_attn/__init__.py that no flash-attn dist-info lists; flash-attn-4 "
        f"writes flash_attn/cute into that package (install FA4 into its own --target folder)"
    )


def hand_over_cute(fa2: Fa2Install) -> list[str]:
    """FA2's own copy of flash_attn/cute gives way to FA4's: its rows leave FA2's RECORD first (so
    `pip uninstall flash-attn` never deletes FA4's files), then the files it listed are removed. Only
    paths FA2's RECORD names, inside flash_attn/cute, are touched. Returns them.

    Each file is unlinked relative to its folder, opened from the site folder down without following a
    symlink (as merge_into holds its folders), so a folder swapped for a symlink after the check below
    makes the hand-over stop in one line, never delete outside."""
    rows = record_rows(fa2.record_file, FA2_FIX)
    prefix = "flash_attn/cute/"
    ours = [row[0] for row in rows if row[0].startswith(prefix) and ".." not in Path(row[0]).parts]
    root = fa2.dist_info.parent
    linked = next(
        (name for name in ours if _through_link(root, name) or (root / name).is_dir()), None
    )
    if linked:  # unlinking through a link would delete another folder's file
        raise ToolkitError(
            f"{root / linked}: a folder, or reached through a symlink (flash_attn, flash_attn/cute or "
            f"a folder in it); nothing is removed (reinstall flash-attn 2.x as a plain folder)"
        )
    if ours:
        import csv
        import io

        kept = io.StringIO()
        csv.writer(kept, lineterminator="\n").writerows(row for row in rows if row[0] not in ours)
        write_atomic(fa2.record_file, kept.getvalue())
        with _held_folder(root) as site:
            for name in ours:
                _unlink_held(root, Path(name).parts, site)
            with (
                _held_folder(root / "flash_attn", site) as inner,
                _held_folder(root / prefix, inner) as cute,
            ):
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
    site = Path(
        children.run_tied(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    if not any(site.glob("flash_attn_4-*.dist-info")):
        return []
    beside = flash_attn_2_beside(site)
    handed = hand_over_cute(beside) if beside else []
    with owned_dir(log.parent, "fa4-restore") as scratch:
        requirement = scratch / "requirements.txt"
        requirement.write_text(f"flash-attn-4 @ {url} --hash=sha256:{sha256}\n")
        done = children.run_tied(
            [
                python,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--force-reinstall",
                "--require-hashes",
                "--no-index",
                "--quiet",
                "--requirement",
                str(requirement),
            ],
            capture_output=True,
            text=True,
            errors="replace",
        )
    with open(log, "a") as out:
        out.write(
            f"\n$ pip install --force-reinstall flash-attn-4 @ {url}\n{done.stdout}{done.stderr}"
        )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(
            f"{site}: flash-attn-4 could not be reinstalled after flash-attn 2.x ({tail}; is {url} "
            f"reachable?)"
        )
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
        folders = {
            path: stack.enter_context(_held_folder(path)) for path in (target, staging, replaced)
        }
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
        fd = os.open(
            path if parent is None else path.name,
            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
            dir_fd=parent,
        )
    except OSError as exc:
        raise ToolkitError(
            f"{display_path(path)}: a symlink or not a folder ({exc.strerror}); nothing outside "
            f"it was touched (make it a plain folder and install again)"
        ) from None
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
            now = (
                os.stat(path, follow_symlinks=False)
                if path == target
                else os.stat(path.name, dir_fd=folders[target], follow_symlinks=False)
            )
            swapped = (now.st_dev, now.st_ino) != (
                os.fstat(folders[path]).st_dev,
                os.fstat(folders[path]).st_ino,
            )
        except FileNotFoundError:
            swapped = True
        if swapped:
            raise ToolkitError(
                f"{display_path(path)}: replaced while installing (by a symlink or another folder); "
                f"the install stopped and nothing outside {display_path(target)} was touched (put "
                f"the folder back and install again)"
            )


def _pip_target_path(row: str) -> str:
    """A RECORD path of a `pip install --target` install, relative to the target: pip writes console scripts
    as ../../bin/NAME (relative to its temporary lib/python) and moves them to TARGET/bin/NAME."""
    return "bin/" + row[len("../../bin/") :] if row.startswith("../../bin/") else row


def owned_paths(target: Path, rel: Release, beside: Fa2Install | None) -> set[str]:
    """The files of `target` an install may replace: those the RECORDs of an earlier install of this
    release's wheels list, and the flash_attn/cute rows of the flash-attn 2.x beside it."""
    from packaging.utils import canonicalize_name

    projects = {canonicalize_name(pin.name) for pin in rel.wheels}
    owned: set[str] = set()
    for dist_info in target.glob("*.dist-info"):
        project = dist_info.name[: -len(".dist-info")].rsplit("-", 1)[0]
        if canonicalize_name(project) in projects and (dist_info / "RECORD").is_file():
            owned.update(
                _pip_target_path(row[0]) for row in record_rows(dist_info / "RECORD", FA2_FIX)
            )
    if beside:
        owned.update(
            row[0]
            for row in record_rows(beside.record_file, FA2_FIX)
            if row[0].startswith("flash_attn/cute/")
        )
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
            found = [
                Path(root) / name
                for root, dirs, files in os.walk(dest)
                for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]
            ]
        foreign += [
            rel
            for rel in (path.relative_to(target).as_posix() for path in found)
            if rel not in owned and "__pycache__" not in rel.split("/")
        ]
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
        raise ToolkitError(
            f"{path}: target: written for {record.target!r}, not this folder ({fix})"
        )
    odd = next((v for v in (record.python, *record.python_path) if not plain_path(v)), None)
    if odd is not None:
        raise ToolkitError(f"{path}: {odd!r} is not a plain absolute path ({fix})")
    outside = next(
        (p for p in record.python_path if not Path(p).resolve().is_relative_to(target.resolve())),
        None,
    )
    if outside is not None:
        raise ToolkitError(f"{path}: python_path: {outside} is outside {target} ({fix})")
    if python is not None and record.python != python:
        raise ToolkitError(
            f"{path}: written for the python {record.python!r}, not --python {python} (pass the "
            f"--python of that install, or {fix})"
        )
    return record


def import_check(record: Fa4Record, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Does `import flash_attn.cute` work in a fresh process of the recorded python? (ok, last line)"""
    probe = "import flash_attn.cute as f, cutlass; print(f.__file__, cutlass.__file__)"
    done = children.run_tied(
        [record.python, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, **record.env(), **(env or {})},
    )
    text = (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines() or [
        "no output"
    ]
    return done.returncode == 0, text[-1]
