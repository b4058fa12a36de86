"""The compile cache every build compiles through (issue 33, item 3): sccache, a server per build.

The end-to-end test builds tests/fixtures/fa_fixture with the real nvcc (tests/cuda_toolchain.py) without the cache,
then twice with it: the wheel's sha256 (hashlib) is the same all three times, the second build with the cache takes
every compile from it (sccache's own counts, in the record), and nothing of the servers runs on. The pieces (the
shim's launcher words, the site's file) are checked against text written out here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from test_build_resume import cache_with_sdist, locked_project, sha256_of  # noqa: F401 (a fixture)

from toolkit.base.errors import ToolkitError
from toolkit.build.compile_cache import CompileCacheConfig, read_config, sccache_program, storage
from toolkit.build.ninja_shim import ManifestPlan, prepared_manifest

pytestmark = pytest.mark.slow


def build(root: Path, wheelhouse: Path, cache: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", "build", "fixture", "--no-install", "--wheelhouse",
                           str(wheelhouse), *extra], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "TOOLKIT_CACHE": str(cache), **env})


def record_and_wheel(wheelhouse: Path) -> tuple[dict, Path]:
    (record,) = (wheelhouse / "fixture").glob("*.build.json")
    (wheel,) = (wheelhouse / "fixture").glob("*.whl")
    return json.loads(record.read_text()), wheel


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
    plain = build(root, tmp_path / "wh0", cache, "--no-compile-cache")
    assert plain.returncode == 0, plain.stderr
    plain_record, plain_wheel = record_and_wheel(tmp_path / "wh0")
    assert plain_record["compile_cache"] is None and "compile cache: off (--no-compile-cache)" in plain.stderr

    shared = tmp_path / "shared" / "sccache"  # a site's folder on a shared filesystem, named by its file
    site = tmp_path / "compile-cache.toml"
    site.write_text(f'[sccache]\nSCCACHE_DIR = "{shared}"\n')
    runs = []
    for n in (1, 2):
        done = build(root, tmp_path / f"wh{n}", cache, FA_ENVKIT_COMPILE_CACHE=str(site))
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
    assert any(p.is_file() for p in shared.rglob("*")) and not (cache / "sccache").exists()
    # the launcher word is in every compile ninja ran (the build log), and no server outlives its build
    log = (root / second["log"]).read_text()
    steps = [line.strip() for line in log.splitlines() if line.strip().startswith("[") and " -c " in line]
    assert len(steps) == 3 and all(f"] {sccache_program()} " in step for step in steps), steps
    assert sccache_servers() <= servers_before


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
