"""FA4's lock: the pinned wheels' files and sha256s as the index serves them, written to and read back from
locks/<line>.fa4-lock.json (digest-checked).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from toolkit.base.atomic import write_atomic
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.base.workspace import DEFAULT, Workspace
from toolkit.knowledge.fa4_pins import KNOWLEDGE_FILE, Release, release, wheel_fits_python

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


def write_lock(spec, files_of=pypi_files, workspace: Workspace = DEFAULT) -> Path:
    """locks/<line>.fa4-lock.json: the exact, hash-pinned FA4 wheels for the line's CUDA major and python."""
    from toolkit.base.digest import sha256_json

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
    path = workspace.fa4_lock_file(spec.line)
    write_atomic(path, json.dumps(data, indent=2) + "\n")
    return path


def read_lock(path: Path) -> tuple[Release, str]:
    """(the release, CUDA major) a lock pins, refusing an edited lock or one that disagrees with the knowledge."""
    from toolkit.base.digest import sha256_json

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
