"""The rules over conda-forge's packaging bounds and the patch knowledge, in the style of test_foundation.py:
a scratch envs/, `toolkit check`, the exact one-line message with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_foundation import envs  # noqa: F401  (the scratch envs/ fixture: a base and a good cu126)

from toolkit.cli import main
from toolkit.knowledge.facts import load_knowledge
from toolkit.spec.rules import RULES

ROOT = Path(__file__).resolve().parent.parent


def line(envs: Path, cuda: str, gcc: int, torch: str, python: str = "3.12", flash_attn: str = "2.8.3.post2",
         extra: str = "") -> str:
    tag = "cu" + cuda.replace(".", "")
    (envs / f"{tag}.yaml").write_text(
        f'extends: base\ncuda: "{cuda}"\npython: "{python}"\ngcc: {gcc}\ntorch:\n  version: "{torch}"\n'
        f"  index: https://download.pytorch.org/whl/{tag}\nflash_attn_2: {{version: \"{flash_attn}\"}}\n{extra}")
    return tag


def check(capsys, *args) -> tuple[int, list[str]]:
    code = main(["check", *args])
    return code, capsys.readouterr().out.strip().splitlines()


def test_the_new_rules_are_registered():
    assert {"gcc-allowed-by-conda-nvcc", "flash-attn-patch-known"} <= {r.name for r in RULES}


# ---------------------------------------------------------------- conda-forge's gcc bound


def test_cu124_with_gcc_13_is_refused_with_the_fix(envs, capsys):
    """nvcc 12.4 itself accepts gcc 13 (host_config.h), but no conda-forge cuda-nvcc-impl 12.4 build does."""
    assert load_knowledge().cuda_lines["12.4"].max_gcc == 13
    tag = line(envs, "12.4", 13, "2.6.0")
    code, out = check(capsys, tag)
    assert code == 1
    assert out == ["envs/cu124.yaml:4: gcc: gcc 13 cannot be installed beside conda-forge's nvcc 12.4: every "
                   "cuda-nvcc-impl build (12.4.99, 12.4.131) has run_constrained gcc_impl >=6,<13 (use gcc 12, or "
                   "CUDA 12.6+ for gcc 13; see toolkit/knowledge/conda_forge_nvcc.yaml)"]


def test_cu124_with_gcc_12_passes(envs, capsys):
    assert check(capsys, line(envs, "12.4", 12, "2.6.0")) == (0, ["1 spec checked: no problems"])


@pytest.mark.parametrize("cuda,gcc,torch,allowed", [
    ("12.1", 12, "2.5.1", True), ("12.1", 13, "2.5.1", False),
    ("12.6", 13, "2.9.1", True),
    ("12.8", 14, "2.11.0", True),  # only from 12.8.61 build 1 on (e59e5f6); the solver may pick that build
    ("13.0", 15, "2.14.1", True), ("13.2", 15, "2.15.0", True),
])
def test_conda_forge_bound_per_line(envs, capsys, cuda, gcc, torch, allowed):
    code, out = check(capsys, line(envs, cuda, gcc, torch))
    assert (code == 0) == allowed, out
    assert allowed or len(out) == 1


def test_external_toolchains_are_not_bound_by_conda_forge(envs, capsys):
    tag = line(envs, "12.4", 13, "2.6.0", extra=(
        'toolchain:\n  kind: external\n  cuda_home: /opt/cuda-12.4\n  python_executable: /usr/bin/python3\n'
        '  nvcc: "12.4"\n  gcc: 13\n  python: "3.12"\n  torch: "2.6.0"\n  cxx11_abi: true\n'))
    assert check(capsys, tag) == (0, ["1 spec checked: no problems"])


def test_cu118_bound_is_unknown_so_only_host_config_applies(envs, capsys):
    """No published record of nvidia/label/cuda-11.8.0's cuda-nvcc with its constrains was found: the rule says
    nothing, and gcc-accepted-by-nvcc (max 11) is what refuses gcc 12."""
    assert load_knowledge().nvcc_packaging["11.8"].builds == ()
    extra = "channels: [nvidia/label/cuda-11.8.0, conda-forge]\n"
    assert check(capsys, line(envs, "11.8", 11, "2.7.1", "3.11", "2.7.3", extra))[0] == 0
    code, out = check(capsys, line(envs, "11.8", 12, "2.7.1", "3.11", "2.7.3", extra))
    assert code == 1 and len(out) == 1 and "newer than nvcc 11.8 accepts" in out[0]


def test_conda_forge_bound_is_never_looser_than_nvcc():
    """A packaging bound that admits a gcc nvcc's host_config.h rejects would be a data error."""
    kb = load_knowledge()
    for cuda, packaging in kb.nvcc_packaging.items():
        if cuda in kb.cuda_lines:
            assert not packaging.allowed_gcc(kb.cuda_lines[cuda].max_gcc + 1), cuda


def test_every_shipped_locked_line_gets_a_gcc_conda_forge_allows(monkeypatch):
    from toolkit.spec.envspec import load_spec, spec_paths
    monkeypatch.chdir(ROOT)
    kb = load_knowledge()
    for path in spec_paths(ROOT / "envs"):
        spec = load_spec(path)
        packaging = kb.nvcc_packaging[spec.cuda]
        if spec.toolchain.kind == "locked" and packaging.builds:
            assert packaging.allowed_gcc(int(spec.gcc)), spec.line


# ---------------------------------------------------------------- patches


def test_a_line_needing_cxx20_without_a_known_patch_is_refused(envs, capsys):
    tag = line(envs, "13.0", 14, "2.14.1", flash_attn="2.8.2")
    code, out = check(capsys, tag)
    assert code == 1
    assert out == ["envs/cu130.yaml:8: flash_attn_2.version: flash-attn 2.8.2 with torch 2.14.1 cannot build: torch >= "
                   "2.13 headers need C++20 and this setup.py passes -std=c++17; no patch in "
                   "toolkit/knowledge/patches.yaml covers 2.8.2 (use flash-attn 2.8.3.post2, which a patch fixes, a "
                   "torch that is not >=2.13, or add a patch for it)"]


def test_a_patched_line_passes_and_check_names_its_patch(envs, capsys):
    code, out = check(capsys, line(envs, "13.2", 14, "2.15.0"))
    assert code == 0
    assert out == ["envs/cu132.yaml: patch: flash-attn 2.8.3.post2 gets toolkit/knowledge/patches/flash-attn-2.8.3-cxx20.patch "
                   "(cxx20, torch 2.15.0; written after https://github.com/Dao-AILab/flash-attention/pull/2899)",
                   "1 spec checked: no problems"]


def test_an_old_torch_needs_no_patch(envs, capsys):
    assert check(capsys, line(envs, "12.6", 13, "2.12.1")) == (0, ["1 spec checked: no problems"])
