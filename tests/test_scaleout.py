"""`toolkit matrix run` / `--github`: plans, batch scripts, the local executor and real Slurm.

The machinery tests run stand-in stage commands (tests/fixtures/matrix_stage.py: seconds, not the
hour a real flash-attn build takes) through the real batch scripts, real bash, real flock and a real
single-node Slurm cluster (tests/slurm_cluster.sh, started by .ci/run). The end-to-end test at the
bottom runs the real lock/install/build/verify verbs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import locked
from toolkit.cli import main
from toolkit.site.scaleout import (
    HEADROOM_GB,
    LINE_LOCKS,
    RunOptions,
    build_sizing,
    load_stage_templates,
    plan_matrix,
    write_run_dir,
)
from toolkit.spec.envspec import spec_paths
from toolkit.spec.rules import checked_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "tests" / "fixtures" / "matrix_stage.py"
FIXTURE_LINE = "extends: cu126\nbuild:\n  jobs: 1\n  nvcc_threads: 1\n  gb_per_nvcc_thread: 0.5\n"
SMALL_VERIFY = ["--verify-cpus", "1", "--verify-mem-gb", "0.5"]  # the test node has 2 cpus


STAGES = """\
build:
  build: "@STAGE build {line} --sleep 0.5 --fail-line '@FAIL'"
  quoting: |-
    printf '%s\\n' "it's \\"{line}\\" $((6*7))" >> quoted.txt
verify:
  verify: "@STAGE verify {line} --fail-line '@FAIL'"
"""


def stages_yaml(fail_line: str) -> str:
    """Stage commands for the fixture stage; the second build stage checks that quoting survives the scripts."""
    return STAGES.replace("@STAGE", f"{sys.executable} {STAGE}").replace("@FAIL", fail_line)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project directory: the repo's envs/ plus fixture lines fx1..fx3 (1 build job, 0.5 GB per thread)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "envs", tmp_path / "envs")
    for line in ("fx1", "fx2", "fx3"):
        (tmp_path / "envs" / f"{line}.yaml").write_text(FIXTURE_LINE)
    (tmp_path / "stages.yaml").write_text(stages_yaml(fail_line="fx2"))
    return tmp_path


def stage_rows(project: Path) -> list[tuple[str, str, float, float, int]]:
    """What the fixture stage recorded, in order: (stage, line, start, end, exit code)."""
    rows = [line.split() for line in (project / "stages.log").read_text().splitlines()]
    return [(stage, line, float(start), float(end), int(code)) for stage, line, start, end, code in rows]


def stage_log(project: Path) -> dict[tuple[str, str], tuple[float, float, int]]:
    return {(stage, line): (start, end, code) for stage, line, start, end, code in stage_rows(project)}


def summary_of(project: Path) -> dict:
    (run_dir,) = sorted((project / "runs").iterdir())[-1:]
    return json.loads((run_dir / "summary.json").read_text())


def assert_failed_line_reported_alone(project: Path, summary: dict) -> None:
    """fx2's build fails on purpose; fx1 and fx3 build and verify; the summary says exactly that."""
    truth = stage_log(project)
    lines = {row["line"]: row for row in summary["lines"]}
    assert summary["ok"] is False
    for line in ("fx1", "fx3"):
        (record_file,) = (project / "wheelhouse" / line).glob("*.whl.build.json")
        assert lines[line]["build"] == "done" and lines[line]["verify"] == "done" and lines[line]["ok"]
        assert lines[line]["wheel"] == record_file.name.removesuffix(".build.json")
        assert lines[line]["wheel_cached"] is False
        assert truth[("build", line)][1] <= truth[("verify", line)][0], "verification started before its build ended"
        assert 0.4 < lines[line]["build_seconds"] < 30
    assert lines["fx2"]["build"] == "failed" and lines["fx2"]["build_detail"] == "build, exit 3"
    assert lines["fx2"]["verify"] == "not run" and lines["fx2"]["wheel"] is None
    assert truth[("build", "fx2")][2] == 3 and ("verify", "fx2") not in truth
    assert "fails on purpose" in Path(lines["fx2"]["build_log"]).read_text()
    assert (project / "quoted.txt").read_text().count("it's \"fx1\" 42\n") == 1


# ---------------------------------------------------------------- plans and scripts


def test_build_resources_follow_the_build_knobs(project):
    (project / "envs" / "big.yaml").write_text("extends: cu126\nbuild:\n  jobs: 6\n  nvcc_threads: 3\n")
    options = RunOptions(cpus=5, nvcc_threads=2)
    big, auto = checked_spec(project / "envs" / "big.yaml"), checked_spec(project / "envs" / "cu126.yaml")
    assert auto.build.jobs is None and big.build.jobs == 6
    jobs, threads, resources = build_sizing(big, options)
    assert (jobs, threads, resources.cpus) == (6, 3, 6)
    assert resources.mem_mb == math.ceil((6 * 3 * big.build.gb_per_nvcc_thread + HEADROOM_GB) * 1024)
    jobs, threads, resources = build_sizing(auto, options)
    assert (jobs, threads) == (5, 2)
    assert resources.mem_mb == math.ceil((5 * 2 * auto.build.gb_per_nvcc_thread + HEADROOM_GB) * 1024)
    plan = plan_matrix([auto, big], options, "gpu:1", "toolkit matrix run")
    assert plan.build_resources.cpus == 6  # the array takes the largest line's needs
    assert plan.build_resources.mem_mb == max(p.build_resources.mem_mb for p in plan.lines)


def test_batch_scripts_carry_resources_and_site_options(project):
    options = RunOptions(stages=project / "stages.yaml", partition="cpu", verify_partition="gpu", account="ml",
                         time="2:00:00", sbatch=("--qos=long",), verify_cpus=3, verify_mem_gb=7)
    specs = [checked_spec(project / "envs" / f"{n}.yaml") for n in ("fx1", "fx3")]
    plan = plan_matrix(specs, options, "gpu:1", "toolkit matrix run fx1 fx3")
    write_run_dir(plan)
    build = plan.build_script.read_text()
    for option in ("--array=0-1", "--cpus-per-task=1", f"--mem={plan.build_resources.mem_mb}M",
                   "--partition=cpu", "--account=ml", "--time=2:00:00", "--qos=long", f"--chdir={project}"):
        assert f"#SBATCH {option}\n" in build
    assert "--gres" not in build and "LINES=(fx1 fx3)" in build
    verify = plan.verify_script("fx3").read_text()
    for option in ("--gres=gpu:1", "--partition=gpu", "--cpus-per-task=3", "--mem=7168M", "--kill-on-invalid-dep=yes",
                   "--qos=long"):
        assert f"#SBATCH {option}\n" in verify
    assert "afterok:${BUILD}_1 " + str(plan.verify_script("fx3")) in (plan.run_dir / "submit.sh").read_text()
    for script in (plan.build_script, plan.verify_script("fx1"), plan.run_dir / "submit.sh"):
        assert os.access(script, os.X_OK)
        subprocess.run(["bash", "-n", str(script)], check=True)
    assert json.loads((plan.run_dir / "plan.json").read_text())["lines"][1]["line"] == "fx3"


def test_default_stages_install_only_lines_with_a_locked_toolchain(project):
    specs = [checked_spec(project / "envs" / f"{n}.yaml") for n in ("cu126", "gpu-machine")]
    assert [s.toolchain.kind for s in specs] == ["locked", "external"]
    plan = plan_matrix(specs, RunOptions(), None, "toolkit matrix run")
    assert [[s.name for s in p.build_stages] for p in plan.lines] == [["lock", "install", "build"], ["lock", "build"]]
    build = plan.lines[0].build_stages[2].command
    assert build.endswith(f"-m toolkit build envs/cu126.yaml --jobs={plan.lines[0].jobs} --nvcc-threads="
                          f"{plan.lines[0].nvcc_threads}")
    assert [s.command for s in plan.lines[1].verify_stages] == [f"{sys.executable} -m toolkit verify envs/gpu-machine.yaml"]


def test_nodes_ask_for_nodes_and_build_with_job_steps(project):
    """--nodes N: the array's tasks ask for N nodes and the build stage runs `toolkit build --slurm` with the
    threads alone (its jobs are what the allocation holds); without it the build takes --jobs."""
    spec = checked_spec(project / "envs" / "cu126.yaml")
    plan = plan_matrix([spec], RunOptions(nodes=3, cpus=4, nvcc_threads=2), None, "toolkit matrix run --nodes=3")
    write_run_dir(plan)
    build = plan.build_script.read_text()
    assert "#SBATCH --nodes=3\n" in build and "#SBATCH --cpus-per-task=4\n" in build
    assert plan.lines[0].build_stages[-1].command.endswith("-m toolkit build envs/cu126.yaml --nvcc-threads=2 --slurm")
    assert "#SBATCH --nodes" not in plan.verify_script("cu126").read_text()  # a verification is one GPU job


def test_nodes_with_the_local_executor_is_one_line(project, capsys):
    assert main(["matrix", "run", "cu126", "--executor", "local", "--nodes", "2"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: toolkit matrix run: --nodes 2: a build spreads over the nodes of a Slurm allocation, which "
        "--executor local has none of (use --executor slurm, or leave --nodes out)")


@pytest.mark.parametrize("text, problem", [
    ("build:\n  install: {run: echo, toolchain: gpu}\n", "build.install: expected a stage name"),
    ("build:\n  install: {toolchain: locked}\n", "build.install: expected a stage name"),
    ("build:\n  install: {run: 5, toolchain: locked}\n", "build.install: expected a stage name"),
    ("build:\n  build: echo {cuda}\n", "bad placeholder ('cuda'"),
    ("verify:\n  verify: echo\n", "expected a mapping with `build:`"),
    ("build:\n  'bad name': echo\n", "build.bad name: expected a stage name"),
    ("build: [\n", "cannot read the stages file"),
])
def test_a_bad_stages_file_is_one_line(project, text, problem):
    (project / "bad.yaml").write_text(text)
    with pytest.raises(ToolkitError) as caught:
        load_stage_templates(project / "bad.yaml")
    assert str(caught.value).startswith("bad.yaml: ") and problem in str(caught.value)
    assert "\n" not in str(caught.value)


def test_github_matrix_lists_every_line(capsys):
    assert main(["matrix", "show", "--github", "--envs", str(ROOT / "envs")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one line, for $GITHUB_OUTPUT
    rows = json.loads(out)["include"]
    specs = [checked_spec(p) for p in spec_paths(ROOT / "envs")]
    assert [r["line"] for r in rows] == [s.line for s in specs]
    for row, spec in zip(rows, specs):
        assert row == {"line": spec.line, "cuda": spec.cuda, "python": spec.python, "torch": spec.torch_version,
                       "archs": ";".join(spec.archs)}


def test_run_options_without_run_are_refused(project, capsys):
    assert main(["matrix", "show", "fx1", "--executor", "local", "--max-parallel", "2"]) == 1
    err = capsys.readouterr().err
    assert "--executor, --max-parallel belong to `toolkit matrix run`" in err and err.count("\n") == 1
    assert main(["matrix", "run", "fx1", "--github"]) == 1
    assert main(["matrix", "show", "fx1", "--json"]) == 0 and not (project / "runs").exists()


# ---------------------------------------------------------------- file locks


@pytest.mark.parametrize("holder", ["flock(1)", "toolkit.base.fslock"])
def test_locked_waits_for_another_process(tmp_path, holder):
    """The lock a batch script takes with flock(1) and the one locked() takes exclude each other."""
    entry = tmp_path / "cache" / "entry"
    entry.parent.mkdir()
    hold = f"touch {tmp_path}/held; sleep 1; touch {tmp_path}/released"
    in_python = f"import subprocess; from toolkit.base.fslock import locked\nwith locked({str(entry)!r}): " \
                f"subprocess.run({hold!r}, shell=True)"
    command = ["flock", f"{entry}.lock", "-c", hold] if holder == "flock(1)" else [sys.executable, "-c", in_python]
    process = subprocess.Popen(command)
    try:
        for _ in range(100):
            if (tmp_path / "held").exists():
                break
            time.sleep(0.05)
        with locked(entry) as lock_file:
            assert (tmp_path / "released").exists(), "got the lock while the other process held it"
            assert lock_file == tmp_path / "cache" / "entry.lock"
    finally:
        process.wait(timeout=10)


# ---------------------------------------------------------------- local executor


def test_local_run_reports_the_failed_line_alone(project, capsys):
    code = main(["matrix", "run", "fx1", "fx2", "fx3", "--executor", "local", "--max-parallel", "2",
                 "--stages", "stages.yaml", "--verify", "always"])
    out = capsys.readouterr().out
    assert code == 1
    summary = summary_of(project)
    assert_failed_line_reported_alone(project, summary)
    assert "2 of 3 lines ok" in out and "fx2: see runs/" in out
    run_dir = Path(summary["run_dir"])
    assert {p.name for p in run_dir.iterdir()} >= {"build.sbatch", "verify-fx1.sbatch", "submit.sh", "plan.json",
                                                   "summary.json", "logs", "status"}


def test_local_verify_if_gpu_skips_without_a_gpu_and_a_rerun_is_a_cache_hit(project, capsys):
    has_gpu = subprocess.run("nvidia-smi -L", shell=True, capture_output=True).returncode == 0
    code = main(["matrix", "run", "fx1", "--executor", "local", "--stages", "stages.yaml", "--json"])
    (row,) = json.loads(capsys.readouterr().out)["lines"]
    assert code == 0 and row["build"] == "done" and row["wheel_cached"] is False
    assert (row["verify"], row["verify_detail"]) == (("done", "") if has_gpu else ("skipped", "no GPU"))
    assert main(["matrix", "run", "fx1", "--executor", "local", "--stages", "stages.yaml", "--verify", "never"]) == 0
    out = capsys.readouterr().out
    (again,) = summary_of(project)["lines"]
    assert again["wheel"] == row["wheel"] and again["wheel_cached"] is True and "(cached)" in out
    assert (again["verify"], again["verify_detail"]) == ("skipped", "--verify never")


def test_a_line_waits_while_another_job_holds_its_lock(project, capsys):
    result = {}
    with locked(project / LINE_LOCKS / "fx1"):
        run = threading.Thread(target=lambda: result.update(code=main(
            ["matrix", "run", "fx1", "--executor", "local", "--stages", "stages.yaml", "--verify", "never"])))
        run.start()
        time.sleep(1.5)
        assert not (project / "stages.log").exists(), "the build ran while another job held the line's lock"
        (log,) = (project / "runs").glob("*/logs/fx1.build.log")
        assert "waiting for" in log.read_text()
    run.join(timeout=30)
    assert result == {"code": 0} and ("build", "fx1") in stage_log(project)


# ---------------------------------------------------------------- Slurm


@pytest.mark.slurm
def test_slurm_run_fails_one_line_alone_and_orders_verification(project, slurm_cluster, capsys):
    code = main(["matrix", "run", "fx1", "fx2", "fx3", "--stages", "stages.yaml", "--verify", "always",
                 "--gres", "", *SMALL_VERIFY, "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 1 and summary == summary_of(project)
    assert_failed_line_reported_alone(project, summary)
    lines = {row["line"]: row for row in summary["lines"]}
    build_array = lines["fx1"]["build_job"].split("_")[0]
    assert [lines[n]["build_job"] for n in ("fx1", "fx2", "fx3")] == [f"{build_array}_{i}" for i in range(3)]
    for line in ("fx1", "fx3"):  # the status files the jobs wrote on the node say the same
        run_dir = Path(summary["run_dir"])
        built = json.loads((run_dir / "status" / f"{line}.build.json").read_text())
        verified = json.loads((run_dir / "status" / f"{line}.verify.json").read_text())
        assert built["job"] == lines[line]["build_job"] and verified["job"] == lines[line]["verify_job"]
        assert built["finished"] <= verified["started"]
    # Slurm itself cancels the verification whose build failed (afterok never satisfied).
    done = subprocess.run(["squeue", "-h", "-t", "all", "-j", lines["fx2"]["verify_job"], "-o", "%T %r"],
                          capture_output=True, text=True)
    assert done.stdout.split() == ["CANCELLED", "DependencyNeverSatisfied"]


@pytest.mark.slurm
def test_slurm_verify_if_gpu_reports_skipped_and_submit_sh_resubmits(project, slurm_cluster, capsys):
    """No node offers a gpu gres here: verification jobs run without one and report 'skipped (no GPU)'.
    Then submit.sh, as an admin would run it, submits the same jobs again."""
    has_gpu = "gpu" in subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True).stdout
    code = main(["matrix", "run", "fx1", "--stages", "stages.yaml", *SMALL_VERIFY])
    out = capsys.readouterr().out
    row = summary_of(project)["lines"][0]
    assert code == 0 and row["build"] == "done"
    if not has_gpu:
        assert (row["verify"], row["verify_detail"]) == ("skipped", "no GPU") and "skipped (no GPU)" in out
    run_dir = Path(summary_of(project)["run_dir"])
    assert "--gres" not in (run_dir / "verify-fx1.sbatch").read_text()
    resubmitted = subprocess.run(["bash", str(run_dir / "submit.sh")], capture_output=True, text=True, check=True)
    jobs = [line.split(": ")[1] for line in resubmitted.stdout.splitlines()]
    for _ in range(120):
        listed = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"], capture_output=True, text=True)
        if not listed.stdout.strip():
            break
        time.sleep(0.5)
    assert [row[:2] for row in stage_rows(project) if row[0] == "build"] == [("build", "fx1")] * 2
    status = json.loads((run_dir / "status" / "fx1.verify.json").read_text())
    assert status["job"] == jobs[1] and status["state"] in ("skipped", "done")


# ---------------------------------------------------------------- end to end, the real verbs


@pytest.mark.slurm
@pytest.mark.nvcc
def test_slurm_matrix_of_fixture_lines_through_the_real_verbs(tmp_path, monkeypatch, slurm_cluster, capsys):
    """fxa and fxb build the fixture sdist with the real nvcc; fxbad's machine has another torch than its
    spec says, so its build stops at the preflight. The default stages run: lock (current, so not re-run),
    build, verify (no GPU here: skipped). A second run of fxa and fxb hits the build cache."""
    from conda_channel import build_simple_index, serve_directory
    from fixtures.fa_fixture_project import (
        make_stub_torch_env,
        pack_fixture_sdist,
        write_external_spec,
    )

    monkeypatch.chdir(tmp_path)
    for line, torch in (("fxa", "2.13.0"), ("fxb", "2.13.0"), ("fxbad", "2.12.0")):
        python = make_stub_torch_env(tmp_path / "venvs" / line, torch, "13.0")  # one each: builds install into it
        write_external_spec(tmp_path / "envs", line, python, "2.13.0", archs=("80",))
    build_simple_index(tmp_path / "index", [pack_fixture_sdist(tmp_path / "sdist")])
    small = ["--cpus", "1", "--nvcc-threads", "1", *SMALL_VERIFY, "--json"]
    has_gpu = subprocess.run("nvidia-smi -L", shell=True, capture_output=True).returncode == 0
    with serve_directory(tmp_path / "index") as url:
        for line in ("fxa", "fxb", "fxbad"):  # the sdist pin comes from the loopback index, not PyPI
            assert main(["lock", line, "--pypi", f"{url}/simple"]) == 0
        locks = {p: p.stat().st_mtime_ns for p in (tmp_path / "locks").glob("*.conda-lock.yml")}
        capsys.readouterr()
        assert main(["matrix", "run", "fxa", "fxb", "fxbad", *small]) == 1
        first = {row["line"]: row for row in json.loads(capsys.readouterr().out)["lines"]}
        assert main(["matrix", "run", "fxa", "fxb", *small]) == 0
        again = {row["line"]: row for row in json.loads(capsys.readouterr().out)["lines"]}
    assert {p: p.stat().st_mtime_ns for p in locks} == locks  # current locks are checked, not re-made
    for line in ("fxa", "fxb"):
        (wheel,) = (tmp_path / "wheelhouse" / line).glob("*.whl")
        assert first[line]["build"] == "done" and first[line]["wheel"] == wheel.name and not first[line]["wheel_cached"]
        assert "+cu130torch2.13" in wheel.name
        assert again[line]["wheel"] == wheel.name and again[line]["wheel_cached"] is True
        assert again[line]["build_seconds"] < first[line]["build_seconds"]
        if not has_gpu:
            assert (first[line]["verify"], first[line]["verify_detail"]) == ("skipped", "no GPU")
        log = Path(first[line]["build_log"]).read_text()
        assert "every lock is current" in log and "/toolkit lock envs" not in log.split("every lock is current")[1]
        assert "cached: wheelhouse/" in Path(again[line]["build_log"]).read_text()
    bad = first["fxbad"]
    assert (bad["build"], bad["build_detail"], bad["verify"]) == ("failed", "build, exit 1", "not run")
    assert "torch 2.12.0, the line wants 2.13.0" in Path(bad["build_log"]).read_text()
    assert not list(tmp_path.glob("wheelhouse/fxbad/*.whl"))


@pytest.mark.slurm
@pytest.mark.nvcc
def test_slurm_matrix_with_nodes_compiles_in_job_steps(tmp_path, monkeypatch, slurm_cluster, capsys):
    """--nodes 1 on the real single-node cluster: the fixture line's build task runs `toolkit build --slurm`,
    which says it runs each compile as a job step of the task's allocation, and makes the wheel."""
    from conda_channel import build_simple_index, serve_directory
    from fixtures.fa_fixture_project import (
        make_stub_torch_env,
        pack_fixture_sdist,
        write_external_spec,
    )

    monkeypatch.chdir(tmp_path)
    python = make_stub_torch_env(tmp_path / "venvs" / "fxn", "2.13.0", "13.0")
    write_external_spec(tmp_path / "envs", "fxn", python, "2.13.0", archs=("80",))
    build_simple_index(tmp_path / "index", [pack_fixture_sdist(tmp_path / "sdist")])
    with serve_directory(tmp_path / "index") as url:
        assert main(["lock", "fxn", "--pypi", f"{url}/simple"]) == 0
        capsys.readouterr()
        code = main(["matrix", "run", "fxn", "--nodes", "1", "--cpus", "1", "--nvcc-threads", "1", "--verify", "never",
                     "--json"])
        row = json.loads(capsys.readouterr().out)["lines"][0]
    log = Path(row["build_log"]).read_text()
    assert code == 0, log[-3000:]
    (wheel,) = (tmp_path / "wheelhouse" / "fxn").glob("*.whl")
    assert row["build"] == "done" and row["wheel"] == wheel.name
    assert re.search(r"Slurm job \d+: 1 node\(s\) of \d+ CPUs and \d+ MB; each compile a job step", log), log[-3000:]
    assert "-m toolkit build envs/fxn.yaml --nvcc-threads=1 --slurm" in log
