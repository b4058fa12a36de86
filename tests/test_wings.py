"""The house in wings: toolkit/'s subpackages import one way (a lower floor never imports a higher one) and
no module imports itself back through others. Read from the code's own import statements (lazy imports
inside functions included), so a new import that breaks either shows here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TOOLKIT = Path(__file__).resolve().parent.parent / "toolkit"
# Lowest floor first; each wing may import only wings before it (docs/architecture.md says what each owns).
FLOORS = ("base", "knowledge", "spec", "env", "machine", "attention", "verify", "fa4", "cache", "build", "doctor", "site")
TOP = ("toolkit", "toolkit.cli", "toolkit.__main__")  # the entry: imports any wing, imported by none


def module_name(path: Path) -> str:
    parts = list(path.relative_to(TOOLKIT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each toolkit module -> the toolkit modules it imports (`from toolkit.x import y` names x.y when y is a
    module, else x)."""
    modules = {module_name(path): path for path in TOOLKIT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "toolkit":
                for alias in node.names:
                    found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "toolkit"}
        graph[name] = found - {name}
    return graph


def wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else "top"


def test_every_module_lives_in_a_wing_or_is_the_entry():
    assert sorted(m for m in imports() if wing(m) == "top" and m not in TOP) == []


def test_wings_import_only_lower_floors():
    upward = sorted(f"{m} -> {t}" for m, targets in imports().items() for t in targets
                    if wing(m) != "top" and (wing(t) == "top" or FLOORS.index(wing(t)) > FLOORS.index(wing(m))))
    assert upward == []


def test_no_module_imports_itself_back():
    graph = imports()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


@pytest.mark.parametrize("broken", ["upward", "circle"])
def test_the_checks_catch_what_they_claim(monkeypatch, broken):
    """The two checks on a graph with one bad edge added: base importing build, or a wing's two modules
    importing each other."""
    real = imports()
    extra = {"upward": ("toolkit.base.errors", "toolkit.build.builder"),
             "circle": ("toolkit.spec.envspec", "toolkit.spec.rules")}[broken]
    graph = {m: set(t) for m, t in real.items()}
    graph[extra[0]].add(extra[1])
    monkeypatch.setitem(globals(), "imports", lambda: graph)
    check = test_wings_import_only_lower_floors if broken == "upward" else test_no_module_imports_itself_back
    with pytest.raises(AssertionError):
        check()
