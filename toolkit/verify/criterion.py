"""Pass/fail rules, as in flash-attn's own tests (tests/test_flash_attn.py of 2.8.3).

A kernel's error is measured against the fp32 reference and compared with the error that torch makes
computing the same attention at the low precision: flash-attn may be at most `factor` times worse,
plus a small absolute epsilon (so that two near-zero errors do not fail on rounding noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Criterion:
    factor: float
    epsilon: float


# Upstream: outputs <= 2x, gradients <= 3x (test_flash_attn_output), + 1e-5 (test_flash_attn_causal).
OUTPUT = Criterion(factor=2.0, epsilon=1e-5)
GRADIENT = Criterion(factor=3.0, epsilon=1e-5)
# Upstream's test_flash_attn_kvcache allows 3x on the output: the split-KV kernel rescales partial results.
KVCACHE_OUTPUT = Criterion(factor=3.0, epsilon=1e-5)


def dropout_tolerance(windowed: bool, varlen: bool) -> float:
    """How far the observed dropped fraction may stray from dropout_p (upstream's bounds)."""
    if not windowed:
        return 0.01
    return 0.04 if varlen else 0.025


@dataclass(frozen=True)
class Check:
    """One comparison within a case: what was measured, the bound it had to meet, and the verdict."""

    name: str
    error: float  # flash-attn's error (or the measured quantity)
    bound: float
    passed: bool
    torch_error: float | None = (
        None  # the low-precision torch run's error, where the bound derives from it
    )

    def summary(self) -> str:
        base = f"{self.name}: {self.error:.3g} > {self.bound:.3g}"
        return base + (
            f" (torch low-precision error {self.torch_error:.3g})"
            if self.torch_error is not None
            else ""
        )


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


def relative_to_torch(
    name: str,
    actual: torch.Tensor,
    reference: torch.Tensor,
    torch_low: torch.Tensor,
    criterion: Criterion,
) -> Check:
    """flash-attn's max error vs the reference, bounded by criterion x torch's low-precision max error."""
    error = max_abs_diff(actual, reference)
    torch_error = max_abs_diff(torch_low, reference)
    bound = criterion.factor * torch_error + criterion.epsilon
    passed = math.isfinite(error) and error <= bound  # NaN/inf never pass
    return Check(name, error, bound, passed, torch_error)


def dropout_fraction(name: str, observed: float, dropout_p: float, tolerance: float) -> Check:
    deviation = abs(observed - dropout_p)
    return Check(name, deviation, tolerance, deviation <= tolerance)


def identical(name: str, first: list[torch.Tensor], second: list[torch.Tensor]) -> Check:
    """Bit-for-bit equality (deterministic backward, KV cache contents); error = the largest difference."""
    error = max(max_abs_diff(a, b) for a, b in zip(first, second))
    passed = all(torch.equal(a, b) for a, b in zip(first, second))
    return Check(name, error, 0.0, passed)
