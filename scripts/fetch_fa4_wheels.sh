#!/usr/bin/env bash
# Download FlashAttention-4's pinned wheels (toolkit/knowledge/flash_attn_4.yaml: exact versions,
# --no-deps, binary only, sha256-checked) into .whl-fa4/all/ and cut them into as many carryable folders as they
# need, .whl-fa4/part1/ (the small wheels + the first chunk of nvidia-cutlass-dsl-libs-cu13), part2/, part3/ (its
# other chunks), each under 44 MiB (one carry is 64 MiB with the working tree beside it), printed with its size,
# for scripts/gpu_fa4.sh on the GPU machine (one `run` call per folder); a partN left by an earlier split is removed.
# --also VERSION: also the wheels of that other release that the default release's pins lack, in one
# folder .whl-fa4/<VERSION without its leading numbers> (--also 4.0.0b36: .whl-fa4/b36, b36's own
# flash-attn-4 wheel), under 44 MiB, for a second install beside it (scripts/gpu_fa4.sh b36).
# Usage (repo root, with PyPI reachable): bash scripts/fetch_fa4_wheels.sh [CUDA_MAJOR] [--also VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CUDA_MAJOR=13
ALSO=
while [ $# -gt 0 ]; do
  case "$1" in
    --also) ALSO=${2:?--also needs a version, e.g. 4.0.0b36}; shift 2 ;;
    [0-9]*) CUDA_MAJOR=$1; shift ;;
    *) echo "usage: $0 [CUDA_MAJOR] [--also VERSION]" >&2; exit 2 ;;
  esac
done
"$PY" -m toolkit.fa4 fetch --cuda-major "$CUDA_MAJOR" --dest .whl-fa4/all --split-into .whl-fa4
if [ -n "$ALSO" ]; then
  DEFAULT=$("$PY" -c 'from toolkit.knowledge.fa4_pins import DEFAULT_RELEASE; print(DEFAULT_RELEASE)')
  SHORT=$(printf '%s' "$ALSO" | sed -E 's/^[0-9.]+//')
  "$PY" -m toolkit.fa4 fetch --cuda-major "$CUDA_MAJOR" --release "$ALSO" --beside "$DEFAULT" \
    --dest ".whl-fa4/${SHORT:-$ALSO}"
fi
