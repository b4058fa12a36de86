#!/bin/sh
# Install the real CUDA torch 2.14.1+cu130 (with NVIDIA's cuBLAS/cuSPARSE/cuSOLVER/... wheels beside it)
# into DIR, for the replica tests that compile flash-attn's flash_api.cpp against a real CUDA torch's headers.
#
#   tests/conda_forge_replica/install_cuda_torch.sh DIR      # then: FA_CUDA_TORCH=DIR pytest tests/test_replica*.py
#
# On the CI/development machines pip takes these files from the machine's own disk (no download; about
# 5.5 GB installed). torch's CPU wheel cannot stand in: it lacks the generated c10/cuda/impl/cuda_cmake_macros.h.
# Python 3.11 (the wheels on disk are cp311). Idempotent: a DIR that already holds this torch is kept.
set -eu
dir=${1:?usage: install_cuda_torch.sh DIR}
python=${PYTHON:-python3}
if [ -f "$dir/torch/version.py" ] && grep -q "__version__ = '2.14.1+cu130'" "$dir/torch/version.py"; then
    echo "install_cuda_torch: $dir already holds torch 2.14.1+cu130"
    exit 0
fi
mkdir -p "$dir"
rm -rf "$dir.partial"
"$python" -m pip install --quiet --target "$dir.partial" "torch==2.14.1"
rm -rf "$dir"
mv "$dir.partial" "$dir"
echo "install_cuda_torch: torch $(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$dir/torch/version.py") in $dir"
