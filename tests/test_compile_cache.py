"""The compile cache every build compiles through (issue 33, item 3): sccache, a server per build.

The end-to-end tests build tests/fixtures/fa_fixture with the real nvcc (tests/cuda_toolchain.py) without the cache,
then twice with it: the wheel's sha256 (hashlib) is the same all three times, the second build with the cache takes
every compile from it (sccache's own counts, in the record), and nothing of the servers runs on; and a second line
that differs only in its python, in its own build folder, takes its kernels' compiles from the first line's cache
(the compile slot, build_dirs.py). The pieces (the shim's launcher words, the site's file, the slot's moves) are
checked against text and folders written out here.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import missing
from cuda_toolchain import NVCC
from fixtures.fa_fixture_project import make_stub_torch_env, other_python, write_external_spec
from rich.console import Console
from test_build_resume import cache_with_sdist, lock_line, locked_project, sha256_of  # noqa: F401 (a fixture)

from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.build.build_dirs import (
    SLOT,
    SLOT_MARKER,
    compile_slot,
    keyed_build_folder,
    put_back_slot,
)
from toolkit.build.compile_cache import (
    CompileCacheConfig,
    read_config,
    sccache_program,
    serving,
    storage,
)
from toolkit.build.ninja_shim import ManifestPlan, prepared_manifest

pytestmark = pytest.mark.slow


NVCC_STAGES = ("CUDA", "CUDA (Device code)", "PTX", "CUBIN")  # sccache's names of nvcc's stages; api.cpp is C/C++


def build(root: Path, wheelhouse: Path, cache: Path, *extra: str, line: str = "fixture",
          **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", "build", line, "--no-install", "--wheelhouse",
                           str(wheelhouse), *extra], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "TOOLKIT_CACHE": str(cache), **env})


def record_and_wheel(wheelhouse: Path, line: str = "fixture") -> tuple[dict, Path]:
    (record,) = (wheelhouse / line).glob("*.build.json")
    (wheel,) = (wheelhouse / line).glob("*.whl")
    return json.loads(record.read_text()), wheel


def nvcc_stages(use: dict, outcome: str) -> int:
    return sum(n for stage, n in use[outcome].items() if stage in NVCC_STAGES)


def children_cpu() -> float:
    """CPU seconds of this test's finished children (and theirs), by the kernel."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sccache_servers() -> set[int]:
    found = set()
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == "sccache":
            found.add(process.pid)
    return found


@pytest.mark.nvcc
def test_a_build_from_the_compile_cache_makes_the_same_wheel(locked_project, tmp_path):
    """Without the cache, with it (all misses, stored in the site's folder), and again with the build folder gone
    (every compile a hit): three wheels of one sha256; each build's counts are in its record."""
    root, cache = locked_project, cache_with_sdist(locked_project, tmp_path / "cache")
    servers_before = sccache_servers()
    cpu0 = children_cpu()
    plain = build(root, tmp_path / "wh0", cache, "--no-compile-cache")
    plain_cpu = children_cpu() - cpu0
    assert plain.returncode == 0, plain.stderr
    plain_record, plain_wheel = record_and_wheel(tmp_path / "wh0")
    assert plain_record["compile_cache"] is None and "compile cache: off (--no-compile-cache)" in plain.stderr

    shared = tmp_path / "shared" / "sccache"  # a site's folder on a shared filesystem, named by its file
    site = tmp_path / "compile-cache.toml"
    site.write_text(f'[sccache]\nSCCACHE_DIR = "{shared}"\n')
    runs = []
    build_cpu = []
    for n in (1, 2):
        cpu0 = children_cpu()
        done = build(root, tmp_path / f"wh{n}", cache, FA_ENVKIT_COMPILE_CACHE=str(site))
        build_cpu.append(children_cpu() - cpu0)
        assert done.returncode == 0, done.stderr
        assert f"compile cache: sccache, folder {shared}" in done.stderr
        runs.append(record_and_wheel(tmp_path / f"wh{n}"))
        assert not (cache / "build" / plain_record["inputs_key"]).exists()  # each build starts from nothing
    (first, first_wheel), (second, second_wheel) = runs
    assert sha256_of(first_wheel) == sha256_of(second_wheel) == sha256_of(plain_wheel)
    assert first_wheel.name == plain_wheel.name
    # three objects: two kernels (nvcc: its CUDA, device-code, PTX and CUBIN stages, one PTX and CUBIN per arch)
    # and api.cpp (the host compiler's C/C++)
    assert first["compile_cache"]["requests"] == second["compile_cache"]["requests"] == 3
    assert first["compile_cache"]["hits"] == {}
    assert first["compile_cache"]["misses"]["PTX"] == first["compile_cache"]["misses"]["CUBIN"] == 2 * 2
    assert second["compile_cache"]["misses"] == {}
    assert second["compile_cache"]["hits"] == first["compile_cache"]["misses"]
    assert second["compile_cache"]["tool"] == "sccache 0.16.0" and second["compile_cache"]["errors"] == 0
    # the record's CPU time counts the compiles the cache's server ran (its children): at least what the same
    # compiles took without the cache (that build's CPU time as this test's RUSAGE_CHILDREN saw it bounds its
    # record's), and no more than this test saw the whole build take
    plain_cpu_s, first_cpu_s = (r["outputs"]["efficiency"]["cpu_s"] for r in (plain_record, first))
    assert plain_cpu_s <= plain_cpu + 0.1 and first_cpu_s <= build_cpu[0] + 0.1
    assert first_cpu_s >= 0.8 * plain_cpu_s, (first_cpu_s, plain_cpu_s, plain_cpu)
    assert any(p.is_file() for p in shared.rglob("*")) and not (cache / "sccache").exists()
    # the launcher word is in every compile ninja ran (the build log), and no server outlives its build
    log = (root / second["log"]).read_text()
    steps = [line.strip() for line in log.splitlines() if line.strip().startswith("[") and " -c " in line]
    assert len(steps) == 3 and all(f"] {sccache_program()} " in step for step in steps), steps
    assert sccache_servers() <= servers_before


@pytest.mark.nvcc
def test_a_line_of_another_python_takes_its_kernels_from_the_first_lines_cache(locked_project, tmp_path):
    """The fixture's line, then a line that differs only in its python (another venv, another inputs key, so
    another build folder): sccache's own counts say the second line's kernels came from the cache, every nvcc
    stage of them (the issue asks for >= 90 % of its kernel objects); only api.cpp, compiled against the other
    python's headers, is compiled. The first line's wheel, compiled in the slot, is the bytes of the same line
    compiled in its own folder without the cache."""
    python = other_python()
    if python is None:
        missing("needs a python of another minor version (python3.12) for a second line", "FA_REQUIRE_PYTHON312")
    root, cache = locked_project, cache_with_sdist(locked_project, tmp_path / "cache")
    minor = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                           text=True, check=True).stdout.strip()
    other = make_stub_torch_env(tmp_path / "venv-other", "2.13.0", "13.0", base=python)
    write_external_spec(root / "envs", "fixture-other", other, "2.13.0", python_minor=minor)
    lock_line(root, "fixture-other")

    first = build(root, tmp_path / "wh1", cache)
    assert first.returncode == 0, first.stderr
    first_record, first_wheel = record_and_wheel(tmp_path / "wh1")
    second = build(root, tmp_path / "wh2", cache, line="fixture-other")
    assert second.returncode == 0, second.stderr
    second_record, second_wheel = record_and_wheel(tmp_path / "wh2", "fixture-other")
    assert second_record["inputs_key"] != first_record["inputs_key"]
    assert f"cp{minor.replace('.', '')}" in second_wheel.name
    assert not (cache / "build" / SLOT).exists()  # each build moved its folder back (and removed it: done)

    cold, warm = first_record["compile_cache"], second_record["compile_cache"]
    assert nvcc_stages(cold, "hits") == 0 and nvcc_stages(cold, "misses") > 0
    # every nvcc stage of the two kernels that the first line compiled is a hit for the second (>= 90 % asked)
    assert nvcc_stages(warm, "hits") == nvcc_stages(cold, "misses") and nvcc_stages(warm, "misses") == 0, warm
    assert warm["misses"] == {"C/C++": 1}, warm  # api.cpp: the other python's include folder
    assert warm["errors"] == 0
    assert f"compiling in {cache / 'build' / SLOT} (the compile slot" in first.stderr

    plain = build(root, tmp_path / "wh0", cache, "--no-compile-cache")  # in its keyed folder, no slot
    assert plain.returncode == 0, plain.stderr
    assert "compile slot" not in plain.stderr
    _, plain_wheel = record_and_wheel(tmp_path / "wh0")
    assert plain_wheel.name == first_wheel.name and sha256_of(plain_wheel) == sha256_of(first_wheel)


@pytest.mark.nvcc
def test_torch_s_nvcc_rule_with_its_dependency_file_is_cached(tmp_path):
    """torch's cuda_compile rule (`--generate-dependencies-with-compile --dependency-output $out.d`) through a
    build's server: sccache takes it (no request passed through as not cacheable), and the second compile of the
    kernel, in the same folder, is a hit in every stage, with its dependency file written again."""
    kernel = Path(__file__).parent / "fixtures" / "fa_fixture" / "csrc" / "scale_kernel.cu"
    (tmp_path / "k.cu").write_bytes(kernel.read_bytes())
    command = [str(NVCC), "--generate-dependencies-with-compile", "--dependency-output", str(tmp_path / "k.o.d"),
               "-gencode", "arch=compute_80,code=sm_80", "-c", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.o")]
    console = Console(file=io.StringIO())
    with serving(CompileCacheConfig(), tmp_path / "cache", dict(os.environ), tmp_path / "log", console) as server:
        assert server is not None
        for _ in range(2):
            (tmp_path / "k.o.d").unlink(missing_ok=True)
            subprocess.run([*server.launcher, *command], env={**os.environ, **server.client_env}, cwd=tmp_path,
                           check=True, capture_output=True)
            assert str(tmp_path / "k.cu") in (tmp_path / "k.o.d").read_text()
        stats = server.statistics()["stats"]
    assert stats["compile_requests"] == 2
    assert stats["requests_not_cacheable"] == stats["requests_unsupported_compiler"] == 0, stats
    assert stats["not_cached"] == {}, stats
    first = stats["cache_misses"]["counts"]
    assert first and all(stats["cache_hits"]["counts"].get(stage) == n for stage, n in first.items()), stats


def test_the_compile_slot_holds_one_folder_and_gives_it_back(tmp_path):
    """A build's folder moves to the slot and back, also on an error; a second holder compiles in place; what a
    killed build left in the slot goes back to its keyed folder, and anything else there is removed."""
    key, other_key = "a" * 64, "b" * 64
    with keyed_build_folder(tmp_path, key, fresh=False, keep=True) as home:
        (home.path / "obj.o").write_bytes(b"object")
        with pytest.raises(KeyboardInterrupt), compile_slot(tmp_path, home) as slotted:
            assert slotted.path == tmp_path / SLOT and slotted.kept_at == tmp_path / key
            assert (tmp_path / SLOT / "obj.o").read_bytes() == b"object" and not (tmp_path / key).exists()
            with keyed_build_folder(tmp_path, other_key, fresh=False, keep=True) as second, \
                    compile_slot(tmp_path, second) as in_place:
                assert in_place.path == tmp_path / other_key and in_place.kept_at == in_place.path
            raise KeyboardInterrupt
        assert (tmp_path / key / "obj.o").read_bytes() == b"object" and not (tmp_path / SLOT).exists()

    # SIGKILL in the slot: the folder lies there with its marker, nobody holds it
    (tmp_path / key).rename(tmp_path / SLOT)
    assert (tmp_path / SLOT / SLOT_MARKER).read_text() == key
    with locked(tmp_path / SLOT):  # a live build's slot is never touched
        assert put_back_slot(tmp_path) is None and (tmp_path / SLOT).is_dir()
    assert put_back_slot(tmp_path) == tmp_path / key
    assert (tmp_path / key / "obj.o").read_bytes() == b"object" and not (tmp_path / SLOT).exists()
    for stranger in ("not-a-key", ""):  # a marker the toolkit did not write, or none: the slot goes
        (tmp_path / SLOT).mkdir()
        if stranger:
            (tmp_path / SLOT / SLOT_MARKER).write_text(stranger)
        assert put_back_slot(tmp_path) is None and not (tmp_path / SLOT).exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted([key, other_key])


def test_the_shim_puts_the_launcher_before_each_compile_and_not_the_link():
    """torch's rules (compile: $cxx, cuda_compile: $nvcc) and a link: srun's words, then sccache's, bound on the
    two compile edges; the link keeps its command; nvcc's seed binding carries the launcher."""
    manifest = "\n".join([
        "nvcc = /cuda/bin/nvcc",
        "cxx = c++",
        "rule compile",
        "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",
        "rule cuda_compile",
        "  command = $nvcc --generate-dependencies-with-compile --dependency-output $out.d $cuda_cflags -c $in -o $out",
        "rule link",
        "  command = $cxx $in -shared -o $out",
        "build /b/build/api.o: compile /b/csrc/api.cpp",
        "build /b/build/k.o: cuda_compile /b/csrc/k.cu",
        "build /b/out.so: link /b/build/api.o /b/build/k.o",
        "",
    ])
    plan = ManifestPlan("/b", {}, launcher=["srun", "--ntasks=1", "/opt/venv/bin/sccache"])
    text, seeded, _, _ = prepared_manifest(manifest, plan)
    assert seeded == 1
    lines = text.split("\n")
    assert lines[lines.index("build /b/build/api.o: compile /b/csrc/api.cpp") + 1] == \
        "  cxx = srun --ntasks=1 /opt/venv/bin/sccache $cxx"
    alias = "/fa-envkit-build/csrc/k.cu"
    assert lines[lines.index("build /b/build/k.o: cuda_compile /b/csrc/k.cu") + 1] == (
        f"  nvcc = srun --ntasks=1 /opt/venv/bin/sccache $nvcc -frandom-seed={alias} -Xcudafe "
        f"--orig_src_path_name={alias} -Xcicc --orig_src_path_name={alias}")
    link = lines.index("build /b/out.so: link /b/build/api.o /b/build/k.o")
    assert lines[link + 1] == ""
    # without launcher words, the manifest is what the shim made before the compile cache
    bare, _, _, _ = prepared_manifest(manifest, ManifestPlan("/b", {}))
    assert "sccache" not in bare and "  cxx =" not in bare


def test_the_site_file_names_sccache_variables_and_nothing_else(tmp_path):
    """A shared folder, a remote store, off; and each malformed file refused in one line naming it."""
    site = tmp_path / "compile-cache.toml"
    assert read_config(site) == CompileCacheConfig()  # no file: on, in the toolkit's folder
    assert storage(CompileCacheConfig(), tmp_path / "c") == ({"SCCACHE_DIR": str(tmp_path / "c" / "sccache")},
                                                             tmp_path / "c" / "sccache")
    site.write_text('enabled = true\n[sccache]\nSCCACHE_DIR = "/shared/sccache"\nSCCACHE_CACHE_SIZE = "200G"\n')
    shared = read_config(site)
    assert shared.variables == {"SCCACHE_DIR": "/shared/sccache", "SCCACHE_CACHE_SIZE": "200G"}
    assert storage(shared, tmp_path)[1] == Path("/shared/sccache")
    site.write_text('[sccache]\nSCCACHE_BUCKET = "fa-objects"\nSCCACHE_REGION = "eu-west-1"\n')
    assert storage(read_config(site), tmp_path) == ({"SCCACHE_BUCKET": "fa-objects", "SCCACHE_REGION": "eu-west-1"},
                                                    None)  # a remote store: no folder to hold
    site.write_text("enabled = false\n")
    assert not read_config(site).enabled
    for text, says in [
        ("enabled = 'yes'\n", "expected `enabled = true|false` and an [sccache] table"),
        ("[sccache]\nSCCACHE_SERVER_UDS = '/tmp/x'\n", "[sccache] 'SCCACHE_SERVER_UDS' is not one of sccache's"),
        ("[sccache]\nLD_PRELOAD = '/tmp/x.so'\n", "[sccache] 'LD_PRELOAD' is not one of sccache's variables"),
        ("[sccache]\nSCCACHE_DIR = 3\n", "[sccache] SCCACHE_DIR takes a string"),
        ("sccache = 'x'\n", "[sccache] is a table of sccache's variables"),
        ("[sccache\n", "not TOML"),
    ]:
        site.write_text(text)
        with pytest.raises(ToolkitError) as refused:
            read_config(site)
        assert str(refused.value).startswith(f"{site}: ") and says in str(refused.value), str(refused.value)
        assert "\n" not in str(refused.value)
    os.mkfifo(tmp_path / "fifo.toml")
    with pytest.raises(ToolkitError, match="unreadable compile-cache configuration"):
        read_config(tmp_path / "fifo.toml")
