"""Specs, inheritance, the compatibility rules and the check/matrix CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cuda_toolchain import tool_on_path

from toolkit.cli import main
from toolkit.knowledge.facts import load_knowledge
from toolkit.spec import fa3 as fa3_rules
from toolkit.spec import fa4 as fa4_rules
from toolkit.spec.envspec import load_spec, merge
from toolkit.spec.rules import RULES, violations

ROOT = Path(__file__).resolve().parent.parent

BASE = """\
platforms: [linux-64]
channels: [conda-forge]
conda_packages:
  python: "{python}.*"
  cuda-version: "{cuda}.*"
  cuda-nvcc: "*"
  gxx: "{gcc}.*"
pip_packages:
  packaging: "*"
flash_attn:
  version: "2.8.3.post2"
archs: ["80", "90"]
build:
  jobs: auto
  nvcc_threads: auto
toolchain:
  kind: locked
"""

CU126 = """\
extends: base
cuda: "12.6"
python: "3.12"
gcc: 13
torch:
  version: "2.9.1"
  index: https://download.pytorch.org/whl/cu126
"""


@pytest.fixture
def envs(tmp_path, monkeypatch):
    """A scratch envs/ dir with a base and a good cu126; tests overwrite files in it."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "base.yaml").write_text(BASE)
    (folder / "cu126.yaml").write_text(CU126)
    return folder


def check(capsys, *args) -> tuple[int, list[str], str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out.strip().splitlines(), err.strip()


# ---------------------------------------------------------------- the shipped specs


def test_shipped_specs_pass_check(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, _ = check(capsys)
    assert code == 0, out
    assert out[-1] == f"{len(list((ROOT / 'envs').glob('*.yaml'))) - 1} specs checked: no problems"
    assert all(": patch: " in line for line in out[:-1]), out  # the patches lines' builds apply


def test_every_cuda_line_has_a_spec(monkeypatch):
    monkeypatch.chdir(ROOT)
    lines = {load_spec(p).cuda for p in (ROOT / "envs").glob("cu*.yaml")}
    assert {"11.8", "12.1", "12.4", "12.6", "12.8", "13.0"} <= lines


def test_check_is_fast(monkeypatch):
    monkeypatch.chdir(ROOT)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "toolkit", "check"], capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"toolkit check on envs/: {elapsed:.2f} s (goal: well under 1 s of work plus interpreter start)")


def test_gpu_machine_spec_is_external_and_matches_image(monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = load_spec(ROOT / "envs/gpu-machine.yaml")
    assert spec.toolchain.kind == "external"
    assert (spec.cuda, spec.python, spec.gcc, spec.archs) == ("13.0", "3.12", "13", ("90",))
    assert spec.torch_version == spec.toolchain.torch == "2.11.0+cu130"
    assert violations(spec) == []


# ---------------------------------------------------------------- inheritance


def test_merge_rules():
    parent = {"a": 1, "m": {"x": 1, "y": 2}, "l": [1, 2], "gone": 3}
    child = {"m": {"y": 20, "z": 30}, "l": [9], "gone": None}
    assert merge(parent, child) == {"a": 1, "m": {"x": 1, "y": 20, "z": 30}, "l": [9]}


def test_inheritance_and_placeholders(envs):
    spec = load_spec(envs / "cu126.yaml")
    assert spec.platforms == ("linux-64",)  # from base
    assert spec.conda_packages == {"python": "3.12.*", "cuda-version": "12.6.*", "cuda-nvcc": "*", "gxx": "13.*"}
    assert spec.conda_specs() == ["python 3.12.*", "cuda-version 12.6.*", "cuda-nvcc", "gxx 13.*"]
    assert spec.pip_requirements() == ["torch==2.9.1", "packaging"]
    assert spec.build.jobs is None and spec.build.gb_per_nvcc_thread == 4.5
    assert spec.chain == (envs / "cu126.yaml", envs / "base.yaml")
    assert str(spec.where("cuda")) == "envs/cu126.yaml:2"
    assert str(spec.where("archs")) == "envs/base.yaml:12"


def test_three_level_inheritance_and_null_removal(envs):
    (envs / "cu126-h100.yaml").write_text('extends: cu126\narchs: ["90a"]\npip_packages:\n  packaging: null\n')
    spec = load_spec(envs / "cu126-h100.yaml")
    assert spec.archs == ("90a",) and spec.cuda == "12.6" and spec.pip_packages == {}


def test_input_hash_follows_the_merged_content(envs):
    before = load_spec(envs / "cu126.yaml").input_hash()
    (envs / "base.yaml").write_text(BASE.replace('"90"]', '"90", "89"]'))
    changed = load_spec(envs / "cu126.yaml").input_hash()
    assert changed != before
    (envs / "cu126.yaml").write_text((envs / "cu126.yaml").read_text() + "build:\n  jobs: 7\n  threads_per_cpu: 2\n")
    assert load_spec(envs / "cu126.yaml").build.jobs == 7
    assert load_spec(envs / "cu126.yaml").input_hash() == changed  # sizing changes only the speed


# ---------------------------------------------------------------- bad input: exact message, exit code

BAD_INPUTS = [
    ("malformed-yaml", "extends: base\ncuda: [12.6\n",
     "envs/cu126.yaml:3: malformed YAML: expected ',' or ']', but got '<stream end>'"),
    ("tab-indentation", "extends: base\ntorch:\n\tversion: '2.9.1'\n",
     "envs/cu126.yaml:3: malformed YAML: tab character in indentation (indent with spaces)"),
    ("unknown-key", CU126 + "cuda_version: '12.6'\n",
     "envs/cu126.yaml:8: cuda_version: unknown field (known fields: extends, description, cuda, python, "
     "gcc, platforms, channels, conda_packages, pip_packages, torch, flash_attn_2, flash_attn_4, flash_attn_3, archs, "
     "build, toolchain)"),
    ("unknown-nested-key", CU126 + "build:\n  max_jobs: 4\n",
     "envs/cu126.yaml:9: build.max_jobs: unknown field (known fields of build: jobs, nvcc_threads, "
     "gb_per_nvcc_thread, threads_per_cpu)"),
    ("float-version", CU126.replace('cuda: "12.6"', "cuda: 12.6"),
     "envs/cu126.yaml:2: cuda: expected a quoted version like \"12.6\", got float 12.6 "
     "(quote it: YAML reads 12.10 as 12.1)"),
    ("wrong-list-type", CU126 + "archs: 90\n",
     "envs/cu126.yaml:8: archs: expected a list, got int 90"),
    ("bad-arch-item", CU126 + "archs: [sm90]\n",
     "envs/cu126.yaml:8: archs[0]: 'sm90' is not an sm number like 90 or 90a"),
    ("bad-platform", CU126 + "platforms: [win-64]\n",
     "envs/cu126.yaml:8: platforms[0]: 'win-64' is not one of linux-64, linux-aarch64"),
    ("bad-jobs", CU126 + "build:\n  jobs: lots\n",
     "envs/cu126.yaml:9: build.jobs: 'lots' is not a positive integer or auto"),
    ("boolean-for-string", CU126 + "description: yes\n",
     "envs/cu126.yaml:8: description: expected a string, got a boolean"),
    ("empty-file", "",
     "envs/cu126.yaml: empty file (a spec needs at least `extends: base`)"),
    ("top-level-list", "- extends\n- base\n",
     "envs/cu126.yaml:1: top level must be a mapping of fields, got list"),
    ("duplicate-key", CU126 + "python: '3.11'\n",
     "envs/cu126.yaml:8: python: duplicate key (keep one)"),
    ("missing-extends-target", CU126.replace("extends: base", "extends: bsae"),
     "envs/cu126.yaml:1: extends: no spec named 'bsae' in envs/ (known: base, cu126)"),
    ("missing-required", "extends: base\ncuda: '12.6'\npython: '3.12'\ngcc: 13\n",
     "envs/cu126.yaml: missing required fields torch.version, torch.index (set them here or in "
     "envs/base.yaml)"),
    ("bad-placeholder", CU126 + "conda_packages:\n  cuda-nvcc: '{cudaa}.*'\n",
     "envs/cu126.yaml:9: conda_packages.cuda-nvcc: bad placeholder in '{cudaa}.*' ('cudaa'; "
     "allowed: {cuda}, {python}, {gcc})"),
    # issue 14: the forms of the hostile-spec refusals (tests/test_hostile_spec.py has the full set)
    ("alias", CU126 + "description: &d x\n",
     "envs/cu126.yaml:8: anchors and aliases (&name, *name) are not allowed in a spec (write the value out; "
     "specs share values through `extends`)"),
    ("placeholder-attribute", CU126 + "conda_packages:\n  cuda-nvcc: '{cuda.real}'\n",
     "envs/cu126.yaml:9: conda_packages.cuda-nvcc: bad placeholder in '{cuda.real}' ('cuda.real'; "
     "allowed: {cuda}, {python}, {gcc})"),
    ("empty-archs", CU126 + "archs: []\n",
     'envs/cu126.yaml:8: archs: empty (list at least one, e.g. archs: ["80", "90"])'),
    ("duplicate-platform", CU126 + "platforms: [linux-64, linux-64]\n",
     "envs/cu126.yaml:8: platforms[1]: duplicate of platforms[0] 'linux-64' (keep one)"),
    ("pip-version-newline", CU126 + "pip_packages:\n  packaging: \">=1\\n--index-url https://evil.example\"\n",
     "envs/cu126.yaml:9: pip_packages.packaging: '>=1\\n--index-url https://evil.example' is not a pip version "
     "specifier like \"*\", \">=1.2\" or \"==2.0.*\" (comparisons joined by commas, no spaces, markers or URLs; "
     "==1.2 for one version)"),
    ("jobs-out-of-range", CU126 + "build:\n  jobs: 1000000000000000000000000000000\n",
     "envs/cu126.yaml:9: build.jobs: 1000000000000000000000000000000 is out of range (1 to 4096)"),
    ("control-byte", CU126 + "# \x1b[2J\n",
     "envs/cu126.yaml:8: U+001B (a control character) in the file (delete it: a spec is plain text)"),
    ("extends-path", CU126.replace("extends: base", "extends: ../../etc/passwd"),
     "envs/cu126.yaml:1: extends: '../../etc/passwd' is not a spec name like base (the name of a spec in the same "
     "folder, not a path)"),
]


@pytest.mark.parametrize("name,text,expected", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_with_exit_1(envs, capsys, name, text, expected):
    (envs / "cu126.yaml").write_text(text)
    code = main(["check", "cu126"])
    out, err = capsys.readouterr()
    assert code == 1
    assert (out.strip(), err) == (expected, "")
    assert "Traceback" not in out + err


def test_cyclic_extends(envs, capsys):
    (envs / "a.yaml").write_text("extends: b\n")
    (envs / "b.yaml").write_text("extends: a\n")
    code, out, _ = check(capsys, "a")
    assert code == 1
    assert out == ["envs/a.yaml: cyclic extends: envs/a.yaml -> envs/b.yaml -> envs/a.yaml (remove one `extends`)"]


def test_unknown_line_on_the_command_line(envs, capsys):
    code = main(["check", "cu999"])
    assert code == 1
    assert capsys.readouterr().err.strip() == "error: envs/cu999.yaml: no spec for line 'cu999' (known lines: cu126)"


def test_broken_base_reported_once_for_all_lines(envs, capsys):
    (envs / "cu128.yaml").write_text(CU126.replace("12.6", "12.8").replace("cu126", "cu128"))
    (envs / "base.yaml").write_text(BASE + "bogus: 1\n")
    code, out, _ = check(capsys)
    assert code == 1
    assert out == ["envs/base.yaml:18: bogus: unknown field (known fields: extends, description, cuda, python, gcc, "
                   "platforms, channels, conda_packages, pip_packages, torch, flash_attn_2, flash_attn_4, flash_attn_3, "
                   "archs, build, toolchain)"]


# ---------------------------------------------------------------- every rule: a failing example (one line, exact)

RULE_FAILURES = [
    ("cuda-line-known", {"cuda": '"12.5"'}, "cu125",
     "envs/cu125.yaml:2: cuda: CUDA 12.5 is not a known CUDA line (known: 11.8, 12.1, 12.4, 12.6, 12.8, 12.9, 13.0, "
     "13.1, 13.2, 13.3, 13.4, 13.5)"),
    ("line-name-matches-cuda", {"cuda": '"12.8"'}, "cu126",
     "envs/cu126.yaml:2: cuda: file cu126.yaml says CUDA 12.8 (cu128): rename it or fix cuda"),
    ("torch-known", {"torch_version": "2.16.0"}, "cu126",
     "envs/cu126.yaml:6: torch.version: torch 2.16 is not in the compatibility data (known: 2.0-2.15); add it with "
     "its source to toolkit/knowledge/torch_releases.yaml"),
    ("torch-has-build-for-line", {"cuda": '"11.8"', "torch_version": "2.8.0", "index": "cu118", "gcc": "11",
                                  "flash_attn": "2.7.3"}, "cu118",
     "envs/cu118.yaml:6: torch.version: torch 2.8.0 has no cu118 build (cu118 builds: torch 2.0-2.7)"),
    ("torch-local-tag-matches-line", {"torch_version": "2.9.1+cu128"}, "cu126",
     "envs/cu126.yaml:6: torch.version: torch 2.9.1+cu128 is a cu128 build but the line is cu126 (use +cu126 or "
     "no tag)"),
    ("torch-index-serves-line", {"index": "cu124"}, "cu126",
     "envs/cu126.yaml:7: torch.index: index serves cu124 wheels but the line is cu126 "
     "(use https://download.pytorch.org/whl/cu126)"),
    ("channels-provide-cuda-toolchain", {"cuda": '"11.8"', "torch_version": "2.7.1", "index": "cu118", "gcc": "11",
                                         "flash_attn": "2.7.3"}, "cu118",
     "envs/cu118.yaml: channels: CUDA 11.8's nvcc comes from nvidia/label/cuda-11.8.0, which channels lack (use "
     "channels: [nvidia/label/cuda-11.8.0, conda-forge], or a mirror of them) [set in envs/base.yaml:2]"),
    ("python-has-torch-wheel", {"python": '"3.14"', "torch_version": "2.8.0"}, "cu126",
     "envs/cu126.yaml:3: python: torch 2.8 has no wheel for python 3.14 (torch 2.8 wheels: python 3.9-3.13)"),
    ("gcc-allowed-by-conda-nvcc", {"cuda": '"12.4"', "torch_version": "2.6.0", "index": "cu124"}, "cu124",
     "envs/cu124.yaml:4: gcc: gcc 13 cannot be installed beside conda-forge's nvcc 12.4: every cuda-nvcc-impl build "
     "(12.4.99, 12.4.131) has run_constrained gcc_impl >=6,<13 (use gcc 12, or CUDA 12.6+ for gcc 13; see "
     "toolkit/knowledge/conda_forge_nvcc.yaml)"),
    ("flash-attn-patch-known", {"cuda": '"13.0"', "torch_version": "2.14.1", "index": "cu130", "gcc": "14",
                                "flash_attn": "2.8.2"}, "cu130",
     "envs/cu130.yaml:9: flash_attn_2.version: flash-attn 2.8.2 with torch 2.14.1 cannot build: torch >= 2.13 headers "
     "need C++20 and this setup.py passes -std=c++17; no patch in toolkit/knowledge/patches.yaml covers 2.8.2 (use "
     "flash-attn 2.8.3.post2, which a patch fixes, a torch that is not >=2.13, or add a patch for it)"),
    ("gcc-accepted-by-nvcc", {"gcc": "14"}, "cu126",
     "envs/cu126.yaml:4: gcc: gcc 14 is newer than nvcc 12.6 accepts (max gcc 13: use gcc <= 13 or CUDA 12.8+)"),
    ("archs-targetable-by-nvcc", {"archs": '["90", "100"]'}, "cu126",
     "envs/cu126.yaml:8: archs: nvcc 12.6 cannot target sm_100 (sm_100 needs CUDA 12.8+; 12.6 targets sm_50-sm_90a)"),
    ("archs-supported-by-flash-attn", {"archs": '["75", "80"]'}, "cu126",
     "envs/cu126.yaml:8: archs: sm_75 below sm_80: FlashAttention-2 needs Ampere or newer (drop it)"),
    ("archs-built-by-flash-attn", {"archs": '["80", "86"]'}, "cu126",
     "envs/cu126.yaml:8: archs: flash-attn 2.8.3.post2's setup.py compiles only sm_80, sm_90, sm_100, sm_120 and "
     "silently skips sm_86 (drop it: sm_80 code runs on sm_86/sm_89)"),
    ("flash-attn-released", {"flash_attn": "2.9.9"}, "cu126",
     "envs/cu126.yaml:9: flash_attn_2.version: flash-attn 2.9.9 is not a released version (newest known: 2.8.3.post2; "
     "see toolkit/knowledge/flash_attn_2.yaml)"),
    ("flash-attn-cuda-floor", {"cuda": '"11.8"', "torch_version": "2.7.1", "index": "cu118", "gcc": "11"}, "cu118",
     "envs/cu118.yaml:9: flash_attn_2.version: flash-attn 2.8.3.post2 needs CUDA >= 12.0 (use flash-attn <= 2.7.3 for "
     "CUDA 11.8)"),
    ("flash-attn-torch-floor", {"cuda": '"12.1"', "torch_version": "2.1.2", "index": "cu121", "gcc": "12",
                                "python": '"3.11"'}, "cu121",
     "envs/cu121.yaml:9: flash_attn_2.version: flash-attn 2.8.3.post2 needs torch >= 2.2 (raise torch.version)"),
]


def write_line(envs: Path, name: str, values: dict) -> None:
    v = {"cuda": '"12.6"', "python": '"3.12"', "gcc": "13", "torch_version": "2.9.1", "index": "cu126",
         "archs": '["80", "90"]', "flash_attn": "2.8.3.post2", **values}
    (envs / f"{name}.yaml").write_text(
        f"extends: base\ncuda: {v['cuda']}\npython: {v['python']}\ngcc: {v['gcc']}\ntorch:\n"
        f"  version: \"{v['torch_version']}\"\n  index: https://download.pytorch.org/whl/{v['index']}\n"
        f"archs: {v['archs']}\nflash_attn_2: {{version: \"{v['flash_attn']}\"}}\n"
        + (f"channels: {v['channels']}\n" if "channels" in v else ""))


def test_every_rule_has_a_failing_example():
    assert {r[0] for r in RULE_FAILURES} | {"locked-toolchain-has-no-external-fields", "external-nvcc-is-line",
                                            "external-gcc-is-spec-gcc", "external-python-is-spec-python",
                                            "external-torch-is-spec-torch",
                                            "external-torch-is-line-build"} \
        | {"pypi-line-known", "pypi-torch-pairs-with-cuda", "pypi-platforms-checked",
           "pypi-has-no-conda-layer"} \
        | {name for name, _, _ in fa4_rules.CHECKS} | {name for name, _, _ in fa3_rules.CHECKS} \
        == {r.name for r in RULES}  # FA4: test_fa4_rules.py; FA3: test_fa3.py; pypi: test_pypi_lines.py


@pytest.mark.parametrize("rule,values,name,expected", RULE_FAILURES, ids=[r[0] for r in RULE_FAILURES])
def test_rule_fails_with_its_fix(envs, capsys, rule, values, name, expected):
    write_line(envs, name, values)
    code, out, _ = check(capsys, name)
    assert code == 1
    assert expected in out, out


@pytest.mark.parametrize("name,values", [
    ("cu118", {"cuda": '"11.8"', "torch_version": "2.7.1", "index": "cu118", "gcc": "11", "flash_attn": "2.7.3",
               "python": '"3.11"', "channels": "[nvidia/label/cuda-11.8.0, conda-forge]"}),
    ("cu121", {"cuda": '"12.1"', "torch_version": "2.5.1", "index": "cu121", "gcc": "12", "python": '"3.11"'}),
    ("cu128", {"cuda": '"12.8"', "torch_version": "2.9.1+cu128", "index": "cu128", "gcc": "14",
               "archs": '["80", "90", "100", "120"]'}),
    ("cu130", {"cuda": '"13.0"', "torch_version": "2.9.0", "index": "cu130", "gcc": "15", "archs": '["80", "120"]'}),
])
def test_rules_pass_on_allowed_combinations(envs, capsys, name, values):
    write_line(envs, name, values)
    code, out, _ = check(capsys, name)
    assert code == 0, out


def test_all_violations_reported_not_just_the_first(envs, capsys):
    write_line(envs, "cu126", {"gcc": "14", "archs": '["75", "100"]', "flash_attn": "2.9.9"})
    code, out, _ = check(capsys, "cu126")
    assert code == 1 and len(out) == 4
    assert [line.split(": ")[1] for line in out] == ["gcc", "archs", "archs", "flash_attn_2.version"]


def test_value_from_base_points_at_base(envs, capsys):
    (envs / "base.yaml").write_text(BASE.replace('archs: ["80", "90"]', 'archs: ["70", "80"]'))
    code, out, _ = check(capsys, "cu126")
    assert out[0] == ("envs/cu126.yaml: archs: sm_70 below sm_80: FlashAttention-2 needs Ampere or newer (drop it) "
                      "[set in envs/base.yaml:12]")


EXTERNAL = """\
extends: cu126
toolchain:
  kind: external
  cuda_home: /usr/local/cuda
  python_executable: /usr/bin/python3
  nvcc: "12.6"
  gcc: 13
  python: "3.12"
  torch: "2.9.1+cu126"
  cxx11_abi: true
"""


def test_external_toolchain_must_match_the_spec(envs, capsys):
    (envs / "site.yaml").write_text(EXTERNAL)
    assert check(capsys, "site")[0] == 0
    (envs / "site.yaml").write_text(EXTERNAL.replace('nvcc: "12.6"', 'nvcc: "12.4"').replace("gcc: 13", "gcc: 12")
                                    .replace('python: "3.12"', 'python: "3.11"').replace("2.9.1+cu126", "2.8.0+cu126"))
    code, out, _ = check(capsys, "site")
    assert code == 1
    assert out == [
        "envs/site.yaml:6: toolchain.nvcc: the external toolchain has nvcc 12.4 but the spec builds for cuda 12.6 "
        "(make them equal)",
        "envs/site.yaml:7: toolchain.gcc: the external toolchain has gcc 12 but the spec builds for gcc 13 "
        "(make them equal)",
        "envs/site.yaml:8: toolchain.python: the external toolchain has python 3.11 but the spec builds for python "
        "3.12 (make them equal)",
        "envs/site.yaml:9: toolchain.torch: the external toolchain has torch 2.8.0+cu126 but the spec builds for "
        "torch 2.9.1 (make them equal)",
    ]


def test_external_toolchain_needs_its_fields(envs, capsys):
    (envs / "site.yaml").write_text("extends: cu126\ntoolchain:\n  kind: external\n")
    code, out, _ = check(capsys, "site")
    assert code == 1
    assert out == ["envs/site.yaml: missing required fields toolchain.cuda_home, toolchain.python_executable, "
                   "toolchain.nvcc, toolchain.gcc, toolchain.python, toolchain.torch, toolchain.cxx11_abi "
                   "(set them here or in envs/base.yaml)"]


def test_locked_toolchain_rejects_external_fields(envs, capsys):
    (envs / "cu126.yaml").write_text(CU126 + "toolchain:\n  nvcc: '12.6'\n")
    code, out, _ = check(capsys, "cu126")
    assert out == ["envs/cu126.yaml:8: toolchain: nvcc only apply to kind: external (a locked toolchain comes from "
                   "the lock; remove them or set kind: external)"]


# ---------------------------------------------------------------- knowledge data


def test_knowledge_has_sources_for_every_file():
    import yaml

    from toolkit.knowledge.files import KNOWLEDGE_DIR
    for path in KNOWLEDGE_DIR.glob("*.yaml"):
        assert yaml.safe_load(path.read_text()).get("sources"), f"{path.name} names no sources"


@pytest.mark.nvcc
def test_knowledge_archs_of_13_0_match_the_real_nvcc():
    done = subprocess.run([tool_on_path("nvcc"), "--list-gpu-code"], capture_output=True, text=True, check=True)
    real = {line.removeprefix("sm_") for line in done.stdout.split()}
    plain = {a for a in load_knowledge().cuda_lines["13.0"].archs if a.isdigit()}
    assert plain == real


# ---------------------------------------------------------------- matrix and CLI surface


def test_matrix_json(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["matrix", "show", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_line = {r["line"]: r for r in rows}
    assert by_line["cu118"]["driver_floor"] == "520.61.05"
    assert by_line["gpu-machine"]["toolchain"] == "external"
    assert by_line["cu126"]["torch_experimental"] is False
    assert set(rows[0]) >= {"line", "cuda", "python", "torch", "gcc", "flash_attn", "archs", "driver_floor",
                            "toolchain"}
    # issue 34: archs no GPU of this project has run (gpus.yaml `ran`: sm_90 only) are said, per line
    assert by_line["py-cu132"]["never_ran"] == ["80", "100", "120"]
    assert by_line["gpu-machine"]["never_ran"] == []


def test_matrix_table(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["matrix", "show", "cu126"]) == 0
    out = capsys.readouterr().out
    assert "cu126" in out and "560.28.03" in out and "cu118" not in out


def test_matrix_fits_80_columns_with_every_line_name_whole():
    """At 80 columns rich cut every line name to `cu1…`: the table may wrap or abbreviate other columns, never
    the line names, and no printed row may be wider than the terminal."""
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run([sys.executable, "-m", "toolkit", "matrix"], capture_output=True, text=True, cwd=ROOT,
                          env=env)
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    too_wide = [row for row in rows if len(row) > 80]
    assert not too_wide, too_wide
    names = sorted(p.stem for p in (ROOT / "envs").glob("*.yaml") if p.stem != "base")
    assert "gpu-machine-fa4" in names  # the longest name today
    notes = next(i for i, row in enumerate(rows) if re.match(r"[\w.+-]+: ", row))  # `cu126: old stack: ...`
    table = rows[:notes]
    for name in names:  # the first cell of a table row is the whole name
        cell = re.compile(rf"^[\s│┃]*{re.escape(name)}([\s│┃]|$)")
        assert any(cell.search(row) for row in table), (name, done.stdout)


def test_every_verb_has_help():
    from toolkit.cli import build_parser
    parser = build_parser()
    verbs = parser._subparsers._group_actions[0].choices
    assert {"check", "matrix"} <= set(verbs)
    for name, sub in verbs.items():
        assert sub.format_help().strip(), name
    done = subprocess.run([sys.executable, "-m", "toolkit", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and "check" in done.stdout


def test_console_script_installed():
    done = subprocess.run(["toolkit", "check", "--help"], capture_output=True, text=True,
                          env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    assert done.returncode == 0 and "compatibility" in done.stdout


def test_nox_sessions_come_from_envs():
    listed = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True).stdout
    sessions = {line.split()[1] for line in listed.splitlines() if line[:2] in ("* ", "- ")}
    lines = {p.stem for p in (ROOT / "envs").glob("*.yaml")} - {"base"}
    for line in lines:
        assert {f"check-{line}", f"lock-{line}", f"build-{line}", f"verify-{line}", f"bench-{line}"} <= sessions
    assert "env-cu126" in sessions and "env-gpu-machine" not in sessions  # external: nothing to install


def test_a_mirror_of_the_nvidia_channel_counts(envs, capsys):
    write_line(envs, "cu118", {"cuda": '"11.8"', "torch_version": "2.7.1", "index": "cu118", "gcc": "11",
                               "flash_attn": "2.7.3", "python": '"3.11"',
                               "channels": "[https://conda.example.org/nvidia/label/cuda-11.8.0/, conda-forge]"})
    assert check(capsys, "cu118")[0] == 0
