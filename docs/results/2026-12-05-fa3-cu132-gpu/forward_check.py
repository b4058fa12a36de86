"""Forward-only check of the CUDA 13.2 FA3 wheel (profile hdim128-bf16-fwd: no backward, so the verify suite's
func cases, which take gradients, are `unsupported`): flash_attn_func's output against an fp32 SDPA reference,
error compared with the same attention computed by torch in bf16 (the verify suite's criterion: <= 2x)."""

import torch
import torch.nn.functional as F
from flash_attn_interface import flash_attn_func


def sdpa(q, k, v, causal, dtype):
    """torch's attention in `dtype`, the K/V heads repeated for GQA, causal aligned to the bottom right as
    flash-attn's is when there are fewer queries than keys."""
    t = [x.transpose(1, 2).to(dtype) for x in (q, k, v)]
    rep = q.shape[2] // k.shape[2]
    t[1], t[2] = t[1].repeat_interleave(rep, 1), t[2].repeat_interleave(rep, 1)
    mask = None
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.ones(sq, sk, device="cuda", dtype=torch.bool).tril(sk - sq)
    return F.scaled_dot_product_attention(*t, attn_mask=mask).transpose(1, 2)


torch.manual_seed(0)
rows = []
for b, sq, sk, hq, hk, causal in [(2, 512, 512, 8, 8, False), (2, 512, 512, 8, 8, True),
                                  (1, 113, 2048, 16, 4, False), (4, 1024, 1024, 12, 2, True)]:
    q = torch.randn(b, sq, hq, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, hk, 128, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_func(q, k, v, causal=causal)
    out = out[0] if isinstance(out, tuple) else out

    ref = sdpa(q, k, v, causal, torch.float32)
    fa_err = (out.float() - ref).abs().max().item()
    torch_err = (sdpa(q, k, v, causal, torch.bfloat16).float() - ref).abs().max().item()
    ok = fa_err <= 2 * torch_err
    rows.append((b, sq, sk, hq, hk, causal, fa_err, torch_err, ok))
    print(f"b{b} q{sq} k{sk} h{hq}:{hk} causal={causal}: fa3 {fa_err:.4f} torch-bf16 {torch_err:.4f} "
          f"{'pass' if ok else 'FAIL'}")
print(f"{sum(r[-1] for r in rows)}/{len(rows)} passed")
