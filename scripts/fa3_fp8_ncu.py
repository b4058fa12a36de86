"""One FA3 forward at d128, seqlen 8192, non-causal, in bf16 and in FP8 (e4m3, unit descales), for ncu."""
import sys

import torch
from flash_attn_interface import flash_attn_func

dtype = sys.argv[1]
b, s, h, d = 2, 8192, 16, int(sys.argv[2]) if len(sys.argv) > 2 else 128
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
kw = {}
if dtype == "fp8":
    q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    one = torch.ones(b, h, device="cuda", dtype=torch.float32)
    kw = {"q_descale": one, "k_descale": one, "v_descale": one}
for _ in range(3):
    flash_attn_func(q, k, v, causal=False, **kw)
torch.cuda.synchronize()
print(dtype, "done")
