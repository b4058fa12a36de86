"""The README and docs/ against the tree they describe: links and module paths that exist, every line named,
the `toolkit check` example as check prints it, and no issue numbers, in the documents nor in the dated records under
docs/results/ (their READMEs and the JSON the verbs wrote: they say what was measured, not which issue asked)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from test_wings import FLOORS

from toolkit.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROJECT_FILES = {p.name for folder in ("toolkit", "tests", "bench", "scripts") for p in (ROOT / folder).rglob("*.py")}
PROJECT_FILES |= {p.name for p in ROOT.glob("*.py")}


RESULTS = sorted(p for suffix in ("*.md", "*.json") for p in (ROOT / "docs" / "results").rglob(suffix))


def test_no_document_names_an_issue_number():
    found = [f"{doc.relative_to(ROOT)}:{n}" for doc in [*DOCS, *RESULTS]
             for n, line in enumerate(doc.read_text().splitlines(), 1) if re.search(r"\bissues? #?\d", line, re.IGNORECASE)]
    assert RESULTS and found == []


def test_every_relative_link_resolves():
    broken = [f"{doc.name}: {target}" for doc in DOCS for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text())
              if not target.startswith(("http://", "https://", "#"))
              and not (doc.parent / target.split("#")[0]).exists()]
    broken += [f"{doc.name}: {named}" for doc in DOCS for named in re.findall(r"(?<![\w/.])docs/[\w./-]+\.md", doc.read_text())
               if not (ROOT / named).is_file()]  # named in the text, from the project root (docs/gpu-machine.md)
    assert broken == []


def is_module(dotted: str) -> bool:
    path = ROOT / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_module_path_a_document_names_exists():
    """`toolkit/build.py`, `machine_checks.py`: the tree moved into wings, and the docs must follow it."""
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        files = set(re.findall(r"toolkit/[\w/]+\.(?:py|yaml)", text))
        files |= {f"toolkit/{p}" for p in re.findall(rf"`((?:{'|'.join(FLOORS)})/\w+\.py)`", text)}
        missing += [f"{doc.name}: {f}" for f in sorted(files) if not (ROOT / f).is_file()]
        # a bare `spec.py`, `machine_checks.py`: some file of the project has that name
        missing += [f"{doc.name}: {name}" for name in sorted(set(re.findall(r"`(\w+\.py)`", text)))
                    if name not in PROJECT_FILES]
        # toolkit.verify.bench (a module) or toolkit.base.fslock.locked (a module's name)
        missing += [f"{doc.name}: {d}" for d in sorted(set(re.findall(r"\btoolkit(?:\.\w+)+", text)))
                    if not is_module(d) and not is_module(d.rsplit(".", 1)[0])]
    assert missing == []


def test_the_spec_format_names_every_line():
    text = (ROOT / "docs" / "spec-format.md").read_text()
    lines = sorted(p.stem for p in (ROOT / "envs").glob("*.yaml") if p.stem != "base")
    assert [line for line in lines if f"`{line}`" not in text and f"`{line}.yaml`" not in text
            and f"`envs/{line}.yaml`" not in text] == []


def test_the_check_example_is_what_check_prints(tmp_path, capsys):
    """The spec format's example names the file, line, field and fix of a real refusal (it once said line 7)."""
    example = re.search(r"^envs/(cu118\.yaml:\d+: .*)$", (ROOT / "docs" / "spec-format.md").read_text(), re.M)
    assert example
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs", envs)
    spec = envs / "cu118.yaml"
    spec.write_text(spec.read_text().replace('version: "2.7.1"', 'version: "2.8.0"'))
    assert main(["check", "--envs", str(envs), "cu118"]) == 1
    out = capsys.readouterr()
    assert example.group(1) in out.out + out.err


def test_the_readme_begins_with_the_two_commands():
    first_block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == [
        "pip install -e '.[test]' && nox -s check matrix", "python3 -m pytest -ra"]
