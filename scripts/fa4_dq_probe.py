"""Whether FlashAttention-4's sm_90 backward still gets dQ wrong at head dims that are multiples of 16 but not
of 32 (knowledge/flash_attn_4.yaml `bwd_sm90_padding`): the cases the FA4 suite records as unsupported at those
head dims, run anyway through the verification's own runner and criterion (toolkit/verify/runner.py), beside
the listed multiples of 32. On the GPU machine, with the install's env (scripts/gpu_fa4.sh dq-probe):

    python scripts/fa4_dq_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import torch

from toolkit.verify.cases import Case
from toolkit.verify.fa4 import Fa4Backend, fa4_version, import_fa4
from toolkit.verify.runner import run_case

HEAD_DIMS = (32, 40, 64, 80, 96, 112, 128)  # 40, 80, 112: the knowledge's wrong ones; the rest: its right ones


def main(out: str) -> int:
    module, error = import_fa4()
    if module is None:
        print(f"flash_attn.cute does not import: {error}", file=sys.stderr)
        return 1
    torch.set_float32_matmul_precision("highest")
    rows = []
    for dtype in ("float16", "bfloat16"):
        for causal in (False, True):
            for head_dim in HEAD_DIMS:
                case = Case("func", dtype, head_dim, 113, 203, causal=causal)
                result = run_case(Fa4Backend(module), case, torch.device("cuda"))
                rows.append({"case": case.name, "head_dim": head_dim, "status": result.status,
                             "message": result.message, "checks": [asdict(c) for c in result.checks]})
                print(f"{case.name}: {result.status} {result.message}")
    gpu = torch.cuda.get_device_name()
    data = {"fa4": fa4_version(), "gpu": gpu, "torch": torch.__version__, "rows": rows}
    with open(out, "w") as f:
        json.dump(data, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
