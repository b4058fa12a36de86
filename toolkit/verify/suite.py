"""The seam between `toolkit verify` and each attention implementation it checks: a `Suite`.

Each implementation's suite is a module beside this one, named in command.SUITES, that offers what the protocol lists: its cases
for a level, how to import the implementation, how to run a case list, its parity if any, where its reports go.
toolkit/verify/command.py names them in SUITES and holds what they share (the verb, the child re-executed under
the line's python, the GPU gate, environment, progress and reports), so a new implementation is one module here
and one line there. This module imports only the standard library: the CLI loads it to register the verb.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from toolkit.spec.envspec import EnvSpec
    from toolkit.verify.cases import Case
    from toolkit.verify.parity import ParityResult
    from toolkit.verify.runner import CaseResult

# The suites' adapters name these in their signatures; torch is imported only where a measurement runs.
Tensor = Any  # torch.Tensor
Device = Any  # a torch.device or its name
Window = tuple[int, int]  # FA2's (left, right), -1 unbounded


@dataclass(frozen=True)
class Run:
    """One verification run as a suite sees it, in the python that measures."""

    line: str
    level: str
    report_dir: Path
    command: str  # the command that reproduces the run, recorded in the report
    given_arch: int | None = None  # --arch
    profile: str | None = (
        None  # the build profile the line's spec names, for a suite that has profiles
    )

    @property
    def arch(self) -> int:
        """The sm the cases are judged for, e.g. 90: --arch, else the GPU's (asked only by a suite that needs it,
        so a CPU test double of one that does not never meets torch.cuda)."""
        if self.given_arch:
            return self.given_arch
        import torch

        major, minor = torch.cuda.get_device_capability()
        return int(major) * 10 + int(minor)


class Suite(Protocol):
    """What `toolkit verify LINE --impl NAME` needs of an implementation's suite (a module named in command.SUITES)."""

    @property
    def LEVEL_PREFIX(self) -> str:
        """What the report's level starts with ("" for the first suite, a prefix for each later one), so a
        report says which suite wrote it."""

    @property
    def WITH_PARITY(self) -> tuple[str, ...]:
        """The levels whose report carries transformers parity and the line's recommendation beside it."""

    def refusal(self, level: str) -> str:
        """Why this suite cannot run `level` (one line with the fix), or ""."""

    def build_profile(self, spec: EnvSpec) -> str | None:
        """The build profile the line's spec names for this implementation, handed to the measuring child, or
        None; a line that does not build the implementation is refused here, in one line naming its spec."""

    def import_implementation(self) -> tuple[ModuleType | None, str]:
        """(module, "") or (None, why it does not import): a broken install is a finding of the report."""

    def environment(self, module: ModuleType | None, run: Run) -> dict[str, Any]:
        """What the report records of the implementation beyond machine.environment_info's (which it replaces)."""

    def cases(self, level: str) -> list[Case]:
        """The cases of `level` ([] for a level of parity alone)."""

    def judge(
        self, module: Any, cases: list[Case], run: Run, on_result: Callable[[CaseResult], None]
    ) -> object:
        """Judge `cases` against the imported `module`, calling on_result after each (the caller collects them)."""

    def parity(self, level: str) -> list[ParityResult]:
        """transformers parity rows for `level` ([] where the level has none)."""
