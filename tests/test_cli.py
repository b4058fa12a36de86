"""One CLI convention: every verb's handler named for its words, second verbs that argparse knows, one
meaning per option name, the line given as LINE, and one entry wrapper for `toolkit` and every
`python -m toolkit...` program (a ToolkitError, Ctrl-C and SIGTERM end each of them the same way)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from toolkit.base.entry import RenamedVerb
from toolkit.cli import VERBS, build_parser, main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def leaf_verbs(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(verb words, parser) of every verb that runs something (`fa4 lock` is ("fa4", "lock")); an earlier
    spelling that is only refused (`fa4 recommend`) runs nothing."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups and words:
        yield words, parser
    for group in groups:
        for name, sub in group.choices.items():
            if not isinstance(sub, RenamedVerb):
                yield from leaf_verbs(sub, (*words, name))


def test_every_verb_handler_is_named_for_its_words():
    verbs = dict(leaf_verbs(build_parser()))
    assert {("matrix", "show"), ("matrix", "run"), ("build",), ("build-report",), ("fa4", "cache-install"),
            ("recommend",), ("knowledge", "check-updates")} <= set(verbs)
    assert ("fa4", "recommend") not in verbs
    for words, parser in verbs.items():
        handler = parser.get_default("func")
        expected = "_".join(words).replace("-", "_") + "_command"
        assert handler is not None and handler.__name__ == expected, (words, handler)
        assert handler.__annotations__.get("return") in (int, "int"), words


def test_matrix_run_and_build_report_are_verbs_argparse_knows(tmp_path, monkeypatch, capsys):
    parse = build_parser().parse_args
    run = parse(["matrix", "run", "cu126", "--executor", "local"])
    assert run.func.__name__ == "matrix_run_command" and run.lines == ["cu126"] and run.executor == "local"
    show = parse(["matrix", "show", "cu126", "--json"])
    assert show.func.__name__ == "matrix_show_command" and show.lines == ["cu126"] and show.json
    report = parse(["build-report", "cu126", "--wheelhouse", "wh"])
    assert report.func.__name__ == "build_report_command" and report.line == "cu126" and report.wheelhouse == Path("wh")
    # `run` is a verb, never a line name that happens to be first: `matrix show run` looks for envs/run.yaml
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "envs", tmp_path / "envs")
    assert main(["matrix", "show", "run"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: envs/run.yaml: no spec for line 'run'") and err.count("\n") == 1
    show_help = " ".join(dict(leaf_verbs(build_parser()))[("matrix", "show")].format_help().split())
    assert "--executor" not in show_help and "--stages" not in show_help  # run's options: on `matrix run` only


@pytest.mark.parametrize("argv, says", [
    (["explain", "build.log", "--prefix", "/opt/env"], "toolkit explain: --prefix is gone: write `--search-prefix DIR`"),
    (["build", "cu126", "--report"], "toolkit build: --report is gone: write `toolkit build-report LINE`"),
    (["doctor", "--line", "cu126"], "toolkit doctor: --line is gone: write `toolkit doctor LINE`"),
    (["recommend", "--bench", "b.json", "--line", "cu126"],
     "toolkit recommend: --line is gone: write `toolkit recommend LINE`"),
    (["recommend", "--bench", "b.json", "--verify", "fa4=v.json"],
     "toolkit recommend: --verify is gone: write --verified BACKEND=VERIFY_JSON (--verify is matrix run's mode)"),
    *((["fa4", "recommend", *rest], "toolkit fa4 recommend is gone: write `toolkit recommend LINE --bench BENCH_JSON "
                                    "--verified BACKEND=VERIFY_JSON` (it chooses among every verified backend, not "
                                    "FA4 alone)")
      for rest in (["cu126", "--bench", "b.json", "--verified", "fa4=v.json"], ["--help"], [])),
    (["fa4", "cache-install", "--target", "t", "--arch", "90", "--record", "r.json", "--dest", "d"],
     "toolkit fa4 cache-install: --record is gone: write --cache-record (--record is check-updates' recording folder)"),
])
def test_an_earlier_spelling_is_refused_in_one_line_naming_the_new_one(tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err == f"error: {says}\n" and captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_explain_search_prefix_means_prefixes_to_search_and_prefix_means_an_environment_elsewhere():
    parsers = dict(leaf_verbs(build_parser()))
    search = parsers[("explain",)].parse_args(["x.log", "--search-prefix", "/a", "--search-prefix", "/b"])
    assert search.search_prefix == [Path("/a"), Path("/b")]
    for words in (("install",), ("build",), ("doctor",), ("modules",)):  # one environment prefix each
        prefix = next(a for a in parsers[words]._actions if "--prefix" in a.option_strings)
        assert prefix.type is Path and prefix.nargs is None and not isinstance(prefix, argparse._AppendAction)


def test_the_line_is_the_positional_LINE_in_every_verb_that_takes_one():
    for words, parser in leaf_verbs(build_parser()):
        assert not any("--line" in a.option_strings and a.help != argparse.SUPPRESS for a in parser._actions), words
        lines = [a for a in parser._actions if not a.option_strings and a.dest in ("line", "lines", "specs")]
        assert all(a.metavar == "LINE" for a in lines), words


# LINE, DIR, BACKEND=VERIFY_JSON, a list S,S,...; never {a,b,c}
METAVAR = re.compile(r"[A-Z][A-Z0-9_]*(=[A-Z][A-Z0-9_]*|(,[A-Z][A-Z0-9_]*)*,\.\.\.)?")


def every_parser(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(verb words, parser) of the top level, every verb and every step below one (`fa4 warm`)."""
    yield words, parser
    for group in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        for name, sub in group.choices.items():
            if not isinstance(sub, RenamedVerb):
                yield from every_parser(sub, (*words, name))


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """What `--help` of this parser leaves out: its description, a listed step's line, an option's help text
    or a metavar of its own (argparse's stand-in is the dest, LINE_NAME, or the choices, {a,b,c})."""
    missing = [] if (parser.description or "").strip() else ["no description"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        name = "/".join(action.option_strings) or action.dest
        if isinstance(action, argparse._SubParsersAction):
            listed = {step.dest for step in action._choices_actions if (step.help or "").strip()}
            missing += [f"step {step}: no help line" for step, sub in action.choices.items()
                        if step not in listed and not isinstance(sub, RenamedVerb)]
        elif not (action.help or "").strip():
            missing.append(f"{name}: no help")
        if action.nargs != 0 and not METAVAR.fullmatch(str(action.metavar or "")):
            missing.append(f"{name}: metavar {action.metavar!r}")
    return missing


def test_every_verb_step_and_option_has_its_help_and_a_metavar():
    found = {words: undocumented(parser) for words, parser in every_parser(build_parser())}
    assert {("fa4", "warm"), ("matrix", "run"), ("knowledge", "check-updates"), ("lock",)} <= set(found)
    assert {words: missing for words, missing in found.items() if missing} == {}


def test_a_shared_option_is_spelled_the_same_in_every_verb():
    """LINE, --python, --prefix, --report-dir, --json and --arch come from toolkit/base/arguments.py: one dest,
    metavar and kind of value everywhere (install's --python was EXE, doctor's PYTHON, fa4's none)."""
    shared = ("--python", "--prefix", "--report-dir", "--json", "--arch")
    seen: dict[str, set] = {}
    for _, parser in every_parser(build_parser()):
        for action in parser._actions:
            name = next((o for o in action.option_strings if o in shared), None)
            if name is None and not action.option_strings and action.dest in ("line", "lines"):
                name = "LINE"
            if name is not None and action.help != argparse.SUPPRESS:
                seen.setdefault(name, set()).add((action.dest.removesuffix("s"), action.metavar, type(action).__name__))
    assert seen == {"LINE": {("line", "LINE", "_StoreAction")},
                    "--python": {("python", "PYTHON", "_StoreAction")},
                    "--prefix": {("prefix", "DIR", "_StoreAction")},
                    "--report-dir": {("report_dir", "DIR", "_StoreAction")},
                    "--json": {("json", None, "_StoreTrueAction")},
                    "--arch": {("arch", "ARCH", "_StoreAction")}}


# ---------------------------------------------------------------- one entry wrapper


def slow_python(tmp_path: Path) -> Path:
    """An `interpreter` the fa4 install probes first: it says it started, then waits to be signalled."""
    script = tmp_path / "slow-python"
    script.write_text(f"#!/bin/sh\ntouch {tmp_path}/started\nexec sleep 60\n")
    script.chmod(0o755)
    return script


def interrupted(command: list[str], tmp_path: Path) -> tuple[int, str]:
    """Run `command` until its child interpreter started, send SIGTERM, return (exit code, stderr)."""
    (tmp_path / "started").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the probe never started: {process.communicate()}")
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    return process.returncode, err


def test_sigterm_ends_python_m_toolkit_fa4_as_it_ends_toolkit_fa4(tmp_path):
    args = ["install", "--wheels", str(tmp_path / "wheels"), "--target", str(tmp_path / "target"),
            "--python", str(slow_python(tmp_path))]
    by_toolkit = interrupted([sys.executable, "-m", "toolkit", "fa4", *args], tmp_path)
    by_child = interrupted([sys.executable, "-m", "toolkit.fa4", *args], tmp_path)
    line = "error: interrupted by SIGTERM (this run's temporary files are removed as it exits; re-run the same command)\n"
    assert by_toolkit == (143, line)
    assert by_child == by_toolkit
    assert not (tmp_path / "target").exists()


def test_ctrl_c_is_answered_at_once_while_the_cleanup_still_runs(tmp_path):
    """Ctrl-C during `toolkit install` of a pypi line was answered only once the cleanup was done (deleting the
    half-made venv: 15-30 s of silence). Here the cleanup waits for a child that ignores SIGTERM (the
    supervisor kills it STOP_GRACE_S later): the one line must come within 2 s of the real SIGINT, before the
    exit, and be the only line."""
    from toolkit.base.children import STOP_GRACE_S

    stubborn = tmp_path / "stubborn-python"
    stubborn.write_text(f"#!/bin/sh\ntrap '' TERM\ntouch {tmp_path}/started\nsleep 60\n")
    stubborn.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "toolkit", "fa4", "install", "--wheels", str(tmp_path / "w"),
                                "--target", str(tmp_path / "target"), "--python", str(stubborn)],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               # as a terminal's foreground command has it: a test run started in the background
                               # (`nohup ... &`, CI) passes SIGINT on ignored, and the toolkit keeps it ignored
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the probe never started: {process.communicate()}")
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    first = process.stderr.readline()
    answered = time.monotonic() - sent
    rest = process.communicate(timeout=60)[1]
    ended = time.monotonic() - sent
    assert first == ("error: interrupted by Ctrl-C (this run's temporary files are removed as it exits; re-run the "
                     "same command)\n") and rest == "" and process.returncode == 130
    assert answered < 2 and ended >= STOP_GRACE_S - 1  # answered first, then the cleanup ran on


@pytest.mark.parametrize("child", [["toolkit.verify"], ["toolkit.verify.bench"],
                                   ["toolkit.verify", "--impl", "flash-attn-4"]], ids=" ".join)
def test_a_measuring_child_takes_LINE_and_fails_in_one_line(tmp_path, child):
    """Without a GPU (or torch) each measuring child refuses in one `error:` line, as `toolkit` does."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", *child, "cu126", "--report-dir", str(tmp_path / "r")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr


def test_matrix_alone_is_matrix_show(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["matrix"]) == 0
    alone = capsys.readouterr().out
    assert main(["matrix", "show"]) == 0
    assert alone == capsys.readouterr().out and "py-cu132" in alone


def test_a_reader_that_leaves_early_ends_the_program_quietly():
    """`toolkit matrix show --json | head -c 1` where head has gone: the closed pipe is exit 141 and no
    traceback (the read end is closed before the program writes, so every write meets it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "toolkit", "matrix", "show", "--json"], cwd=ROOT, env=env,
                              stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, b"")


# ---------------------------------------------------------------- what the README spells


def test_matrix_without_show_takes_shows_options_and_lines(monkeypatch, capsys):
    """The README writes `toolkit matrix [show] [LINE...]` (`--json`, `--github`): without `show` each was
    refused with the top-level usage (`matrix cu126`: "invalid choice: 'cu126'")."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    for words in (["--json", "cu126"], ["--github", "cu126", "py-cu130"], ["cu126"]):
        assert main(["matrix", "show", *words]) == 0
        shown = capsys.readouterr().out
        assert main(["matrix", *words]) == 0
        assert capsys.readouterr().out == shown, words
    assert main(["matrix", "--github", "cu126", "py-cu130"]) == 0
    include = json.loads(capsys.readouterr().out)["include"]
    assert [(row["line"], row["torch"]) for row in include] == [
        ("cu126", yaml.safe_load((ROOT / "envs/cu126.yaml").read_text())["torch"]["version"]),
        ("py-cu130", yaml.safe_load((ROOT / "envs/py-cu130.yaml").read_text())["torch"]["version"])]


def test_the_matrix_says_where_nvcc_comes_from_not_toolchain(monkeypatch, capsys):
    """The table's `toolchain` column said `locked` for lines that have no lock on a fresh clone."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["matrix", "cu126", "gpu-machine", "py-cu130"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert "nvcc from" in rows[1] and "toolchain" not in rows[1]
    assert [r.split()[-1] for r in rows if r.split() and r.split()[0] in ("cu126", "gpu-machine", "py-cu130")] == [
        "conda", "machine", "PyPI"]


@pytest.mark.parametrize("argv, says", [
    (["matrix", "--jsn"], "toolkit matrix show: error: unrecognized arguments: --jsn (did you mean --json?)"),
    (["install", "cu126", "--prefx", "/x"],
     "toolkit install: error: unrecognized arguments: --prefx /x (did you mean --prefix?)"),
    (["build", "cu126", "cu128"], "toolkit build: error: unrecognized arguments: cu128"),
    (["matrix", "run", "--jsn"], "toolkit matrix run: error: unrecognized arguments: --jsn (did you mean --json?)"),
    (["knowledge", "check-updates", "--recrded", "r"],
     "toolkit knowledge check-updates: error: unrecognized arguments: --recrded r (did you mean --recorded?)"),
    (["fa4", "lock", "cu126", "--lcks", "l"],
     "toolkit fa4 lock: error: unrecognized arguments: --lcks l (did you mean --locks?)"),
    (["fa4", "cache-install", "--target", "t", "--arch", "90", "--cache-record", "r", "--dest", "d", "--pyhton=p"],
     "toolkit fa4 cache-install: error: unrecognized arguments: --pyhton=p (did you mean --python?)"),
])
def test_an_unknown_word_is_refused_by_its_verb_with_the_nearest_option(tmp_path, argv, says):
    """argparse answered every unknown option with the top-level usage (`usage: toolkit [-h] [--version] VERB
    ...`) and no guess; the verb's own usage and its nearest option say what to write."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "toolkit", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    verb = says.partition(": error")[0]
    assert done.returncode == 2 and done.stderr.startswith(f"usage: {verb} ")
    assert done.stderr.rstrip("\n").splitlines()[-1] == says


def test_lock_help_promises_requirements_files_only_for_the_lines_that_write_them():
    """`toolkit lock --help` said every lock comes with locks/<line>.<platform>.requirements.txt; the committed
    pypi locks have a pylock.<line>.toml and no requirements file."""
    text = " ".join(dict(leaf_verbs(build_parser()))[("lock",)].format_help().split())
    committed = {p.name for p in (ROOT / "locks").iterdir()}
    assert "pylock.py-cu130.toml" in committed and not any(n.startswith("py-cu130.") and n.endswith(".txt")
                                                           for n in committed)
    assert "conda-lock.yml plus locks/<line>.<platform>.requirements.txt" not in text
    assert "A pypi line (toolchain kind pypi) has no conda layer and no requirements.txt" in text


def test_an_old_spelling_that_still_works_reads_as_the_new_one_after_one_notice(capsys):
    """add_option_alias and renamed_choice (toolkit/base/entry.py): the old option and the old value give the
    same namespace as the new ones, each with one notice on stderr; an unknown value is still refused."""
    from toolkit.base.entry import add_option_alias, renamed_choice

    parser = argparse.ArgumentParser(prog="toolkit x")
    names = ("new-a", "new-b")
    parser.add_argument("--now", choices=names, default="new-a", metavar="NAME",
                        type=renamed_choice(names, {"old-a": "new-a"}, "toolkit x"))
    add_option_alias(parser, "--then", "--now")
    assert vars(parser.parse_args(["--then", "new-b"])) == {"now": "new-b"}
    assert capsys.readouterr().err == "toolkit x: --then is now --now; the old spelling still works\n"
    assert vars(parser.parse_args(["--then", "old-a"])) == {"now": "new-a"}
    assert capsys.readouterr().err.count("the old spelling still works") == 2
    assert "--then" not in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--then", "old-b"])


# ---------------------------------------------------------------- start-up is cheap

# Imports what `toolkit ARGV...` imports (the verb's own run aside: --help stops at the parser) and prints the
# modules then loaded, one a line, on stderr (stdout has the help).
LOADED_BY = """
import sys
from toolkit.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(*sorted(sys.modules), sep="\\n", file=sys.stderr)
"""


def modules_loaded_by(*argv: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", LOADED_BY, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: toolkit"), done
    return set(done.stderr.split())


def wings_of(modules: set[str]) -> set[str]:
    return {name.split(".")[1] for name in modules if name.startswith("toolkit.") and name != "toolkit.cli"}


def test_toolkit_help_imports_no_wing_nor_pydantic_yaml_or_rich():
    """`toolkit --help` imported all thirteen wings' modules (0.4 s of CPU for a usage text)."""
    loaded = modules_loaded_by("--help")
    assert wings_of(loaded) == {"base"}
    assert not {"pydantic", "yaml", "rich", "packaging"} & {name.split(".")[0] for name in loaded}


def test_a_verb_imports_its_own_wing_and_those_below_it_only():
    """`toolkit check` imports the spec wing (and knowledge, base below it), not the site, build or doctor wings."""
    assert wings_of(modules_loaded_by("check", "--help")) <= {"base", "knowledge", "spec"}
    assert "toolkit.spec.rules" in modules_loaded_by("check", "--help")


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_s_help_comes_from_its_wing_through_the_entry(verb, capsys):
    """`toolkit VERB --help` loads the verb's wing on its own: the usage and description are the wing's."""
    described = build_parser().parse_args  # every verb loaded: the parser the tests walk
    with pytest.raises(SystemExit) as exit:
        main([verb, "--help"])
    assert exit.value.code == 0
    shown = capsys.readouterr().out
    with pytest.raises(SystemExit):
        described([verb, "--help"])
    assert shown == capsys.readouterr().out and shown.startswith(f"usage: toolkit {verb}")


def test_the_verb_list_is_every_verb_the_wings_register_each_with_its_line():
    listed = {a.dest: a.help for a in next(a for a in build_parser(())._actions
                                           if isinstance(a, argparse._SubParsersAction))._choices_actions}
    registered = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(listed) == set(registered) == set(VERBS)
    assert all(line and line == VERBS[verb].help for verb, line in listed.items())
    assert all(parser.description for parser in registered.values())  # the wing's, not a listed stand-in


def test_no_pydantic_adapter_is_built_at_import():
    """Every module that types a file with pydantic imported: no TypeAdapter is built until a file is read
    (each cost milliseconds of every run's start-up)."""
    typed = sorted(".".join(path.relative_to(ROOT).with_suffix("").parts) for path in (ROOT / "toolkit").rglob("*.py")
                   if "import pydantic" in path.read_text())
    assert len(typed) >= 6
    script = ("import importlib, sys, pydantic\n"
              "built = []\n"
              "real = pydantic.TypeAdapter.__init__\n"
              "def counted(self, *a, **k):\n"
              "    built.append(repr(a[0]))\n"
              "    real(self, *a, **k)\n"
              "pydantic.TypeAdapter.__init__ = counted\n"
              "for name in sys.argv[1:]:\n"
              "    importlib.import_module(name)\n"
              "print(*built, sep='\\n')\n")
    done = subprocess.run([sys.executable, "-c", script, *typed], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


# a verb's threads read sysconfig's table (uv's find_uv_bin, imports); its first fill is unguarded before CPython
# 3.13, so a reader beside it saw the table empty: `toolkit lock py-cu132` once ended in a TypeError traceback
SYSCONFIG_FILLED = """
import sys, sysconfig
from toolkit.base.entry import run_main
def verb(argv):
    print(sysconfig._CONFIG_VARS is not None and sysconfig._CONFIG_VARS.get("EXE") is not None)
    return 0
sys.exit(run_main(verb, []))
"""


def test_every_verb_starts_with_sysconfigs_table_filled():
    done = subprocess.run([sys.executable, "-c", SYSCONFIG_FILLED], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr


# Ctrl-C while a module imported late makes a class: CPython 3.11 wraps the KeyboardInterrupt raised in a descriptor's
# __set_name__ (a dataclass's field: rich's table, imported by the first status line) in a RuntimeError, and an
# interrupted `toolkit lock` now and then ended in that traceback (tests/test_hostile_lock_install.py's Ctrl-C test)
INTERRUPTED_IN_A_CLASS = """
import os, signal, sys, time
from toolkit.base.entry import run_main
class Descriptor:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        time.sleep(1)  # the signal's handler runs here
def verb(argv):
    class Made:
        field = Descriptor()
    return 0
sys.exit(run_main(verb, []))
"""


# a signal after an interrupted run's cleanup (its exit hooks, the interpreter's finalization) must not change how it
# ends: `toolkit lock` interrupted by Ctrl-C now and then ended killed by SIGINT (-2) after its one line
SIGNALLED_AT_THE_EXIT = """
import atexit, os, signal, subprocess, sys, time
from toolkit.base.entry import run_main
def late():  # registered first, run last: a second signal comes while the program ends
    subprocess.Popen(["sh", "-c", f"kill -{sys.argv[1][3:]} {os.getpid()}"]).wait()
    time.sleep(0.5)
atexit.register(late)
def verb(argv):
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    time.sleep(5)
sys.exit(run_main(verb, []))
"""


@pytest.mark.parametrize("script", [INTERRUPTED_IN_A_CLASS, SIGNALLED_AT_THE_EXIT], ids=["class", "second-signal"])
@pytest.mark.parametrize("signame, exit_code, by", [("SIGINT", 130, "Ctrl-C"), ("SIGTERM", 143, "SIGTERM")])
def test_an_interrupted_run_ends_with_the_interruptions_line_and_exit_code(script, signame, exit_code, by):
    done = subprocess.run([sys.executable, "-c", script, signame], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == exit_code, done.stderr
    assert done.stderr.splitlines() == [f"error: interrupted by {by} (this run's temporary files are removed as it "
                                        "exits; re-run the same command)"]


# the interpreter's finalization ran a collection over every object a verb made and imported: 0.12-0.15 s of a
# conda line's lock, 0.02 s of a warm install (docs/results/2026-12-06-everyday-install)
FROZEN_AT_EXIT = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))  # runs after the toolkit's
from toolkit.base.entry import run_main
def verb(argv):
    print("frozen while the verb runs:", gc.get_freeze_count() > 0, flush=True)
    return 0
sys.exit(run_main(verb, []))
"""


def test_a_program_ends_without_the_interpreters_last_collection_over_its_objects():
    done = subprocess.run([sys.executable, "-c", FROZEN_AT_EXIT], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["frozen while the verb runs: False", "frozen at exit: True"]
