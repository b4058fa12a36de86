"""Verification suite (issue 5): reference attention, criterion, cases, runner, reports, CLI, parity.

No GPU here: the suite runs against `ReferenceAttention`, a TEST DOUBLE of the flash_attn module
(below); tests marked `gpu` run the same suite against the real flash-attn where a GPU exists.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

from toolkit.cli import main  # noqa: E402
from toolkit.verify import cases, criterion, reference, report, runner  # noqa: E402
from toolkit.verify.cases import Case  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch sees none)")


# ================================================================ the test double

# TEST DOUBLE for the `flash_attn` module (no GPU, so no real flash-attn, on the CI machines).
# It implements flash-attn's five public functions with flash-attn's signatures in pure torch, one
# sequence at a time through the fp32 reference (scaling k instead of q, so it rounds differently from
# the reference it is judged against), and returns results in the inputs' low precision:
# the verification machinery (inputs, packing, dropout-mask recovery, criterion, reports) runs against
# it exactly as it runs against the real module on a GPU. Knobs turn it into a *broken* kernel that
# the suite must catch: a causal mask shifted by one key, a wrong dV, a KV cache that is not written.
BLOCK = 128  # flash-attn rounds the returned probability matrix up to its block size


class _ScaleGrad(torch.autograd.Function):
    """Identity forward, gradient scaled by `factor`: a backward bug with a correct forward."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _round_up(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


class ReferenceAttention:
    """Stands in for the installed flash_attn module (TEST DOUBLE: see the comment above)."""

    __version__ = "0.0-test-double"
    __file__ = __file__

    def __init__(self, causal_off_by_one: bool = False, dv_factor: float = 1.0, write_cache: bool = True,
                 fail_api: str | None = None):
        self.causal_off_by_one = causal_off_by_one
        self.dv_factor = dv_factor
        self.write_cache = write_cache
        self.fail_api = fail_api

    # ------------------------------------------------------------ one sequence

    def _attend(self, q, k, v, slopes, dropout_p, causal, window, softcap):
        """q (1, sq, h, d), k/v (1, sk, hk, d) -> (out, signed probabilities (1, h, sq, sk))."""
        if self.causal_off_by_one and causal:
            causal, window = False, (window[0], 1)
        if self.dv_factor != 1.0:
            v = _ScaleGrad.apply(v, self.dv_factor)
        keep = None
        if dropout_p > 0:
            keep = torch.rand(1, q.shape[2], q.shape[1], k.shape[1], device=q.device) >= dropout_p
        out, probs = reference.attention_ref(q, k, v, causal=causal, window=tuple(window), softcap=softcap,
                                             alibi_slopes=slopes, dropout_p=dropout_p, keep=keep, reorder_ops=True)
        signed = probs if keep is None else torch.where(keep, probs, -probs)
        return out, signed

    def _batch(self, name, qs, ks, vs, dropout_p, causal, window_size, softcap, alibi_slopes, max_q, max_k):
        """Per-sequence outputs and the (batch, heads, max_q, max_k) block-rounded signed probabilities."""
        if name == self.fail_api:
            raise RuntimeError(f"{name}: no kernel image is available for execution on the device")
        outs, probs = [], torch.full((len(qs), qs[0].shape[1], _round_up(max_q), _round_up(max_k)), -1.0,
                                     dtype=qs[0].dtype, device=qs[0].device)
        for b, (q, k, v) in enumerate(zip(qs, ks, vs)):
            slopes = None if alibi_slopes is None else alibi_slopes[b:b + 1]
            out, signed = self._attend(q[None], k[None], v[None], slopes, dropout_p, causal, window_size, softcap)
            outs.append(out[0])
            probs[b, :, :q.shape[0], :k.shape[0]] = signed[0].detach()
        return outs, probs

    # ------------------------------------------------------------ flash-attn's API

    def flash_attn_func(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
        outs, probs = self._batch("flash_attn_func", q.unbind(0), k.unbind(0), v.unbind(0), dropout_p, causal,
                                  window_size, softcap, alibi_slopes, q.shape[1], k.shape[1])
        out = torch.stack(outs)
        return (out, None, probs) if return_attn_probs else out

    def flash_attn_qkvpacked_func(self, qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                                  window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                  return_attn_probs=False):
        return self.flash_attn_func(*qkv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap,
                                    alibi_slopes, deterministic, return_attn_probs)

    def flash_attn_kvpacked_func(self, q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                                 window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                 return_attn_probs=False):
        return self.flash_attn_func(q, *kv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap,
                                    alibi_slopes, deterministic, return_attn_probs)

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        def split(x, cu):
            return [x[start:end] for start, end in zip(cu[:-1].tolist(), cu[1:].tolist())]

        outs, probs = self._batch("flash_attn_varlen_func", split(q, cu_seqlens_q), split(k, cu_seqlens_k),
                                  split(v, cu_seqlens_k), dropout_p, causal, window_size, softcap, alibi_slopes,
                                  max_seqlen_q, max_seqlen_k)
        out = torch.cat(outs)
        return (out, None, probs) if return_attn_probs else out

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
        appended = 0 if k is None else k.shape[1]
        lengths = [start + appended for start in cache_seqlens.tolist()]
        if appended and self.write_cache:
            for b, start in enumerate(cache_seqlens.tolist()):
                k_cache[b, start:start + appended] = k[b]
                v_cache[b, start:start + appended] = v[b]
        outs, _ = self._batch("flash_attn_with_kvcache", q.unbind(0),
                              [k_cache[b, :n] for b, n in enumerate(lengths)],
                              [v_cache[b, :n] for b, n in enumerate(lengths)], 0.0, causal, window_size, softcap,
                              alibi_slopes, q.shape[1], k_cache.shape[1])
        return torch.stack(outs)


def small(case: Case) -> Case:
    """The same API and features at CPU-friendly sizes (windows kept shorter than the keys)."""
    seqlen_q, seqlen_k = max(1, case.seqlen_q // 8), max(case.new_tokens + 8, case.seqlen_k // 8)
    window = tuple(min(side, seqlen_k - 1) for side in case.window)
    return replace(case, seqlen_q=seqlen_q, seqlen_k=seqlen_k, window=window, head_dim=min(case.head_dim, 40))


# ================================================================ reference attention semantics


def test_causal_mask_is_bottom_right_aligned_as_flash_attn_documents():
    # The two examples of flash_attn_func's docstring (1 = keep).
    two_by_five = reference.allowed_mask(1, 2, 5, causal=True)[0, 0].int().tolist()
    assert two_by_five == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    five_by_two = reference.allowed_mask(1, 5, 2, causal=True)[0, 0].int().tolist()
    assert five_by_two == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]


def test_sliding_window_keeps_keys_between_left_and_right_of_the_diagonal():
    allowed = reference.allowed_mask(1, 6, 6, window=(2, 1))[0, 0]
    expected = [[-2 <= j - i <= 1 for j in range(6)] for i in range(6)]
    assert allowed.tolist() == expected
    # seqlen_q != seqlen_k: the diagonal shifts by seqlen_k - seqlen_q
    shifted = reference.allowed_mask(1, 2, 5, window=(1, 0))[0, 0]
    assert shifted.int().tolist() == [[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]


def _sdpa(q, k, v, **kwargs):
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                           v.transpose(1, 2), **kwargs)
    return out.transpose(1, 2)


@pytest.mark.parametrize("causal,heads_k", [(False, 4), (True, 4), (False, 2), (True, 1)])
def test_reference_agrees_with_torch_sdpa(causal, heads_k):
    torch.manual_seed(0)
    q = torch.randn(2, 33, 4, 16)
    k, v = torch.randn(2, 33, heads_k, 16), torch.randn(2, 33, heads_k, 16)
    out, probs = reference.attention_ref(q, k, v, causal=causal)
    expected = _sdpa(q, k, v, is_causal=causal, enable_gqa=heads_k != 4)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 33))


def test_reference_window_alibi_softcap_match_an_explicit_loop():
    """An independent oracle: every score computed one by one from the documented formulas."""
    torch.manual_seed(1)
    batch, seqlen_q, seqlen_k, heads, dim = 2, 5, 7, 2, 4
    q, k, v = torch.randn(batch, seqlen_q, heads, dim) * 3, torch.randn(batch, seqlen_k, heads, dim), \
        torch.randn(batch, seqlen_k, heads, dim)
    slopes = torch.rand(batch, heads) * 0.3
    left, right, softcap = 2, 1, 2.5
    out, _ = reference.attention_ref(q, k, v, window=(left, right), alibi_slopes=slopes, softcap=softcap)
    expected = torch.zeros_like(out)
    for b in range(batch):
        for h in range(heads):
            for i in range(seqlen_q):
                diagonal = i + seqlen_k - seqlen_q
                keys = [j for j in range(seqlen_k) if diagonal - left <= j <= diagonal + right]
                scores = []
                for j in keys:
                    s = float(q[b, i, h] @ k[b, j, h]) / math.sqrt(dim)
                    scores.append(softcap * math.tanh(s / softcap) - float(slopes[b, h]) * abs(diagonal - j))
                weights = torch.softmax(torch.tensor(scores), dim=0)
                expected[b, i, h] = sum(w * v[b, j, h] for w, j in zip(weights, keys))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_rows_with_nothing_to_attend_give_zeros_and_finite_gradients():
    q = torch.randn(1, 6, 2, 8, requires_grad=True)
    k, v = torch.randn(1, 3, 2, 8, requires_grad=True), torch.randn(1, 3, 2, 8, requires_grad=True)
    out, _ = reference.attention_ref(q, k, v, causal=True)  # queries 0..2 lie before every key
    assert out[:, :3].abs().max() == 0 and out[:, 3:].abs().min() > 0
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_padded_batch_equals_each_sequence_alone():
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 10, 2, 8), torch.randn(3, 12, 2, 8), torch.randn(3, 12, 2, 8)
    q_lens, k_lens = torch.tensor([10, 4, 7]), torch.tensor([12, 9, 5])
    slopes = torch.rand(3, 2)
    out, _ = reference.attention_ref(q, k, v, q_lens=q_lens, k_lens=k_lens, causal=True, alibi_slopes=slopes)
    for b, (n_q, n_k) in enumerate(zip(q_lens.tolist(), k_lens.tolist())):
        alone, _ = reference.attention_ref(q[b:b + 1, :n_q], k[b:b + 1, :n_k], v[b:b + 1, :n_k], causal=True,
                                           alibi_slopes=slopes[b:b + 1])
        torch.testing.assert_close(out[b:b + 1, :n_q], alone)
        assert out[b, n_q:].abs().max() == 0 if n_q < 10 else True


def test_dropout_scales_kept_probabilities():
    q, k, v = torch.randn(1, 8, 2, 4), torch.randn(1, 8, 2, 4), torch.randn(1, 8, 2, 4)
    plain, _ = reference.attention_ref(q, k, v)
    keep_all = torch.ones(1, 2, 8, 8, dtype=torch.bool)
    scaled, _ = reference.attention_ref(q, k, v, dropout_p=0.5, keep=keep_all)
    torch.testing.assert_close(scaled, 2 * plain)
    drop_all, _ = reference.attention_ref(q, k, v, dropout_p=0.5, keep=~keep_all)
    assert drop_all.abs().max() == 0


def test_unpad_and_pad_round_trip_and_carry_gradients():
    x = torch.randn(3, 5, 2, requires_grad=True)
    lens = torch.tensor([5, 2, 4], dtype=torch.int32)
    packed, indices, cu_seqlens, max_len = reference.unpad(x, lens)
    assert cu_seqlens.tolist() == [0, 5, 7, 11] and cu_seqlens.dtype == torch.int32 and max_len == 5
    torch.testing.assert_close(packed[5:7], x[1, :2])
    back = reference.pad(packed, indices, 3, 5)
    torch.testing.assert_close(back[1, :2], x[1, :2])
    assert back[1, 2:].abs().max() == 0
    back.sum().backward()
    assert x.grad[1].sum(-1).tolist() == [2, 2, 0, 0, 0]


def test_kvcache_expected_appends_at_each_sequence_length():
    k_cache, v_cache = torch.zeros(2, 6, 1, 1), torch.zeros(2, 6, 1, 1)
    k_new, v_new = torch.ones(2, 2, 1, 1), 2 * torch.ones(2, 2, 1, 1)
    k, v, lens = reference.kvcache_expected(k_cache, v_cache, k_new, v_new, torch.tensor([1, 4], dtype=torch.int32))
    assert k[:, :, 0, 0].tolist() == [[0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1]]
    assert v[1, 4:, 0, 0].tolist() == [2, 2] and lens.tolist() == [3, 6]
    assert k_cache.abs().max() == 0  # the inputs stay untouched


def test_kvcache_expected_without_new_tokens_is_the_cache_as_it_was():
    k_cache, v_cache = torch.arange(12.0).view(2, 6, 1, 1), torch.ones(2, 6, 1, 1)
    lengths = torch.tensor([2, 5], dtype=torch.int32)
    k, v, lens = reference.kvcache_expected(k_cache, v_cache, None, None, lengths)
    assert torch.equal(k, k_cache) and torch.equal(v, v_cache) and k is not k_cache
    assert lens.dtype == torch.int64 and lens.tolist() == [2, 5]


def test_the_varlen_call_refuses_inputs_made_without_padding():
    case = next(c for c in cases.smoke_cases() if c.api == "func")
    inputs = runner.make_inputs(case, torch.device("cpu"))
    with pytest.raises(ValueError, match="varlen API needs a varlen case"):
        inputs.padded_lengths()
    varlen = runner.make_inputs(replace(case, api="varlen"), torch.device("cpu"))
    q_lens, k_lens = varlen.padded_lengths()
    assert q_lens.max() == case.seqlen_q and k_lens.max() == case.seqlen_k


def test_keep_pattern_is_cropped_from_flash_attn_block_rounded_probabilities():
    probs = torch.full((1, 1, 128, 128), -1.0)  # rounded-up rows/columns must not count
    probs[0, 0, :3, :4] = torch.tensor([[0.5, -0.2, 0.3, 0.0], [-0.0, 0.1, -0.1, 0.2], [0.4, 0.4, 0.1, -0.1]])
    keep = reference.keep_from_probs(probs, 3, 4)
    assert keep.shape == (1, 1, 3, 4)
    assert keep[0, 0].int().tolist() == [[1, 0, 1, 1], [1, 1, 0, 1], [1, 1, 1, 0]]
    allowed = reference.allowed_mask(1, 3, 4, causal=True)  # 2 + 3 + 4 = 9 attendable entries, 3 dropped
    assert reference.dropped_fraction(keep, allowed) == pytest.approx(3 / 9)
    assert reference.keep_from_probs(probs[:, :, :2, :2], 3, 4).shape == (1, 1, 3, 4)  # short: padded


# ================================================================ criterion


def test_criterion_is_relative_to_torch_low_precision_error():
    ref = torch.zeros(4)
    low = torch.tensor([0.0, 0.01, 0.0, 0.0])
    ok = criterion.relative_to_torch("out", torch.tensor([0.0, 0.0, 0.019, 0.0]), ref, low, criterion.OUTPUT)
    bad = criterion.relative_to_torch("out", torch.tensor([0.0, 0.0, 0.021, 0.0]), ref, low, criterion.OUTPUT)
    grad = criterion.relative_to_torch("dq", torch.tensor([0.0, 0.0, 0.029, 0.0]), ref, low, criterion.GRADIENT)
    assert ok.passed and not bad.passed and grad.passed
    assert bad.bound == pytest.approx(0.02 + 1e-5) and bad.torch_error == pytest.approx(0.01)
    assert "out: 0.021 > 0.02" in bad.summary()


def test_criterion_epsilon_and_non_finite_errors():
    zeros = torch.zeros(3)
    assert criterion.relative_to_torch("out", torch.full((3,), 5e-6), zeros, zeros, criterion.OUTPUT).passed
    assert not criterion.relative_to_torch("out", torch.full((3,), 2e-5), zeros, zeros, criterion.OUTPUT).passed
    nan = torch.tensor([0.0, float("nan"), 0.0])
    assert not criterion.relative_to_torch("out", nan, zeros, torch.ones(3), criterion.OUTPUT).passed
    assert not criterion.identical("det", [nan], [nan]).passed
    assert criterion.identical("det", [torch.ones(2)], [torch.ones(2)]).passed
    assert not criterion.dropout_fraction("drop", 0.19, 0.17, criterion.dropout_tolerance(False, False)).passed
    assert criterion.dropout_fraction("drop", 0.19, 0.17, criterion.dropout_tolerance(True, False)).passed


# ================================================================ cases


@pytest.mark.parametrize("level", sorted(cases.LEVELS))
def test_every_case_of_every_level_is_a_valid_unique_combination(level):
    chosen = cases.LEVELS[level]()
    assert [c for c in chosen if c.problem()] == []
    assert len({c.name for c in chosen}) == len(chosen)
    assert len({c.seed for c in chosen}) == len(chosen)


def test_levels_cover_the_issue_feature_list():
    def covered(chosen):
        return {
            "apis": {c.api for c in chosen} == set(cases.APIS),
            "dtypes": {c.dtype for c in chosen} == set(cases.DTYPES),
            "non-power-of-two head dim": any(c.head_dim & (c.head_dim - 1) for c in chosen),
            "causal": any(c.causal for c in chosen), "window": any(c.window != (-1, -1) for c in chosen),
            "mqa": any(c.nheads_k == 1 for c in chosen),
            "gqa": any(1 < c.nheads_k < c.nheads for c in chosen),
            "seqlen_q != seqlen_k": any(c.seqlen_q != c.seqlen_k for c in chosen),
            "odd lengths": any(c.seqlen_q % 2 for c in chosen), "softcap": any(c.softcap for c in chosen),
            "alibi": any(c.alibi for c in chosen), "dropout": any(c.dropout_p for c in chosen),
            "deterministic": any(c.deterministic for c in chosen),
            "kvcache append": any(c.new_tokens for c in chosen),
        }

    for level in ("smoke", "full"):
        missing = [feature for feature, ok in covered(cases.LEVELS[level]()).items() if not ok]
        assert missing == [], f"{level} misses {missing}"
    full = cases.full_cases()
    assert {c.head_dim for c in full} >= {32, 59, 64, 96, 111, 128, 160, 192, 224, 256}
    # budget: the fp32 reference is O(seqlen^2); sizes stay where an H200 runs the level in minutes
    assert len(cases.smoke_cases()) <= 15 and len(full) <= 400
    assert max(max(c.seqlen_q, c.seqlen_k) for c in full if c.api != "kvcache") <= 2048


# ================================================================ the suite against the test double


def test_suite_passes_a_correct_kernel_through_every_api_and_feature():
    chosen = [small(c) for c in cases.smoke_cases()]
    seen = []
    results = runner.run_suite(ReferenceAttention(), chosen, "cpu", seen.append)
    assert [(r.name, r.status, r.message) for r in results if r.status != "passed"] == []
    assert seen == results
    by_api = {r.api: {c.name for c in r.checks} for r in results}
    assert by_api["func"] >= {"out", "dq", "dk", "dv"} and by_api["kvcache"] == {"out", "cache update"}
    checks = {c.name for r in results for c in r.checks}
    assert {"dropped fraction", "deterministic backward"} <= checks
    # the yardstick is real: torch's low-precision error is non-zero for every output check
    assert all(c.torch_error > 0 for r in results for c in r.checks if c.name == "out")


@pytest.mark.parametrize("broken,expect_failed", [
    (dict(causal_off_by_one=True), {"out", "dq", "dk", "dv"}),
    (dict(dv_factor=1.05), {"dv"}),
    (dict(write_cache=False), {"cache update"}),
])
def test_suite_fails_a_broken_kernel(broken, expect_failed):
    chosen = [small(c) for c in cases.smoke_cases() if c.causal or c.new_tokens]
    results = runner.run_suite(ReferenceAttention(**broken), chosen, "cpu")
    failed = [r for r in results if r.status == "failed"]
    assert failed, "a broken kernel passed"
    failed_checks = {c.name for r in failed for c in r.checks if not c.passed}
    assert expect_failed <= failed_checks
    assert all(r.message for r in failed)


def test_an_exception_is_one_errored_case_and_the_suite_goes_on():
    chosen = [small(c) for c in cases.smoke_cases()]
    results = runner.run_suite(ReferenceAttention(fail_api="flash_attn_varlen_func"), chosen, "cpu")
    errored = [r for r in results if r.status == "error"]
    assert [r.api for r in errored] == ["varlen"]
    assert errored[0].message.startswith("RuntimeError: flash_attn_varlen_func: no kernel image")
    assert "Traceback" in errored[0].traceback
    assert len(results) == len(chosen) and sum(r.status == "passed" for r in results) == len(chosen) - 1


def test_an_impossible_case_is_reported_not_raised():
    result = runner.run_case(ReferenceAttention(), Case("qkvpacked", "float16", 32, 8, 16), torch.device("cpu"))
    assert result.status == "error" and "qkvpacked needs equal heads and lengths" in result.message


# ================================================================ reports


def _environment():
    return {"date": "2026-11-29T12:00:00+00:00", "hostname": "test-host", "command": "toolkit verify x",
            "python": sys.executable, "torch": torch.__version__, "cuda": None, "gpu": "test double (CPU)",
            "gpu_capability": None, "flash_attn": {"version": "0.0-test-double", "path": __file__,
                                                   "extension": None}}


def test_reports_json_and_junit_read_back(tmp_path):
    chosen = [small(c) for c in cases.smoke_cases()[:4]]
    results = runner.run_suite(ReferenceAttention(causal_off_by_one=True, fail_api="flash_attn_func"), chosen,
                               "cpu")
    results += runner.run_suite(ReferenceAttention(causal_off_by_one=True), chosen[1:2], "cpu")
    data = report.build_report("cu126", "smoke", _environment(), results, [], 12.5)
    json_path, xml_path = report.write_reports(data, tmp_path)
    saved = json.loads(json_path.read_text())
    assert saved["summary"] == {"passed": 0, "failed": 1, "error": 4, "unsupported": 0, "total": 5,
                                "duration_s": 12.5, "setup_error": ""}
    assert saved["hostname"] == "test-host" and saved["flash_attn"]["version"] == "0.0-test-double"
    assert not report.passed(saved)
    suite = ET.parse(xml_path).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("5", "1", "4")
    failed = [tc for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert failed[0].get("name") == chosen[1].name and "out:" in failed[0].find("failure").get("message")
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["line"] == "cu126" and properties["flash_attn"] == "0.0-test-double"
    assert list(tmp_path.iterdir()) == [json_path, xml_path] or set(tmp_path.iterdir()) == {json_path, xml_path}


def test_report_of_a_wheel_that_does_not_import_is_still_written(tmp_path):
    data = report.build_report("cu126", "full", _environment(), [], [], 0.1,
                               setup_error="ImportError: undefined symbol: _ZN3c10")
    report.write_reports(data, tmp_path)
    assert not report.passed(data)
    error = ET.parse(tmp_path / "verify.xml").getroot().find("testsuite/testcase/error")
    assert "undefined symbol" in error.get("message")
    assert "did not import" in report.summary_line(data, tmp_path)


def test_parity_rows_get_their_own_junit_suite_and_table(tmp_path):
    from rich.console import Console

    from toolkit.verify.parity import ParityResult

    rows = [ParityResult("padding/flash_attention_2", "failed", 0.5, 0.03, 0.2, "logits differ by 0.5 > 0.03"),
            ParityResult("padding/sdpa", "passed", 0.01, 0.03, 0.1)]
    data = report.build_report("gpu-machine", "parity", _environment(), [], rows, 1.0)
    report.write_reports(data, tmp_path)
    suites = {suite.get("name"): suite for suite in ET.parse(tmp_path / "verify.xml").getroot()}
    assert set(suites) == {"parity"} and (suites["parity"].get("tests"), suites["parity"].get("failures")) == ("2", "1")
    assert not report.passed(data)
    console = Console(record=True, width=200)
    report.print_tables(data, console)
    text = console.export_text()
    assert "padding/flash_attention_2" in text and "0.03" in text and "worst error/bound" not in text


def test_console_tables_show_groups_and_failures(tmp_path):
    from rich.console import Console

    chosen = [small(c) for c in cases.smoke_cases()[:3]]
    results = runner.run_suite(ReferenceAttention(causal_off_by_one=True), chosen, "cpu")
    data = report.build_report("cu126", "smoke", _environment(), results, [], 1.0)
    report.write_reports(data, tmp_path)
    console = Console(record=True, width=200)
    report.show(tmp_path / "verify.json", console)
    text = console.export_text()
    assert "func" in text and "failures" in text and chosen[1].name in text
    assert "2 passed, 1 failed, 0 errors" in text


# ================================================================ CLI without a GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message; this machine has a GPU")
def test_verify_without_a_gpu_says_so_in_one_line(capsys, tmp_path):
    code = main(["verify", "gpu-machine", "--python", sys.executable, "--envs", str(ROOT / "envs"),
                 "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert err == ("error: no CUDA GPU visible (torch.cuda.is_available() is False): "
                   "run verification on a GPU machine\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message; this machine has a GPU")
def test_verify_re_executes_under_the_environment_python(tmp_path):
    """--python of another environment: the measurement runs as `python -m toolkit.verify` there."""
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    # a wrapper, not a symlink: a symlinked venv python no longer finds its pyvenv.cfg (nor its torch)
    (env_bin / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (env_bin / "python").chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "toolkit", "verify", "gpu-machine", "--python",
                           str(env_bin / "python"), "--report-dir", str(tmp_path / "reports")],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: no CUDA GPU visible (torch.cuda.is_available() is False): run verification on a GPU machine"]


def test_verify_command_end_to_end_with_the_double(monkeypatch, tmp_path, capsys):
    """The whole in-process `toolkit verify` path on the CPU: suite, reports, tables, exit status."""
    from toolkit.verify import fa2, machine

    monkeypatch.setattr(fa2, "DEVICE", "cpu")
    monkeypatch.setattr(machine, "require_cuda", lambda what: torch)
    double = ReferenceAttention()
    monkeypatch.setattr(machine, "import_flash_attn", lambda: (double, ""))
    monkeypatch.setitem(cases.LEVELS, "smoke", lambda: [small(c) for c in cases.smoke_cases()])
    argv = ["verify", "gpu-machine", "--python", sys.executable, "--envs", str(ROOT / "envs"),
            "--report-dir", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["command"] == "toolkit verify gpu-machine --level smoke" and data["python"] == sys.executable
    assert data["summary"]["passed"] == len(cases.smoke_cases()) and data["parity"] == []
    assert f"{len(cases.smoke_cases())} passed, 0 failed, 0 errors" in capsys.readouterr().out
    double.dv_factor = 1.05  # the same run against a kernel with a wrong dV fails the command
    assert main(argv) == 1
    assert json.loads((tmp_path / "verify.json").read_text())["summary"]["failed"] > 0


# ================================================================ transformers parity


def test_parity_harness_passes_real_backends_and_catches_a_broken_one():
    """eager vs sdpa on CPU prove the harness; a registered attention with a wrong scale must fail."""
    pytest.importorskip("transformers")
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from toolkit.verify import parity

    def wrong_scale(module, query, key, value, attention_mask, scaling=None, **kwargs):
        scaling = 1.5 * (scaling or query.shape[-1] ** -0.5)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    AttentionInterface.register("test_wrong_scale", wrong_scale)
    results = parity.run_parity("cpu", ("sdpa", "eager", "test_wrong_scale"))
    status = {r.name: r.status for r in results}
    assert status == {"no-padding/sdpa": "passed", "padding/sdpa": "passed", "no-padding/eager": "passed",
                      "padding/eager": "passed", "no-padding/test_wrong_scale": "failed",
                      "padding/test_wrong_scale": "failed"}
    assert all(0 < r.bound < 1 for r in results)


def test_parity_without_a_usable_implementation_is_an_error_row():
    pytest.importorskip("transformers")
    from toolkit.verify import parity

    results = parity.run_parity("cpu", ("no_such_attention",))
    assert {r.status for r in results} == {"error"} and len(results) == 2


# ================================================================ on a GPU, against the real flash-attn


@pytest.mark.gpu
@needs_gpu
def test_real_flash_attn_passes_the_smoke_level():
    flash_attn = pytest.importorskip("flash_attn")
    results = runner.run_suite(flash_attn, cases.smoke_cases(), "cuda")
    assert [(r.name, r.message) for r in results if r.status != "passed"] == []


@pytest.mark.gpu
@needs_gpu
def test_real_flash_attn_is_caught_when_given_a_wrong_mask():
    """The criterion is sharp on real kernels too: flash-attn causal vs a non-causal reference fails."""
    flash_attn = pytest.importorskip("flash_attn")

    class NonCausal:
        def __getattr__(self, name):
            return getattr(flash_attn, name)

        def flash_attn_func(self, *args, causal=False, **kwargs):
            return flash_attn.flash_attn_func(*args, causal=not causal, **kwargs)

    result = runner.run_case(NonCausal(), Case("func", "bfloat16", 128, 256, 256), torch.device("cuda"))
    assert result.status == "failed"
