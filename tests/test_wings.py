"""The house in wings: toolkit/'s subpackages import one way (a lower floor never imports a higher one) and
no module imports itself back through others. Read from the code's own import statements (lazy imports
inside functions included), so a new import that breaks either shows here."""

from __future__ import annotations

import ast
import re
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


# ---------------------------------------------------------------- each wing's face


def assigned(node: ast.stmt) -> list[str]:
    """The names a top-level assignment binds (`X = ...`, `X: T = ...`)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def public(wing_name: str) -> set[str]:
    """The wing's PUBLIC list, read from its __init__.py without importing it."""
    tree = ast.parse((TOOLKIT / wing_name / "__init__.py").read_text())
    found = [node.value for node in tree.body if "PUBLIC" in assigned(node)]
    assert len(found) == 1, f"toolkit/{wing_name}/__init__.py declares no PUBLIC tuple"
    return set(ast.literal_eval(found[0]))


def cross_wing_imports() -> set[tuple[str, str, str]]:
    """(importing module, wing, entry) for every import of a wing from another wing or from the entry: the entry
    is `module` or `module.name` inside the wing; the entry's VERBS' modules are reached for their register()."""
    from toolkit.cli import VERBS

    modules = {module_name(path): path for path in TOOLKIT.rglob("*.py")}
    found = {("toolkit.cli", wing(verb.module), verb.module.split(".", 2)[2] + ".register") for verb in VERBS.values()}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "toolkit":
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.split(".")[0] == "toolkit"]
            else:
                continue
            for target in targets:
                if wing(target) not in ("top", wing(name)):
                    found.add((name, wing(target), target.split(".", 2)[2]))
    return found


def test_an_import_across_wings_names_a_public_entry():
    private = sorted(f"{importer} -> toolkit.{target_wing}.{entry}" for importer, target_wing, entry in cross_wing_imports()
                     if entry not in public(target_wing))
    assert private == []


def test_every_public_entry_exists_and_is_used_across_wings():
    """A face lists only what is there and what another wing (or the entry) uses: it cannot go stale."""
    used = {(target_wing, entry) for _, target_wing, entry in cross_wing_imports()}
    problems = []
    for wing_name in FLOORS:
        for entry in sorted(public(wing_name)):
            module, _, name = entry.partition(".")
            path = TOOLKIT / wing_name / f"{module}.py"
            body = ast.parse(path.read_text()).body if path.is_file() else []
            defined = {n for node in body for n in assigned(node)} | {
                node.name for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            if not path.is_file() or (name and name not in defined):
                problems.append(f"{wing_name}: {entry} does not exist")
            elif (wing_name, entry) not in used:
                problems.append(f"{wing_name}: {entry} is used by no other wing")
    assert problems == []


def test_the_face_check_catches_a_private_import(monkeypatch):
    """With base's face missing ToolkitError, every wing's import of it is named."""
    real = public
    monkeypatch.setitem(globals(), "public", lambda w: real(w) - {"errors.ToolkitError"})
    with pytest.raises(AssertionError, match="errors.ToolkitError"):
        test_an_import_across_wings_names_a_public_entry()


# ---------------------------------------------------------------- the implementations' seam

# A line naming an attention implementation other than the default (FA2 is every generic module's default).
NAMES_AN_IMPLEMENTATION = re.compile(r"fa3|fa4|flash.attn.?3|flash.attn.?4|flash_attn_[34]|FlashAttention-[34]", re.I)
# One module per implementation in each stage wing (spec/, build/, verify/: fa2.py, fa3.py, fa4.py), the FA4 wing,
# FA3's and FA4's pins, FA4's hooks into FA2's build, its lock beside a line's lock, its kernel cache in the cache wing.
IMPLEMENTATION_MODULE = re.compile(
    r"(^|/)(fa[234]|fa[34]_pins|fa4_hooks|fa4_lock|kernel_cache)\.py$|^fa4/")
# The generic modules that may name one, and why (docs/architecture.md, "Attention implementations").
ALLOWED = {
    # the registries: each wing's one table of implementations, and the entry that registers the wings
    "attention/backends.py": "the implementations' names and their earlier spellings",
    "build/builder.py": "WHEEL_SOURCES, and the calls into build/fa4_hooks.py",
    "spec/rules.py": "CHECKS",
    "verify/command.py": "SUITES",
    "verify/bench.py": "PACKAGED, the bench's columns",
    "base/workspace.py": "WHEEL_FOLDER_SUFFIXES and the report folder of each implementation",
    "cli.py": "the entry: the fa4 wing's verbs, and FA4's kernel cache handed down from the cache wing",
    "knowledge/__init__.py": "the wing's face lists the implementation modules other wings import",
    "env/__init__.py": "the wing's face lists FA4's lock and install record",
    "spec/__init__.py": "the wing's face lists spec/fa4.py, which env's lock asks",
    # the named hooks, where the next implementation looks
    "spec/envspec.py": "each implementation's spec section (Fa3Request, Fa4Request)",
    "env/lock.py": "FA4's pinned wheels in a line's lock (with_flash_attn_4)",
    "env/install_record.py": "FA4's install record (Fa4Record)",
    "knowledge/object_costs.py": "FA3's object costs, keyed by commit and profile",
    "knowledge/upstream.py": "check-updates judges FA3's pinned git ids and FA4's pinned closure against upstream",
    "build/record.py": "FA3's sources in the record and its key (pinned by git ids)",
    "build/timing.py": "FA3's builds found by their record section for object costs",
    "build/wheel_check.py": "FA4's files handed back after FA2's install (fa4_hooks)",
    "build/ninja_shim.py": "FA3's setup.py writes its own nvcc rule",
    "attention/recommend.py": "FA4's targets are ratios against other implementations",
    "attention/formats.py": "schema-1 reports spelled the implementations the old way",
    "doctor/facts.py": "the distributions doctor probes, FA4's kernel cache in use",
    "doctor/command.py": "a published-build row per distribution, FA4's kernel-cache row",
    "cache/publish.py": "FA4's kernel caches published beside the wheels",
    "cache/table.py": "FA4's kernel-cache entries beside the wheels' entries",
    "cache/runtime_lock.py": "FA4's pinned wheels (its lock, not a build) in a line's runtime lock",
    "site/publish.py": "FA3's archives in the provenance, FA4's kernel caches found for publish",
}


def naming_modules() -> dict[str, int]:
    """Each generic module (not an implementation module) -> how many of its lines name an implementation."""
    found = {}
    for path in sorted(TOOLKIT.rglob("*.py")):
        name = path.relative_to(TOOLKIT).as_posix()
        if not IMPLEMENTATION_MODULE.search(name):
            lines = sum(bool(NAMES_AN_IMPLEMENTATION.search(line)) for line in path.read_text().splitlines())
            if lines:
                found[name] = lines
    return found


def test_only_implementation_modules_registries_and_named_hooks_name_an_implementation():
    found = naming_modules()
    assert sorted(set(found) - set(ALLOWED)) == []  # a new mention: move it to its implementation's module
    assert sorted(set(ALLOWED) - set(found)) == []  # a hook that no longer names one leaves the list
