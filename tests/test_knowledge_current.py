"""Knowledge current to 2026-12 and the command that keeps it so (`toolkit knowledge check-updates`), run on
index answers recorded from PyPI on 2026-12-01 (tests/data/upstream, see tests/data/README.md)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit import upstream
from toolkit.cli import main
from toolkit.knowledge import load_knowledge
from toolkit.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests/data/upstream"
SIMPLE_PAGE = ROOT / "tests/data/pypi_simple_torch_2.14-2.15.html"


def recorded_report(kb=None) -> upstream.Report:
    return upstream.check_updates(upstream.recorded_fetch(RECORDED), kb)


# ---------------------------------------------------------------- the facts


def test_torch_2_14_and_2_15_with_their_cuda_lines():
    kb = load_knowledge()
    assert kb.torch_releases["2.14"].cuda == ("12.6", "13.0", "13.2")
    assert kb.torch_releases["2.14"].experimental == ()
    assert kb.torch_releases["2.15"].cuda == ("13.2",)
    assert kb.torch_releases["2.15"].python[0] == "3.11"  # 2.15.0's files start at cp311 on PyPI
    assert kb.torch_lines("13.2") == ["2.12", "2.13", "2.14", "2.15"]


def test_cuda_13_1_and_13_2_as_nvidia_wheels_say():
    kb = load_knowledge()
    for cuda in ("13.1", "13.2"):
        line = kb.cuda_lines[cuda]
        assert line.max_gcc == 15 and line.archs == kb.cuda_lines["13.0"].archs
    assert kb.cuda_lines["13.1"].torch_index is None  # no torch release ships cu131
    assert kb.cuda_lines["13.2"].tag == "cu132"


def test_conda_forge_packaging_known_for_every_line():
    kb = load_knowledge()
    assert set(kb.cuda_lines) <= set(kb.nvcc_packaging)
    for cuda, packaging in kb.nvcc_packaging.items():
        assert all(len(b.commit) == 40 and b.version.startswith(cuda + ".") for b in packaging.builds), cuda


def test_recorded_pypi_answers_cover_no_newer_torch_or_flash_attn():
    """On the day of recording the knowledge covered every torch, flash-attn and flash-attn-4 release."""
    findings = recorded_report().findings
    assert [f for f in findings if f.package in ("torch", "flash-attn", "flash-attn-4")] == []


def test_at_least_one_line_builds_the_newest_torch(monkeypatch):
    monkeypatch.chdir(ROOT)
    newest = list(load_knowledge().torch_releases)[-1]
    lines = [load_spec(p) for p in (ROOT / "envs").glob("cu*.yaml")]
    assert any(s.torch_version.startswith(newest + ".") for s in lines)


# ---------------------------------------------------------------- the check on recorded answers


def test_check_names_cuda_releases_the_knowledge_lacks():
    """NVIDIA's PyPI wheels went on to 13.3-13.5; conda-forge's feedstocks (and so the knowledge) stop at 13.2."""
    findings = {(f.package, f.versions) for f in recorded_report().findings}
    assert ("nvidia-cuda-nvcc", ("13.3.33", "13.3.73")) in findings
    assert ("nvidia-cuda-nvcc", ("13.5.37",)) in findings
    assert ("nvidia-cuda-runtime", ("13.4.49", "13.4.92")) in findings
    assert not any("13.4.46rc1" in f.versions for f in recorded_report().findings)  # pre-releases are not news


def test_check_names_a_torch_release_the_knowledge_lacks():
    kb = load_knowledge()
    older = dataclasses.replace(kb, torch_releases={k: v for k, v in kb.torch_releases.items() if k != "2.15"})
    torch = [f for f in recorded_report(older).findings if f.package == "torch"]
    assert [f.versions for f in torch] == [("2.15.0",)]
    assert "torch 2.15 (released 2026-10-28) is not in toolkit/knowledge/torch_releases.yaml" in str(torch[0])


def test_check_names_flash_attn_releases_the_knowledge_lacks():
    kb = load_knowledge()
    older = dataclasses.replace(kb, fa_released=kb.fa_released[:-2])
    fa = [f for f in recorded_report(older).findings if f.package == "flash-attn"]
    assert [f.versions for f in fa] == [("2.8.3.post1",), ("2.8.3.post2",)]


def test_check_names_newer_flash_attn_4(monkeypatch):
    watch = upstream.watch_list()
    for entry in watch["pypi"]:
        if entry["package"] == "flash-attn-4":
            entry["newest_known"] = "4.0.0b34"
    monkeypatch.setattr(upstream, "watch_list", lambda: watch)
    [fa4] = [f for f in recorded_report().findings if f.package == "flash-attn-4"]
    assert fa4.versions == ("4.0.0b35", "4.0.0b36")


def test_index_page_versions_from_a_real_pep503_page():
    assert upstream.index_page_versions(SIMPLE_PAGE.read_bytes()) == {"2.14.0", "2.14.1", "2.15.0"}


def test_a_line_index_serving_a_torch_the_knowledge_does_not_list_for_it():
    kb = load_knowledge()
    [gap] = upstream.line_gaps(kb, "cu130", "13.0", {"2.15.0+cu130", "2.14.1+cu130", "2.16.0.dev20261101+cu130"})
    assert gap.versions == ("2.15",) and "lists 2.15 for CUDA 13.2 only (add 13.0)" in gap.message


def test_cli_on_recorded_answers(capsys):
    code = main(["knowledge", "check-updates", "--recorded", str(RECORDED)])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert sum(line.startswith("nvidia-cuda-nvcc ") for line in out) == 3
    # download.pytorch.org could not be recorded from here: named, never silently skipped
    assert "not checked: https://download.pytorch.org/whl/cu132/torch/ (not recorded)" in out


def test_record_then_replay_gives_the_same_findings(tmp_path):
    report = recorded_report()
    upstream.record(tmp_path, report.answers)
    index = json.loads((tmp_path / "index.json").read_text())
    assert set(index) == set(report.answers) and all(v["recorded"] for v in index.values())
    assert upstream.check_updates(upstream.recorded_fetch(tmp_path)).findings == report.findings


def test_missing_recording_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "toolkit", "knowledge", "check-updates", "--recorded",
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: {tmp_path}/index.json: unreadable index of recorded answers (file not found; ")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.network
def test_live_pypi_answers_parse():
    """PyPI answers today: the same parser reads them (skip where PyPI is unreachable)."""
    try:
        answer = upstream.live_fetch(upstream.PYPI_JSON.format(package="flash-attn-4"))
    except OSError as exc:
        pytest.skip(f"PyPI not reachable: {exc}")
    versions = {r.version for r in upstream.pypi_releases("flash-attn-4", answer, "")}
    assert "4.0.0b36" in versions


def test_matrix_says_which_lines_are_current_and_which_patches_they_get(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["matrix", "--json"]) == 0
    rows = {r["line"]: r for r in json.loads(capsys.readouterr().out)}
    assert {line for line, r in rows.items() if r["status"] == "current"} == {"cu130", "cu132"}
    assert rows["cu132"]["patches"] == rows["cu130"]["patches"] == ["flash-attn-2.8.3-cxx20.patch"]
    assert rows["cu124"]["status"] == "old stack"
    assert rows["cu124"]["status_note"] == "torch 2.6 is the last with cu124 wheels (newest torch: 2.15)"
    assert rows["cu126"]["status_note"] == "torch 2.14 ships cu126 (this line keeps torch 2.9)"
    assert rows["cu126"]["patches"] == []
    monkeypatch.setenv("COLUMNS", "220")
    assert main(["matrix", "cu132"]) == 0
    out = capsys.readouterr().out
    assert "flash-attn-2.8.3-cxx20.patch" in out and "cu132: current: torch 2.15 is the newest with cu132" in out
