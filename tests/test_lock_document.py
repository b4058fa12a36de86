"""toolkit/env/lock_document.py against conda-lock's own functions on the same inputs: the oracle of every
conversion is conda-lock 4 itself (imported whole here, as its CLI imports it), on real records (the replica's,
copied from public conda-forge lockfiles and recipes: tests/conda_forge_replica) and on the forms its fast
paths leave to conda-lock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.env import lock_document
from toolkit.env.lock_document import (
    LockChannel,
    content_hashes,
    lock_channel,
    lock_url,
    locked_dependencies,
    requested_dependency,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conda_forge_replica.replica import load_records  # noqa: E402


def replica_depends() -> list[list[str]]:
    return [record.get("depends") or [] for record in load_records()]


def matchspec_dependencies(depends: list[str]) -> dict[str, str]:
    """conda-lock's conversion (conda_solver.solve_conda) of a record's depends, with its vendored MatchSpec."""
    from conda_lock.interfaces.vendored_conda import MatchSpec

    by_name: dict[str, list] = {}
    for dep in depends:
        match = MatchSpec(dep)
        by_name.setdefault(match.name, []).append(match)
    return {name: (MatchSpec.merge(ms)[0] if len(ms) > 1 else ms[0]).version.spec_str
            if (MatchSpec.merge(ms)[0] if len(ms) > 1 else ms[0]).version is not None else ""
            for name, ms in by_name.items()}


# depends strings of real conda-forge records beyond the replica's, and forms the fast path leaves to MatchSpec
ODD_DEPENDS = [
    ["python >=3.12,<3.13.0a0", "python_abi 3.12.* *_cp312", "libgcc >=14", "__glibc >=2.28,<3.0.a0"],
    ["libzlib >=1.3.1,<2.0a0", "openssl >=3.5.0,<4.0a0", "cuda-version >=12.0,<13"],
    ["numpy >=1.21,<3", "numpy >=1.23"],  # a name twice: merged
    ["foo *"], ["foo =1.2"], ["foo >=1.2.*"], ["foo 1.2|1.3"], ["foo ==1.2"], ["foo !=1.2"],
    ["foo 1.0RC1"], ["foo >=1.2,<2|3"], ["foo 1.2.3 build_0"], ["foo 2024.1.1", "bar 1!2.0"],
    ["foo"], ["foo 1.2.3+local"], ["foo 1.2_3"], ["Foo 1.2"], ["foo[version='>=1.2']"], ["foo ==1.2 b_0"],
    ["foo ==1.2.* b"], ["foo ==1 *"], ["foo >=1.2 b"], ["foo 1.2  b"], ["foo 1.2 b extra"], ["foo ==1.2a0 h1_2"],
]


def test_the_replicas_depends_convert_as_conda_locks_matchspec():
    every = replica_depends()
    assert len(every) > 300
    for depends in every:
        assert locked_dependencies(depends) == matchspec_dependencies(depends), depends


@pytest.mark.parametrize("depends", ODD_DEPENDS, ids=[" ; ".join(d) for d in ODD_DEPENDS])
def test_odd_depends_convert_as_conda_locks_matchspec(depends):
    assert locked_dependencies(depends) == matchspec_dependencies(depends)


SPECS = ["python 3.12.*", "cuda-version 13.0.*", "ninja", "cuda-nvcc >=13.0,<13.1", "gxx 14.*", "python 3.12",
         "conda-forge::pip", "python=3.12", "python >=3.12.*", "numpy 1.26.4 py312*", "Python 3.12", "pip *",
         "gxx_linux-64 14.*", "libgcc >=14", "foo ==1.2", "foo 1.2.3+local"]


@pytest.mark.parametrize("spec", SPECS)
def test_each_spec_is_conda_locks_versioned_dependency(spec):
    from conda_lock.src_parser.conda_common import conda_spec_to_versioned_dep

    assert requested_dependency(spec) == conda_spec_to_versioned_dep(spec, "main").model_dump()


CHANNELS = ["conda-forge", "nvidia/label/cuda-11.8.0", "file:///srv/replica", "file:///srv/replica/",
            "https://conda.anaconda.org/conda-forge", "https://host.example:8443/channel",
            "https://host.example/t/tk-123/channel", "https://user:secret@host.example/channel",
            "https://host.example/$CHANNEL_TOKEN/channel", "file:///tmp/a%20b", "https://HOST.example/Path"]


@pytest.mark.parametrize("channel", CHANNELS)
def test_each_channel_is_conda_locks_channel(channel, monkeypatch):
    from conda_lock.models.channel import Channel, normalize_url_with_placeholders

    monkeypatch.setenv("FA_TEST_REPO_TOKEN", "tk-123")
    monkeypatch.setenv("FA_TEST_PASSWORD", "secret")
    expected = Channel.from_string(channel)
    ours = lock_channel(channel)
    assert ours.document() == json.loads(expected.model_dump_json())
    url = f"{channel.rstrip('/')}/linux-64/x-1.0-0.conda"
    assert lock_url(url, (ours,)) == normalize_url_with_placeholders(url, [expected])


# conda-lock's own content hash of an environment file and a virtual-package spec, in a process of its own
CONDA_LOCK_HASHES = """
import json, sys
from pathlib import Path
from conda_lock.content_hash import compute_content_hashes
from conda_lock.lookup import DEFAULT_MAPPING_URL
from conda_lock.src_parser import make_lock_spec
from conda_lock.virtual_package import virtual_package_repo_from_specification
spec = make_lock_spec(src_files=[Path(sys.argv[1])], mapping_url=DEFAULT_MAPPING_URL)
print(json.dumps(compute_content_hashes(spec, virtual_package_repo_from_specification(Path(sys.argv[2])))))
"""


def conda_lock_hashes(tmp_path: Path, channels, platforms, specs, virtual) -> dict[str, str]:
    import yaml

    environment, virtual_file = tmp_path / "env.yml", tmp_path / "virtual.yml"
    environment.write_text(yaml.safe_dump({"name": "x", "channels": list(channels), "platforms": list(platforms),
                                           "dependencies": list(specs)}, sort_keys=False))
    virtual_file.write_text(yaml.safe_dump({"subdirs": {p: {"packages": v} for p, v in virtual.items()}}))
    done = subprocess.run([sys.executable, "-c", CONDA_LOCK_HASHES, str(environment), str(virtual_file)],
                          capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout)


def test_the_content_hash_is_conda_locks(tmp_path):
    """A CUDA line's specs over two platforms, with a name given twice, a spec conda-lock converts itself, a
    channel URL and `nodefaults`: the hash conda-lock's make_lock_spec and compute_content_hashes give."""
    virtual = {"__unix": "0", "__linux": "5.10", "__glibc": "2.28", "__cuda": "13.0"}
    platforms = ("linux-64", "linux-aarch64")
    channels = ("conda-forge", "nodefaults", "file:///srv/replica")
    specs = ("python 3.12.*", "cuda-version 13.0.*", "cuda-nvcc >=13.0,<13.1", "gxx 14.*", "ninja",
             "python >=3.12,<3.13", "conda-forge::pip")
    virtuals = {"linux-64": {**virtual, "__archspec": "1 x86_64"},
                "linux-aarch64": {**virtual, "__archspec": "1 aarch64"}}
    ours = content_hashes(lock_document.requested_dependencies(specs), lock_document.lock_channels(channels),
                          platforms, virtuals)
    assert ours == conda_lock_hashes(tmp_path, channels, platforms, specs, virtuals)


def test_an_unreached_record_gets_no_entry_as_conda_locks_categories():
    """apply_categories gives a record no requested name reaches no category, and to_v1 writes no entry for it;
    names are looked up with - and _ alike."""
    from conda_lock.lockfile import apply_categories
    from conda_lock.lockfile.v2prelim.models import HashModel, LockedDependency
    from conda_lock.lookup import DEFAULT_MAPPING_URL
    from conda_lock.models.lock_spec import VersionedDependency

    records = [{"name": "a", "version": "1", "url": "https://x/linux-64/a-1-0.conda", "md5": "0" * 32,
                "depends": ["b_c >=1", "__glibc >=2.17"]},
               {"name": "b-c", "version": "1", "url": "https://x/linux-64/b-c-1-0.conda", "md5": "1" * 32},
               {"name": "lone", "version": "1", "url": "https://x/linux-64/lone-1-0.conda", "md5": "2" * 32}]
    ours = lock_document.conda_entries(records, "linux-64", (LockChannel("https://x"),), ["a"])
    planned = {r["name"]: LockedDependency(name=r["name"], version=r["version"], manager="conda", platform="linux-64",
                                           dependencies=locked_dependencies(r.get("depends") or []), url=r["url"],
                                           hash=HashModel(md5=r["md5"])) for r in records}
    apply_categories(requested={"a": VersionedDependency(name="a", version="")}, planned=planned,
                     mapping_url=DEFAULT_MAPPING_URL)
    expected = [entry.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)
                for p in planned.values() for entry in p.to_v1()]
    assert [entry.document() for entry in ours] == expected
    assert [entry.name for entry in ours] == ["a", "b-c"]


@pytest.mark.parametrize("line", ["gpu-machine", "gpu-machine-fa3", "gpu-machine-fa4", "gpu-machine-fp8",
                                  "gpu-replica"])
def test_the_committed_locks_content_hash_is_made_again(line):
    """The committed locks of the external-toolchain lines hold the content hash conda-lock computed when they were
    written (an earlier session's conda-lock, its own models): the same hash comes from the spec again."""
    import yaml

    from toolkit.env.engine import layer_from_actions
    from toolkit.env.lock import conda_request
    from toolkit.spec.envspec import load_spec

    request = conda_request(load_spec(ROOT / "envs" / f"{line}.yaml"))
    committed = yaml.safe_load((ROOT / "locks" / f"{line}.conda-lock.yml").read_text())["metadata"]
    layer = layer_from_actions(request, {platform: [] for platform in request.platforms})
    assert layer.content_hash == committed["content_hash"]
    assert [channel.document() for channel in layer.channels] == committed["channels"]


def test_the_replicas_conversions_import_no_module_of_conda_lock():
    """Every record of the replica (real conda-forge records) and every spec of the repo's conda lines take the
    forms converted here: a conda lock imports nothing of conda-lock where its document is made."""
    script = f"""
import sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]
from conda_forge_replica.replica import load_records
from pathlib import Path
from toolkit.env import lock_document
from toolkit.env.lock import conda_request
from toolkit.spec.envspec import load_spec
for record in load_records():
    lock_document.locked_dependencies(record.get("depends") or [])
for path in sorted(Path({str(ROOT / 'envs')!r}).glob("cu1*.yaml")):
    request = conda_request(load_spec(path))
    lock_document.content_hashes(lock_document.requested_dependencies(request.specs),
                                 lock_document.lock_channels(request.channels), request.platforms,
                                 request.virtual_packages)
print(sorted({{name.split(".")[0] for name in sys.modules}} & {{"conda_lock", "pydantic", "requests"}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr
