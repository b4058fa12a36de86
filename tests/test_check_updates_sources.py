"""`toolkit knowledge check-updates` beyond PyPI's release lists (issue 34, item 2): FA4's closure, transformers'
attn_implementation names, verl's flash-attn routing, FA3's git source, the HF kernels builds; each with its days
behind, and an unreachable source "not checked" by name. Replays tests/data/upstream-2026-12-05 (PyPI, recorded
by the real run of docs/results/2026-12-05-check-updates) and tests/data/github-flash-attention (GitHub's answers
assembled from a git snapshot: see tests/data/README.md)."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import tarfile
import zipfile
from datetime import date
from pathlib import Path

import pytest
import tomllib

from toolkit.attention import backends
from toolkit.base.errors import ToolkitError
from toolkit.cli import main
from toolkit.knowledge import fa3_pins, fa4_pins, frameworks, upstream
from toolkit.knowledge import upstream_answers as answers

ROOT = Path(__file__).resolve().parent.parent
TODAY = ROOT / "tests/data/upstream-2026-12-05"
GITHUB = ROOT / "tests/data/github-flash-attention"
DAY = date(2026, 12, 5)


def report() -> upstream.Report:
    return upstream.check_updates(upstream.recorded_fetch(TODAY), today=DAY)


def recorded(url: str) -> bytes:
    return upstream.recorded_fetch(TODAY)(url)


def recorded_pypi(package: str) -> dict:
    return json.loads(recorded(upstream.PYPI_JSON.format(package=package)))


def uploaded(package: str, version: str) -> str:
    return min(f["upload_time"] for f in recorded_pypi(package)["releases"][version])[:10]


def states(rep: upstream.Report) -> dict[str, upstream.SourceState]:
    return {s.name: s for s in rep.sources}


def newest_file(package: str, suffix: str) -> str:
    data = recorded_pypi(package)
    [url] = [f["url"] for f in data["releases"][data["info"]["version"]] if f["filename"].endswith(suffix)]
    return upstream.urllib.parse.urljoin(upstream.PYPI_JSON.format(package=package), url)


# ---------------------------------------------------------------- today's answers


def test_todays_pypi_leaves_the_knowledge_nothing_to_add():
    """Done-when of issue 34: on PyPI's answers of 2026-12-05 every PyPI source is current; the sources this machine
    could not reach are each named, never passed."""
    rep = report()
    assert rep.findings == ()
    by_name = states(rep)
    for package in ("transformers", "verl", "kernels", "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi",
                    "flash-attn-4"):
        assert by_name[f"pypi {package}"].line(DAY) == f"pypi {package}: current"
    unchecked = {name for name, s in by_name.items() if s.unchecked}
    assert unchecked == {n for n in by_name if n.startswith(("torch index", "github", "hub"))}
    assert {u.split(" ")[0].split("/")[2] for u in rep.unchecked} == {"download.pytorch.org", "api.github.com",
                                                                     "huggingface.co"}


def test_cli_prints_days_behind_and_names_every_unreachable_source(capsys):
    assert main(["knowledge", "check-updates", "--recorded", str(TODAY)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "days behind, per source (as of 2026-12-05):" in out
    assert "  pypi transformers: current" in out
    assert ("  github Dao-AILab/flash-attention hopper/, flash_attn_3/: not checked: "
            "https://api.github.com/repos/Dao-AILab/flash-attention/git/trees/main (not recorded)") in out
    for repo in ("flash-attn3", "vllm-flash-attn3", "flash-attn2", "flash-attn4"):
        assert (f"  hub kernels-community/{repo}: not checked: https://huggingface.co/api/models/kernels-community/"
                f"{repo} (not recorded)") in out


def test_record_then_replay_keeps_what_each_reader_reads(tmp_path):
    """A recording of a recording: the trimmed wheel and sdist still answer the readers (the same findings with a
    knowledge that lacks the names and the routing)."""
    rep = report()
    upstream.record(tmp_path, rep.answers)
    again = upstream.check_updates(upstream.recorded_fetch(tmp_path), today=DAY)
    assert again.findings == rep.findings and again.sources == rep.sources
    wheel = newest_file("transformers", ".whl")
    assert (answers.attn_implementation_names(upstream.recorded_fetch(tmp_path)(wheel), wheel)
            == answers.attn_implementation_names(recorded(wheel), wheel))


# ---------------------------------------------------------------- transformers


def mapping_keys(wheel: bytes) -> set[str]:
    """The quoted keys between `_global_mapping = {` and its `}` in modeling_utils.py, read line by line."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as zf:
        lines = zf.read("transformers/modeling_utils.py").decode().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "_global_mapping = {")
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "}")
    return {re.match(r'\s*"([^"]+)":', line).group(1) for line in lines[start + 1:end]}


def test_attn_implementation_names_are_the_wheels():
    wheel = newest_file("transformers", ".whl")
    names = answers.attn_implementation_names(recorded(wheel), wheel)
    assert set(names.names) == mapping_keys(recorded(wheel)) | {"eager"} and not names.problem
    assert set(names.names) == set(frameworks.transformers().attn_implementations)
    assert {b.attn_implementation for b in backends.backends().values()} <= set(
        frameworks.transformers().attn_implementations)  # so that the check's list covers every backend's name


def test_knowledge_read_from_5_24_hears_of_5_25(monkeypatch):
    """attention_backends.yaml as it was (read from 5.24.0, no flash_attention_4 listed): 5.25.0 is news, four days
    behind, and so is a flash name it accepts that the knowledge does not list."""
    known = frameworks.transformers()
    older = dataclasses.replace(known, version="5.24.0",
                                attn_implementations=tuple(n for n in known.attn_implementations
                                                           if n != "flash_attention_4"))
    monkeypatch.setattr(frameworks, "transformers", lambda: older)
    rep = report()
    found = [f for f in rep.findings if f.package == "transformers"]
    day = uploaded("transformers", "5.25.0")
    assert [(f.versions, f.behind_since) for f in found] == [(("5.25.0",), day), (("5.25.0",), day)]
    assert "accepts attn_implementation flash_attention_4, which attention_backends.yaml" in found[1].message
    assert states(rep)["pypi transformers"].line(DAY) == f"pypi transformers: {(DAY - date.fromisoformat(day)).days} " \
                                                         f"days behind (since {day})"


def test_a_name_transformers_dropped(monkeypatch):
    """`paged|sdpa`, deprecated in 5.x ("will be removed in v5.23") and absent from 5.25.0's mapping: a knowledge
    that still lists it hears so."""
    known = frameworks.transformers()
    monkeypatch.setattr(frameworks, "transformers", lambda: dataclasses.replace(
        known, attn_implementations=(*known.attn_implementations, "paged|sdpa")))
    [found] = [f for f in report().findings if f.package == "transformers"]
    assert "paged|sdpa" not in mapping_keys(recorded(newest_file("transformers", ".whl")))
    assert found.message.startswith("no longer accepts attn_implementation paged|sdpa, which attention_backends.yaml")


def test_a_wheel_without_the_mapping_is_a_finding_not_a_pass(tmp_path):
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("transformers/modeling_utils.py", "class AttentionInterface:\n    pass\n")
    names = answers.attn_implementation_names(wheel.getvalue(), "w.whl")
    assert names.names == () and "no AttentionInterface._global_mapping" in names.problem
    with pytest.raises(ToolkitError, match=r"^w\.whl: not a readable wheel"):
        answers.attn_implementation_names(b"not a zip", "w.whl")


# ---------------------------------------------------------------- verl


def test_verl_routing_read_from_its_sdist():
    url = newest_file("verl", ".tar.gz")
    with tarfile.open(fileobj=io.BytesIO(recorded(url))) as tar:
        [member] = tar.getmembers()
        project = tomllib.loads(tar.extractfile(member).read().decode())
    index = project["tool"]["uv"]["sources"]["flash-attn"]["index"]
    [url_of] = [i["url"] for i in project["tool"]["uv"]["index"] if i["name"] == index]
    routes = answers.verl_flash_attn(recorded(url), url)
    assert [(r.extra, f"flash-attn{r.pin}", r.index_url) for r in routes] == [
        (extra, req, url_of) for extra, reqs in project["project"]["optional-dependencies"].items()
        for req in reqs if req.startswith("flash-attn==")]
    assert tuple(routes) == frameworks.verl().flash_attn


def test_verl_routing_the_knowledge_lacks(monkeypatch):
    known = frameworks.verl()
    monkeypatch.setattr(frameworks, "verl", lambda: dataclasses.replace(known, flash_attn=()))
    [found] = [f for f in report().findings if f.package == "verl"]
    assert found.versions == ("0.9.1",) and found.behind_since == uploaded("verl", "0.9.1")
    assert ("[flash-attn-cu130torch211] flash-attn==2.8.3 from https://verl-project.github.io/verl-wheelhouse/simple/"
            in found.message)


# ---------------------------------------------------------------- FA4's closure and HF's kernels


def test_fa4_closure_newer_than_its_pin(monkeypatch):
    release = fa4_pins.release()
    older = dataclasses.replace(release, wheels=tuple(
        dataclasses.replace(w, version="0.6.3") if w.name == "quack-kernels" else w for w in release.wheels))
    monkeypatch.setattr(fa4_pins, "release", lambda: older)
    rep = report()
    [found] = [f for f in rep.findings if f.package == "quack-kernels"]
    assert found.versions == ("0.6.4", "0.6.5") and found.behind_since == uploaded("quack-kernels", "0.6.4")
    assert f"newer than 0.6.3, which toolkit/knowledge/flash_attn_4.yaml pins for flash-attn-4 {release.version}" \
        in found.message
    assert states(rep)["pypi nvidia-cutlass-dsl"].behind_since == ""


def test_kernels_package_newer_than_known(monkeypatch):
    watch = upstream.watch_list()
    [entry] = [e for e in watch["pypi"] if e["package"] == "kernels"]
    entry["newest_known"] = "0.18.3"
    monkeypatch.setattr(upstream, "watch_list", lambda: watch)
    [found] = [f for f in report().findings if f.package == "kernels"]
    assert found.versions == ("0.19.1",) and found.behind_since == uploaded("kernels", "0.19.1")


# ---------------------------------------------------------------- FA3's git source


GITHUB_ENTRY = {"repo": "Dao-AILab/flash-attention", "branch": "main", "paths": ["hopper", "flash_attn_3"]}
PIN = "c75d019dea9d910312974417bc28f190dfdda6d9"


def github_ask() -> upstream.Ask:
    return upstream.Ask(upstream.recorded_fetch(GITHUB))


def test_fa3_pin_matches_main_of_the_snapshot():
    """The snapshot's main (2026-08-15) has the hopper/ tree flash_attn_3.yaml pins and no flash_attn_3/ yet."""
    ask = github_ask()
    assert upstream.fa3_git(GITHUB_ENTRY, ask, upstream.newest_fa3_pin()) == [] and ask.failed == []
    assert upstream.newest_fa3_pin().commit == PIN


def test_fa3_pin_behind_main_names_the_commits_since():
    """A knowledge pinned at the commit before (14c37795, 2026-07-27, its hopper tree be45f0ec in git) is behind
    main by c75d019 (2026-07-29), whose hopper/ tree is the one the real knowledge pins."""
    pin = fa3_pins.commit(PIN)
    [root] = [a for a in pin.archives if a.place == ""]
    older = dataclasses.replace(pin, commit="14c377950125c70b7a9dabf9c561fca53715ac7d", date="2026-07-27",
                                archives=(dataclasses.replace(
                                    root, pins={**root.pins, "hopper": "be45f0ec31217d61bb7658b35c8f9fdabad2b639"}),))
    [found] = upstream.fa3_git(GITHUB_ENTRY, github_ask(), older)
    assert found.versions == ("hopper/",) and found.behind_since == pin.date
    assert f"at main is tree {root.pins['hopper'][:12]}, not the be45f0ec3121 flash_attn_3.yaml pins" in found.message
    assert f"1 commits touch it since; newest {PIN[:12]} {pin.date} 'Remove SM100 Functions from Hopper (#2746)'" \
        in found.message


def test_a_path_upstream_has_and_the_pins_lack():
    """A watched path the pinned archives do not hold (as flash_attn_3/ will be) is named, dated by its oldest commit
    since the pin; flash_attn/ of the snapshot stands in for it."""
    entry = {**GITHUB_ENTRY, "paths": ["flash_attn"]}
    [found] = upstream.fa3_git(entry, github_ask(), upstream.newest_fa3_pin())
    commits = json.loads((GITHUB / "answer2.json").read_text())
    assert found.behind_since == commits[-1]["commit"]["committer"]["date"][:10]
    assert f"{len(commits)} commits touch it since" in found.message and "pins for no commit" in found.message


def test_github_answer_of_another_shape_is_one_line(tmp_path):
    (tmp_path / "tree.json").write_text('{"message": "API rate limit exceeded"}')
    url = answers.tree_url("Dao-AILab/flash-attention", "main")
    (tmp_path / "index.json").write_text(json.dumps({"schema": 2, "answers": {url: {"file": "tree.json"}}}))
    with pytest.raises(ToolkitError, match=rf"^{re.escape(url)}: unreadable GitHub tree answer \(sha"):
        upstream.fa3_git(GITHUB_ENTRY, upstream.Ask(upstream.recorded_fetch(tmp_path)), upstream.newest_fa3_pin())


def test_days_behind_counts_from_the_oldest_change_and_an_undated_one_is_said():
    state = upstream.SourceState("pypi x", "2026-11-11")
    assert state.line(DAY) == "pypi x: 24 days behind (since 2026-11-11)"  # FA4 b39 as issue 34 counted it
    assert upstream.SourceState("pypi x", "yesterday").line(DAY) == "pypi x: behind, since a day the answer gives as 'yesterday'"


@pytest.mark.network
def test_live_verl_sdist_reads():
    """Today's newest verl on PyPI: its sdist's pyproject still reads (skip where PyPI is unreachable)."""
    from conftest import pypi_unreachable

    url = upstream.PYPI_JSON.format(package="verl")
    try:
        answer = upstream.pypi_answer(upstream.live_fetch(url), url)
        sdist = answer.file_url(answer.info.version, ".tar.gz", url)
        assert sdist is not None
        body = upstream.live_fetch(sdist)
    except OSError as exc:
        pypi_unreachable(exc)
    routes = answers.verl_flash_attn(body, sdist)
    assert all(r.pin.startswith(("==", ">=", "<", "~=", "!=")) or r.pin == "" for r in routes)
