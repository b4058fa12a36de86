"""Messages tried as a new user would: each names what is wrong and the fix that works from here, and a
command that did nothing says so with a non-zero exit. Also the safe defaults of `matrix run --executor
local` (size from this machine) and a declared dependency missing mid-run (one line, not a traceback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures.fa_fixture_project import write_external_spec
from test_recommend import GPU, _bench, _case

from toolkit.cli import main
from toolkit.machine.fingerprint import from_dict
from toolkit.machine.preflight import findings, preflight_input, problems
from toolkit.site.scaleout import RunOptions, plan_matrix
from toolkit.spec.envspec import load_spec
from toolkit.spec.rules import checked_spec, violations

ROOT = Path(__file__).resolve().parent.parent
# Every line is a spec file in envs/ except base.yaml (a parent); listed by file name, as a directory listing sorts
# them ("gpu-machine-fa3.yaml" before "gpu-machine.yaml"), so adding a line to envs/ needs no edit here.
LINES = [p.name.removesuffix(".yaml") for p in sorted((ROOT / "envs").glob("*.yaml"), key=lambda p: p.name)
         if p.name != "base.yaml"]
KNOWN = ", ".join(LINES)


def toolkit(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=120)


@pytest.mark.parametrize("verb", ["install", "build", "check", "lock --check"])
def test_a_mistyped_line_is_named_with_the_nearest_one(verb):
    """`install cu26` said "locks/cu26.conda-lock.yml: no lock file"; every verb now names the typo."""
    done = toolkit(*verb.split(), "cu26")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr == (f"error: envs/cu26.yaml: no spec for line 'cu26' (did you mean cu126? known lines: "
                           f"{KNOWN})\n")


def test_build_with_a_prefix_says_to_install_there(tmp_path):
    """`build --prefix X` suggested "or pass --prefix", which the user had just done."""
    # py-cu130: a line whose lock is committed (without one, the missing lock is named first)
    done = toolkit("build", "py-cu130", "--prefix", str(tmp_path / "my env"), env={"TOOLKIT_CACHE": str(tmp_path / "c")})
    assert done.returncode == 1
    assert done.stderr == (f"error: {tmp_path}/my env: no installed environment for py-cu130 (install it there with "
                           f"`toolkit install py-cu130 --prefix '{tmp_path}/my env'`, or pass the --prefix it was "
                           f"installed with)\n")


def test_modules_with_every_line_skipped_fails_and_writes_nothing(tmp_path):
    done = toolkit("modules", "--root", str(tmp_path / "modules"), "--env-root", str(tmp_path / "none"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr == (f"error: {tmp_path}/modules: nothing written: no line has an installed environment "
                           f"(run `toolkit install LINE` first, or pass --env-root where they are installed)\n")
    assert done.stdout.count("skipped ") == len(LINES) and not (tmp_path / "modules").exists()


def test_a_missing_interpreter_is_not_python_none():
    """gpu-machine where its python is absent: the mismatch line said "python None (spec: 3.12), torch None
    ...", beside the line that says the interpreter is missing."""
    spec = checked_spec(ROOT / "envs" / "gpu-machine.yaml")
    h200 = from_dict(json.loads((ROOT / "tests/fingerprints/healthy-h200.json").read_text())["fingerprint"])
    no_python = replace(h200, python_path=None, python_version=None, torch=None, gcc_version="12.3.0")
    judged = findings(preflight_input(spec, no_python, spec.archs, 240.0, Path("/tmp")))
    assert [f.message for f in judged if f.status == "fail"] == ["gcc 12, the line wants 13", "not found or does not run"]
    assert not any("None" in f.line() for f in judged)


def test_a_cpu_torch_fails_check(tmp_path):
    """A +cpu torch passed `toolkit check`, as the spec's torch or as the external toolchain's."""
    external = load_spec(write_external_spec(tmp_path / "ext", "cpu", Path(sys.executable), "2.13.0+cpu"))
    assert [str(v).split(": ", 1)[1] for v in violations(external)] == [
        "toolchain.torch: torch 2.13.0+cpu is a cpu build but the line is cu130 (use +cu130 or no tag)"]
    locked = tmp_path / "envs" / "cu126.yaml"
    locked.parent.mkdir()
    locked.write_text((ROOT / "envs" / "cu126.yaml").read_text().replace("2.9.1", "2.9.1+cpu"))
    shutil.copy(ROOT / "envs" / "base.yaml", tmp_path / "envs" / "base.yaml")
    assert [v.message for v in violations(load_spec(locked))] == [
        "torch 2.9.1+cpu is a cpu build but the line is cu126 (use +cu126 or no tag)"]


def test_recommend_says_which_shapes_the_verification_did_not_cover(tmp_path, capsys):
    """A smoke verification proving d128 non-causal only: "worst shape 0.888" alone did not say why."""
    (tmp_path / "bench.json").write_text(json.dumps(_bench()))
    (tmp_path / "verify.json").write_text(json.dumps({
        "gpu": GPU, "level": "fa4-smoke", "date": "2026-12-01", "cases": [_case("passed", 128, False)],
        "summary": {"passed": 1, "failed": 0, "error": 0, "unsupported": 0, "setup_error": ""}}))
    assert main(["recommend", "--bench", str(tmp_path / "bench.json"), "--verified",
                 f"flash-attn-4={tmp_path / 'verify.json'}", "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    out = out[:next(i for i, line in enumerate(out) if line.startswith("verl "))]  # verl's lines come last
    assert out[-2] == f"recommended vs best measured, worst shape: {477 / 537:.3f} (needs >= 0.98); {tmp_path}/r.json"
    assert out[-1] == (f"below 0.98: bfloat16 d64 fwd seqlen 4096 ({477 / 537:.3f}), bfloat16 d128 causal fwd "
                       f"seqlen 4096 ({571 / 630:.3f}): flash-attn-4 measured fastest, but its verification (fa4-smoke) did "
                       f"not cover these shapes (verify flash-attn-4 with `--level full` and pass that report with "
                       f"--verified flash-attn-4=VERIFY_JSON)")


def test_a_local_matrix_build_sizes_from_this_machine(tmp_path, monkeypatch):
    """`matrix run --executor local` passed the batch defaults (--jobs 8 --nvcc-threads 2, about 74 GB) to
    `toolkit build` on any machine; locally the build sizes itself unless --cpus/--nvcc-threads are given."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "envs", tmp_path / "envs")
    spec = checked_spec(tmp_path / "envs" / "cu126.yaml")
    assert spec.build.jobs is None and spec.build.nvcc_threads is None  # auto: the run decides

    def build_command(**options: object) -> str:
        plan = plan_matrix([spec], RunOptions(runs_dir=tmp_path / "runs", **options), None, "toolkit matrix run")
        return plan.lines[0].build_stages[-1].command

    assert build_command(executor="local").endswith("-m toolkit build envs/cu126.yaml")
    assert build_command(executor="local", cpus=3).endswith("-m toolkit build envs/cu126.yaml --jobs=3")
    assert build_command(executor="slurm").endswith("-m toolkit build envs/cu126.yaml --jobs=8 --nvcc-threads=2")


@pytest.mark.parametrize("module, said", [
    ("rattler", "fa-envkit needs py-rattler, which this python lacks (no module 'rattler'): "
                f"{sys.executable} -m pip install 'py-rattler==0.28.0'"),
    ("yaml", "fa-envkit needs pyyaml, which this python lacks (no module 'yaml'): "
             f"{sys.executable} -m pip install 'pyyaml>=6'"),
])
def test_a_missing_declared_dependency_is_one_line(module, said, tmp_path):
    """`toolkit check` imports rattler lazily (mid-run: for a conda version of no plain form, here "1.2.3a0")
    and yaml with its stage modules (building the parser): a python without them (a partial install) got a
    ModuleNotFoundError traceback. The import is made to fail for real (None in sys.modules)."""
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs", envs)
    (envs / "cu126.yaml").write_text((envs / "cu126.yaml").read_text() + 'conda_packages:\n  ninja: "1.2.3a0"\n')
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.modules[{module!r}] = None\n"
                           "from toolkit.cli import main\n"
                           f"sys.exit(main(['check', 'cu126', '--envs', {str(envs)!r}]))"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: {said}"


def unlocked_workspace(tmp_path: Path, channel: str, index: str) -> list[str]:
    """cu126's spec in a workspace of its own without its lock, its conda channel and torch index as given."""
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs", envs)
    (envs / "base.yaml").write_text((envs / "base.yaml").read_text().replace("channels: [conda-forge]",
                                                                             f"channels: [{channel}]"))
    (envs / "cu126.yaml").write_text((envs / "cu126.yaml").read_text().replace(
        "https://download.pytorch.org/whl/cu126", index))
    (tmp_path / "locks").mkdir()
    return ["--envs", str(envs), "--locks", str(tmp_path / "locks")]


@pytest.mark.parametrize("verb", ["build", "install", "lock --check"])
def test_a_conda_forge_line_without_its_lock_names_the_unreachable_channel_first(tmp_path, verb):
    """`toolkit build cu126` on a fresh clone said "run toolkit install first", install said "re-run toolkit
    lock", and only lock said that conda-forge is unreachable: every one of them now says it first."""
    workspace = unlocked_workspace(tmp_path, "./gone-channel", f"file://{tmp_path}/gone-index")
    done = toolkit(*verb.split(), "cu126", *workspace, cwd=tmp_path, env={"TOOLKIT_CACHE": str(tmp_path / "c")})
    said = done.stderr if verb != "lock --check" else "error: " + done.stdout
    assert done.returncode == 1 and "Traceback" not in done.stderr and said.count("\n") == 1
    assert said == (f"error: locks/cu126.conda-lock.yml: missing, and this machine cannot make it: "
                    f"`toolkit lock cu126` reads {(tmp_path / 'envs' / 'gone-channel').as_uri()}, file://{tmp_path}"
                    f"/gone-index, unreachable from here (no folder {tmp_path}/envs/gone-channel): lock it on a "
                    f"machine that reaches them and commit locks/, or name a mirror in the spec (locks/README.md)\n")


def test_a_line_without_its_lock_whose_sources_answer_is_told_to_lock(tmp_path):
    (tmp_path / "channel").mkdir()
    (tmp_path / "index").mkdir()
    workspace = unlocked_workspace(tmp_path, str(tmp_path / "channel"), f"file://{tmp_path}/index")
    done = toolkit("install", "cu126", *workspace, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (
        1, "error: locks/cu126.conda-lock.yml: missing (run `toolkit lock cu126`)\n")


def test_install_takes_a_spec_file_as_its_siblings_do(tmp_path):
    """`toolkit install envs/gpu-machine.yaml` said "'envs/gpu-machine.yaml' is not a line name", where
    build, lock, check and verify take the spec file."""
    by_file, by_name = toolkit("install", "envs/gpu-machine.yaml"), toolkit("install", "gpu-machine")
    assert by_file.returncode == by_name.returncode == 1 and by_file.stderr == by_name.stderr
    assert by_file.stderr.startswith("error: locks/gpu-machine.conda-lock.yml: gpu-machine has an external toolchain")
    missing = toolkit("install", str(tmp_path / "mine.yaml"))
    assert (missing.returncode, missing.stderr) == (1, f"error: {tmp_path}/mine.yaml: file not found\n")


def test_recommend_LINE_reads_the_lines_reports(tmp_path, monkeypatch, capsys):
    """`toolkit recommend LINE`, as the README writes it, said "the following arguments are required: --bench":
    it now reads reports/LINE/bench.json and each backend's verify.json where `toolkit verify` writes it."""
    monkeypatch.chdir(tmp_path)
    assert main(["recommend", "cu126"]) == 1
    assert capsys.readouterr().err == ("error: reports/cu126/bench.json: no bench report for cu126 (run `toolkit bench "
                                       "cu126` first, or pass --bench FILE)\n")
    reports = tmp_path / "reports" / "cu126"
    (reports / "fa4").mkdir(parents=True)
    (reports / "bench.json").write_text(json.dumps(_bench()))
    (reports / "fa4" / "verify.json").write_text(json.dumps({
        "gpu": GPU, "level": "fa4-smoke", "date": "2026-12-01", "cases": [_case("passed", 128, False)],
        "summary": {"passed": 1, "failed": 0, "error": 0, "unsupported": 0, "setup_error": ""}}))
    assert main(["recommend", "cu126", "--bench", str(reports / "bench.json"), "--verified",
                 f"flash-attn-4={reports / 'fa4' / 'verify.json'}", "--out", str(tmp_path / "spelled-out.json")]) == 0
    capsys.readouterr()
    assert main(["recommend", "cu126"]) == 0
    assert "flash-attn-4" in json.loads((tmp_path / "spelled-out.json").read_text())["verified"]
    assert (reports / "recommendation.json").read_text() == (tmp_path / "spelled-out.json").read_text()


def test_arch_and_mem_gb_given_on_the_command_line_are_named_not_the_spec_or_meminfo():
    """`build --arch 75` was blamed on envs/gpu-machine.yaml's archs and `--mem-gb 1` on /proc/meminfo: the
    option the user typed is named, with its fix."""
    spec = checked_spec(ROOT / "envs" / "gpu-machine.yaml")
    h200 = from_dict(json.loads((ROOT / "tests/fingerprints/healthy-h200.json").read_text())["fingerprint"])
    need = spec.build.gb_per_nvcc_thread
    failed = problems(preflight_input(spec, h200, ("75",), 1.0, Path("/tmp"), archs_given="--arch 75",
                                      mem_given="--mem-gb 1"))
    assert "--arch 75: sm_75 older than FlashAttention-2 supports (sm_80 or newer: give those to --arch)" in failed
    assert (f"--mem-gb 1: 1 GB is less than one nvcc thread needs (about {need} GB): pass at least --mem-gb {need:g}, "
            f"or leave it out to size from this machine's available memory") in failed
    assert not any("gpu-machine.yaml" in m or "/proc/meminfo" in m for m in failed)
    from_spec = problems(preflight_input(spec, h200, ("75",), 1.0, Path("/tmp")))
    assert any(m.startswith(f"{spec.where('archs')}: archs: sm_75") for m in from_spec)
    assert any(m.startswith("/proc/meminfo: 1.0 GB available") for m in from_spec)


def test_modules_never_says_no_line_is_installed_after_naming_one_that_is(tmp_path):
    """An installed cu126 without flash-attn was skipped ("flash-attn is not installed"), and then the run said
    "no line has an installed environment"."""
    prefix = tmp_path / "envs-root" / "cu126"
    (prefix / "conda-meta").mkdir(parents=True)
    (prefix / "conda-meta" / "python-3.12.0-0.json").write_text('{"name": "python", "version": "3.12.0", "build": "0"}')
    torch = prefix / "lib" / "python3.12" / "site-packages" / "torch-2.9.1.dist-info"
    torch.mkdir(parents=True)
    (torch / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1\n")
    done = toolkit("modules", "--root", str(tmp_path / "modules"), "--env-root", str(tmp_path / "envs-root"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"skipped cu126: {torch.parent}: flash-attn is not installed" in done.stdout
    assert done.stderr == (f"error: {tmp_path}/modules: nothing written: cu126 has an environment but no flash-attn "
                           f"there (`toolkit build LINE` builds it and installs it there; each skipped line above says "
                           f"what is missing)\n")
    assert not (tmp_path / "modules").exists()


def test_a_pypi_mirror_of_html_pages_only_is_named_as_such(tmp_path):
    """`lock --pypi URL` of a PEP 503 mirror (HTML only) failed with "Expecting value: line 1 column 1" from
    the JSON parser: it now says the mirror must serve the JSON simple API."""
    import functools
    import http.server
    import threading

    from toolkit.base.errors import ToolkitError
    from toolkit.env.lock import fetch_sdist_pin

    page = tmp_path / "simple" / "flash-attn" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text('<html><body><a href="flash_attn-2.8.3.post2.tar.gz#sha256=00">x</a></body></html>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        with pytest.raises(ToolkitError) as caught:
            fetch_sdist_pin("2.8.3.post2", index)
    finally:
        server.shutdown()
        server.server_close()  # its listening socket, else collected later as an unclosed socket's ResourceWarning
    assert str(caught.value) == (
        f"--pypi {index}: {index}/flash-attn/ answered text/html, not PyPI's JSON simple API (PEP 691, "
        f"application/vnd.pypi.simple.v1+json), which the sdist pin reads: give a mirror that serves it, or leave "
        f"--pypi out (PyPI does)")
