"""flake.nix, offline: it parses, its lines are envs/' lines, and every line gets a shell or a reason.

These machines cannot fetch nixpkgs, so the flake's `nixpkgs` input is overridden with the stub in
tests/nix_stubs/nixpkgs (nixpkgs' attribute names and shapes, trivial derivations; its
available.json says which attributes exist and the tests rewrite it). Nix itself is real: Debian's
nix-bin 2.8, which CI installs. Nix sees only git-tracked files of a flake, and the project's git
state is not ours to change, so each test runs nix against a copy in a temporary git repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.fa_fixture_project import see_running_packages

from toolkit.spec.envspec import EnvSpec, load_spec, spec_paths

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "tests" / "nix_stubs" / "nixpkgs"
SYSTEM_OF = {"linux-64": "x86_64-linux", "linux-aarch64": "aarch64-linux"}

pytestmark = [pytest.mark.nix, pytest.mark.skipif(
    shutil.which("nix") is None or shutil.which("nix-instantiate") is None,
    reason="nix is not installed (CI installs Debian's nix-bin; here: apt-get install nix-bin)",
)]


def run_nix(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`nix ARGS` with flakes on and no binary cache; options go before a `--` (what follows is the app's)."""
    split = args.index("--") if "--" in args else len(args)
    options = ["--extra-experimental-features", "nix-command flakes", "--option", "substituters", ""]
    command = ["nix", *args[:split], *options, *args[split:]]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def make_repo(tmp: Path, envs: Path = ROOT / "envs") -> Path:
    """A git repository with the files flake.nix reads, tracked (not committed) so nix sees them."""
    repo = tmp / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "flake.nix", repo)
    shutil.copy(ROOT / "pyproject.toml", repo)
    shutil.copytree(envs, repo / "envs")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    return repo


def make_stub(tmp: Path, present: list[str] | None = None, removed: list[str] | None = None,
              host_python: str | None = None) -> Path:
    """A copy of the nixpkgs stub; `present`/`removed` replace the attributes it has."""
    stub = tmp / "nixpkgs-stub"
    shutil.copytree(STUB, stub)
    available = json.loads((STUB / "available.json").read_text())
    available["present"] = available["present"] if present is None else present
    available["removed"] = available["removed"] if removed is None else removed
    available["host_python"] = host_python
    (stub / "available.json").write_text(json.dumps(available))
    return stub


def flake(repo: Path, stub: Path, *args: str, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`nix ARGS` on the repo's flake with nixpkgs overridden by the stub."""
    split = args.index("--") if "--" in args else len(args)
    override = ("--override-input", "nixpkgs", f"path:{stub}")
    return run_nix(*args[:split], *override, *args[split:], cwd=cwd or repo, env=env)


def flake_json(repo: Path, stub: Path, attribute: str, apply: str | None = None):
    args = ["eval", "--json", f"{repo}#{attribute}"] + (["--apply", apply] if apply else [])
    result = flake(repo, stub, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def nixpkgs_attrs(spec: EnvSpec) -> set[str]:
    """The nixpkgs attributes a line's shell needs, named as nixpkgs names them."""
    return {f"cudaPackages_{spec.cuda.replace('.', '_')}", f"gcc{spec.gcc}", f"python{spec.python.replace('.', '')}"}


@pytest.fixture(scope="module")
def specs() -> dict[str, EnvSpec]:
    return {path.stem: load_spec(path) for path in spec_paths(ROOT / "envs")}


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


def test_flake_parses():
    result = subprocess.run(["nix-instantiate", "--parse", str(ROOT / "flake.nix")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_flake_reads_the_same_lines_and_facts_as_the_toolkit(repo: Path, tmp_path: Path, specs):
    lines = flake_json(repo, make_stub(tmp_path), "lib.lines")
    assert set(lines) == set(specs)
    for name, spec in specs.items():
        assert lines[name] == {"cuda": spec.cuda, "gcc": spec.gcc, "python": spec.python,
                               "platforms": list(spec.platforms), "kind": spec.toolchain.kind}, name


@pytest.mark.parametrize("nixpkgs", ["as-stubbed", "without-cudaPackages_12_6"])
def test_every_line_has_a_shell_or_a_reason(repo: Path, tmp_path: Path, specs, nixpkgs: str):
    available = json.loads((STUB / "available.json").read_text())
    present = [a for a in available["present"] if not (nixpkgs.startswith("without-") and a == nixpkgs[8:])]
    stub = make_stub(tmp_path, present=present)
    show = flake(repo, stub, "flake", "show", "--json")
    assert show.returncode == 0, show.stderr
    shown = json.loads(show.stdout)
    not_provided = flake_json(repo, stub, "notProvided")
    assert set(shown["devShells"]) == set(not_provided) == set(SYSTEM_OF.values())
    for platform, system in SYSTEM_OF.items():
        shells = set(shown["devShells"][system]) - {"default"}
        assert shells | set(not_provided[system]) == set(specs), system
        assert not shells & set(not_provided[system]), system
        for name, spec in specs.items():
            missing = sorted(nixpkgs_attrs(spec) - set(present))
            if spec.toolchain.kind != "locked":
                assert f"toolchain.kind {spec.toolchain.kind}:" in not_provided[system][name]
            elif platform not in spec.platforms:
                assert platform in not_provided[system][name]
            elif missing:
                assert all(attr in not_provided[system][name] for attr in missing), (name, missing)
            else:
                assert name in shells, (system, name)
                assert shown["devShells"][system][name]["name"] == f"fa-envkit-{name}"


def test_flake_check_evaluates_every_output(repo: Path, tmp_path: Path):
    result = flake(repo, make_stub(tmp_path), "flake", "check", "--no-build")
    assert result.returncode == 0, result.stderr


def test_shells_have_the_spec_toolchain(repo: Path, tmp_path: Path, specs):
    stub = make_stub(tmp_path)
    default = flake_json(repo, stub, "devShells.x86_64-linux.default", "s: map (p: p.name) s.packages")
    assert {"python3.stub", "ninja.stub", "micromamba.stub"} <= set(default)
    shells = flake_json(repo, stub, "devShells.x86_64-linux", "builtins.attrNames")
    assert set(shells) - {"default"}
    for name in set(shells) - {"default"}:
        spec = specs[name]
        shell = flake_json(repo, stub, f"devShells.x86_64-linux.{name}",
                           "s: { home = s.CUDA_HOME.name; parts = map (p: p.name) s.CUDA_HOME.paths; "
                           "hook = s.shellHook; packages = map (p: p.name) s.packages; }")
        assert shell["home"] == f"cuda-home-{spec.cuda}"
        wanted = {f"cuda_nvcc-{spec.cuda}", f"cuda_cudart-{spec.cuda}", f"cuda_cccl-{spec.cuda}"}
        assert wanted <= set(shell["parts"])
        assert (f"cuda_crt-{spec.cuda}" in shell["parts"]) == (int(spec.cuda.split(".")[0]) >= 13)
        assert f"python{spec.python.replace('.', '')}.stub" in shell["packages"]
        assert f"cuda_nvcc-{spec.cuda}" in shell["packages"]
        compilers = dict(re.findall(r"\b(CC|CXX|NVCC_CCBIN)=(\S+)", shell["hook"]))
        host = f"-gcc-wrapper-{spec.gcc}.stub/bin/"  # the spec's gcc, not nvcc's default one
        assert compilers["CC"].endswith(host + "gcc")
        assert compilers["CXX"].endswith(host + "g++") and compilers["NVCC_CCBIN"] == compilers["CXX"]


def test_unfree_is_allowed_for_the_cuda_eula_only(repo: Path, tmp_path: Path):
    cases = ('[ { meta.license = { shortName = "CUDA EULA"; free = false; }; }'
             '  { meta.license = { shortName = "cuDNN EULA"; free = false; }; }'
             '  { meta.license = [ { free = true; } { shortName = "CUDA EULA"; free = false; } ]; }'
             '  { meta.license = [ { free = true; } { shortName = "unfree"; free = false; } ]; } ]')
    allowed = flake_json(repo, make_stub(tmp_path), "lib.allowUnfreePredicate", f"allow: map allow {cases}")
    assert allowed == [True, False, True, False]


def test_spec_the_flake_cannot_read_is_one_clear_error(tmp_path: Path):
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs", envs)
    # Valid for the toolkit; a line reader that skipped the block list would silently inherit cu128's.
    (envs / "cu129.yaml").write_text('extends: cu128\ncuda: "12.9"\nplatforms:\n  - linux-64\n')
    assert load_spec(envs / "cu129.yaml").platforms == ("linux-64",)
    repo = make_repo(tmp_path, envs)
    result = flake(repo, make_stub(tmp_path), "eval", "--json", f"{repo}#lib.lines")
    assert result.returncode != 0
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "envs/cu129.yaml: platforms:" in error and "lists as [a, b]" in error


def test_check_app_installs_the_toolkit_or_says_why(repo: Path, tmp_path: Path):
    stub = make_stub(tmp_path, host_python=str(Path(sys.executable).resolve()))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    result = flake(repo, stub, "run", f"{repo}#check", cwd=outside)
    assert result.returncode == 1 and "is not the project root" in result.stderr

    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}
    result = flake(repo, stub, "run", f"{repo}#check", env=offline)
    assert result.returncode == 1 and "installing into" in result.stderr
    [venv] = (repo / ".cache" / "nix-venv").iterdir()
    assert not (venv / ".installed").exists()  # a failed install is never marked done

    # A venv that sees this interpreter's packages, stamped with pyproject.toml's hash: used as it is.
    shutil.rmtree(venv)
    subprocess.run([str(Path(sys.executable).resolve()), "-m", "venv", "--without-pip", str(venv)], check=True)
    see_running_packages(venv / "bin" / "python")
    (venv / "bin" / "toolkit").write_text(f'#!/bin/sh\nexec "{venv}/bin/python" -m toolkit "$@"\n')
    (venv / "bin" / "toolkit").chmod(0o755)
    (venv / ".installed").write_text(hashlib.sha256((repo / "pyproject.toml").read_bytes()).hexdigest() + "\n")
    result = flake(repo, stub, "run", f"{repo}#check", "--", "cu126", env=offline)
    assert result.returncode == 0, result.stderr
    assert "installing" not in result.stderr and "1 spec checked" in result.stdout
