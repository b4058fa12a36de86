"""FlashAttention-2's suite (`toolkit verify LINE`, the default): flash-attn 2.x judged through its own API.

Every case runs (FA2 is the API the cases and the runner are written for); the full and parity levels add
transformers' tiny-Llama parity with attn_implementation="flash_attention_2" beside sdpa and eager. Reports go to
the line's own report folder. A Suite (toolkit/verify/suite.py); importing it loads no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.verify import machine
from toolkit.verify.cases import LEVELS as CASES
from toolkit.verify.cases import Case
from toolkit.verify.suite import Run

if TYPE_CHECKING:
    from toolkit.spec.envspec import EnvSpec
    from toolkit.verify.parity import ParityResult
    from toolkit.verify.runner import CaseResult

DEVICE = "cuda"  # the CPU tests point this at the CPU and hand in a test double for flash-attn
LEVEL_PREFIX = ""
WITH_PARITY: tuple[str, ...] = ("full", "parity")


def refusal(level: str) -> str:
    return ""


def build_profile(spec: EnvSpec) -> str | None:
    return None


def import_implementation() -> tuple[ModuleType | None, str]:
    return machine.import_flash_attn()


def environment(module: ModuleType | None, run: Run) -> dict[str, Any]:
    """Nothing beyond machine.environment_info, which reads flash_attn and its extension."""
    return {}


def cases(level: str) -> list[Case]:
    return CASES[level]() if level in CASES else []


def judge(
    module: Any, cases: list[Case], run: Run, on_result: Callable[[CaseResult], None]
) -> object:
    from toolkit.verify.runner import run_suite

    return run_suite(module, cases, DEVICE, on_result)


def parity(level: str) -> list[ParityResult]:
    from toolkit.verify.parity import run_parity

    return run_parity(DEVICE) if level in WITH_PARITY else []
