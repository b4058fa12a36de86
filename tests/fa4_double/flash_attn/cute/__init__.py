"""TEST DOUBLE of flash_attn.cute (FlashAttention-4 needs an sm_90+ GPU; the CI machines have none).

What is real: the function names and keyword signatures of flash_attn_func / flash_attn_varlen_func
of the flash_attn_4-4.0.0b36 wheel (interface.py: window_size=(None, None), cu_seqlens_q/k,
seqused_k, page_table, returns (out, lse)), and the cache switches of its cache_utils.py
(FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1, FLASH_ATTENTION_CUTE_DSL_CACHE_DIR; entries under a
fingerprint folder, one file per compile key). What is NOT real: the kernels (the attention is the
project's fp32 reference run per sequence with k scaled instead of q, so it rounds differently) and the
compile (a sleep of FA4_DOUBLE_COMPILE_S seconds, default 0.3, on a variant's first call in a process
unless the cache folder holds its entry). `broken_window=True` ignores the window: a kernel bug the
verification must catch.
"""

import hashlib
import os
import time
from pathlib import Path

import torch

from toolkit.verify import reference

__version__ = "0.0.0"  # what the real 4.0.0b36 says too (it reads the distribution "fa4")
FINGERPRINT = "double-fingerprint"


class Fa4Double:
    def __init__(self, broken_window: bool = False):
        self.broken_window = broken_window
        self.compiled: set[str] = set()

    def _compile(self, name: str, key: tuple) -> None:
        digest = hashlib.sha256(repr(key).encode()).hexdigest()
        if digest in self.compiled:
            return
        entry = None
        if os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0") == "1":
            folder = Path(os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "/nonexistent"))
            entry = folder / FINGERPRINT / name / f"{digest}.o"
        if entry is None or not entry.is_file():
            time.sleep(float(os.environ.get("FA4_DOUBLE_COMPILE_S", "0.3")))
            if entry is not None:
                entry.parent.mkdir(parents=True, exist_ok=True)
                entry.write_bytes(b"compiled " + repr(key).encode())
        self.compiled.add(digest)

    def _attend(self, q, k, v, causal, window_size, softcap):
        window = (-1, -1) if self.broken_window else tuple(-1 if s is None else s for s in window_size)
        out, _ = reference.attention_ref(q[None], k[None], v[None], causal=causal, window=window, softcap=softcap,
                                         reorder_ops=True)
        return out[0]

    def _key(self, q, causal, window_size, softcap, varlen):
        return (str(q.dtype), q.shape[-1], causal, tuple(window_size) != (None, None), softcap > 0, varlen,
                torch.is_grad_enabled() and q.requires_grad)

    def flash_attn_func(self, q, k, v, qv=None, softmax_scale=None, causal=False, window_size=(None, None),
                        learnable_sink=None, softcap=0.0, deterministic=False, **unused):
        self._compile("fwd", self._key(q, causal, window_size, softcap, False))
        out = torch.stack([self._attend(qb, kb, vb, causal, window_size, softcap)
                           for qb, kb, vb in zip(q.unbind(0), k.unbind(0), v.unbind(0))])
        return out, None

    def flash_attn_varlen_func(self, q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                               max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                               gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0, deterministic=False,
                               **unused):
        self._compile("fwd", self._key(q, causal, window_size, softcap, True))
        if page_table is not None:  # k, v: (num_pages, page_size, heads_k, d); q: (batch, seqlen_q, heads, d)
            ks = [k[pages].flatten(0, 1)[:n] for pages, n in zip(page_table.long(), seqused_k.tolist())]
            vs = [v[pages].flatten(0, 1)[:n] for pages, n in zip(page_table.long(), seqused_k.tolist())]
            out = torch.stack([self._attend(qb, kb, vb, causal, window_size, softcap)
                               for qb, kb, vb in zip(q.unbind(0), ks, vs)])
            return out, None
        spans_q = list(zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist()))
        spans_k = list(zip(cu_seqlens_k[:-1].tolist(), cu_seqlens_k[1:].tolist()))
        outs = [self._attend(q[a:b], k[c:d], v[c:d], causal, window_size, softcap)
                for (a, b), (c, d) in zip(spans_q, spans_k)]
        return torch.cat(outs), None


_default = Fa4Double()
flash_attn_func = _default.flash_attn_func
flash_attn_varlen_func = _default.flash_attn_varlen_func
