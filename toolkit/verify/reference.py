"""Reference attention in plain torch: what flash-attn's outputs and gradients are compared against.

The semantics follow flash-attn 2.8's documented behaviour (flash_attn_interface.py docstrings and
upstream tests/test_flash_attn.py), re-derived here in our own code:
  * causal and sliding-window masks are aligned to the bottom-right corner, per sequence:
    query i of a sequence with q_len queries and k_len keys may attend key j when
    i + k_len - q_len - left <= j <= i + k_len - q_len + right (causal means right = 0);
  * ALiBi adds -slope * |i + k_len - q_len - j| to the score of query i and key j;
  * softcap replaces a score s by softcap * tanh(s / softcap), before masks and bias;
  * a query row with no key to attend gives a zero output row (not NaN);
  * dropout keeps a probability with chance 1 - p and scales the kept ones by 1 / (1 - p).
Batches are right-padded: a sequence's tokens come first, `lens` says how many are real.
"""

from __future__ import annotations

import math

import torch


def length_mask(
    lens: torch.Tensor | None, batch: int, seqlen: int, device: torch.device
) -> torch.Tensor:
    """(batch, seqlen) bool, True for real tokens; all True when `lens` is None (no padding)."""
    positions = torch.arange(seqlen, device=device)
    if lens is None:
        return torch.ones(batch, seqlen, dtype=torch.bool, device=device)
    return positions[None, :] < lens.to(device)[:, None]


def _lengths(
    lens: torch.Tensor | None, batch: int, seqlen: int, device: torch.device
) -> torch.Tensor:
    """(batch, 1, 1, 1) lengths, broadcastable against (batch, heads, q, k) score tensors."""
    if lens is None:
        lens = torch.full((batch,), seqlen, device=device)
    return lens.to(device=device, dtype=torch.long).view(batch, 1, 1, 1)


def diagonal_offset(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    q_lens: torch.Tensor | None,
    k_lens: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """(batch, 1, q, k): (i + k_len - q_len) - j, i.e. how far key j lies left of query i's diagonal."""
    rows = torch.arange(seqlen_q, device=device).view(1, 1, seqlen_q, 1)
    cols = torch.arange(seqlen_k, device=device).view(1, 1, 1, seqlen_k)
    shift = _lengths(k_lens, batch, seqlen_k, device) - _lengths(q_lens, batch, seqlen_q, device)
    return rows + shift - cols


def allowed_mask(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    *,
    q_lens: torch.Tensor | None = None,
    k_lens: torch.Tensor | None = None,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """(batch, 1, q, k) bool: True where query i may attend key j (padding, causal and window applied)."""
    device = torch.device(device)
    left, right = window
    if causal:
        right = 0
    offset = diagonal_offset(batch, seqlen_q, seqlen_k, q_lens, k_lens, device)
    allowed = (
        length_mask(q_lens, batch, seqlen_q, device)[:, None, :, None]
        & length_mask(k_lens, batch, seqlen_k, device)[:, None, None, :]
    )
    if right >= 0:
        allowed = allowed & (offset >= -right)
    if left >= 0:
        allowed = allowed & (offset <= left)
    return allowed


def alibi_bias(
    slopes: torch.Tensor,
    seqlen_q: int,
    seqlen_k: int,
    q_lens: torch.Tensor | None = None,
    k_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """(batch, heads, q, k) fp32 bias -slope * |i + k_len - q_len - j| for slopes of shape (batch, heads)."""
    batch = slopes.shape[0]
    offset = diagonal_offset(batch, seqlen_q, seqlen_k, q_lens, k_lens, slopes.device)
    return -slopes.float()[:, :, None, None] * offset.abs().float()


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    q_lens: torch.Tensor | None = None,
    k_lens: torch.Tensor | None = None,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    keep: torch.Tensor | None = None,
    upcast: bool = True,
    reorder_ops: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of padded q (b, sq, h, d) over k, v (b, sk, h_k, d); returns (out, probabilities).

    upcast=True computes in fp32 (the reference); upcast=False stays in the inputs' precision and,
    with reorder_ops=True, scales k instead of q: the error of that "torch at low precision" run is
    the yardstick flash-attn's own error is measured against. `keep` (b, h, sq, sk) is the dropout
    pattern to apply (True = kept), recovered from flash-attn so both sides drop the same entries.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    group = heads // k.shape[2]
    k = k.repeat_interleave(group, dim=2)  # MQA/GQA: query head h reads key/value head h // group
    v = v.repeat_interleave(group, dim=2)
    if reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q, k / math.sqrt(head_dim))
    else:
        scores = torch.einsum("bthd,bshd->bhts", q / math.sqrt(head_dim), k)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    allowed = allowed_mask(
        batch,
        seqlen_q,
        seqlen_k,
        q_lens=q_lens,
        k_lens=k_lens,
        causal=causal,
        window=window,
        device=q.device,
    )
    empty_rows = ~allowed.any(dim=-1, keepdim=True)
    # An all-masked row would give NaN in softmax and its backward; give it finite scores, then zero it.
    scores = scores.masked_fill(~allowed & ~empty_rows, float("-inf"))
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, seqlen_q, seqlen_k, q_lens, k_lens)
    probs = torch.softmax(scores, dim=-1).to(v.dtype).masked_fill(empty_rows, 0.0)
    kept = probs if keep is None else probs.masked_fill(~keep, 0.0)
    out = torch.einsum("bhts,bshd->bthd", kept, v * (1.0 / (1.0 - dropout_p)))
    out = out.masked_fill(~length_mask(q_lens, batch, seqlen_q, q.device)[:, :, None, None], 0.0)
    return out.to(dtype), probs.to(dtype)


# ---------------------------------------------------------------- varlen packing


def unpad(
    x: torch.Tensor, lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Right-padded (b, s, ...) -> packed (total, ...), row indices, cu_seqlens (int32, b + 1), max length.

    Differentiable in x, so gradients of the packed tensor land on the padded one.
    """
    batch, seqlen = x.shape[:2]
    indices = torch.nonzero(length_mask(lens, batch, seqlen, x.device).flatten()).flatten()
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=x.device)
    cu_seqlens[1:] = torch.cumsum(lens.to(x.device), dim=0)
    return x.flatten(0, 1)[indices], indices, cu_seqlens, int(lens.max())


def pad(x_packed: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Packed (total, ...) -> right-padded (b, s, ...) with zeros in the padding; differentiable."""
    flat = x_packed.new_zeros(batch * seqlen, *x_packed.shape[1:]).index_put((indices,), x_packed)
    return flat.view(batch, seqlen, *x_packed.shape[1:])


# ---------------------------------------------------------------- KV cache and dropout


def kvcache_expected(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    cache_seqlens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The caches after appending k_new/v_new at each sequence's cache_seqlens, and the new key lengths."""
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    if k_new is None or v_new is None:  # nothing appended
        return k_expected, v_expected, cache_seqlens.long()
    appended = k_new.shape[1]
    for b, start in enumerate(cache_seqlens.tolist()):
        k_expected[b, start : start + appended] = k_new[b]
        v_expected[b, start : start + appended] = v_new[b]
    return k_expected, v_expected, cache_seqlens.long() + appended


def keep_from_probs(probs: torch.Tensor, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """flash-attn's returned S_dmask (b, h, >=sq, >=sk) -> (b, h, sq, sk) bool keep pattern.

    flash-attn encodes a dropped entry as a negative value (rows and columns are rounded up to its
    block size, so crop); anything non-negative was kept.
    """
    short_q, short_k = max(0, seqlen_q - probs.shape[-2]), max(0, seqlen_k - probs.shape[-1])
    probs = torch.nn.functional.pad(probs, (0, short_k, 0, short_q))
    return probs[:, :, :seqlen_q, :seqlen_k] >= 0


def dropped_fraction(keep: torch.Tensor, allowed: torch.Tensor) -> float:
    """Fraction of attendable entries that were dropped (masked and padded entries don't count)."""
    allowed = allowed.expand_as(keep)
    return float((~keep & allowed).sum()) / max(1, int(allowed.sum()))
