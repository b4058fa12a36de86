"""FlashAttention-3 from source: the profiles against the real hopper/setup.py, the source pins, the build.

Expected values come from elsewhere than the code under test: the switch names and the source list from the
excerpt of the real hopper/setup.py (tests/data/fa3/hopper_setup_excerpt.txt, evaluated here), the full
build's object count from upstream's own build log (Dao-AILab/flash-attention#2024: "[1/293]"), git ids from
`git` itself. The build runs tests/fixtures/fa3_fixture (NOT FlashAttention-3's source: a miniature with the
real layout and build knobs, see its README.md) through the shared build with the real nvcc.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from cuda_toolchain import require_nvcc
from fixtures.fa_fixture_project import make_stub_torch_env, pack_fixture_sdist, write_external_spec
from packaging.version import parse
from rich.console import Console

from toolkit.base.digest import git_object_id
from toolkit.base.errors import ToolkitError
from toolkit.base.workspace import Workspace
from toolkit.build.builder import BuildOptions, build, sources_of
from toolkit.build.fa3 import Fa3Source, archive_path, assemble, fetch_archive
from toolkit.build.ninja_shim import ManifestPlan, prepared_manifest
from toolkit.knowledge import fa3_pins
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.object_costs import load_object_costs
from toolkit.spec.envspec import load_spec

ROOT = Path(__file__).resolve().parent.parent
EXCERPT = ROOT / "tests" / "data" / "fa3" / "hopper_setup_excerpt.txt"
FIXTURE = ROOT / "tests" / "fixtures" / "fa3_fixture"
PINNED = "c75d019dea9d910312974417bc28f190dfdda6d9"
FIXTURE_COMMITS = {"flash-attention": "1" * 40, "cutlass": "2" * 40}  # made up: the fixture is no commit


def excerpt_parts() -> tuple[str, str]:
    text = EXCERPT.read_text()
    _, switches, sources = re.split(r"^# --- lines .*$", text, flags=re.M)
    return switches, sources


def setup_py_switches() -> dict[str, str]:
    """The real setup.py's switches: environment name -> its variable (DISABLE_SM8x reads ..._DISABLE_SM80)."""
    found = re.findall(r'^(\w+) = os\.getenv\("(FLASH_ATTENTION_DISABLE_\w+)", "FALSE"\) == "TRUE"$',
                       excerpt_parts()[0], re.M)
    return {env: variable for variable, env in found}


def setup_py_sources(disabled: set[str], torch_version: str = "2.11.0") -> list[str]:
    """The real setup.py's source list with these switches on: its own code, evaluated."""
    names = setup_py_switches()
    scope = {"itertools": itertools, "parse": parse, "torch": SimpleNamespace(__version__=torch_version),
             **{variable: env in disabled for env, variable in names.items()}}
    exec(textwrap.dedent(excerpt_parts()[1]), scope)  # upstream's own lines, vendored with their source
    return scope["sources"]


# ---------------------------------------------------------------- profiles against the real setup.py


def test_the_knowledge_lists_exactly_the_switches_setup_py_reads():
    assert len(setup_py_switches()) == 19
    assert sorted(fa3_pins.switches()) == sorted(setup_py_switches())


@pytest.mark.parametrize("name", list(fa3_pins.knowledge()["profiles"]))
def test_each_profile_compiles_what_its_name_says(name):
    profile = fa3_pins.profile(name)
    assert set(profile.switches) <= set(setup_py_switches())
    sources = setup_py_sources(set(profile.switches))
    kernels = [s for s in sources if s.startswith("instantiations/")]
    hdims = {int(re.search(r"hdim(\d+)", s).group(1)) for s in kernels}
    dtypes = {re.search(r"_(bf16|fp16|e4m3)", s).group(1) for s in kernels}
    kinds = {s.split("/")[1].split("_")[1] for s in kernels}
    assert profile.sm80 == any(s.endswith("_sm80.cu") for s in sources)
    expected = {
        "full": ({64, 96, 128, 192, 256}, {"bf16", "fp16", "e4m3"}, {"fwd", "bwd"}),
        "hopper-full": ({64, 96, 128, 192, 256}, {"bf16", "fp16", "e4m3"}, {"fwd", "bwd"}),
        "hopper-training": ({64, 128}, {"bf16", "fp16"}, {"fwd", "bwd"}),
        "hopper-training-fp8": ({64, 128}, {"bf16", "fp16", "e4m3"}, {"fwd", "bwd"}),
        "hopper-fp8-fwd": ({128, 256}, {"bf16", "e4m3"}, {"fwd"}),
        "hdim128-bf16-fwd": ({128}, {"bf16"}, {"fwd"}),
    }[name]
    assert (hdims, dtypes, kinds) == expected



@pytest.mark.parametrize("bogus", ["FLASH_ATTENTION_DISABLE_SM8x", "FLASH_ATTENTION_DISABLE_FP8_KV"])
def test_a_profile_naming_a_switch_setup_py_does_not_read_is_one_line(tmp_path, bogus):
    """setup.py ignores a variable it does not read, so the misspelt profile would build every kernel it meant to
    leave out: DISABLE_SM8x is setup.py's own name for what it reads as FLASH_ATTENTION_DISABLE_SM80."""
    assert bogus not in setup_py_switches()
    data = yaml.safe_load(fa3_pins.KNOWLEDGE_FILE.read_text())
    data["profiles"]["misspelt"] = {"description": "x", "switches": ["FLASH_ATTENTION_DISABLE_SM80", bogus],
                                    "sm80": False}
    path = tmp_path / "flash_attn_3.yaml"
    path.write_text(yaml.safe_dump(data))
    assert fa3_pins.profile("hopper-full", path).switches == ("FLASH_ATTENTION_DISABLE_SM80",)
    with pytest.raises(ToolkitError) as refused:
        fa3_pins.profile("misspelt", path)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and f"profile misspelt: {bogus} is not" in message


def test_object_counts_are_the_length_of_setup_pys_source_list():
    pinned = fa3_pins.commit(PINNED)
    counts = {name: len(setup_py_sources(set(fa3_pins.profile(name).switches))) for name in pinned.objects}
    assert counts == pinned.objects
    assert pinned.objects["full"] == 293  # ninja's "[1/293]" of a full build, Dao-AILab/flash-attention#2024


def test_setup_py_builds_the_stable_abi_api_from_the_torch_the_knowledge_says():
    stable = fa3_pins.commit(PINNED).stable_abi_torch
    assert stable == ">=2.9"
    assert setup_py_sources(set(), "2.9.0")[0] == "flash_api_stable.cpp"
    assert setup_py_sources(set(), "2.8.0")[0] == "flash_api.cpp"


# ---------------------------------------------------------------- git ids


def git(*args: str, cwd: Path) -> str:
    if shutil.which("git") is None:
        pytest.skip("needs git for the expected ids")
    return subprocess.run(["git", "-c", "core.fileMode=true", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def git_ids(tree: Path, paths: list[str]) -> dict[str, str]:
    """What git itself says the ids of these paths of a folder are."""
    git("init", "-q", ".", cwd=tree)
    git("add", "-A", ".", cwd=tree)
    root = git("write-tree", cwd=tree)
    return {path: git("rev-parse", f"{root}:{path}", cwd=tree) for path in paths}


def test_git_object_id_is_gits_own(tmp_path):
    tree = tmp_path / "t"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "empty").mkdir()  # git keeps no empty folder
    (tree / "a" / "run.sh").write_text("#!/bin/sh\n")
    (tree / "a" / "run.sh").chmod(0o755)
    (tree / "a" / "b" / "x.h").write_bytes(b"\x00binary\n")
    (tree / "a" / "b-c.txt").write_text("sorted after b/ by git's rule\n")
    (tree / "a" / "link").symlink_to("b/x.h")
    expected = git_ids(tree, ["a", "a/b", "a/run.sh"])
    assert {p: git_object_id(tree / p) for p in expected} == expected


# ---------------------------------------------------------------- the source: fetched, checked, assembled


def fixture_commit(tmp_path: Path) -> tuple[fa3_pins.Fa3Commit, Path]:
    """The pinned commit's entry with its archives replaced by the fixture's: packed as GitHub packs them (one
    top folder), served from file:// URLs, pinned by the ids git gives the fixture's paths."""
    served = tmp_path / "served"
    data = yaml.safe_load(fa3_pins.KNOWLEDGE_FILE.read_text())
    entry = data["commits"][PINNED]
    for archive in entry["archives"]:
        commit = FIXTURE_COMMITS[archive["name"]]
        base = f"{archive['name']}-{commit}"
        archive.update(commit=commit, filename=f"{base}.tar.gz", url=(served / f"{base}.tar.gz").as_uri())
        pack_fixture_sdist(served, base, FIXTURE / archive["name"])
        copy = tmp_path / "git" / archive["name"]
        shutil.copytree(FIXTURE / archive["name"], copy, ignore=shutil.ignore_patterns("__pycache__"))
        archive["pins"] = git_ids(copy, list(archive["pins"]))
    data["commits"] = {PINNED: entry}
    path = tmp_path / "flash_attn_3.yaml"
    path.write_text(yaml.safe_dump(data))
    return fa3_pins.commit(PINNED, path), served


def test_archives_are_checked_against_their_pins_and_laid_out_as_setup_py_reads_them(tmp_path):
    pinned, _ = fixture_commit(tmp_path)
    cache = tmp_path / "cache"
    paths = [fetch_archive(a, cache) for a in pinned.archives]
    assert paths == [cache / "flash-attn-3" / FIXTURE_COMMITS[a.name] / a.filename for a in pinned.archives]
    root, _ = assemble(paths, pinned.archives, tmp_path / "build")
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == sorted(
        [f"hopper/{p.relative_to(FIXTURE / 'flash-attention/hopper').as_posix()}"
         for p in (FIXTURE / "flash-attention/hopper").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        + ["README.md", "csrc/cutlass/include/cutlass/numeric_types.h"])


def test_a_download_that_is_not_the_pinned_source_never_enters_the_cache(tmp_path):
    pinned, served = fixture_commit(tmp_path)
    archive = pinned.archives[0]
    tampered = tmp_path / "tampered"
    shutil.copytree(FIXTURE / "flash-attention", tampered)
    (tampered / "hopper" / "setup.py").write_text((tampered / "hopper" / "setup.py").read_text() + "# changed\n")
    pack_fixture_sdist(served, archive.filename.removesuffix(".tar.gz"), tampered)
    with pytest.raises(ToolkitError) as refused:
        fetch_archive(archive, tmp_path / "cache")
    message = str(refused.value)
    assert "\n" not in message and f"hopper has git id {git_object_id(tampered / 'hopper')}" in message
    assert f"pins {archive.pins['hopper']}" in message
    assert not archive_path(tmp_path / "cache", archive).exists()


def test_a_cached_archive_that_was_changed_is_refused_and_removed(tmp_path):
    pinned, _ = fixture_commit(tmp_path)
    cache = tmp_path / "cache"
    paths = [fetch_archive(a, cache) for a in pinned.archives]
    with tarfile.open(paths[1], "w:gz") as tar:  # put there by hand: cutlass without its include/
        tar.addfile(tarfile.TarInfo(f"cutlass-{FIXTURE_COMMITS['cutlass']}/README.md"))
    with pytest.raises(ToolkitError, match=r"include is missing .* \(removed the archive; re-run to download"):
        assemble(paths, pinned.archives, tmp_path / "build")
    assert not paths[1].exists() and paths[0].exists()



@pytest.mark.parametrize("damage", ["truncated", "not gzip"])
def test_a_cached_archive_cut_short_or_not_gzip_is_one_line_and_removed(tmp_path, damage):
    """gzip's EOFError of a download cut short, and tarfile's five-line "could not be opened" of an HTML error
    page saved under the archive's name: one line naming the file and the fix, and the file leaves the cache."""
    pinned, _ = fixture_commit(tmp_path)
    cache = tmp_path / "cache"
    paths = [fetch_archive(a, cache) for a in pinned.archives]
    whole = paths[0].read_bytes()
    paths[0].write_bytes(whole[:len(whole) // 2] if damage == "truncated" else b"<html>404: Not Found</html>\n")
    with pytest.raises(ToolkitError) as refused:
        assemble(paths, pinned.archives, tmp_path / "build")
    message = str(refused.value)
    assert "\n" not in message and f"{paths[0].name}: cannot unpack an archive of flash-attention (" in message
    assert message.endswith(f"; removed the archive; re-run to download {pinned.archives[0].url} again, or put that "
                            "archive there)")
    assert not paths[0].exists() and paths[1].exists()


def test_a_download_cut_short_never_enters_the_cache(tmp_path):
    pinned, served = fixture_commit(tmp_path)
    archive = pinned.archives[1]
    whole = (served / archive.filename).read_bytes()
    (served / archive.filename).write_bytes(whole[:len(whole) // 2])
    with pytest.raises(ToolkitError) as refused:
        fetch_archive(archive, tmp_path / "cache")
    assert "\n" not in str(refused.value) and "cannot unpack an archive of cutlass (it ends early" in str(refused.value)
    assert not archive_path(tmp_path / "cache", archive).exists()


# ---------------------------------------------------------------- the build's plumbing


def test_the_ninja_shim_seeds_the_rules_fa3_writes():
    """hopper/setup.py's _write_ninja_file: rules cuda_compile, cuda_compile_sm80 ... run $nvcc_from_env."""
    manifest = "\n".join([
        "nvcc_from_env = /usr/local/cuda/bin/nvcc", "nvcc = /usr/local/cuda/bin/nvcc",
        "rule cuda_compile", "  depfile = $out.d",
        "  command = $nvcc_from_env  $cuda_cflags -c $in -o $out $cuda_post_cflags",
        "rule cuda_compile_sm80", "  command = $nvcc_from_env  $cuda_cflags -c $in -o $out $cuda_post_cflags_sm80",
        "rule cuda_devlink", "  command = $nvcc $in -o $out $cuda_dlink_post_cflags",
        "build /b/x_sm90.o: cuda_compile /b/src/x_sm90.cu", "build /b/y_sm80.o: cuda_compile_sm80 /b/src/y_sm80.cu",
    ])
    text, seeded, _, _ = prepared_manifest(manifest, ManifestPlan("/b", {}))
    assert seeded == 2
    assert "build /b/x_sm90.o: cuda_compile /b/src/x_sm90.cu\n  nvcc_from_env = $nvcc_from_env -frandom-seed=" in text


def test_fa3_wheels_have_a_folder_no_line_can_have():
    workspace = Workspace()
    assert workspace.wheel_dir("gpu-machine", "flash-attn-3") == Path("wheelhouse/gpu-machine+fa3")
    with pytest.raises(ToolkitError):
        workspace.wheel_dir("gpu-machine+fa3")


def fa3_section(profile: str, commit: str = PINNED) -> str:
    return f"flash_attn_3: {{commit: {commit}, profile: {profile}}}"


@pytest.mark.parametrize("body, problem", [
    (fa3_section("full"), "archs: FlashAttention-3 profile full compiles sm_80"),
    (fa3_section("tiny"), ":2: flash_attn_3.profile: no FlashAttention-3 profile"),
    (fa3_section("hopper-full", "a" * 40), ":2: flash_attn_3.commit: FlashAttention-3 commit aaa"),
    (fa3_section("hopper-full", "c75d019"), ":2: flash_attn_3.commit: 'c75d019' is not a git commit"),
    ('archs: ["80"]\n' + fa3_section("hopper-training"), ":2: archs: FlashAttention-3 runs on sm_90a only"),
    # below the stable-ABI floor (the range's top is 2.15, built: docs/results/2026-12-05-fa3-cu132/)
    ('extends: cu128\ntorch: {version: "2.8.0"}\n' + fa3_section("hopper-training"),
     ":2: torch.version: FlashAttention-3 at c75d019dea9d is known to build its stable-ABI wheel for torch >=2.9,<2.16"),
])
def test_toolkit_check_refuses_a_line_fa3_cannot_build_in_one_line(tmp_path, body, problem):
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs", envs)
    (envs / "t.yaml").write_text(body + "\n" if body.startswith("extends:") else f"extends: gpu-machine\n{body}\n")
    done = subprocess.run([sys.executable, "-m", "toolkit", "check", "--envs", str(envs), "t"], cwd=tmp_path,
                          capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if ": patch: " not in line]  # FA2's patch notes
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("envs/t.yaml"), done.stdout
    assert problem in lines[0] and "(" in lines[0] and "Traceback" not in done.stderr


def test_the_cuda_13_2_line_passes_the_check_after_its_compile():
    """issue 34: FA3 on CUDA 13.2 was decided by a compile (docs/results/2026-12-05-fa3-cu132/: ptxas 13.2.86 built
    the pinned kernels, the hdim128-bf16-fwd wheel built against torch 2.15.0), so py-cu132-fa3 (CUDA 13.2, torch
    2.15.0 from its parent py-cu132, read here with yaml) passes `toolkit check`; the torch range stopped at 2.11."""
    parent = yaml.safe_load((ROOT / "envs" / "py-cu132.yaml").read_text())
    assert (parent["cuda"], parent["torch"]["version"]) == ("13.2", "2.15.0")
    done = subprocess.run([sys.executable, "-m", "toolkit", "check", "py-cu132-fa3"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # no FA2 in the line, so no note of FA2's cxx20 patch (torch 2.15 would get it where FA2 is built)
    assert done.stdout.splitlines() == ["1 spec checked: no problems"]


def test_the_example_line_passes_toolkit_check():
    spec = load_spec(ROOT / "envs" / "gpu-machine-fa3.yaml")
    assert spec.flash_attn_3 is not None and spec.flash_attn_3.commit == PINNED
    done = subprocess.run([sys.executable, "-m", "toolkit", "check", "gpu-machine-fa3"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_the_example_line_builds_fa3_instead_of_fa2():
    workspace = Workspace()
    assert [type(s) for s in sources_of(load_spec(ROOT / "envs" / "gpu-machine-fa3.yaml"), workspace)] == [Fa3Source]
    assert [type(s).__name__ for s in sources_of(load_spec(ROOT / "envs" / "gpu-machine.yaml"), workspace)] == [
        "Fa2Source"]


# ---------------------------------------------------------------- the build, with the real nvcc


def knowledge_with_fixture_costs(tmp: Path) -> Path:
    """The real knowledge with object costs for the fixture's build (the pinned commit, profile
    hdim128-bf16-fwd) by path inside the flash-attention tree. The figures are NOT measured: any will do, the
    test is that FA3's build finds them by commit and profile and matches its objects to them."""
    knowledge = tmp / "knowledge"
    shutil.copytree(knowledge_files.KNOWLEDGE_DIR, knowledge)
    costs = yaml.safe_load((knowledge / "object_costs.yaml").read_text())
    costs["releases"].append({"version": "3.0.0", "profile": "fa3", "commit": PINNED, "fa3_profile": "hdim128-bf16-fwd",
                              "arch": "90", "source": "fa3", "cpu_seconds": {
                                  "hopper/api.cpp": 1.0, "hopper/flash_fwd_hdim128_bf16_sm90.cu": 2.0}})
    (knowledge / "object_costs.yaml").write_text(yaml.safe_dump(costs))
    return knowledge


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture built through the shared build as a line's FA3 with profile hdim128-bf16-fwd, a first build
    with the knowledge's object costs (knowledge_with_fixture_costs)."""
    require_nvcc()
    tmp = tmp_path_factory.mktemp("fa3")
    pinned, _ = fixture_commit(tmp)
    python = make_stub_torch_env(tmp / "venv", "2.13.0", "13.0")
    spec_path = write_external_spec(tmp / "envs", "fa3fix", python, "2.13.0", archs=("90",))
    spec_path.write_text(spec_path.read_text() + f"flash_attn_3: {{commit: {PINNED}, profile: hdim128-bf16-fwd}}\n")
    spec = load_spec(spec_path)
    source = Fa3Source(spec, pinned, fa3_pins.profile("hdim128-bf16-fwd"))
    options = BuildOptions(workspace=Workspace(wheelhouse=tmp / "wheelhouse"), cache=tmp / "cache")
    with open(tmp / "console.txt", "w") as console_file, pytest.MonkeyPatch.context() as patch:
        console = Console(file=console_file)
        patch.setattr(knowledge_files, "KNOWLEDGE_DIR", knowledge_with_fixture_costs(tmp))
        load_object_costs.cache_clear()
        try:
            result = build(spec, options, console, source)
        finally:
            load_object_costs.cache_clear()
        patch.undo()
        again = build(spec, options, console, Fa3Source(spec, pinned, fa3_pins.profile("hdim128-bf16-fwd")))
    return SimpleNamespace(tmp=tmp, spec=spec, result=result, again=again, python=python)


def test_the_fa3_wheel_is_built_into_its_own_folder_and_cached(built):
    wheel = built.result.wheel
    assert wheel.parent == built.tmp / "wheelhouse" / "fa3fix+fa3"
    assert wheel.name == "flash_attn_3-3.0.0+cu130torch2.13-cp310-abi3-linux_x86_64.whl"
    assert built.again.cached and built.again.wheel == wheel
    assert "flash-attn-3" in (built.tmp / "wheelhouse" / "simple" / "index.html").read_text()


def test_setup_py_saw_the_profiles_switches_offline_and_the_lines_nvcc(built):
    profile = fa3_pins.profile("hdim128-bf16-fwd")
    with zipfile.ZipFile(built.result.wheel) as wheel:
        config = wheel.read("flash_attn_config.py").decode()
    assert config == f"CONFIG = {{'build_flags': {dict.fromkeys(profile.switches, True)!r}}}\n"
    env = built.result.record.environment
    assert env["FLASH_ATTENTION_OFFLINE_BUILD"] == "TRUE" and env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert env["CUDA_HOME"] == built.spec.toolchain.cuda_home
    assert {k for k, v in env.items() if k.startswith("FLASH_ATTENTION_DISABLE_") and v == "TRUE"} == set(
        profile.switches)


def test_the_record_says_commit_profile_switches_and_archives(built):
    record = json.loads(built.result.record_path.read_text())
    section = record["flash_attn_3"]
    assert (section["commit"], section["profile"]) == (PINNED, "hdim128-bf16-fwd")
    assert section["switches"] == list(fa3_pins.profile("hdim128-bf16-fwd").switches)
    assert [a["commit"] for a in section["archives"]] == list(FIXTURE_COMMITS.values())
    import hashlib

    cached = [built.tmp / "cache" / "flash-attn-3" / a["commit"] / a["filename"] for a in section["archives"]]
    assert [a["sha256"] for a in section["archives"]] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in cached]
    # DISABLE_BACKWARD left the backward kernel out: the .cpp and one kernel, the kernel's nvcc seeded
    assert sorted(o["name"] for o in record["outputs"]["objects"]) == ["api.cpp.o", "flash_fwd_hdim128_bf16_sm90.cu.o"]
    assert record["schedule"]["nvcc_objects_seeded"] == 1
    # a first build: both objects ordered by the knowledge's costs of this commit and profile, by their paths
    # inside the flash-attention tree (hopper/...), not inside hopper/ where setup.py runs
    assert (record["schedule"]["order"], record["schedule"]["edges_ordered"], record["schedule"]["objects_without_cost"]) \
        == ("knowledge", 2, 0)
    assert record["schedule"]["from_knowledge"].endswith(f"(flash-attn 3.0.0 fa3 at {PINNED[:12]}, profile "
                                                         "hdim128-bf16-fwd, measured on sm_90: fa3)")
    assert record["outputs"]["archs_compiled"] == {"flash_attn_3/_C.abi3.so": ["90a"]}


def test_the_fa3_wheel_installs_beside_flash_attn_2(built):
    """Imported after the install (flash_attn_interface loads flash_attn_3._C), and none of its top-level names
    is one flash-attn 2.8.3.post2 installs (its top_level.txt, read in the knowledge)."""
    assert built.result.record.outputs.imported
    with zipfile.ZipFile(built.result.wheel) as wheel:
        tops = {n.split("/")[0].split(".")[0] for n in wheel.namelist() if ".dist-info/" not in n}
    assert tops == {"flash_attn_3", "flash_attn_interface", "flash_attn_config"}
    assert not tops & {"flash_attn", "hopper", "flash_attn_2_cuda"}
