"""The one wrapper around every program's main: `toolkit` and each `python -m toolkit...` child.

Every program ends the same way: a ToolkitError is one `error:` line and its exit code, Ctrl-C and SIGTERM
unwind like an interrupt (the run's temporaries removed) and end in one line with 130 / 143, and a declared
dependency that is not installed is named with its install command. Only the standard library at the top:
the verify and bench children run under a line's python that may lack the toolkit's dependencies.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import re
import signal
import sys
import sysconfig
from collections.abc import Callable, Sequence
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from toolkit.base.atomic import Terminated, terminate_like_interrupt
from toolkit.base.errors import ToolkitError

if TYPE_CHECKING:
    from packaging.requirements import Requirement


class Program(Protocol):
    def __call__(self, argv: list[str] | None = None) -> int: ...


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """main(argv)'s exit code; every failure a user can cause is one line on stderr, never a traceback."""
    announced: list[KeyboardInterrupt] = []

    def announce(
        exc: KeyboardInterrupt,
    ) -> None:  # at the signal, before the cleanup: see terminate_like_interrupt
        if not announced:
            announced.append(exc)
            print(f"error: {interrupted_line(exc)}", file=sys.stderr, flush=True)

    # sysconfig fills its table on the first call, unguarded before CPython 3.13: a verb's threads reading it at
    # once (uv's find_uv_bin beside imports in a lock's threads) saw it empty, EXE None, and a traceback
    sysconfig.get_config_vars()
    collect_young_seldom()
    end_without_last_collection()
    try:
        with terminate_like_interrupt(announce):
            return main(argv)
    except KeyboardInterrupt as exc:
        first = announced[0] if announced else exc
        announce(first)
        return interrupted_exit(first)
    except Exception as exc:
        if announced:
            # the interruption, turned into another exception on its way up: CPython 3.11 wraps one raised while
            # a class is made (a dataclass's field in a module imported late: its __set_name__) in a RuntimeError,
            # which ended `toolkit lock` interrupted by Ctrl-C in a traceback now and then; or a cleanup's error
            return interrupted_exit(announced[0])
        return failure_exit(exc)


def interrupted_exit(first: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM: the run is over, its cleanup done, so SIGINT and SIGTERM are blocked from
    here to the exit. Without it an interrupted `toolkit lock` ended now and then killed by SIGINT (-2) after its
    one line and its exit hooks (the Ctrl-C test under load: 2 in 43 runs; none in 123 with both signals blocked
    in an exit hook), and a second SIGTERM while a program ends killed it (-15)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    return 143 if isinstance(first, Terminated) else 130


def failure_exit(exc: Exception) -> int:
    """The exit code of a failure `run_main` answers in one line (its line printed), or exc raised again: a bug's
    traceback."""
    if isinstance(exc, ToolkitError):
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    missing = missing_dependency(exc) if isinstance(exc, ModuleNotFoundError) else None
    if missing is not None:
        print(f"error: {missing}", file=sys.stderr)
        return 1
    if isinstance(exc, BrokenPipeError):
        # the reader left (`toolkit matrix show --json | head`): stop quietly, as a shell tool does; the exit's
        # flush writes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    raise exc


# CPython collects its youngest generation every 700 allocations; a program, every YOUNG_COLLECTION
YOUNG_COLLECTION = 50_000


def collect_young_seldom() -> None:
    """A verb's start-up allocates some 50,000 objects that live to its end (its modules' classes, functions and
    tables); collected every 700 allocations, each of ~80 collections walked the young ones again: 12-15 ms of
    a conda line's lock, none at YOUNG_COLLECTION. A long verb keeps its collector: each collection walks at
    most that many young objects. The older generations' thresholds are unchanged."""
    gc.set_threshold(YOUNG_COLLECTION)


def end_without_last_collection() -> None:
    """At this process's exit, freeze the collector's objects (gc.freeze) before the interpreter finalizes: its
    finalization otherwise runs a collection over every object the verb made and imported, 0.02 s
    of a warm install and 0.12-0.15 s of a conda line's lock (pydantic's and conda-lock's), a tenth of each.
    Frozen objects are still released by their reference counts; only garbage in reference cycles is left to
    the process's end, and the toolkit closes its files and removes its temporaries itself (`with`), never in a
    finalizer. Registered once a process, before the verb runs: the exit handlers its libraries register (their
    temporaries' removal) run before it, and freezing stops none of those registered earlier."""
    global _EXIT_FREEZE_REGISTERED
    if not _EXIT_FREEZE_REGISTERED:
        atexit.register(gc.freeze)
        _EXIT_FREEZE_REGISTERED = True


_EXIT_FREEZE_REGISTERED = False


def interrupted_line(exc: KeyboardInterrupt) -> str:
    by = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
    return f"interrupted by {by} (this run's temporary files are removed as it exits; re-run the same command)"


def program(main: Callable[[list[str] | None], int]) -> Program:
    """A program's `main(argv=None) -> int`, run through run_main: `python -m` and a test calling main()
    get the same exit code and line."""

    @wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        return run_main(main, argv)

    return wrapped


def add_renamed_option(parser: argparse.ArgumentParser, old: str, now: str) -> None:
    """An option's earlier spelling, hidden from --help: given, it is refused in one line that says what to
    write now (`now`: the command or option that replaced it), instead of argparse's usage block."""

    class Renamed(argparse.Action):
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: object,
            option_string: str | None = None,
        ) -> None:
            raise ToolkitError(f"{parser.prog}: {old} is gone: write {now}")

    parser.add_argument(
        old, nargs="?", action=Renamed, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )


def rename_notice(prog: str, old: str, now: str) -> None:
    """The one line an old spelling that still works prints (stderr, so a --json reader is not disturbed)."""
    print(f"{prog}: {old} is now {now}; the old spelling still works", file=sys.stderr)


def add_option_alias(parser: argparse.ArgumentParser, old: str, now: str) -> None:
    """An option's earlier spelling that keeps working, hidden from --help: `old VALUE` is `now VALUE` (the
    value goes through now's type and choices), after a one-line rename notice."""
    target = next(a for a in parser._actions if now in a.option_strings)

    class Alias(argparse.Action):
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: object,
            option_string: str | None = None,
        ) -> None:
            rename_notice(parser.prog, old, now)
            words = (
                values if isinstance(values, list) else [str(values)]
            )  # one word: the alias takes one value
            target(parser, namespace, parser._get_values(target, words), now)

    parser.add_argument(
        old,
        action=Alias,
        dest=argparse.SUPPRESS,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
        metavar=target.metavar,
    )


def renamed_choice(
    choices: tuple[str, ...], renamed: dict[str, str], prog: str
) -> Callable[[str], str]:
    """An argparse `type=` for a choice whose values were renamed: an old value (`renamed`: old -> new) is
    read as its new one after a one-line notice; anything else is left for `choices` to judge."""

    def read(value: str) -> str:
        if value in renamed and value not in choices:
            rename_notice(prog, value, renamed[value])
            return renamed[value]
        return value

    return read


class RenamedVerb(argparse.ArgumentParser):
    """A verb's earlier spelling (see add_renamed_verb): whatever follows it, it is refused in one line."""

    now = ""

    def parse_known_args(  # type: ignore[override]  # argparse calls it on the verb's words
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        raise ToolkitError(f"{self.prog} is gone: write {self.now}")


def add_renamed_verb(verbs: argparse._SubParsersAction, old: str, now: str) -> None:
    """A verb's earlier spelling, hidden from the verb list: given, with any options after it, it is refused
    in one line that says what to write now, instead of argparse's usage block or an unknown-verb error."""
    parser = verbs.add_parser(
        old, add_help=False
    )  # its prog ("toolkit VERB OLD"); no help: not listed
    renamed = RenamedVerb(prog=parser.prog, add_help=False)
    renamed.now = now
    verbs.choices[old] = renamed


class DefaultStep(argparse.ArgumentParser):
    """A verb with steps, one of them its default (see add_verb_with_default_step)."""

    default_step = ""

    def parse_known_args(  # type: ignore[override]  # argparse calls it on the verb's words
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        steps = next(a for a in self._actions if isinstance(a, argparse._SubParsersAction)).choices
        if not words or (words[0] not in steps and words[0] not in ("-h", "--help")):
            words = [self.default_step, *words]
        return super().parse_known_args(words, namespace)


def add_verb_with_default_step(
    verbs: argparse._SubParsersAction, name: str, default_step: str, **kwargs: Any
) -> argparse._SubParsersAction:
    """A verb whose steps are verbs of their own (`matrix show`, `matrix run`), where words that name no step
    go to `default_step`: `toolkit matrix --json`, `toolkit matrix cu126` are `toolkit matrix show ...`, as the
    README spells them. Returns what its steps are added to (`add_parser`), as plain parsers: a step is no
    DefaultStep of its own."""
    prog = verbs.add_parser(name).prog  # its prog (the entry lists the verb: toolkit/cli.py)
    parser = DefaultStep(prog=prog, **kwargs)
    parser.default_step = default_step
    verbs.choices[name] = parser
    return parser.add_subparsers(
        title="steps", metavar="STEP", parser_class=argparse.ArgumentParser
    )


def parse_verb_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parser.parse_args(argv), except that words no verb knows are refused by the verb they were given to,
    with its usage and the nearest option it has (argparse answers with the top-level usage and no guess)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        import difflib

        verb = handler_parser(parser, args.func) or parser
        options = [
            o for a in verb._actions if a.help != argparse.SUPPRESS for o in a.option_strings
        ]
        guesses = [
            difflib.get_close_matches(word.partition("=")[0], options, n=1)
            for word in unknown
            if word.startswith("-")
        ]
        hint = ", ".join(f"did you mean {g[0]}?" for g in guesses if g)
        verb.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" ({hint})" if hint else ""))
    return args


def handler_parser(parser: argparse.ArgumentParser, func: object) -> argparse.ArgumentParser | None:
    """The verb's parser whose handler is `func` (argparse keeps no other trace of which verb ran)."""
    for group in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        for sub in group.choices.values():
            if (found := handler_parser(sub, func)) is not None:
                return found
    return parser if parser.get_default("func") is func else None


def declared_requirements() -> list[Requirement]:
    """fa-envkit's dependencies, extras included: the installed distribution's metadata, else (run from a
    checkout) pyproject.toml beside the package."""
    from importlib import metadata  # here, not at the top: every run's start-up would pay for it

    from packaging.requirements import Requirement

    try:
        lines = metadata.requires("fa-envkit") or []
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        if sys.version_info < (3, 11) or not pyproject.is_file():
            return []
        import tomllib

        project = tomllib.loads(pyproject.read_text())["project"]
        lines = [
            *project["dependencies"],
            *(
                f"{r}; extra == '{extra}'"
                for extra, rs in project["optional-dependencies"].items()
                for r in rs
            ),
        ]
    return [Requirement(line) for line in lines]


def missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """The one line for a declared dependency that is not installed (a lazy import failed mid-run), naming
    the distribution and the install command; None for any other missing module (a bug: its traceback),
    and where packaging itself is missing (a line's python running a child), since it cannot tell."""
    try:
        from packaging.utils import canonicalize_name
    except ModuleNotFoundError:
        return None
    module = (exc.name or "").partition(".")[0]
    for req in declared_requirements():
        name = canonicalize_name(req.name)
        if module in {
            name.replace("-", "_"),
            name.replace("-", ""),
            name.removeprefix("py-").replace("-", "_"),
            name.removeprefix("py"),
        }:  # conda_lock, rattler (py-rattler), yaml (pyyaml)
            extra = re.search(r"extra == ['\"]([\w.-]+)", str(req.marker or ""))
            wanted = f"{req.name} (its {extra.group(1)} extra)" if extra else req.name
            return (
                f"fa-envkit needs {wanted}, which this python lacks (no module {module!r}): "
                f"{sys.executable} -m pip install '{req.name}{req.specifier}'"
            )
    return None
