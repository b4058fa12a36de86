"""One reader of the knowledge files: every stage reads toolkit/knowledge/*.yaml through toolkit.knowledge.files,
and an edited file that is broken (bad YAML, a missing field, a bad value) is one line naming the file.

The broken files are the real ones with one edit each, copied to tmp_path."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
import yaml

import toolkit
from toolkit.attention import backends as attention_backends
from toolkit.base.errors import ToolkitError
from toolkit.build import diagnose
from toolkit.cli import main
from toolkit.doctor import command as doctor
from toolkit.env import lock
from toolkit.knowledge import fa3_pins, fa4_pins, upstream
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.facts import load_knowledge
from toolkit.knowledge.files import KNOWLEDGE_DIR
from toolkit.knowledge.object_costs import load_object_costs
from toolkit.machine import preflight
from toolkit.site import scaleout
from toolkit.spec import patches
from toolkit.spec.envspec import load_spec
from toolkit.verify import bench

TOOLKIT = Path(toolkit.__file__).parent
ROOT = TOOLKIT.parent
# The readers of YAML that is not knowledge: specs (spec/envspec.py's strict loader), locks (env/lockfile.py;
# env/lock.py reads its own draft lock back; cache/runtime_lock.py runtime locks), a user's --stages file
# (site/scaleout.py).
NOT_KNOWLEDGE = {"knowledge/files.py", "env/lockfile.py", "env/lock.py", "cache/runtime_lock.py", "site/scaleout.py",
                 "spec/envspec.py"}


def safe_load_calls(path: Path) -> list[int]:
    """The lines that parse YAML: yaml.safe_load(...), or yaml.load(..., Loader=...) (libyaml's loader)."""
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and (node.func.attr == "safe_load" or (node.func.attr == "load" and isinstance(node.func.value, ast.Name)
                                                   and node.func.value.id == "yaml"))]


def test_only_the_loader_parses_knowledge_yaml():
    calls = {str(p.relative_to(TOOLKIT)): lines for p in TOOLKIT.rglob("*.py")
             if p.relative_to(TOOLKIT).as_posix() not in NOT_KNOWLEDGE and (lines := safe_load_calls(p))}
    assert calls == {}
    assert safe_load_calls(TOOLKIT / "knowledge" / "files.py") != []


def test_every_knowledge_file_is_read_by_a_stage_through_the_loader(monkeypatch):
    """Each stage's reader of each file, with the loader recording what it was asked for."""
    read: list[str] = []
    real = knowledge_files.read
    monkeypatch.setattr(knowledge_files, "read", lambda name: read.append(Path(name).name) or real(name))
    for cached in (patches.catalog, diagnose.load_catalog, doctor.doctor_knowledge, scaleout.slurm_state_groups,
                   preflight._compiler_headers, fa4_pins.knowledge, fa3_pins.knowledge, load_knowledge,
                   load_object_costs, attention_backends.backends, attention_backends.verl):
        cached.cache_clear()
    load_knowledge()
    patches.catalog()
    diagnose.load_catalog()
    assert bench.gpu_facts("NVIDIA H200")[0]["match"] == "H200"
    doctor.doctor_knowledge()
    assert scaleout.slurm_state_groups()["PENDING"] == "queued"
    assert preflight.required_headers("2.7.0.post2")
    assert upstream.watch_list()
    assert fa4_pins.knowledge()["releases"]
    assert load_object_costs().releases
    assert attention_backends.backends()["flash-attn-4"].attn_implementation == "flash_attention_4"
    assert attention_backends.verl().default_attn_implementation == "flash_attention_2"
    assert fa3_pins.profile("hopper-training").switches
    assert lock.virtual_packages(load_spec(ROOT / "envs" / "cu126.yaml"))["linux-64"]["__cuda"] == "12.6"
    assert sorted(set(read)) == sorted(p.name for p in KNOWLEDGE_DIR.glob("*.yaml"))


def edited(tmp_path: Path, name: str, edit) -> Path:
    """A copy of the real knowledge file with `edit` applied to its text."""
    path = tmp_path / name
    path.write_text(edit((KNOWLEDGE_DIR / name).read_text()))
    return path


def test_broken_yaml_names_the_file_and_line(tmp_path):
    path = edited(tmp_path, "build_failures.yaml", lambda text: text.replace("\nfailures:", "\nfailures: [", 1))
    with pytest.raises(ToolkitError) as err:
        diagnose.load_catalog(path)
    assert re.fullmatch(rf"{re.escape(str(path))}:\d+: not valid YAML: [^\n]+ \(fix the file or restore it[^\n]*\)",
                        str(err.value))


def test_missing_field_names_the_file_and_field(tmp_path):
    data = yaml.safe_load((KNOWLEDGE_DIR / "gpus.yaml").read_text())
    del data["sources"]
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ToolkitError, match=r"gpus\.yaml: sources: missing \("):
        bench.gpu_facts("NVIDIA H200", path)


def test_bad_value_names_the_file(tmp_path):
    data = yaml.safe_load((KNOWLEDGE_DIR / "build_failures.yaml").read_text())
    data["failures"][0]["pattern"] = "unclosed (group"
    path = tmp_path / "build_failures.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ToolkitError, match=r"build_failures\.yaml: malformed entry: missing \), unterminated"):
        diagnose.load_catalog(path)


def test_missing_and_non_mapping_files(tmp_path):
    with pytest.raises(ToolkitError, match=r"flash_attn_4\.yaml: knowledge file not found \("):
        fa4_pins.knowledge(tmp_path / "flash_attn_4.yaml")
    listed = tmp_path / "upstream.yaml"
    listed.write_text("- a list\n")
    with pytest.raises(ToolkitError, match=r"upstream\.yaml: expected a mapping at the top"):
        knowledge_files.read(listed)


def test_a_broken_knowledge_file_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    """`toolkit explain` with the installed catalog broken: exit 1 and one line naming it, no traceback."""
    knowledge = tmp_path / "knowledge"
    shutil.copytree(KNOWLEDGE_DIR, knowledge)
    edited(knowledge, "build_failures.yaml", lambda text: text.replace("\nfailures:", "\nfailures: [", 1))
    monkeypatch.setattr(knowledge_files, "KNOWLEDGE_DIR", knowledge)
    diagnose.load_catalog.cache_clear()
    log = tmp_path / "build.log"
    log.write_text("fatal error: cuda_runtime.h: No such file or directory\n")
    try:
        code = main(["explain", str(log)])
    finally:
        diagnose.load_catalog.cache_clear()
    err = capsys.readouterr().err.strip()
    assert code == 1 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and "build_failures.yaml:" in err and "not valid YAML" in err


def test_a_relative_path_is_read_from_the_working_directory_and_a_name_from_the_knowledge(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("upstream.yaml").write_text("here: true\n")
    assert knowledge_files.read(Path("upstream.yaml")) == {"here": True}
    assert knowledge_files.read("upstream.yaml") == yaml.safe_load((KNOWLEDGE_DIR / "upstream.yaml").read_text())


def test_a_knowledge_file_is_parsed_once_per_process_and_an_edit_is_read_anew(tmp_path, monkeypatch):
    """`toolkit check` read flash_attn_4.yaml twelve times with the pure-Python loader: each text is now parsed
    once (libyaml where built in), keyed by its bytes, and every reader gets its own copy."""
    import yaml

    from toolkit.knowledge import files

    copy = tmp_path / "gpus.yaml"
    copy.write_text((files.KNOWLEDGE_DIR / "gpus.yaml").read_text())
    expected = yaml.safe_load(copy.read_text())
    parsed = []
    real_load = yaml.load
    monkeypatch.setattr(yaml, "load", lambda text, Loader: parsed.append(Loader) or real_load(text, Loader=Loader))
    monkeypatch.setattr(files, "PARSED", {})
    first = files.read(copy)
    first["changed by a caller"] = True
    assert files.read(copy) == expected  # the file's content, not the caller's change
    assert len(parsed) == 1 and parsed[0] is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    copy.write_text(copy.read_text() + "\n# an edit\n")
    files.read(copy)
    assert len(parsed) == 2
