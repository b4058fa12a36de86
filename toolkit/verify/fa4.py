"""Verify FlashAttention-4 (flash_attn.cute) with the same cases, fp32 reference and criterion as FA2.

FA4's API differs from FA2's (window sides are None instead of -1, varlen takes keywords, functions
return (out, lse), paged KV goes through flash_attn_varlen_func's page_table), so `Fa4Backend` wraps
it in FA2's signatures and the unchanged runner judges it. Which cases apply comes from
knowledge/flash_attn_4.yaml: a case whose features and head dim the knowledge lists for the GPU's sm
runs, and its failure is a failure; any other case is recorded as "unsupported" with the reason,
never silently skipped.

`toolkit verify LINE --impl flash-attn-4 [--arch SM]` runs it in the env's own python (torch + flash_attn.cute;
pyyaml only to read the knowledge file), a Suite (toolkit/verify/suite.py). `--level parity` runs transformers'
tiny-Llama parity with attn_implementation="flash_attention_4" (a report of its own, so that a transformers
integration problem never marks the kernels unverified).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.verify.cases import (
    Case,
    case_features,
    import_finding,
    installed_version,
    level_with_extras,
)
from toolkit.verify.suite import Device, Fa2Adapter, KvCache, Lengths, Options, Run, Tensor

if TYPE_CHECKING:
    from toolkit.spec.envspec import EnvSpec
    from toolkit.verify.parity import ParityResult
    from toolkit.verify.runner import CaseResult

DEVICE = "cuda"  # the CPU tests point this at the CPU and hand in a test double for flash_attn.cute
LEVEL_PREFIX = "fa4-"
WITH_PARITY: tuple[str, ...] = ("parity",)  # a report of its own: the kernels' levels carry none


def listed_features(knowledge: dict, arch: int) -> dict[str, set[str]]:
    """feature -> {"fwd", "bwd"} for the sm family of `arch` (90 -> sm90, 100/103 -> sm100)."""
    family = f"sm{arch // 10 * 10}"
    return {
        name: set(facts[family]) for name, facts in knowledge["features"].items() if family in facts
    }


def unsupported_reason(case: Case, knowledge: dict, arch: int) -> str:
    """Why the knowledge does not list this case for the GPU, or "" when it does."""
    family = f"sm{arch // 10 * 10}"
    listed = listed_features(knowledge, arch)
    passes = (
        {"fwd", "bwd"} if case.backward else {"fwd"}
    )  # a feature must work in every pass the case runs
    missing = sorted(
        f
        for f in case_features(case)
        if not ({"bwd"} if f == "backward" else passes) <= listed.get(f, set())
    )
    dims = knowledge["head_dims"].get(family)
    if dims is None:
        return f"flash_attn_4.yaml lists no head dims for {family}"
    for rule, scope in ((dims, ""), (dims.get("bwd") if case.backward else None, " backward")):
        if rule and not (
            rule["min"] <= case.head_dim <= rule["max"] and case.head_dim % rule["multiple_of"] == 0
        ):
            return (
                f"head dim {case.head_dim} not listed for {family}{scope} ({rule['min']}..{rule['max']}, "
                f"multiple of {rule['multiple_of']}; flash_attn_4.yaml head_dims)"
            )
    if missing:
        return f"not listed for {family} in flash_attn_4.yaml: {', '.join(missing)}"
    return ""


def _window(window: tuple[int, int]) -> tuple[int | None, int | None]:
    """FA2's -1 (unbounded side) is FA4's None."""
    left, right = window
    return (None if left < 0 else left, None if right < 0 else right)


def page_size_for(seqlen_k: int) -> int:
    """The largest page (of FA4's tested sizes) that divides the cache length."""
    return next((size for size in (128, 64, 32, 16) if seqlen_k % size == 0), 0)


def _fa4_options(options: Options) -> dict[str, Any]:
    """The shared options in FA4's spelling (window sides None, not -1)."""
    return {**asdict(options), "window_size": _window(options.window_size)}


class Fa4Backend(Fa2Adapter):
    """flash_attn.cute behind FA2's function signatures (the runner's contract): its own calls."""

    NAME = "flash_attn.cute"

    def __init__(self, module: Any):
        super().__init__(module)
        self.__version__ = getattr(module, "__version__", None)

    def func(self, q: Tensor, k: Tensor, v: Tensor, options: Options) -> Tensor:
        return self.module.flash_attn_func(q, k, v, **_fa4_options(options))[0]

    def varlen(self, q: Tensor, k: Tensor, v: Tensor, lengths: Lengths, options: Options) -> Tensor:
        return self.module.flash_attn_varlen_func(
            q, k, v, **vars(lengths), **_fa4_options(options)
        )[0]

    def kvcache(self, q: Tensor, cache: KvCache, options: Options) -> Tensor:
        """Attention over a KV cache held in shuffled pages (paged KV: varlen's page_table + seqused_k); the runner
        always passes cache_seqlens (its default is FA2's signature)."""
        import torch

        if cache.k is not None or cache.v is not None:
            raise NotImplementedError("flash_attn.cute has no in-place KV-cache append")
        if cache.cache_seqlens is None:
            raise NotImplementedError("flash_attn.cute's paged cache call needs cache_seqlens")
        batch, seqlen_k, heads_k, head_dim = cache.k_cache.shape
        page = page_size_for(seqlen_k)
        if not page:
            raise NotImplementedError(f"cache length {seqlen_k} is not a multiple of a page size")
        per_seq = seqlen_k // page
        order = torch.randperm(batch * per_seq, generator=torch.Generator().manual_seed(seqlen_k))
        pages = [
            c.reshape(batch * per_seq, page, heads_k, head_dim)
            for c in (cache.k_cache, cache.v_cache)
        ]
        pools = [torch.empty_like(p) for p in pages]
        for pool, source in zip(pools, pages):
            pool[order.to(pool.device)] = source
        page_table = order.view(batch, per_seq).to(device=q.device, dtype=torch.int32)
        return self.module.flash_attn_varlen_func(
            q,
            pools[0],
            pools[1],
            seqused_k=cache.cache_seqlens.to(torch.int32),
            page_table=page_table,
            causal=options.causal,
            window_size=_window(options.window_size),
            softcap=options.softcap,
        )[0]


def fa4_cases(level: str) -> list[Case]:
    return level_with_extras(level)


def run_fa4_suite(
    module: Any,
    cases: list[Case],
    device: Device,
    arch: int,
    knowledge: dict,
    on_result: Callable[[CaseResult], None] = lambda r: None,
) -> list[CaseResult]:
    """Listed cases through the runner (judged as for FA2); unlisted ones recorded as "unsupported"."""
    import torch

    from toolkit.verify.runner import CaseResult, run_case

    device = torch.device(device)
    torch.set_float32_matmul_precision("highest")
    backend = Fa4Backend(module)
    results = []
    for case in cases:
        reason = unsupported_reason(case, knowledge, arch)
        result = (
            CaseResult(case.name, case.api, case.params(), "unsupported", 0.0, message=reason)
            if reason
            else run_case(backend, case, device)
        )
        on_result(result)
        results.append(result)
    return results


def import_fa4() -> tuple[ModuleType | None, str]:
    """flash_attn.cute; a missing `cutlass` (the .pth trap) or a driver mismatch is a finding."""
    return import_finding("flash_attn.cute")


def fa4_version() -> str | None:
    """flash_attn.cute.__version__ reads the distribution "fa4" and says 0.0.0; the wheel's name is flash-attn-4."""
    return installed_version("flash-attn-4")


ATTN_IMPLEMENTATION = "flash_attention_4"  # transformers' name for FA4 (its parity level)


# ---------------------------------------------------------------- the Suite (toolkit/verify/suite.py)


def refusal(level: str) -> str:
    return ""


def build_profile(spec: EnvSpec) -> str | None:
    return None


def import_implementation() -> tuple[ModuleType | None, str]:
    return import_fa4()


def environment(module: ModuleType | None, run: Run) -> dict[str, Any]:
    return {
        "flash_attn": {
            "version": fa4_version(),
            "path": getattr(module, "__file__", None),
            "package": "flash-attn-4 (flash_attn.cute)",
            "extension": None,
        },
        "arch": run.arch,
    }


def cases(level: str) -> list[Case]:
    return [] if level in WITH_PARITY else fa4_cases(level)


def judge(
    module: Any, cases: list[Case], run: Run, on_result: Callable[[CaseResult], None]
) -> object:
    from toolkit.knowledge.fa4_pins import knowledge

    return run_fa4_suite(module, cases, DEVICE, run.arch, knowledge(), on_result)


def parity(level: str) -> list[ParityResult]:
    from toolkit.verify.parity import run_implementation_parity

    return run_implementation_parity(DEVICE, ATTN_IMPLEMENTATION) if level in WITH_PARITY else []
