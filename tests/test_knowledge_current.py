"""Knowledge current to 2026-12 and the command that keeps it so (`toolkit knowledge check-updates`), run on
index answers recorded from PyPI on 2026-12-01 (tests/data/upstream, see tests/data/README.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import subprocess
import sys
import urllib.parse
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from conftest import pypi_unreachable
from packaging.requirements import Requirement

from toolkit.cli import main
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge import upstream
from toolkit.knowledge.facts import load_knowledge
from toolkit.spec.envspec import load_spec

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


def test_cuda_13_3_to_13_5_as_nvidia_wheels_say():
    """crt/host_config.h and `nvcc --list-gpu-code` of the 13.3.73, 13.4.92 and 13.5.37 wheels (sources "13.3-13.5")."""
    kb = load_knowledge()
    assert kb.cuda_lines["13.3"].max_gcc == 15 and kb.cuda_lines["13.3"].archs == kb.cuda_lines["13.0"].archs
    for cuda in ("13.4", "13.5"):
        line = kb.cuda_lines[cuda]
        assert line.max_gcc == 16
        assert set(line.archs) - set(kb.cuda_lines["13.0"].archs) == {"107", "107a", "107f"}
        assert line.torch_index is None and line.conda_channels == ()  # nvcc from PyPI only (pypi_cuda.yaml)
    assert kb.cuda_lines["13.3"].min_driver == "610.43.02"  # cuda_13.3.0_610.43.02_linux.run


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


def without_cuda(*lines: str):
    kb = load_knowledge()
    return dataclasses.replace(kb, cuda_lines={k: v for k, v in kb.cuda_lines.items() if k not in lines})


def test_recorded_pypi_answers_cover_every_cuda_release():
    """NVIDIA's PyPI wheels on the day of recording went to 13.5; the knowledge has every line up to it."""
    findings = recorded_report().findings
    assert [f for f in findings if f.package.startswith("nvidia-")] == []


def test_check_names_cuda_releases_the_knowledge_lacks():
    """The recorded wheels of 13.3-13.5 (NVIDIA's PyPI uploads from 2026-05-26 on) are news to a knowledge without them."""
    findings = {(f.package, f.versions) for f in recorded_report(without_cuda("13.3", "13.4", "13.5")).findings}
    assert ("nvidia-cuda-nvcc", ("13.3.33", "13.3.73")) in findings
    assert ("nvidia-cuda-nvcc", ("13.4.59", "13.4.92")) in findings
    assert ("nvidia-cuda-nvcc", ("13.5.37",)) in findings
    assert ("nvidia-cuda-runtime", ("13.4.49", "13.4.92")) in findings
    assert not any("13.4.46rc1" in versions for _, versions in findings)  # pre-releases are not news
    [only] = [f for f in recorded_report(without_cuda("13.4")).findings if f.package == "nvidia-cuda-nvcc"]
    assert only.versions == ("13.4.59", "13.4.92")
    assert "CUDA 13.4 (first wheel 2026-09-09) is not in toolkit/knowledge/cuda_lines.yaml" in str(only)


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
    assert not any(line.startswith("nvidia-") for line in out)  # exit 1: the torch indexes below
    # download.pytorch.org could not be recorded from here: named, never silently skipped
    assert "not checked: https://download.pytorch.org/whl/cu132/torch/ (not recorded)" in out


def test_record_then_replay_gives_the_same_findings(tmp_path):
    report = recorded_report()
    upstream.record(tmp_path, report.answers)
    index = json.loads((tmp_path / "index.json").read_text())["answers"]
    assert set(index) == set(report.answers) and all(v["recorded"] for v in index.values())
    assert upstream.check_updates(upstream.recorded_fetch(tmp_path)).findings == report.findings



# A release of each watched package that the knowledge does not cover, as PyPI's JSON lists it: a wheel and an sdist.
UNCOVERED = {"torch": "2.16.0", "flash-attn": "2.8.4", "flash-attn-4": "4.0.0b41", "nvidia-cuda-nvcc": "13.6.20",
             "nvidia-cuda-runtime": "13.6.20"}


def recording_with(tmp_path: Path, yanked: bool) -> Path:
    """The recorded answers, each PyPI one with an UNCOVERED release added whose files are all `yanked`."""
    folder = tmp_path / ("yanked" if yanked else "live")
    shutil.copytree(RECORDED, folder)
    for package, version in UNCOVERED.items():
        path = folder / json.loads((RECORDED / "index.json").read_text())[upstream.PYPI_JSON.format(package=package)][
            "file"]
        data = json.loads(path.read_text())
        data["releases"][version] = [
            {"filename": f"{package.replace('-', '_')}-{version}{suffix}", "upload_time": "2027-01-05T10:00:00",
             "yanked": yanked, "yanked_reason": "broken wheel" if yanked else None}
            for suffix in ("-py3-none-any.whl", ".tar.gz")]
        path.write_text(json.dumps(data))
    return folder


def test_a_yanked_release_is_no_news(tmp_path):
    """PyPI's JSON marks a withdrawn release's files "yanked": true; the same releases unyanked are each named."""
    before = recorded_report().findings
    live = upstream.check_updates(upstream.recorded_fetch(recording_with(tmp_path, yanked=False))).findings
    named = {(f.package, version) for f in set(live) - set(before) for version in f.versions}
    assert named == set(UNCOVERED.items())
    yanked = recording_with(tmp_path, yanked=True)
    assert upstream.check_updates(upstream.recorded_fetch(yanked)).findings == before
    replayed = tmp_path / "replayed"  # --record keeps one file of each release, with its yanked flag
    upstream.record(replayed, upstream.check_updates(upstream.recorded_fetch(yanked)).answers)
    assert upstream.check_updates(upstream.recorded_fetch(replayed)).findings == before


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
        pypi_unreachable(exc)
    versions = {r.version for r in upstream.pypi_releases("flash-attn-4", answer, "")}
    assert "4.0.0b36" in versions


# ---------------------------------------------------------------- what PyPI's own wheels pin


def torch_pypi_cuda() -> dict[str, str]:
    """torch_releases.yaml's `pypi`: the CUDA release of PyPI's own torch wheels per minor (typed by no stage yet)."""
    return {minor: facts["pypi"] for minor, facts in knowledge_files.read("torch_releases.yaml")["releases"].items()}


def test_torch_2_14_on_pypi_is_cuda_13_0_and_2_15_is_13_2():
    pypi = torch_pypi_cuda()
    assert set(pypi) == set(load_knowledge().torch_releases)
    assert pypi["2.14"] == pypi["2.13"] == "13.0" and pypi["2.15"] == "13.2"
    assert {cuda for cuda in pypi.values() if cuda.startswith("13.")} <= {line["cuda"] for line in pypi_cuda()["lines"].values()}


def pypi_cuda() -> dict:
    """pypi_cuda.yaml through the knowledge reader, each line with the fields the `pypi` kind reads."""
    def build(data: dict) -> dict:
        for release, facts in data["lines"].items():
            for key in ("cuda", "components", "pins", "symlinks", "torch"):
                if key not in facts:
                    raise KeyError(f"lines.{release}.{key}")
        return data
    return knowledge_files.typed("pypi_cuda.yaml", build)


def test_pypi_cuda_loads_through_the_knowledge_reader():
    data = pypi_cuda()
    assert list(data["lines"]) == ["13.0.3", "13.0.2", "13.2.2", "13.3.1", "13.4.3", "13.5.0"]
    assert {line["cuda"] for line in data["lines"].values()} <= set(load_knowledge().cuda_lines)
    line = data["lines"]["13.2.2"]
    assert line["cuda"] == "13.2" and line["torch"] == ["2.15.0"]
    assert data["lines"]["13.0.2"]["torch"] == ["2.11.0", "2.12.0", "2.12.1"]  # https://pypi.org/simple/torch/
    assert line["pins"] == {"nvidia-nvjitlink": "==13.2.86.*", "cuda-bindings": "==13.2.*"}
    assert data["lines"]["13.0.3"]["symlinks"]["lib64"] == "lib" and "lib64" not in line["symlinks"]
    assert data["cuda_home"] == "nvidia/cu13" and {"nvcc", "cccl", "crt", "nvvm", "cudart"} <= set(data["extras"])
    assert "cuda_12" in data and "12" not in {line["cuda"].split(".")[0] for line in data["lines"].values()}


def pypi_wheel(package: str, version: str, want: str) -> tuple[str, bytes]:
    """(url, bytes) of the first file of package==version whose name has `want`, checked against PyPI's sha256."""
    answer = upstream.live_fetch(upstream.PYPI_JSON.format(package=package))
    [entry] = [f for f in json.loads(answer)["releases"][version] if want in f["filename"]][:1]
    url = urllib.parse.urljoin(upstream.PYPI_JSON.format(package=package), entry["url"])
    body = upstream.live_fetch(url)
    assert hashlib.sha256(body).hexdigest() == entry["digests"]["sha256"]
    return url, body


@pytest.mark.network
def test_pypi_cuda_pins_are_what_the_cuda_toolkit_wheels_pin():
    """Each line's cuda-toolkit wheel (~2.6 KB, from PyPI) pins every component at the recorded version, ==X.*,
    and leaves nvjitlink at the floor the line pins: e.g. 13.2.2's [nvcc] gives nvidia-cuda-nvcc==13.2.86.*."""
    data = pypi_cuda()
    linux = {"sys_platform": "linux", "platform_machine": "x86_64"}
    for release, line in data["lines"].items():
        cuda = line["cuda"]
        _, wheel = pypi_wheel("cuda-toolkit", release, "none-any.whl")
        with zipfile.ZipFile(io.BytesIO(wheel)) as zf:
            [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            metadata = Parser().parsestr(zf.read(name).decode())
        pinned: dict[str, set[str]] = {}
        for text in metadata.get_all("Requires-Dist"):
            req = Requirement(text)
            if any(req.marker and req.marker.evaluate({**linux, "extra": e}) for e in data["extras"]):
                pinned.setdefault(req.name, set()).add(str(req.specifier))
        # 13.0.3 on: cusparse/cusolver's extras let nvjitlink float from the release's own; 13.0.2's extras leave it
        # out (only its `nvjitlink` extra pins it): either way the line's pin is what holds it to the release
        assert pinned.pop("nvidia-nvjitlink", None) in ({f"<14,>={line['pins']['nvidia-nvjitlink'][2:-2]}"}, None), cuda
        assert pinned == {name: {f"=={version}.*"} for name, version in line["components"].items()}, cuda
        if cuda == "13.2":
            assert pinned["nvidia-cuda-nvcc"] == {"==13.2.86.*"}


@pytest.mark.network
def test_torch_pypi_cuda_is_what_the_wheel_metadata_pins():
    """torch 2.14.0's PEP 658 metadata (a few KB) pins cuda-toolkit 13.0.3, the release torch_releases.yaml names."""
    answer = json.loads(upstream.live_fetch(upstream.PYPI_JSON.format(package="torch")))
    [wheel] = [f for f in answer["releases"]["2.14.0"]
               if f["filename"] == "torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
    url = urllib.parse.urljoin(upstream.PYPI_JSON.format(package="torch"), wheel["url"]) + ".metadata"
    metadata = Parser().parsestr(upstream.live_fetch(url).decode())
    [toolkit] = [Requirement(r) for r in metadata.get_all("Requires-Dist") if r.startswith("cuda-toolkit")]
    assert str(toolkit.specifier) == "==13.0.3"
    assert torch_pypi_cuda()["2.14"] == "13.0" == pypi_cuda()["lines"]["13.0.3"]["cuda"]
    assert "2.14.0" in pypi_cuda()["lines"]["13.0.3"]["torch"]


def test_matrix_says_which_lines_are_current_and_which_patches_they_get(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["matrix", "show", "--json"]) == 0
    rows = {r["line"]: r for r in json.loads(capsys.readouterr().out)}
    assert {line for line, r in rows.items() if r["status"] == "current"} == {"cu130", "cu132", "py-cu130", "py-cu132",
                                                                             "py-cu132-fa3"}
    assert rows["py-cu132-fa3"]["patches"] == []  # FA3 instead of FA2: FA2's patch is not applied
    assert rows["cu132"]["patches"] == rows["cu130"]["patches"] == ["flash-attn-2.8.3-cxx20.patch"]
    assert rows["py-cu132"]["patches"] == rows["py-cu130"]["patches"] == ["flash-attn-2.8.3-cxx20.patch"]  # torch >= 2.13
    assert rows["cu124"]["status"] == "old stack"
    assert rows["cu124"]["status_note"] == "torch 2.6 is the last with cu124 wheels (newest torch: 2.15)"
    assert rows["cu126"]["status_note"] == "torch 2.14 ships cu126 (this line keeps torch 2.9)"
    assert rows["cu126"]["patches"] == []
    monkeypatch.setenv("COLUMNS", "220")
    assert main(["matrix", "show", "cu132"]) == 0
    out = capsys.readouterr().out
    assert "flash-attn-2.8.3-cxx20.patch" in out and "cu132: current: torch 2.15 is the newest with cu132" in out
