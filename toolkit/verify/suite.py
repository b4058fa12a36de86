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


@dataclass(frozen=True)
class Options:
    """FA2's options every attention call shares, as an adapter hands them to its implementation's own API."""

    softmax_scale: float | None
    causal: bool
    window_size: Window
    softcap: float
    deterministic: bool


@dataclass(frozen=True)
class Lengths:
    """FA2's varlen arguments beside q, k, v: the cumulative sequence lengths and the longest of each."""

    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    max_seqlen_q: int
    max_seqlen_k: int


@dataclass(frozen=True)
class KvCache:
    """FA2's KV-cache arguments: the caches, the new keys and values to append (or None) and the cache lengths."""

    k_cache: Tensor
    v_cache: Tensor
    k: Tensor | None
    v: Tensor | None
    cache_seqlens: Tensor | None


class Fa2Adapter:
    """An implementation behind FA2's five function signatures, the runner's contract (toolkit/verify/runner.py).

    FA2's signatures are spelled here once, for every implementation that is not FA2: a subclass calls its own API
    in `func`, `qkvpacked`, `kvpacked`, `varlen` and `kvcache`, each handed the shared options as one `Options`.
    The adapted APIs have no dropout, ALiBi or returned probabilities, so asking for them raises NotImplementedError
    (the runner records the case as an error naming why), as does an entry point the implementation lacks."""

    NAME = "this implementation"  # what a refusal names, e.g. "flash_attn_interface"

    def __init__(self, module: Any):
        self.module = module

    def _options(
        self,
        dropout_p: float,
        alibi_slopes: Tensor | None,
        return_attn_probs: bool,
        softmax_scale: float | None,
        causal: bool,
        window_size: Window,
        softcap: float,
        deterministic: bool,
    ) -> Options:
        if dropout_p > 0 or alibi_slopes is not None or return_attn_probs:
            raise NotImplementedError(
                f"{self.NAME} has no dropout, ALiBi or returned probabilities"
            )
        return Options(softmax_scale, causal, window_size, softcap, deterministic)

    def _lacks(self, entry_point: str) -> NotImplementedError:
        return NotImplementedError(f"{self.NAME} has no {entry_point}")

    # ---------------------------------------------------------------- FA2's signatures (the runner calls these)

    def flash_attn_func(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: Window = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: Tensor | None = None,
        deterministic: bool = False,
        return_attn_probs: bool = False,
    ) -> Tensor:
        options = self._options(
            dropout_p, alibi_slopes, return_attn_probs, softmax_scale, causal, window_size,
            softcap, deterministic,
        )  # fmt: skip
        return self.func(q, k, v, options)

    def flash_attn_qkvpacked_func(
        self,
        qkv: Tensor,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: Window = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: Tensor | None = None,
        deterministic: bool = False,
        return_attn_probs: bool = False,
    ) -> Tensor:
        options = self._options(
            dropout_p, alibi_slopes, return_attn_probs, softmax_scale, causal, window_size,
            softcap, deterministic,
        )  # fmt: skip
        return self.qkvpacked(qkv, options)

    def flash_attn_kvpacked_func(
        self,
        q: Tensor,
        kv: Tensor,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: Window = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: Tensor | None = None,
        deterministic: bool = False,
        return_attn_probs: bool = False,
    ) -> Tensor:
        options = self._options(
            dropout_p, alibi_slopes, return_attn_probs, softmax_scale, causal, window_size,
            softcap, deterministic,
        )  # fmt: skip
        return self.kvpacked(q, kv, options)

    def flash_attn_varlen_func(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cu_seqlens_q: Tensor,
        cu_seqlens_k: Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: Window = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: Tensor | None = None,
        deterministic: bool = False,
        return_attn_probs: bool = False,
    ) -> Tensor:
        options = self._options(
            dropout_p, alibi_slopes, return_attn_probs, softmax_scale, causal, window_size,
            softcap, deterministic,
        )  # fmt: skip
        lengths = Lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        return self.varlen(q, k, v, lengths, options)

    def flash_attn_with_kvcache(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        k: Tensor | None = None,
        v: Tensor | None = None,
        cache_seqlens: Tensor | None = None,
        causal: bool = False,
        window_size: Window = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: Tensor | None = None,
    ) -> Tensor:
        options = self._options(0.0, alibi_slopes, False, None, causal, window_size, softcap, False)
        return self.kvcache(q, KvCache(k_cache, v_cache, k, v, cache_seqlens), options)

    # ---------------------------------------------------------------- the implementation's own calls

    def func(self, q: Tensor, k: Tensor, v: Tensor, options: Options) -> Tensor:
        raise self._lacks("flash_attn_func")

    def qkvpacked(self, qkv: Tensor, options: Options) -> Tensor:
        raise self._lacks("flash_attn_qkvpacked_func")

    def kvpacked(self, q: Tensor, kv: Tensor, options: Options) -> Tensor:
        raise self._lacks("flash_attn_kvpacked_func")

    def varlen(self, q: Tensor, k: Tensor, v: Tensor, lengths: Lengths, options: Options) -> Tensor:
        raise self._lacks("flash_attn_varlen_func")

    def kvcache(self, q: Tensor, cache: KvCache, options: Options) -> Tensor:
        raise self._lacks("flash_attn_with_kvcache")
