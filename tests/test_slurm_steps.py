"""`toolkit build --slurm`'s pieces without a cluster: the allocation read from Slurm's variables, the jobs it
holds, the shared-filesystem check, and the launcher words the ninja shim puts before each compile (the real
srun steps: tests/test_build.py's --slurm build)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from toolkit.base.errors import ToolkitError
from toolkit.build.ninja_shim import ManifestPlan, prepared_manifest
from toolkit.build.slurm_steps import Allocation, shared_filesystem_problem, srun_words

SRUN_ENV = {"SLURM_JOB_ID": "42"}


@pytest.fixture
def srun_on_path(tmp_path, monkeypatch):
    """An srun on PATH for Allocation's check (never run here)."""
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 99\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_allocation_reads_slurms_cpus_per_node_spelling(srun_on_path):
    found = Allocation.from_environment(
        {**SRUN_ENV, "SLURM_JOB_CPUS_PER_NODE": "72(x2),36", "SLURM_MEM_PER_NODE": "64000"})
    assert found.cpus_per_node == (72, 72, 36) and found.nodes == 3
    assert found.mem_per_node_mb == (64000, 64000, 64000)
    per_cpu = Allocation.from_environment({**SRUN_ENV, "SLURM_JOB_CPUS_PER_NODE": "16,8", "SLURM_MEM_PER_CPU": "1000"})
    assert per_cpu.mem_per_node_mb == (16000, 8000)


def test_jobs_are_what_each_node_holds_by_cpus_and_memory(srun_on_path):
    by_cpus = Allocation("1", (72, 72, 36), None)
    assert by_cpus.jobs(threads=2, step_mem_mb=9216) == 36 + 36 + 18
    by_mem = Allocation("1", (72, 72, 36), (64000, 64000, 64000))
    assert by_mem.jobs(threads=2, step_mem_mb=9216) == 6 + 6 + 6  # 64000 // 9216 per node


@pytest.mark.parametrize("environ, words", [
    ({}, "not inside a Slurm allocation (no SLURM_JOB_ID)"),
    ({**SRUN_ENV, "SLURM_JOB_CPUS_PER_NODE": "lots"}, "SLURM_JOB_CPUS_PER_NODE='lots'"),
    ({**SRUN_ENV, "SLURM_JOB_CPUS_PER_NODE": "4", "SLURM_MEM_PER_NODE": "4G"}, "SLURM_MEM_PER_NODE='4G'"),
])
def test_outside_an_allocation_or_with_odd_variables_one_line(srun_on_path, environ, words):
    with pytest.raises(ToolkitError) as refused:
        Allocation.from_environment(environ)
    assert words in str(refused.value) and "\n" not in str(refused.value)


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid 0 0
fs01:/export/home /shared\\040home nfs4 rw,vers=4.2 0 0
lustre@tcp:/scratch /scratch lustre rw 0 0
"""


def test_a_build_folder_the_other_nodes_cannot_see_is_refused():
    two = Allocation("7", (16, 16), None)
    problem = shared_filesystem_problem(two, {"the build folder": Path("/tmp/cache/build/k")}, MOUNTS)
    assert problem is not None and "the build folder /tmp/cache/build/k is on /tmp (tmpfs)" in problem
    assert "other 1 node(s)" in problem and "TOOLKIT_CACHE" in problem
    assert shared_filesystem_problem(two, {"the CUDA toolkit": Path("/opt/cuda")}, MOUNTS) is not None  # ext4 /
    shared = {"the build folder": Path("/shared home/u/build"), "the CUDA toolkit": Path("/scratch/cuda")}
    assert shared_filesystem_problem(two, shared, MOUNTS) is None  # nfs4 (a \\040 in the mount table), lustre
    one = Allocation("7", (16,), None)
    assert shared_filesystem_problem(one, {"the build folder": Path("/tmp/x")}, MOUNTS) is None


TORCH_MANIFEST = """\
ninja_required_version = 1.3
cxx = c++
nvcc = /usr/local/cuda/bin/nvcc

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
  depfile = $out.d
  deps = gcc

rule cuda_compile
  depfile = $out.d
  deps = gcc
  command = $nvcc --generate-dependencies-with-compile --dependency-output $out.d $cuda_cflags -c $in -o $out

rule link
  command = $cxx $in -shared -o $out

build /b/build/temp/flash_api.o: compile /b/csrc/flash_api.cpp
build /b/build/temp/fwd.o: cuda_compile /b/csrc/fwd.cu
build /b/build/lib/fa.so: link /b/build/temp/flash_api.o /b/build/temp/fwd.o
"""


def test_the_launcher_goes_before_every_compile_and_not_the_link(tmp_path):
    """The real ninja (-n -v: prints each command without running it) on a torch-shaped manifest the shim
    prepared with srun's words and a cache's after them: both compiles start with them, in that order, the
    link does not, and the CUDA compile keeps its seed."""
    ninja = shutil.which("ninja")
    assert ninja is not None, "ninja is a test dependency (pyproject's test extra)"
    for source in ("flash_api.cpp", "fwd.cu"):
        (tmp_path / "b" / "csrc").mkdir(parents=True, exist_ok=True)
        (tmp_path / "b" / "csrc" / source).write_text("")
    b = str(tmp_path / "b")
    launcher = [*srun_words(2, 9216, Path("/b/step tmp")), "sccache"]
    manifest = TORCH_MANIFEST.replace("/b/", f"{b}/")
    text, seeded, _, _ = prepared_manifest(manifest, ManifestPlan(b, {}, launcher=launcher))
    assert seeded == 1
    (tmp_path / "build.ninja").write_text(text)
    shown = subprocess.run([ninja, "-n", "-v", "-C", str(tmp_path)], capture_output=True, text=True, check=True)
    commands = {Path(words[words.index("-o") + 1]).relative_to(b).as_posix(): words
                for line in shown.stdout.splitlines() if line.startswith("[")
                for words in [shlex.split(line.split("] ", 1)[1])]}
    srun_part = ["srun", "--exclusive", "--export=ALL", "--quiet", "--job-name=fa-compile", "-N1", "-n1", "-c2",
                 "--mem=9216M", "env", "TMPDIR=/b/step tmp", "sccache"]
    assert commands["build/temp/flash_api.o"][:13] == [*srun_part, "c++"]
    cuda = commands["build/temp/fwd.o"]
    assert cuda[:13] == [*srun_part, "/usr/local/cuda/bin/nvcc"]
    assert "-frandom-seed=/fa-envkit-build/csrc/fwd.cu" in cuda
    assert commands["build/lib/fa.so"][0] == "c++"


def test_without_a_launcher_the_manifest_is_as_before():
    """No launcher: the C++ compile is untouched and only the CUDA edge gains its seed binding."""
    text, seeded, _, _ = prepared_manifest(TORCH_MANIFEST, ManifestPlan("/b", {}))
    added = [line for line in text.splitlines() if line not in TORCH_MANIFEST.splitlines()]
    assert seeded == 1 and len(added) == 1 and added[0].startswith("  nvcc = $nvcc -frandom-seed=")
