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
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.verify.cases import (
    Case,
    case_features,
    import_finding,
    installed_version,
    level_with_extras,
)
from toolkit.verify.suite import Device, Run, Tensor, Window

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


def _unsupported_options(dropout_p: float, alibi_slopes: Any, return_attn_probs: bool) -> None:
    if dropout_p > 0 or alibi_slopes is not None or return_attn_probs:
        raise NotImplementedError("flash_attn.cute has no dropout, ALiBi or returned probabilities")


def page_size_for(seqlen_k: int) -> int:
    """The largest page (of FA4's tested sizes) that divides the cache length."""
    return next((size for size in (128, 64, 32, 16) if seqlen_k % size == 0), 0)


class Fa4Backend:
    """flash_attn.cute behind FA2's function signatures (the runner's contract)."""

    def __init__(self, module: Any):
        self.module = module
        self.__version__ = getattr(module, "__version__", None)

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
        _unsupported_options(dropout_p, alibi_slopes, return_attn_probs)
        return self.module.flash_attn_func(
            q,
            k,
            v,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=_window(window_size),
            softcap=softcap,
            deterministic=deterministic,
        )[0]

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
        _unsupported_options(dropout_p, alibi_slopes, return_attn_probs)
        return self.module.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=_window(window_size),
            softcap=softcap,
            deterministic=deterministic,
        )[0]

    def flash_attn_with_kvcache(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        k: Tensor | None = None,
        v: Tensor | None = None,
        cache_seqlens: Tensor = None,
        causal: bool = False,
        window_size: Window = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: Tensor | None = None,
    ) -> Tensor:
        """Attention over a KV cache held in shuffled pages (paged KV: varlen's page_table + seqused_k); the runner
        always passes cache_seqlens (its default is FA2's signature)."""
        import torch

        _unsupported_options(0.0, alibi_slopes, False)
        if k is not None or v is not None:
            raise NotImplementedError("flash_attn.cute has no in-place KV-cache append")
        batch, seqlen_k, heads_k, head_dim = k_cache.shape
        page = page_size_for(seqlen_k)
        if not page:
            raise NotImplementedError(f"cache length {seqlen_k} is not a multiple of a page size")
        per_seq = seqlen_k // page
        order = torch.randperm(batch * per_seq, generator=torch.Generator().manual_seed(seqlen_k))
        pages = [c.reshape(batch * per_seq, page, heads_k, head_dim) for c in (k_cache, v_cache)]
        pools = [torch.empty_like(p) for p in pages]
        for pool, source in zip(pools, pages):
            pool[order.to(pool.device)] = source
        page_table = order.view(batch, per_seq).to(device=q.device, dtype=torch.int32)
        return self.module.flash_attn_varlen_func(
            q,
            pools[0],
            pools[1],
            seqused_k=cache_seqlens.to(torch.int32),
            page_table=page_table,
            causal=causal,
            window_size=_window(window_size),
            softcap=softcap,
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


PARITY_IMPLEMENTATIONS = ("flash_attention_4", "sdpa", "eager")


def transformers_names_fa4() -> str:
    """ "" when the installed transformers registers attn_implementation "flash_attention_4", else why not."""
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except Exception as exc:  # no transformers, or one too old to have the attention registry
        return f"transformers has no attention registry here ({type(exc).__name__}: {exc})"[:300]
    if "flash_attention_4" not in ALL_ATTENTION_FUNCTIONS:
        return "this transformers does not register attn_implementation 'flash_attention_4'"
    return ""


def run_fa4_parity(device: Device) -> list[ParityResult]:
    """transformers' tiny-Llama parity (toolkit/verify/parity.py) with flash_attention_4 beside sdpa and eager;
    every FA4 row is "unsupported" where this transformers has no such attn_implementation."""
    import torch

    from toolkit.verify.parity import ParityResult, run_parity, scenarios

    why = transformers_names_fa4()
    chosen = tuple(i for i in PARITY_IMPLEMENTATIONS if not (why and i == "flash_attention_4"))
    rows = run_parity(device, chosen)
    if why:
        rows += [
            ParityResult(f"{name}/flash_attention_4", "unsupported", None, None, 0.0, why)
            for name in scenarios(torch.device("cpu"))
        ]
    return rows


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
    return run_fa4_parity(DEVICE) if level in WITH_PARITY else []
