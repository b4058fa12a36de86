"""Run verification cases against an attention backend and judge each one.

The backend is any object with flash-attn's five public functions (flash_attn_func,
flash_attn_qkvpacked_func, flash_attn_kvpacked_func, flash_attn_varlen_func,
flash_attn_with_kvcache) and their signatures: the installed `flash_attn` module on a GPU, a
pure-torch test double in the CPU tests. Every case is isolated: an exception (a missing kernel, a
CUDA error) is recorded as that case's error and the suite goes on.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from toolkit.verify import criterion, reference
from toolkit.verify.cases import Case
from toolkit.verify.criterion import Check


@dataclass
class CaseResult:
    name: str
    api: str
    params: dict
    status: str  # "passed" | "failed" | "error"
    duration_s: float
    checks: list[Check] = field(default_factory=list)
    message: str = ""
    traceback: str = ""


@dataclass
class Inputs:
    """Padded-layout leaves every API's inputs are derived from, so gradients land in one place."""

    q: torch.Tensor  # (batch, seqlen_q, nheads, head_dim)
    k: torch.Tensor  # (batch, seqlen_k, nheads_k, head_dim)
    v: torch.Tensor
    q_lens: torch.Tensor | None  # right-padding lengths (varlen only)
    k_lens: torch.Tensor | None
    alibi_slopes: torch.Tensor | None  # (batch, nheads) fp32

    def padded_lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q_lens, k_lens): make_inputs sets both for a varlen case, and only the varlen API takes them."""
        if self.q_lens is None or self.k_lens is None:
            raise ValueError(
                "the varlen API needs a varlen case's padded inputs (make_inputs with api varlen)"
            )
        return self.q_lens, self.k_lens

    def reference_options(self, case: Case) -> dict:
        return dict(
            q_lens=self.q_lens,
            k_lens=self.k_lens,
            causal=case.causal,
            window=case.window,
            softcap=case.softcap,
            alibi_slopes=self.alibi_slopes,
            dropout_p=case.dropout_p,
        )


def _random_lengths(seqlen: int, batch: int, device: torch.device) -> torch.Tensor:
    """Lengths between seqlen/2 and seqlen; the first sequence is full, so max_seqlen == seqlen."""
    lens = torch.randint(
        max(1, seqlen // 2), seqlen + 1, (batch,), device=device, dtype=torch.int32
    )
    lens[0] = seqlen
    return lens


def make_inputs(case: Case, device: torch.device) -> Inputs:
    torch.manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)
    scale = (
        case.softcap if case.softcap > 0 else 1.0
    )  # as upstream: put scores in the softcap's range

    def leaf(seqlen: int, heads: int, factor: float = 1.0) -> torch.Tensor:
        x = (
            torch.randn(case.batch, seqlen, heads, case.head_dim, device=device, dtype=dtype)
            * factor
        )
        return x.requires_grad_(case.backward)

    q = leaf(case.seqlen_q, case.nheads, scale)
    k, v = leaf(case.seqlen_k, case.nheads_k), leaf(case.seqlen_k, case.nheads_k)
    padded = case.api == "varlen"
    q_lens = _random_lengths(case.seqlen_q, case.batch, device) if padded else None
    k_lens = _random_lengths(case.seqlen_k, case.batch, device) if padded else None
    slopes = torch.rand(case.batch, case.nheads, device=device) * 0.3 if case.alibi else None
    return Inputs(q, k, v, q_lens, k_lens, slopes)


# ---------------------------------------------------------------- calling each API


def _api_options(case: Case, x: Inputs) -> dict:
    return dict(
        dropout_p=case.dropout_p,
        causal=case.causal,
        window_size=case.window,
        softcap=case.softcap,
        alibi_slopes=x.alibi_slopes,
        deterministic=case.deterministic,
        return_attn_probs=case.dropout_p > 0,
    )


def _call_func(backend: Any, case: Case, x: Inputs) -> Any:
    return backend.flash_attn_func(x.q, x.k, x.v, **_api_options(case, x))


def _call_qkvpacked(backend: Any, case: Case, x: Inputs) -> Any:
    return backend.flash_attn_qkvpacked_func(
        torch.stack([x.q, x.k, x.v], dim=2), **_api_options(case, x)
    )


def _call_kvpacked(backend: Any, case: Case, x: Inputs) -> Any:
    return backend.flash_attn_kvpacked_func(
        x.q, torch.stack([x.k, x.v], dim=2), **_api_options(case, x)
    )


def _call_varlen(backend: Any, case: Case, x: Inputs) -> Any:
    q_lens, k_lens = x.padded_lengths()
    q, q_index, cu_q, max_q = reference.unpad(x.q, q_lens)
    k, _, cu_k, max_k = reference.unpad(x.k, k_lens)
    v, _, _, _ = reference.unpad(x.v, k_lens)
    result = backend.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, **_api_options(case, x)
    )
    out = result[0] if isinstance(result, tuple) else result
    padded = reference.pad(out, q_index, case.batch, case.seqlen_q)
    return (padded, *result[1:]) if isinstance(result, tuple) else padded


CALLS: dict[str, Callable[[Any, Case, Inputs], Any]] = {
    "func": _call_func,
    "qkvpacked": _call_qkvpacked,
    "kvpacked": _call_kvpacked,
    "varlen": _call_varlen,
}


# ---------------------------------------------------------------- judging


def check_attention(backend: Any, case: Case, device: torch.device) -> list[Check]:
    """Forward and backward of one autograd API against the fp32 reference (upstream's recipe)."""
    x = make_inputs(case, device)
    result = CALLS[case.api](backend, case, x)
    out, probs = (result[0], result[2]) if case.dropout_p > 0 else (result, None)
    keep = (
        reference.keep_from_probs(probs, case.seqlen_q, case.seqlen_k)
        if probs is not None
        else None
    )
    options = x.reference_options(case)
    ref_out, _ = reference.attention_ref(x.q, x.k, x.v, keep=keep, **options)
    low_out, _ = reference.attention_ref(
        x.q, x.k, x.v, keep=keep, upcast=False, reorder_ops=True, **options
    )
    checks = [criterion.relative_to_torch("out", out, ref_out, low_out, criterion.OUTPUT)]
    if (
        keep is not None and not case.alibi
    ):  # with ALiBi many probabilities are +-0, the count is blurred
        allowed = reference.allowed_mask(
            case.batch,
            case.seqlen_q,
            case.seqlen_k,
            q_lens=x.q_lens,
            k_lens=x.k_lens,
            causal=case.causal,
            window=case.window,
            device=device,
        )
        tolerance = criterion.dropout_tolerance(case.window != (-1, -1), case.api == "varlen")
        checks.append(
            criterion.dropout_fraction(
                "dropped fraction",
                reference.dropped_fraction(keep, allowed),
                case.dropout_p,
                tolerance,
            )
        )
    leaves = (x.q, x.k, x.v)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, grad_out, retain_graph=case.deterministic)
    ref_grads = torch.autograd.grad(ref_out, leaves, grad_out)
    low_grads = torch.autograd.grad(low_out, leaves, grad_out)
    checks += [
        criterion.relative_to_torch(name, grad, ref, low, criterion.GRADIENT)
        for name, grad, ref, low in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads)
    ]
    if case.deterministic:
        again = torch.autograd.grad(out, leaves, grad_out)
        checks.append(criterion.identical("deterministic backward", list(grads), list(again)))
    return checks


def check_kvcache(backend: Any, case: Case, device: torch.device) -> list[Check]:
    """flash_attn_with_kvcache: the in-place cache append and the attention over the grown cache."""
    x = make_inputs(case, device)
    k_cache, v_cache = x.k.detach().clone(), x.v.detach().clone()
    new = case.new_tokens
    k_new = torch.randn_like(k_cache[:, :new]) if new else None
    v_new = torch.randn_like(v_cache[:, :new]) if new else None
    cache_seqlens = torch.randint(
        0 if new else 1, case.seqlen_k - new + 1, (case.batch,), dtype=torch.int32, device=device
    )
    k_expected, v_expected, k_lens = reference.kvcache_expected(
        k_cache, v_cache, k_new, v_new, cache_seqlens
    )
    out = backend.flash_attn_with_kvcache(
        x.q,
        k_cache,
        v_cache,
        k=k_new,
        v=v_new,
        cache_seqlens=cache_seqlens,
        causal=case.causal,
        window_size=case.window,
        softcap=case.softcap,
        alibi_slopes=x.alibi_slopes,
    )
    options: dict[str, Any] = dict(
        k_lens=k_lens,
        causal=case.causal,
        window=case.window,
        softcap=case.softcap,
        alibi_slopes=x.alibi_slopes,
    )
    ref_out, _ = reference.attention_ref(x.q, k_expected, v_expected, **options)
    low_out, _ = reference.attention_ref(
        x.q, k_expected, v_expected, upcast=False, reorder_ops=True, **options
    )
    checks = [criterion.relative_to_torch("out", out, ref_out, low_out, criterion.KVCACHE_OUTPUT)]
    if new:
        checks.append(
            criterion.identical("cache update", [k_cache, v_cache], [k_expected, v_expected])
        )
    return checks


def run_case(backend: Any, case: Case, device: torch.device) -> CaseResult:
    problem = case.problem()

    def checks() -> list[Check]:
        if problem:
            raise ValueError(f"invalid case: {problem}")
        if case.api == "kvcache":
            return check_kvcache(backend, case, device)
        return check_attention(backend, case, device)

    return judged(case, checks)


def judged(case: Case, checks: Callable[[], list[Check]]) -> CaseResult:
    """The case's result from its checks: passed, failed (naming the failed checks) or an error, isolated (one
    broken case is a finding, not the end of the suite). Every suite's cases are judged here."""
    start = time.perf_counter()
    try:
        found = checks()
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        message = f"{type(exc).__name__}: {first_line}"[:500]
        return CaseResult(
            case.name,
            case.api,
            case.params(),
            "error",
            time.perf_counter() - start,
            message=message,
            traceback=traceback.format_exc()[-4000:],
        )
    failed = [c for c in found if not c.passed]
    return CaseResult(
        case.name,
        case.api,
        case.params(),
        "failed" if failed else "passed",
        time.perf_counter() - start,
        found,
        "; ".join(c.summary() for c in failed),
    )


def run_suite(
    backend: Any,
    cases: list[Case],
    device: torch.device | str,
    on_result: Callable[[CaseResult], None] = lambda result: None,
) -> list[CaseResult]:
    """All cases in order; fp32 matmuls stay true fp32 (no TF32) so the reference is a reference."""
    device = torch.device(device)
    torch.set_float32_matmul_precision("highest")
    results = []
    for case in cases:
        result = run_case(backend, case, device)
        on_result(result)
        results.append(result)
    return results
