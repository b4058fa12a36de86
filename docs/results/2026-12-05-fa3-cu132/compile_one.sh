#!/bin/bash
# One FA3 kernel object with the flags hopper/setup.py (c75d019d) gives nvcc, plus torch.utils.cpp_extension's
# COMMON_NVCC_FLAGS; CUDA 13.2.86 from NVIDIA's PyPI wheels (locks/py-cu132.conda-lock.yml).
set -u
SRC=/tmp/fa3cu132/src/flash-attention-c75d019dea9d910312974417bc28f190dfdda6d9
CUTLASS=/tmp/fa3cu132/src/cutlass-7127592069c2fe01b041e174ba4345ef9b279671
export CUDA_HOME=/tmp/fa3cu132/tc/nvidia/cu13
export PATH=$CUDA_HOME/bin:$PATH
export CPLUS_INCLUDE_PATH=$CUDA_HOME/include/cccl
name=$1; shift
cd $SRC/hopper
/usr/bin/time -v nvcc -I$SRC/hopper -I$CUTLASS/include -I$CUDA_HOME/include \
  -c instantiations/$name.cu -o /tmp/fa3cu132/obj/$name.o \
  -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ \
  -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr --compiler-options '-fPIC' \
  --threads 1 -O3 -std=c++17 --ftemplate-backtrace-limit=0 --use_fast_math --resource-usage -lineinfo \
  -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCUTLASS_ENABLE_GDC_FOR_SM90 -DCUTLASS_DEBUG_TRACE_LEVEL=0 -DNDEBUG \
  -gencode arch=compute_90a,code=sm_90a "$@" \
  -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C -DPy_LIMITED_API=0x03090000
echo "exit: $?"
