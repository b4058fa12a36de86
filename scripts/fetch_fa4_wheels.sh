#!/usr/bin/env bash
# Download FlashAttention-4's pinned wheels (toolkit/knowledge/flash_attn_4.yaml: exact versions,
# --no-deps, binary only, sha256-checked) into .whl-fa4/all/ and cut them into two carryable folders,
# .whl-fa4/part1/ (the small wheels + the first chunk of nvidia-cutlass-dsl-libs-cu13) and
# .whl-fa4/part2/ (its other chunks), each under 60 MiB, for scripts/gpu_fa4.sh on the GPU machine.
# Usage (repo root, with PyPI reachable): bash scripts/fetch_fa4_wheels.sh [CUDA_MAJOR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m toolkit.fa4 fetch --cuda-major "${1:-13}" --dest .whl-fa4/all --split-into .whl-fa4
