"""Patches as data: selection from toolkit/knowledge/patches.yaml, applying our patch to the real setup.py of
the pinned sdist, and what the patched setup.py computes for each torch version."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SDIST_SHA256
from cuda_toolchain import tool_on_path
from packaging.version import Version

from toolkit.base.errors import ToolkitError
from toolkit.spec import patches
from toolkit.spec.envspec import load_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
REAL_SETUP = ROOT / "tests/data/flash_attn-2.8.3.post2/setup.py"  # see tests/data/README.md
REAL_SETUP_SHA256 = "152570de3092218ebbb0969281b6e0f58fea62ec65fd6029c7a20ea6589aacf4"
CXX20 = "flash-attn-2.8.3-cxx20.patch"


def sdist_tree(tmp_path: Path, setup_text: str | None = None) -> Path:
    """An unpacked-sdist folder holding the real setup.py (or a variant of it)."""
    src = tmp_path / "flash_attn-2.8.3.post2"
    src.mkdir()
    (src / "setup.py").write_text(setup_text if setup_text is not None else REAL_SETUP.read_text())
    return src


def spec_for(tmp_path: Path, torch: str, flash_attn: str = "2.8.3.post2", cuda: str = "13.0", gcc: int = 14):
    tag = "cu" + cuda.replace(".", "")
    envs = tmp_path / "envs"
    envs.mkdir(exist_ok=True)
    (envs / "base.yaml").write_text((ROOT / "envs/base.yaml").read_text())
    (envs / f"{tag}.yaml").write_text(
        f'extends: base\ncuda: "{cuda}"\npython: "3.12"\ngcc: {gcc}\ntorch:\n  version: "{torch}"\n'
        f"  index: https://download.pytorch.org/whl/{tag}\nflash_attn_2: {{version: \"{flash_attn}\"}}\n")
    return load_spec(envs / f"{tag}.yaml")


def cuda_flags(setup_text: str, torch_version: str) -> dict[str, list[str]]:
    """Run the statements of setup.py's CUDA branch that compute the C++ standard flags, with a stand-in torch
    that has only __version__: the real code of the file, not a copy of it."""
    tree = ast.parse(setup_text)
    branch = next(n for n in ast.walk(tree) if isinstance(n, ast.If)
                  and ast.unparse(n.test) == "not SKIP_CUDA_BUILD and (not IS_ROCM)")
    wanted = {"TORCH_MAJOR", "TORCH_MINOR", "CXX_STD", "nvcc_flags", "compiler_c17_flag"}
    body = [s for s in branch.body if isinstance(s, ast.Assign)
            and {t.id for t in s.targets if isinstance(t, ast.Name)} & wanted]
    namespace = {"torch": SimpleNamespace(__version__=torch_version)}
    exec(compile(ast.Module(body=body, type_ignores=[]), "setup.py", "exec"), namespace)
    return {"nvcc": namespace["nvcc_flags"], "cxx": namespace["compiler_c17_flag"]}


def std_flags(flags: dict[str, list[str]]) -> set[str]:
    return {f for fl in flags.values() for f in fl if f.startswith("-std=")}


# ---------------------------------------------------------------- the data


def test_the_stored_setup_py_is_the_sdists():
    assert hashlib.sha256(REAL_SETUP.read_bytes()).hexdigest() == REAL_SETUP_SHA256


def test_every_patch_file_in_the_knowledge_exists_and_every_patch_file_is_in_the_knowledge():
    needs, known = patches.catalog()
    assert {p.file.name for p in known} == {p.name for p in patches.PATCH_DIR.glob("*.patch")}
    assert {p.fixes for p in known} <= {n.id for n in needs}
    assert all(p.upstream.startswith("https://") for p in known)


@pytest.mark.parametrize("version,torch,selected,unmet", [
    ("2.8.3.post2", "2.14.1+cu130", [CXX20], []),
    ("2.8.3.post2", "2.13.0", [CXX20], []),
    ("2.8.3", "2.15.0", [CXX20], []),
    ("2.8.3.post2", "2.12.1", [], []),  # torch 2.12 headers build as C++17
    ("2.7.3", "2.7.1", [], []),
    ("2.7.3", "2.14.0", [], ["cxx20"]),  # needs C++20, no patch written for 2.7.3's setup.py
    ("2.8.2", "2.13.0", [], ["cxx20"]),
])
def test_plan_selects_by_sdist_and_torch_version(version, torch, selected, unmet):
    chosen = patches.plan("flash-attn", version, torch)
    assert [p.file.name for p in chosen.patches] == selected
    assert [n.id for n in chosen.unmet] == unmet


def test_records_carry_file_and_sha256(tmp_path):
    spec = spec_for(tmp_path, "2.14.1")
    [record] = patches.planned_records(spec)
    expected = hashlib.sha256((patches.PATCH_DIR / CXX20).read_bytes()).hexdigest()
    assert record["file"] == CXX20 and record["sha256"] == expected and record["fixes"] == "cxx20"
    assert patches.planned_records(spec_for(tmp_path, "2.12.1")) == []
    assert patches.key_inputs(spec) == {"patches": [record]}
    assert patches.key_inputs(spec_for(tmp_path, "2.12.1")) == {}  # unpatched lines keep their cache keys


# ---------------------------------------------------------------- applying it to the real setup.py


def test_unpatched_setup_py_asks_for_cxx17_even_with_torch_2_14():
    """The bug the patch fixes, shown on the real file: C++17 whatever torch is installed."""
    assert std_flags(cuda_flags(REAL_SETUP.read_text(), "2.14.1+cu130")) == {"-std=c++17"}


def test_patch_applies_to_the_real_setup_py_and_selects_the_standard_from_torch(tmp_path):
    src = sdist_tree(tmp_path)
    applied = patches.apply(src, spec_for(tmp_path, "2.14.1"), SDIST_SHA256)
    assert [(r.file, r.applied) for r in applied] == [(CXX20, True)]
    patched = (src / "setup.py").read_text()
    assert patched != REAL_SETUP.read_text() and not list(src.glob("*.orig")) and not list(src.glob("*.rej"))
    for torch, std in [("2.14.1+cu130", "-std=c++20"), ("2.13.0", "-std=c++20"), ("2.15.0", "-std=c++20"),
                       ("3.0.0", "-std=c++20"), ("2.12.1", "-std=c++17"), ("2.9.1+cu126", "-std=c++17")]:
        flags = cuda_flags(patched, torch)
        assert std_flags(flags) == {std}, torch
        assert flags["nvcc"][:2] == ["-O3", std] and flags["cxx"] == ["-O3", std]


def test_other_bytes_under_the_same_version_are_not_patched_blind(tmp_path):
    """A test fixture or a rebuilt copy that calls itself 2.8.3.post2: left alone, and the record says why."""
    src = sdist_tree(tmp_path, "print('not flash-attn')\n")
    [record] = patches.apply(src, spec_for(tmp_path, "2.14.1"), "0" * 64)
    assert record.file == CXX20 and record.applied is False and "0" * 64 in record.why
    assert (src / "setup.py").read_text() == "print('not flash-attn')\n"


def test_the_patch_names_the_published_sdists_it_was_checked_against():
    [patch] = patches.catalog()[1]
    assert patch.sdists["2.8.3.post2"] == SDIST_SHA256
    assert set(patch.sdists) == {"2.8.3", "2.8.3.post1", "2.8.3.post2"}
    assert all(patch.when.versions.contains(v) for v in patch.sdists)


def test_lines_below_torch_2_13_leave_the_sdist_untouched(tmp_path):
    src = sdist_tree(tmp_path)
    assert patches.apply(src, spec_for(tmp_path, "2.9.1"), SDIST_SHA256) == []
    assert (src / "setup.py").read_text() == REAL_SETUP.read_text()


def test_a_patch_that_does_not_fit_fails_in_one_line_and_changes_nothing(tmp_path):
    changed = REAL_SETUP.read_text().replace('compiler_c17_flag=["-O3", "-std=c++17"]',
                                              'compiler_c17_flag=["-O2", "-std=c++17"]')
    src = sdist_tree(tmp_path, changed)
    with pytest.raises(ToolkitError) as err:
        patches.apply(src, spec_for(tmp_path, "2.14.1"), SDIST_SHA256)
    message = str(err.value)
    assert "\n" not in message and f"{CXX20}: does not apply to flash_attn-2.8.3.post2 (" in message
    assert (src / "setup.py").read_text() == changed  # the dry run stopped it before any hunk landed


def test_applying_twice_is_refused_not_reversed(tmp_path):
    src = sdist_tree(tmp_path)
    spec = spec_for(tmp_path, "2.14.1")
    patches.apply(src, spec, SDIST_SHA256)
    once = (src / "setup.py").read_text()
    with pytest.raises(ToolkitError, match="does not apply"):
        patches.apply(src, spec, SDIST_SHA256)
    assert (src / "setup.py").read_text() == once


def test_a_line_no_patch_covers_is_refused_before_anything_runs(tmp_path):
    src = sdist_tree(tmp_path)
    with pytest.raises(ToolkitError) as err:
        patches.apply(src, spec_for(tmp_path, "2.14.1", flash_attn="2.8.2"), SDIST_SHA256)
    assert "cannot build: torch >= 2.13 headers need C++20" in str(err.value) and "\n" not in str(err.value)


def test_missing_patch_binary_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(ToolkitError, match="^patch: not found on PATH"):
        patches.apply(sdist_tree(tmp_path), spec_for(tmp_path, "2.14.1"), SDIST_SHA256)


@pytest.mark.network
def test_patch_applies_to_the_whole_pinned_sdist(tmp_path, pinned_sdist):
    """Unpacked the way the build unpacks it."""
    from toolkit.build.source import extract_sdist

    src, _ = extract_sdist(pinned_sdist, tmp_path / "build")
    assert (src / "setup.py").read_bytes() == REAL_SETUP.read_bytes()
    patches.apply(src, spec_for(tmp_path, "2.14.1"), SDIST_SHA256)
    assert std_flags(cuda_flags((src / "setup.py").read_text(), "2.14.1")) == {"-std=c++20"}
    with tarfile.open(pinned_sdist) as tar:
        assert len([m for m in tar.getmembers() if m.name.endswith(".cu")]) > 70  # the full kernel tree is there


# The real setup.py run under a real torch (the CPU torch 2.13.0 of this machine's disk is enough: setup.py only
# reads its version and builds the CUDAExtension list). setuptools.setup is replaced by a recorder, so nothing
# compiles; CUDA_HOME is pointed at a real nvcc, which setup.py asks for its version.
DRIVER = """
import json, runpy, sys, setuptools, torch
import torch.utils.cpp_extension as cpp_extension
if sys.argv[1] != "installed":
    torch.__version__ = sys.argv[1]
cpp_extension.CUDA_HOME = sys.argv[2]
captured = {}
setuptools.setup = lambda **kw: captured.update(kw)
sys.argv = ["setup.py", "--name"]
runpy.run_path("setup.py", run_name="__main__")
print("FLAGS " + json.dumps([e.extra_compile_args for e in captured["ext_modules"]]))
"""


def setup_py_flags(src: Path, torch_version: str, cuda_home: str) -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", DRIVER, torch_version, cuda_home], cwd=src, capture_output=True,
                          text=True, env={**os.environ, "FLASH_ATTN_CUDA_ARCHS": "80"})
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("FLAGS ")]
    [flags] = json.loads(line.removeprefix("FLAGS "))
    return flags


@pytest.mark.nvcc
@pytest.mark.torch
@pytest.mark.network
def test_the_real_patched_setup_py_under_real_torch(tmp_path, pinned_sdist):
    torch = pytest.importorskip("torch")
    nvcc = tool_on_path("nvcc")
    from toolkit.build.source import extract_sdist

    cuda_home = str(Path(nvcc).resolve().parent.parent)
    src, _ = extract_sdist(pinned_sdist, tmp_path / "build")
    if Version(torch.__version__).release[:2] >= (2, 13):
        assert std_flags(setup_py_flags(src, "installed", cuda_home)) == {"-std=c++17"}  # the bug, unpatched
    patches.apply(src, spec_for(tmp_path, "2.14.1"), SDIST_SHA256)
    assert std_flags(setup_py_flags(src, "installed", cuda_home)) == (
        {"-std=c++20"} if Version(torch.__version__).release[:2] >= (2, 13) else {"-std=c++17"})
    assert std_flags(setup_py_flags(src, "2.15.0", cuda_home)) == {"-std=c++20"}
    assert std_flags(setup_py_flags(src, "2.12.1", cuda_home)) == {"-std=c++17"}
