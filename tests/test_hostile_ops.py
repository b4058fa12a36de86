"""Hostile inputs for the operations side: `matrix run` scripts, `toolkit explain` logs, `doctor` probes.

Injection: every value `toolkit matrix run` writes into a batch script is either refused in one line
(site options: --account, --partition, --time, --gres, --sbatch, ...) or arrives as one shell word
(paths: the spec file, the interpreter). The scripts run here with the local executor, i.e. real bash
(what sbatch runs on a node is the same file), so an injected command would really run and leave its
marker file. Slurm itself is not needed: `#SBATCH` lines are bash comments, which is exactly why a
newline in one of them becomes a command.

Logs: `toolkit explain` (and a failed build, which runs the same code) must finish in time linear in
the log and bounded in memory, whatever the log is: one 80 KB line, a 50 MB line, a sparse multi-GB
file, binary bytes with NULs and invalid UTF-8, a FIFO, a directory. Each ends in one line.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from toolkit.base.errors import ToolkitError
from toolkit.build.record import BuildRecord
from toolkit.cli import main
from toolkit.site.scaleout import RunOptions, plan_matrix, write_run_dir
from toolkit.spec.rules import checked_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "tests" / "fixtures" / "matrix_stage.py"
FIXTURE_LINE = "extends: cu126\nbuild:\n  jobs: 1\n  nvcc_threads: 1\n  gb_per_nvcc_thread: 0.5\n"
MARKER = "INJECTED"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project with the repo's envs/ plus fixture line fx1 and a one-stage build (the fixture stage)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "envs", tmp_path / "envs")
    (tmp_path / "envs" / "fx1.yaml").write_text(FIXTURE_LINE)
    (tmp_path / "stages.yaml").write_text(f'build:\n  build: "{sys.executable} {STAGE} build {{line}}"\n')
    return tmp_path


def hostile_values(marker: Path) -> dict[str, str]:
    """Ways a value could turn into shell code or extra shell words in a batch script."""
    return {
        "newline": f"ml\ntouch {marker}",
        "carriage-return-newline": f"ml\r\ntouch {marker}",
        "command-substitution": f"$(touch {marker})",
        "backticks": f"`touch {marker}`",
        "semicolon": f"ml;touch {marker}",
        "single-quote": "ml'x",
        "double-quote": 'ml"x',
        "space": "ml x",
        "empty-after-newline": "ml\n",
    }


SITE_FLAGS = ("account", "partition", "verify-partition", "time", "verify-time", "gres")
HOSTILE_KINDS = tuple(hostile_values(Path("m")))


def run_matrix(*args: str) -> int:
    return main(["matrix", "run", "fx1", "--executor", "local", "--verify", "never", "--stages", "stages.yaml",
                 *args])


def assert_refused_in_one_line(project: Path, capsys, code: int, flag: str) -> None:
    err = capsys.readouterr().err
    assert code == 1, f"accepted: {err}"
    assert err.count("\n") == 1 and flag in err and "Traceback" not in err, err
    assert not (project / MARKER).exists(), "the injected command ran"
    assert not (project / "runs").exists(), "a refused run left a run directory behind"


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
@pytest.mark.parametrize("flag", SITE_FLAGS)
def test_hostile_site_option_is_refused_before_any_script(project, capsys, flag, kind):
    value = hostile_values(project / MARKER)[kind]
    code = run_matrix(f"--{flag}={value}")
    assert_refused_in_one_line(project, capsys, code, f"--{flag}")


@pytest.mark.parametrize("option", [
    f"--qos=long\ntouch {MARKER}", f"--qos=$(touch {MARKER})", f"--qos=`touch {MARKER}`", f"--qos=a;touch {MARKER}",
    "--qos='long'", '--qos="long"', "--qos=a b", "qos=long", "-q long", "-qlong", "--", "--=x", "--QOS=long",
    "--wrap=touch INJECTED", "--array=0-9", "--chdir=/", "--output=/tmp/x", "--dependency=afterok:1",
    "--partition=gpu", "--qos=long\\",
])
def test_hostile_sbatch_option_is_refused(project, capsys, option):
    code = run_matrix(f"--sbatch={option}")
    assert_refused_in_one_line(project, capsys, code, "--sbatch")


def test_real_site_options_are_written_as_sbatch_lines(project):
    """What sites really pass is accepted, one `#SBATCH` line each, and the scripts parse."""
    options = RunOptions(stages=project / "stages.yaml", partition="cpu,cpu-long", verify_partition="gpu_a100",
                         account="proj-ml.2026", time="1-02:00:00", verify_time="90", gres="gpu:a100:2",
                         sbatch=("--qos=long", "--exclusive", "--constraint=a100|h100", "--mail-type=END,FAIL",
                                 "--mail-user=ops@example.org", "--export=ALL,OMP_NUM_THREADS=1"))
    plan = plan_matrix([checked_spec(project / "envs" / "fx1.yaml")], options, "gpu:a100:2", "toolkit matrix run fx1")
    write_run_dir(plan)
    build, verify = plan.build_script.read_text(), plan.verify_script("fx1").read_text()
    for option in ("--partition=cpu,cpu-long", "--account=proj-ml.2026", "--time=1-02:00:00", "--qos=long",
                   "--exclusive", "--constraint=a100|h100", "--export=ALL,OMP_NUM_THREADS=1"):
        assert f"#SBATCH {option}\n" in build
    for option in ("--partition=gpu_a100", "--time=90", "--gres=gpu:a100:2", "--mail-type=END,FAIL"):
        assert f"#SBATCH {option}\n" in verify
    for script in (plan.build_script, plan.verify_script("fx1"), plan.run_dir / "submit.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("value", ["2:00:00", "30", "30:00", "1-0", "1-02", "1-02:30", "UNLIMITED", "infinite"])
def test_slurm_time_formats_are_accepted(value):
    assert RunOptions(time=value).time == value


@pytest.mark.parametrize("value", ["2h", "-1", "1:2:3:4", "1--2", ":30", "now"])
def test_non_slurm_time_formats_are_refused(value):
    with pytest.raises(ToolkitError, match="--time"):
        RunOptions(time=value)


def odd_dir_name() -> str:
    """A legal directory name that is hostile as shell text: spaces, $( ), backticks, ;, both quotes
    (the marker is relative: the stages run in the project directory)."""
    return f"my envs $(touch {MARKER}) `touch {MARKER}` ; it's \"quoted\""


def test_odd_envs_path_reaches_the_stage_command_as_one_word(project, capsys):
    """--envs with spaces, $(...), backticks, ; and quotes: the run works, {spec} is that file, nothing ran."""
    odd = project / odd_dir_name()
    shutil.copytree(project / "envs", odd)
    (project / "stages.yaml").write_text(
        f'build:\n  build: "{sys.executable} {STAGE} build {{line}}"\n  spec: "cp {{spec}} seen-spec.yaml"\n')
    code = run_matrix(f"--envs={odd}", "--json")
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["ok"], summary
    assert (project / "seen-spec.yaml").read_text() == FIXTURE_LINE
    assert not (project / MARKER).exists(), "a path became shell code"
    run_dir = Path(summary["run_dir"])
    for script in (run_dir / "build.sbatch", run_dir / "submit.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_default_stages_take_an_odd_spec_path_as_one_word(project, capsys):
    """The shipped stage commands, run by bash: `lock --check` of a current lock under an odd envs path."""
    odd = project / odd_dir_name()
    odd.mkdir()
    for name in ("base", "cu130", "gpu-machine"):  # gpu-machine: the line whose lock is committed
        shutil.copy(ROOT / "envs" / f"{name}.yaml", odd / f"{name}.yaml")
    shutil.copytree(ROOT / "locks", project / "locks")
    plan = plan_matrix([checked_spec(odd / "gpu-machine.yaml")], RunOptions(), None, "toolkit matrix run")
    (lock_stage,) = [s for s in plan.lines[0].build_stages if s.name == "lock"]
    done = subprocess.run(["bash", "-o", "pipefail", "-c", lock_stage.command], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "current" in done.stdout + done.stderr, done.stdout + done.stderr
    assert not (project / MARKER).exists()


@pytest.mark.parametrize("where", ["envs", "stages"])
def test_a_newline_in_a_path_is_refused_not_written_into_a_comment(project, capsys, where):
    """The scripts' `# Written by:` comment carries the command line: a newline there would be a command."""
    odd = project / f"x\ntouch {MARKER}\n"
    if where == "envs":
        shutil.copytree(project / "envs", odd)
        code = run_matrix(f"--envs={odd}")
    else:
        odd.mkdir()
        shutil.copy(project / "stages.yaml", odd / "stages.yaml")
        code = run_matrix(f"--stages={odd / 'stages.yaml'}")
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "control character" in err, err
    assert not (project / MARKER).exists() and not (project / "runs").exists()


@pytest.mark.parametrize("kind, says", [("fifo", "not a regular file (a FIFO"), ("large", "larger than 64 KiB")])
def test_a_stages_file_that_is_a_fifo_or_huge_is_refused_in_one_line(project, kind, says):
    """--stages goes through the bounded reader: a FIFO never blocks the run, a huge file is never read whole."""
    stages = project / "odd-stages.yaml"
    if kind == "fifo":
        os.mkfifo(stages)
    else:
        stages.write_text("build:\n  build: \"true\"\n" + "# padding\n" * 8000)
    done = subprocess.run([sys.executable, "-m", "toolkit", "matrix", "run", "fx1", "--executor", "local",
                           "--stages", str(stages)], cwd=project, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert done.stderr.startswith("error: odd-stages.yaml: ") and not (project / "runs").exists()


# ---------------------------------------------------------------- logs for `toolkit explain`

OOM_LINE = b"nvcc error   : 'cicc' died due to signal 9 (Kill signal)"


def explain(log: Path, *args: str, runner: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`toolkit explain LOG` in its own process (run by `runner`, if given), with a generous limit (a hang
    fails, not blocks)."""
    started = time.monotonic()
    done = subprocess.run([*runner, sys.executable, "-m", "toolkit", "explain", str(log), *args],
                          capture_output=True, text=True, timeout=60)
    size = log.stat().st_size if log.is_file() else 0
    print(f"toolkit explain {log.name} ({size / 1e6:.1f} MB): {time.monotonic() - started:.2f} s")
    return done


def assert_one_line(done: subprocess.CompletedProcess) -> str:
    out = done.stdout if done.returncode == 0 else done.stderr
    assert "Traceback" not in done.stderr and len(out.splitlines()) == 1 and out.endswith("\n"), out[:500]
    return out


@pytest.mark.parametrize("size", [80_000, 50_000_000])
@pytest.mark.parametrize("filler", [b"a", b" ", b"/", b"'"])
def test_one_huge_line_is_explained_in_bounded_time(tmp_path, size, filler):
    """One line of word characters made the first-error regex quadratic (19 s for 80 KB); the others probe
    the catalog patterns' own repeats. The cause at the line's end is still found."""
    log = tmp_path / "one-line.log"
    log.write_bytes(filler * size + b" " + OOM_LINE)
    done = explain(log)
    assert done.returncode == 0 and "killed for memory" in assert_one_line(done)
    log.write_bytes(filler * size + b" make: Error 1")
    done = explain(log)
    assert done.returncode == 1 and "no known failure matched" in assert_one_line(done)


def test_a_sparse_multi_gigabyte_log_reads_only_its_end(tmp_path):
    log = tmp_path / "huge.log"
    with open(log, "wb") as f:
        f.truncate(3 * 2**30)  # 3 GiB of NUL bytes, no newline, without using the disk
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + OOM_LINE + b"\n")
    done = explain(log)
    assert done.returncode == 0 and "killed for memory" in assert_one_line(done)


def binary_noise(n: int, seed: int) -> bytes:
    """Random bytes: NULs, invalid UTF-8, lone surrogates' encodings, \\r, form feeds, newlines."""
    return random.Random(seed).randbytes(n)


def test_binary_log_with_a_cause_gives_the_cause_and_its_line(tmp_path):
    head, tail = binary_noise(3_000_000, 1), binary_noise(1_000_000, 2)
    log = tmp_path / "binary.log"
    log.write_bytes(head + b"\n" + OOM_LINE + b"\n" + tail)
    done = explain(log)
    out = assert_one_line(done)
    assert done.returncode == 0 and "killed for memory" in out
    line = head.count(b"\n") + 2
    assert f"log line {line}" in out


@pytest.mark.parametrize("seed", range(3))
def test_binary_log_without_a_cause_is_one_line(tmp_path, seed):
    log = tmp_path / "binary.log"
    log.write_bytes(binary_noise(2_000_000, seed) + b"\x00\xff error: \x1b[31m\x0b\x0c\r\xe2\x80\xa8 bad\n")
    done = explain(log)
    assert done.returncode == 1 and "no known failure matched" in assert_one_line(done)


def test_a_cause_deep_in_a_long_log_keeps_its_line_number(tmp_path):
    noise = b"[1/2] compiling something that works\n" * 600_000  # 22 MB before the cause
    log = tmp_path / "long.log"
    log.write_bytes(noise + OOM_LINE + b"\n" + b"ninja: build stopped\n")
    done = explain(log)
    assert done.returncode == 0 and "log line 600001" in assert_one_line(done)


@pytest.mark.parametrize("name", ["build\nlog.txt", "build\x1b[2J.log", "build\rlog"])
def test_a_log_whose_name_has_control_characters_is_reported_in_one_line(tmp_path, name):
    log = tmp_path / name
    log.write_bytes(OOM_LINE + b"\n")
    done = explain(log)
    assert done.returncode == 0 and "killed for memory" in assert_one_line(done) and "\x1b" not in done.stdout


# root reads any file whatever its mode (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), and CI runs as root: there
# the toolkit runs as root without those two capabilities, as an unprivileged user would (a user switch,
# `setpriv --reuid=nobody`, would also lose the python under /root/.pyenv or the checkout's folder)
WITHOUT_READ_OVERRIDE = ("setpriv", "--bounding-set=-dac_override,-dac_read_search",
                         "--inh-caps=-dac_override,-dac_read_search")


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "missing", "unreadable"])
def test_not_a_log_file_is_one_line(tmp_path, kind):
    path = tmp_path / "x.log"
    runner: tuple[str, ...] = ()
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes: reading it would wait forever
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path = Path("/dev/zero")  # endless
    elif kind == "unreadable":
        path.write_text("error\n")
        path.chmod(0)
        runner = WITHOUT_READ_OVERRIDE if os.geteuid() == 0 else ()
        assert subprocess.run([*runner, "test", "-r", str(path)]).returncode == 1  # it really cannot read it
    done = explain(path, runner=runner)
    assert done.returncode == 1 and str(path.name) in assert_one_line(done)


# ---------------------------------------------------------------- doctor and build: what tools print

GARBAGE_VERSIONS = {
    "garbage": "garbage",
    "empty": "",
    "banner-only": "ccache wrapper v2 (c) 2026",
    "suffix": "13.3.0 (Ubuntu)",
    "nul-bytes": "\\0\\377\\376",
    "dots": "...",
    "negative": "-13.3.0",
}


def fake_tool(folder: Path, name: str, output: str) -> Path:
    """An executable that prints `output` for any arguments, as a compiler wrapper or a broken tool does."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\nprintf '%b\\n' '{output}'\n")
    tool.chmod(0o755)
    return tool


@pytest.mark.parametrize("output, form, version", [
    ("13.3.0\n", "DOTTED", "13.3.0"), ("ccache wrapper v2\n13.3.0\n", "DOTTED", "13.3.0"),
    ("1.13.2.git.kitware.jobserver-pipe-1\n", "TOOL", "1.13.2.git.kitware.jobserver-pipe-1"),
    ("3.14.0rc1\n", "PYTHON", "3.14.0rc1"), ("3.13.0a1+\n", "PYTHON", "3.13.0a1+"), ("3.12.3", "PYTHON", "3.12.3"),
    ("13abc\n", "DOTTED", None), ("13.3.0 (Ubuntu)", "DOTTED", None), ("3", "PYTHON", None), (None, "TOOL", None),
])
def test_real_version_outputs_are_kept_and_others_are_none(output, form, version):
    from toolkit.machine import fingerprint

    assert fingerprint.parse_version_output(output, getattr(fingerprint, form)) == version


@pytest.mark.parametrize("kind", GARBAGE_VERSIONS)
def test_gxx_printing_no_version_is_a_doctor_row(tmp_path, kind):
    fake_tool(tmp_path / "bin", "g++", GARBAGE_VERSIONS[kind])
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CUDA_HOME": "/usr/local/cuda"}
    done = subprocess.run([sys.executable, "-m", "toolkit", "doctor", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr[-2000:]
    (gcc,) = [r for r in json.loads(done.stdout)["rows"] if r["check"] == "gcc"]
    assert gcc["status"] == "fail" and "prints no version" in gcc["value"] and gcc["fix"], gcc


@pytest.mark.parametrize("kind", GARBAGE_VERSIONS)
def test_gxx_printing_no_version_stops_the_build_in_one_line(tmp_path, kind):
    """What `toolkit build` does before compiling: fingerprint, then preflight (ValueError here before)."""
    from toolkit.machine.fingerprint import probe
    from toolkit.machine.preflight import preflight_input, run_preflight

    gxx = fake_tool(tmp_path / "bin", "g++", GARBAGE_VERSIONS[kind])
    spec = checked_spec(ROOT / "envs" / "cu130.yaml")
    fp = probe("/usr/local/cuda", sys.executable, cxx=str(gxx))
    assert fp.gcc_version is None
    with pytest.raises(ToolkitError) as caught:
        run_preflight(preflight_input(spec, fp, spec.archs, 64.0, tmp_path))
    assert str(gxx) in str(caught.value)


GOOD_GPU_ROW = "1, NVIDIA A100-SXM4-80GB, 8.0, 580.65.06"
GOOD_GPU = {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}


@pytest.mark.parametrize("output, gpus", [
    ("garbage", []), ("0, NVIDIA H200", []), ("x, NVIDIA H200, 9.0, 580.65.06", []),
    ("0, NVIDIA H200, garbage, 580.65.06", []), ("0, NVIDIA H200, 9.0, garbage", []), (", , , ", []),
    # a column after the four queried ones (a later nvidia-smi) is ignored, the row kept
    ("0, NVIDIA H200, 9.0, 580.65.06, extra", [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"}]),
])
def test_nvidia_smi_printing_garbage_is_no_gpu_not_a_crash(tmp_path, output, gpus):
    """The garbage row is left out and the well-formed row after it kept (so the fake nvidia-smi is the one
    doctor ran, and leaving out every row would fail too)."""
    fake_tool(tmp_path / "bin", "nvidia-smi", f"{output}\\n{GOOD_GPU_ROW}")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CUDA_HOME": "/usr/local/cuda"}
    done = subprocess.run([sys.executable, "-m", "toolkit", "doctor", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr[-2000:]
    assert json.loads(done.stdout)["fingerprint"]["gpus"] == [*gpus, GOOD_GPU]


def torch_version_py(folder: Path, version: str, cuda: str) -> Path:
    """A python whose torch/version.py says what a damaged or hand-edited install might."""
    site = folder / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text(f"__version__ = {version!r}\ncuda = {cuda!r}\n")
    python = folder / "bin" / "python3"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("version, cuda", [("garbage", "13.0"), ("2.13.0+cu130", "garbage"), ("2.13.0", "13"),
                                           ("", ""), ("2.13.0+cu130", "13.0.x")])
def test_a_damaged_torch_version_file_is_rows_not_a_crash(tmp_path, capsys, version, cuda):
    """doctor's rows and the build's preflight over a torch whose version.py holds no real version."""
    from toolkit.machine.fingerprint import probe
    from toolkit.machine.preflight import preflight_input, problems

    python = torch_version_py(tmp_path, version, cuda)
    fp = probe("/usr/local/cuda", str(python))
    assert fp.torch is not None
    spec = checked_spec(ROOT / "envs" / "cu130.yaml")
    problems(preflight_input(spec, fp, spec.archs, 64.0, tmp_path))  # no exception
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"fingerprint": fp.to_dict(), "probe": {"cuda_home_from": "CUDA_HOME"},
                                  "line": "cu130"}))
    code = main(["doctor", "--fingerprint", str(report), "--envs", str(ROOT / "envs"), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in err and json.loads(out)["rows"]


@pytest.mark.parametrize("edit", [{"gcc_version": "garbage"}, {"driver_version": "x.y"}, {"torch": "x"},
                                  {"torch": {"version": 5, "cuda": ["13.0"], "cxx11_abi": True, "path": "/t"}},
                                  {"gpus": [{"index": 0, "name": "x", "compute_capability": "garbage"}]},
                                  {"nvcc_version": {"a": 1}}])
def test_a_hand_edited_build_record_is_a_row_not_a_crash(tmp_path, monkeypatch, capsys, edit):
    recorded = ROOT / "tests" / "fingerprints" / "healthy-h200.json"
    monkeypatch.chdir(tmp_path)
    fingerprint = {**json.loads(recorded.read_text())["fingerprint"], **edit}
    wheel = "flash_attn-2.8.3.post2+cu130torch2.11-cp312-cp312-linux_x86_64.whl"
    real = BuildRecord.read(ROOT / "docs/results/2026-11-29-h200-seeded-build/build-record.json")
    record = replace(real, fingerprint=fingerprint,
                     outputs=replace(real.outputs, wheel=wheel, version="2.8.3.post2+cu130torch2.11"))
    (tmp_path / "wheelhouse" / "gpu-machine").mkdir(parents=True)
    (tmp_path / "wheelhouse" / "gpu-machine" / f"{wheel}.build.json").write_text(record.text())
    code = main(["doctor", "--fingerprint", str(recorded), "--envs", str(ROOT / "envs"), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in err
    assert [r for r in json.loads(out)["rows"] if r["check"] == "record-toolchain"]
